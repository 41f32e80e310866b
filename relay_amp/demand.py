"""Step 2 of the algorithm (stated in :mod:`relay_amp.transform`): dtype demand. Backward over
the bindings, each records the dtypes its operands must have (:class:`Demand`); each follow op's
mode follows from what its consumers demand. Before it, :func:`result_signature` keeps float32
the result leaves of a low-precision signature that the low dtype cannot hold."""

from __future__ import annotations

from dataclasses import dataclass

from tvm import relax
from tvm.ir import Call
from tvm.relax import (
    If,
    MatchCast,
    SeqExpr,
    TensorType,
    TupleGetItem,
)

from .dtypes import (
    OutOfRange,
    max_finite,
    smallest_subnormal,
)
from .kinds import LOW_CATEGORIES, Category, Mode
from .op_registry import ALL, op_info
from .plan import Plan, Scope, range_words
from .reasons import Reason
from .relax_utils import (
    GenericConst,
    TupleType,
    is_var,
    lowered_type,
    type_leaves,
)


@dataclass(frozen=True)
class Demand:
    """What step 2 hands on.

    Attributes
    ----------
    demand : dict
        Var -> the dtypes its consumers want ("original": its own original dtype).
    item_demand : dict
        (tuple var, index) -> the dtypes wanted of that field.
    """

    demand: dict
    item_demand: dict


class DemandPlanner:
    """Step 2 for one function: :meth:`plan` returns its :class:`Demand` and sets the mode
    of every call binding that step 1b left open.

    Parameters
    ----------
    scope : Scope
        The function's bindings.
    decisions : relay_amp.decide.Decisions
        Step 1's output.
    kernels : relay_amp.kernel_plan.KernelPlan, optional
        Step 1b's output (None without ``low_precision_boundaries``).
    """

    def __init__(self, scope: Scope, decisions, kernels=None):
        self.scope, self.decisions, self.kernels = scope, decisions, kernels
        self.low = scope.low
        self.canonical, self.leaves, self.bindings = scope.canonical, scope.leaves, scope.bindings
        self.bound, self.call_args = scope.bound, scope.call_args
        self._orig_dtype = scope.orig_dtype
        self.plans, self.can_low, self.f32_ready = (decisions.plans, decisions.can_low,
                                                    decisions.f32_ready)
        self.demand: dict = {}
        self.item_demand: dict = {}

    def plan(self, seq: SeqExpr, result_dtypes_low: bool, result_type=None) -> Demand:
        """Step 2 over the function body ``seq`` (see :meth:`backward`)."""
        self.backward(seq, result_dtypes_low, result_type)
        return Demand(self.demand, self.item_demand)

    def _read_low_across(self, leaf, var) -> bool:
        """Does ``var`` read ``leaf``'s low-precision copy stored between kernels (widening it
        in its own kernel where it computes float32)?"""
        kernels = self.kernels
        return kernels is not None and (kernels.boundary_read(leaf, var) or (
            leaf in kernels.low_values and (leaf, var) not in kernels.fused
            and kernels.reads_stored(var)))

    def want(self, expr, dtypes):
        """Record that the var leaves of ``expr`` are wanted in ``dtypes``."""
        for leaf in self.leaves(expr):
            if is_var(leaf):
                wanted = self.demand.get(leaf)
                if wanted is None:
                    wanted = self.demand[leaf] = set()
                wanted.update(dtypes)

    def want_original(self, expr):
        for leaf in self.leaves(expr):
            if is_var(leaf):
                dtype = self._orig_dtype(leaf)
                wanted = self.demand.get(leaf)
                if wanted is None:
                    wanted = self.demand[leaf] = set()
                wanted.add(dtype if dtype is not None else "original")

    def backward(self, seq: SeqExpr, result_dtypes_low: bool, result_type=None):
        """Step 2 over ``seq``; ``result_type`` (a low-precision signature with some leaves kept
        float32) says which dtype each leaf of the result is wanted in."""
        if result_type is not None:
            self.want_result(seq.body, result_type)
        elif result_dtypes_low:
            self.want(seq.body, {self.low})
        else:
            self.want_original(seq.body)
        for binding, var, value in reversed(self.bindings(seq)):
            self._backward_binding(binding, var, value)

    def _backward_binding(self, binding, var, value):
        demand = self.demand.get(var, set())
        if type(binding) is MatchCast:
            self.want_original(value)
            return
        value_type = type(value)
        if value_type is Call:
            plan = self.plans.get(var)
            if plan is None:  # a call of a function, closure or extern: keeps its signature
                for arg in value.args:
                    self.want_original(arg)
                return
            self._choose_mode(plan, var, demand)
            if plan.mode == Mode.IDENTITY:
                return
            low_operands = {self.low}
            lowered = op_info(plan.op).low_operands
            for index, (_, arg_leaves) in enumerate(self.call_args[var]):
                if lowered is not None and (plan.mode != Mode.LOW or index not in lowered):
                    continue  # integers, scales and zero points keep their dtypes
                for leaf in arg_leaves:
                    if not is_var(leaf):
                        continue
                    if self._read_low_across(leaf, var):
                        self.want(leaf, low_operands)  # widened in this kernel if need be
                    elif plan.mode == Mode.LOW and self._orig_dtype(leaf) in ("float32", self.low):
                        self.want(leaf, low_operands)
                    elif plan.mixed and self.low in self.demand.get(leaf, ()):
                        self.want(leaf, low_operands)  # the kernel widens it in registers
                    else:
                        self.want_original(leaf)
        elif value_type is If:
            self.backward(value.true_branch, False)
            self.backward(value.false_branch, False)
        elif value_type is relax.Tuple:
            for index, field in enumerate(value.fields):
                wanted = demand | self.item_demand.get((var, index), set())
                self._want_field(field, wanted)
        elif is_var(value):
            self.want(value, demand)
        elif value_type is TupleGetItem:
            source = self.canonical(value.tuple_value)
            self.item_demand.setdefault((source, value.index), set()).update(demand)
            self.want(source, demand)

    def want_result(self, expr, ty):
        """Record that the result ``expr`` is wanted in the dtypes of the type ``ty``."""
        if isinstance(ty, TensorType):
            self.want(expr, {str(ty.dtype)})
            return
        if not isinstance(ty, TupleType):
            self.want_original(expr)
            return
        if type(expr) is relax.Tuple:  # noqa: E721
            for field, field_ty in zip(expr.fields, ty.fields):
                self.want_result(field, field_ty)
            return
        if not is_var(expr):
            return
        var = self.canonical(expr)
        dtypes = {str(t.dtype) for t in type_leaves(ty)}
        if len(dtypes) == 1:
            self.want(var, dtypes)
            return
        for index, field_ty in enumerate(ty.fields):
            field_dtypes = {str(t.dtype) for t in type_leaves(field_ty)}
            self.item_demand.setdefault((var, index), set()).update(
                field_dtypes if len(field_dtypes) == 1 else {"original"})

    def _want_field(self, field, wanted: set):
        """Demand on one field of a tuple: "original" means the field's own original dtype."""
        if type(field) is relax.Tuple:
            for inner in field.fields:
                self._want_field(inner, wanted)
        elif is_var(field):
            field = self.canonical(field)
            original = self._orig_dtype(field)
            resolved = {original if d == "original" and original else d for d in wanted}
            self.demand.setdefault(field, set()).update(resolved)

    def _choose_mode(self, plan: Plan, var, demand: set):
        category = plan.category
        if plan.mode == Mode.IDENTITY or plan.mode_fixed:
            return
        choose = op_info(plan.op).choose_mode
        if choose is not None and category == Category.FOLLOW:
            plan.mode, reason = choose(self.decisions.site(var, self.bound[var], demand))
            plan.reasons.append(reason)
            return
        if category in LOW_CATEGORIES:
            plan.mode = Mode.LOW
            plan.accumulation = (
                plan.decision.accumulation_dtype
                if category == Category.LOW_PRECISION_FP32_ACCUMULATE else self.low)
        elif category == Category.FOLLOW:
            can_low = self.can_low.get(var, False)
            f32_ready = self.f32_ready.get(var, False)
            exact = op_info(plan.op).exact
            if not plan.float_output:
                if can_low and not f32_ready:
                    plan.mode = Mode.LOW
                    plan.reasons.append(Reason.of("inputs_only_low", dtype=self.low))
                else:
                    plan.reasons.append(Reason.of("inputs_float32"))
            elif f32_ready and (not exact or "float32" in demand):
                plan.reasons.append(Reason.of("float32_wanted" if exact else "rounds_once"))
            elif can_low and self.low in demand and plan.constant_inputs:
                plan.mode = Mode.LOW
                plan.reasons.append(Reason.of("constant_copy", dtype=self.low))
            elif can_low and self.low in demand:
                plan.mode = Mode.LOW
                plan.reasons.append(Reason.of("low_wanted", dtype=self.low))
            elif self.low in demand:
                plan.reasons.append(Reason.of("float32_activation"))
            else:
                plan.reasons.append(Reason.of("nothing_wants_low"))
        elif category == Category.STORAGE:
            plan.mode = Mode.STORAGE
        elif category == Category.ACCUMULATE:
            plan.accumulation = "float32"


class _ResultValues:
    """What the values of a function result may be, and whether the low dtype holds them."""

    def __init__(self, scope: Scope, decisions, constant_check):
        self.low, self.canonical, self.bound = scope.low, scope.canonical, scope.bound
        self.dtype_of, self._float_leaves = scope.dtype_of, scope.float_leaves
        self.plans, self.hot = decisions.plans, decisions.hot
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
        var = self.canonical(expr)
        found = [] if path else [var]
        value = self.bound.get(var)
        if value is None:
            return found
        value_type = type(value)
        if value_type is If:
            return (found + self._values(value.true_branch.body, path, depth + 1)
                    + self._values(value.false_branch.body, path, depth + 1))
        if value_type is Call:
            plan = self.plans.get(var)
            if not path and plan is not None and op_info(plan.op).values == ALL:
                leaves = self._float_leaves(var)
                if len(leaves) == 1:
                    found += self._values(leaves[0][0], (), depth + 1)
            return found
        return found + self._values(value, path, depth + 1)

    def _unholdable(self, expr) -> OutOfRange | None:
        """Why the value of ``expr`` (a var or constant) cannot be stored in the low dtype."""
        if type(expr) is GenericConst:
            if self.dtype_of(expr) != "float32":
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



def result_signature(scope: Scope, decisions, constant_check, result, ret_ty):
    """The low-precision signature's result type: ``ret_ty`` with every float32 tensor leaf in
    the low dtype, except the leaves whose value the low dtype cannot hold; and those leaves as
    ``(path, expr, reason)``."""
    return _ResultValues(scope, decisions, constant_check).boundary_result_type(result, ret_ty)
