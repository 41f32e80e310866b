"""Step 1's result analysis (the algorithm is stated in :mod:`relay_amp.transform`): what the
values of a function's result may be, through vars, tuples, If branches and ops that pass their
input's values through, and which result leaves a low-precision signature must keep float32
because the low dtype cannot hold their values (calibration, constants). :class:`relay_amp.decide.
Decider` calls it once its forward pass is done, with what that pass found."""

from __future__ import annotations

from tvm import relax
from tvm.ir import Call
from tvm.relax import If, TensorType, TupleGetItem

from .dtypes import OutOfRange, max_finite, smallest_subnormal
from .op_registry import ALL, op_info
from .plan import range_words
from .relax_utils import GenericConst, TupleType, is_var, lowered_type


class _ResultValues:
    """What the values of a function result may be, and whether the low dtype holds them."""

    def __init__(self, scope, plans, hot, constant_check):
        self.scope, self.plans, self.hot = scope, plans, hot
        self.low = scope.low
        self.constant_check = constant_check

    def _values(self, expr, path=(), depth=0) -> list:
        """The expressions whose value (field ``path`` of) ``expr`` may be: itself, and what it
        is bound to through vars, tuples, tuple items, If branches and ops that pass the values
        of their one float input through."""
        if depth > 64:
            return []
        kind = type(expr)
        if kind is relax.Tuple:
            return self._values(expr.fields[path[0]], path[1:], depth + 1) if path else []
        if kind is TupleGetItem:
            return self._values(expr.tuple_value, (expr.index, *path), depth + 1)
        if kind is GenericConst:
            return [] if path else [expr]
        if not is_var(expr):
            return []
        var = self.scope.canonical(expr)
        found = [] if path else [var]
        value = self.scope.bound.get(var)
        if value is None:
            return found
        value_type = type(value)
        if value_type is If:
            return (found + self._values(value.true_branch.body, path, depth + 1)
                    + self._values(value.false_branch.body, path, depth + 1))
        if value_type is Call:
            plan = self.plans.get(var)
            if not path and plan is not None and op_info(plan.op).values == ALL:
                leaves = self.scope.float_leaves(var)
                if len(leaves) == 1:
                    found += self._values(leaves[0][0], (), depth + 1)
            return found
        return found + self._values(value, path, depth + 1)

    def _unholdable(self, expr) -> OutOfRange | None:
        """Why the value of ``expr`` (a var or constant) cannot be stored in the low dtype."""
        if type(expr) is GenericConst:
            if self.scope.dtype_of(expr) != "float32":
                return None
            bad = self.constant_check(expr)
            if bad is None:
                return None
            overflow = abs(bad) > max_finite(self.low)
            return OutOfRange(f"constant {bad:.4g} {range_words(bad, self.low)}", abs(bad),
                              max_finite(self.low) if overflow else smallest_subnormal(self.low))
        return self.hot.get(expr) if is_var(expr) else None

    def boundary_result_type(self, result, ret_ty):
        """The low-precision signature's result type: ``ret_ty`` with every float32 tensor leaf
        in the low dtype, except the leaves whose value the low dtype cannot hold; and those
        leaves as ``(path, expr, reason)``."""
        kept = []

        def walk(ty, path):
            if isinstance(ty, TensorType):
                if str(ty.dtype) != "float32":
                    return ty
                values = self._values(result, path)
                for expr in values:
                    problem = self._unholdable(expr)
                    if problem is not None:  # named after the var nearest the result
                        kept.append((path, next((v for v in values if is_var(v)), expr),
                                     problem))
                        return ty
                return lowered_type(ty, self.low)
            if isinstance(ty, TupleType):
                return TupleType([walk(f, (*path, i)) for i, f in enumerate(ty.fields)])
            return ty

        return walk(ret_ty, ()), kept


def result_signature(scope, plans, hot, constant_check, result, ret_ty):
    """The low-precision signature's result type and the leaves it keeps float32.

    Parameters
    ----------
    scope : relay_amp.plan.Scope
        The function's bindings.
    plans : Mapping
        Call binding var -> its decision so far (what ops pass their input's values through).
    hot : Mapping
        Var -> why its value cannot be stored in the low dtype (calibration).
    constant_check : callable
        ``const -> float | None``: a value of a float32 constant the low dtype cannot hold.
    result, ret_ty : relax.Expr, relax.Type
        The function's result and its type.

    Returns
    -------
    (relax.Type, list)
        ``ret_ty`` with every float32 tensor leaf in the low dtype except the leaves whose value
        the low dtype cannot hold; and those leaves as ``(path, expr, reason)``.
    """
    return _ResultValues(scope, plans, hot, constant_check).boundary_result_type(result, ret_ty)
