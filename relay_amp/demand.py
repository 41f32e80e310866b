"""Step 2 of the algorithm (stated in :mod:`relay_amp.transform`): dtype demand. Backward over
the bindings, each records the dtypes its operands must have; each binding whose mode step 1b
left open gets its mode from what its consumers demand (:class:`Demand`, all of it)."""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

from tvm import relax
from tvm.ir import Call
from tvm.relax import (
    If,
    MatchCast,
    SeqExpr,
    TensorType,
    TupleGetItem,
)

from .kinds import LOW_CATEGORIES, Category, Mode
from .op_registry import op_info
from .plan import Scope
from .reasons import Reason
from .relax_utils import (
    TupleType,
    is_var,
    type_leaves,
)


@dataclass(frozen=True)
class Demand:
    """What step 2 hands on.

    Attributes
    ----------
    demand : Mapping
        Var -> the dtypes its consumers want, a frozenset ("original": its own original dtype).
    item_demand : Mapping
        (tuple var, index) -> the dtypes wanted of that field.
    modes : Mapping
        Call binding var -> the mode this step chose (absent: as steps 1 and 1b left it).
    accumulation : Mapping
        Call binding var -> the dtype it accumulates in.
    reasons : Mapping
        Call binding var -> the reasons this step adds to its decision.
    """

    demand: dict
    item_demand: dict
    modes: dict
    accumulation: dict
    reasons: dict


class DemandPlanner:
    """Step 2 for one function: :meth:`plan` returns its :class:`Demand`, with the mode of
    every call binding that step 1b left open.

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
        self.demand: dict = {}
        self.item_demand: dict = {}
        self.modes: dict = {}
        self.accumulation: dict = {}
        self.reasons: dict = {}

    def plan(self, seq: SeqExpr, result_dtypes_low: bool, result_type=None) -> Demand:
        """Step 2 over the function body ``seq`` (see :meth:`backward`)."""
        self.backward(seq, result_dtypes_low, result_type)
        return Demand(MappingProxyType({var: frozenset(d) for var, d in self.demand.items()}),
                      MappingProxyType({key: frozenset(d)
                                        for key, d in self.item_demand.items()}),
                      MappingProxyType(self.modes), MappingProxyType(self.accumulation),
                      MappingProxyType({var: tuple(r) for var, r in self.reasons.items()}))

    def _read_low_across(self, leaf, var) -> bool:
        """Does ``var`` read ``leaf``'s low-precision copy stored between kernels (widening it
        in its own kernel where it computes float32)?"""
        kernels = self.kernels
        return kernels is not None and (kernels.boundary_read(leaf, var) or (
            leaf in kernels.low_values and (leaf, var) not in kernels.fused
            and kernels.reads_stored(var)))

    def want(self, expr, dtypes):
        """Record that the var leaves of ``expr`` are wanted in ``dtypes``."""
        for leaf in self.scope.leaves(expr):
            if is_var(leaf):
                wanted = self.demand.get(leaf)
                if wanted is None:
                    wanted = self.demand[leaf] = set()
                wanted.update(dtypes)

    def want_original(self, expr):
        for leaf in self.scope.leaves(expr):
            if is_var(leaf):
                dtype = self.scope.orig_dtype(leaf)
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
        for binding, var, value in reversed(self.scope.bindings(seq)):
            self._backward_binding(binding, var, value)

    def _backward_binding(self, binding, var, value):
        demand = self.demand.get(var, set())
        if type(binding) is MatchCast:
            self.want_original(value)
            return
        value_type = type(value)
        if value_type is Call:
            plan = self.decisions.plans.get(var)
            if plan is None:  # a call of a function, closure or extern: keeps its signature
                for arg in value.args:
                    self.want_original(arg)
                return
            mode = self._choose_mode(plan, var, demand)
            if mode == Mode.IDENTITY:
                return
            low_operands = {self.low}
            lowered = op_info(plan.op).low_operands
            for index, (_, arg_leaves) in enumerate(self.scope.call_args[var]):
                if lowered is not None and (mode != Mode.LOW or index not in lowered):
                    continue  # integers, scales and zero points keep their dtypes
                for leaf in arg_leaves:
                    if not is_var(leaf):
                        continue
                    if self._read_low_across(leaf, var):
                        self.want(leaf, low_operands)  # widened in this kernel if need be
                    elif mode == Mode.LOW and self.scope.orig_dtype(leaf) in ("float32", self.low):
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
            source = self.scope.canonical(value.tuple_value)
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
        var = self.scope.canonical(expr)
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
            field = self.scope.canonical(field)
            original = self.scope.orig_dtype(field)
            resolved = {original if d == "original" and original else d for d in wanted}
            self.demand.setdefault(field, set()).update(resolved)

    def _choose_mode(self, plan, var, demand: set) -> Mode:
        """``var``'s mode: as steps 1 and 1b left it (an identity, or a follow op whose mode
        follows from how its inputs arrive), else chosen here from ``demand``."""
        kernels = self.kernels
        if kernels is not None and var in kernels.modes:
            return kernels.modes[var]
        if plan.mode == Mode.IDENTITY:
            return plan.mode
        mode, accumulation, reason = self._mode(plan, var, demand)
        if mode != Mode.ORIGINAL:
            self.modes[var] = mode
        if accumulation is not None:
            self.accumulation[var] = accumulation
        if reason is not None:
            self.reasons[var] = (reason,)
        return mode

    def _mode(self, plan, var, demand: set):
        """(mode, accumulation dtype or None, reason or None) of a binding step 1b left open."""
        category, low = plan.category, self.low
        choose = op_info(plan.op).choose_mode
        if choose is not None and category == Category.FOLLOW:
            mode, reason = choose(self.decisions.site(var, self.scope.bound[var], demand))
            return mode, None, reason
        if category in LOW_CATEGORIES:
            return Mode.LOW, (plan.decision.accumulation_dtype
                              if category == Category.LOW_PRECISION_FP32_ACCUMULATE else low), None
        if category == Category.STORAGE:
            return Mode.STORAGE, None, None
        if category == Category.ACCUMULATE:
            return Mode.ORIGINAL, "float32", None
        if category != Category.FOLLOW:
            return Mode.ORIGINAL, None, None
        can_low = self.decisions.can_low.get(var, False)
        f32_ready = self.decisions.f32_ready.get(var, False)
        exact = op_info(plan.op).exact
        if not plan.float_output:
            if can_low and not f32_ready:
                return Mode.LOW, None, Reason.of("inputs_only_low", dtype=low)
            return Mode.ORIGINAL, None, Reason.of("inputs_float32")
        if f32_ready and (not exact or "float32" in demand):
            return Mode.ORIGINAL, None, Reason.of("float32_wanted" if exact else "rounds_once")
        if can_low and low in demand and plan.constant_inputs:
            return Mode.LOW, None, Reason.of("constant_copy", dtype=low)
        if can_low and low in demand:
            return Mode.LOW, None, Reason.of("low_wanted", dtype=low)
        if low in demand:
            return Mode.ORIGINAL, None, Reason.of("float32_activation")
        return Mode.ORIGINAL, None, Reason.of("nothing_wants_low")
