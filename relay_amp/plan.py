"""What the stages of one function's conversion hand each other (the algorithm is stated in
:mod:`relay_amp.transform`): the :class:`Context` a function is converted in (its nested
functions and If branches too), the :class:`Scope` every stage reads, a binding's frozen
:class:`BindingPlan`, and the :class:`FunctionPlan` built from the outputs of steps 1, 1b and 2
that step 3, the rewrite, carries out without changing."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from types import MappingProxyType
from typing import NamedTuple

from tvm.ir import Call
from tvm.relax import If, SeqExpr

from .dtypes import is_floating, max_finite
from .kinds import Category, Mode
from .op_hooks import OpSite
from .op_registry import op_info
from .policy import Decision, Policy
from .reasons import Reason
from .relax_utils import VAR_TYPES, TupleType, leaves_of, lowered_type, op_name


@dataclass(frozen=True)
class Context:
    """What one function is converted with; a nested function and an If branch get the
    enclosing function's.

    Attributes
    ----------
    low : str
        The low-precision dtype.
    policy : relay_amp.Policy
        The decision table.
    target_rule : callable, optional
        The target's rule over the policy's decisions (:func:`relay_amp.targets.target_rule`).
    settings : relay_amp.targets.KernelSettings
        The target's kernel settings.
    calibration : relay_amp.Calibration, optional
        Observed ranges.
    callee_kinds : dict
        PrimFunc name -> the FusionKind of a ``call_tir`` of it.
    dtype_of : relay_amp.relax_utils.DtypeCache
        The dtype of an expression, cached for the whole conversion.
    constants : relay_amp.casts.Constants
        The conversion's float32 constants (range checks and low-precision copies).
    selecting_callees : frozenset
        PrimFunc names whose ``call_tir`` selects among its inputs and constants
        (:func:`relay_amp.op_registry.selecting_callees`).
    """

    low: str
    policy: Policy
    target_rule: object
    settings: object
    calibration: object
    callee_kinds: dict
    dtype_of: object
    constants: object
    selecting_callees: frozenset = frozenset()

    def constant_check(self, const) -> float | None:
        """A value of the float32 ``const`` the low dtype cannot hold, or None."""
        return self.constants.out_of_range(const)


class Scope:
    """The bindings of one function as every stage reads them.

    Each FFI access returns a new Python wrapper, and a dict lookup with a wrapper that is not
    the stored key falls back to a Python ``__eq__``; every var is therefore looked up through
    one canonical wrapper per object (:meth:`canonical`), so the lookups hit by identity.

    Parameters
    ----------
    low : str
        The low-precision dtype.
    params_low : set
        The parameters the signature makes low precision (or feeds as integers).
    dtype_of : relay_amp.relax_utils.DtypeCache
        The dtype of an expression, cached.
    int_inputs : dict
        Original float32 parameter -> the integer dtype it is fed in (``input_dtypes``).
    """

    def __init__(self, low: str, params_low, dtype_of, int_inputs=None):
        self.low = low
        self.params_low = params_low
        self.dtype_of = dtype_of
        self.int_inputs = int_inputs or {}
        self.bound: dict = {}  # var -> the value bound to it
        self.call_args: dict = {}  # op call binding var -> [(argument, its leaves)]
        self.ops: dict = {}  # op call binding var -> the op's name (read once: two FFI calls)
        self._canonical: dict = {}
        self._sequences: dict = {}
        self._blocks: dict = {}

    def read(self, seq: SeqExpr) -> Scope:
        """Index the bindings of ``seq`` and of its If branches (values and call arguments)."""
        for _, var, value in self.bindings(seq):
            self.bound[var] = value
            op = op_name(value) if type(value) is Call else None
            if op is not None:
                self.ops[var] = op
                # a slice reads the array without __iter__'s per-item index checks
                self.call_args[var] = [(self.canonical(arg), self.leaves(arg))
                                       for arg in value.args[:]]
            elif type(value) is If:
                self.read(value.true_branch)
                self.read(value.false_branch)
        return self

    def canonical(self, var):
        """The one wrapper the stages use for ``var`` (a Var; anything else is returned)."""
        if type(var) not in VAR_TYPES:
            return var
        return self._canonical.setdefault(var.__chandle__(), var)

    def leaves(self, arg) -> list:
        """``leaves_of(arg)`` with canonical vars."""
        return [self.canonical(leaf) for leaf in leaves_of(arg)]

    def bindings(self, seq: SeqExpr) -> list:
        """(binding, canonical var, value) of ``seq``, extracted once."""
        key = seq.__chandle__()
        entry = self._sequences.get(key)
        if entry is None:
            items = []
            for block in seq.blocks:
                items += self.block_bindings(block)
            entry = self._sequences[key] = (seq, items)
        return entry[1]

    def block_bindings(self, block) -> list:
        """(binding, canonical var, value) of one block of a sequence, extracted once (each
        element of a TVM array crosses the FFI when it is read)."""
        entry = self._blocks.get(block.__chandle__())
        if entry is None:
            items = [(binding, self.canonical(binding.var), binding.value)
                     for binding in block.bindings[:]]
            entry = self._blocks[block.__chandle__()] = (block, items)
        return entry[1]

    def orig_dtype(self, var) -> str | None:
        """The dtype ``var`` has in the function as the signature gives it."""
        if var in self.params_low:
            return self.low
        return self.dtype_of(var)

    def site(self, call, mode: Mode, demand, can_low: bool, f32_ready: bool) -> OpSite:
        """The view of one binding's call that an op hook gets (:class:`OpSite`)."""
        return OpSite(call, self.low, mode, frozenset(demand), can_low, f32_ready,
                      lambda expr: self.bound.get(self.canonical(expr)),
                      lambda expr: self.int_inputs.get(self.canonical(expr)))

    def float_leaves(self, var) -> list:
        """(leaf, dtype) of the float tensor leaves of the arguments of ``var``'s call."""
        found = []
        for _, arg_leaves in self.call_args[var]:
            for leaf in arg_leaves:
                dtype = self.dtype_of(leaf)
                if is_floating(dtype):
                    found.append((leaf, dtype))
        return found


@dataclass(frozen=True)
class BindingPlan:
    """The decision for one call binding, as the rewrite carries it out.

    Attributes
    ----------
    op, name : str
        The op and the binding's name.
    decision : relay_amp.policy.Decision
        What the policy decided.
    category : Category, optional
        The category the binding computes in (float32 where an operand check overruled the
        policy); None: unknown op.
    reasons : tuple of Reason
        Why, in the order the stages found them.
    mode : Mode
        What the rewrite does with the operands.
    accumulation : str, optional
        The dtype a dot product accumulates in.
    mixed : bool
        One kernel reads low precision and computes in float32 registers (``mixed_kernels``).
    source : Expr, optional
        What an identity binding becomes.
    float_output : bool
        The call has a float result.
    constant_inputs : bool
        Every float input of the call is a constant.
    """

    op: str
    name: str
    decision: Decision
    category: Category | None
    reasons: tuple
    mode: Mode
    accumulation: str | None
    mixed: bool
    source: object = None
    float_output: bool = True
    constant_inputs: bool = False

    def adding(self, reason: Reason, **changes) -> BindingPlan:
        """This plan with one more reason (and ``changes``), for the report row."""
        return dataclasses.replace(self, reasons=(*self.reasons, reason), **changes)


@dataclass(frozen=True)
class FunctionPlan:
    """What steps 1-2 hand to the rewrite of one function; the rewrite reads it, never writes.

    Attributes
    ----------
    scope : Scope
        The bindings, their canonical vars and call arguments.
    plans : Mapping
        Call binding var -> its :class:`BindingPlan`.
    demand : Mapping
        Var -> the dtypes its consumers want (step 2).
    item_demand : Mapping
        (tuple var, index) -> the dtypes wanted of that field.
    kernels : relay_amp.kernel_plan.KernelPlan, optional
        The kernel boundaries (step 1b); None without ``low_precision_boundaries``.
    can_low, f32_ready : Mapping
        Step 1's view of each value (what an op hook reads).
    result_type : relax.Type, optional
        The result type where a low-precision signature keeps some result leaves float32.
    kept : tuple of relay_amp.signature.KeptBoundary
        Those leaves.
    nested : Mapping
        Var bound to a nested function -> its :class:`NestedFunction` (signature and plan),
        planned with this one, in the same context.
    """

    scope: Scope
    plans: MappingProxyType
    demand: MappingProxyType
    item_demand: MappingProxyType
    kernels: object
    can_low: MappingProxyType
    f32_ready: MappingProxyType
    result_type: object = None
    kept: tuple = ()
    nested: MappingProxyType = dataclasses.field(default_factory=lambda: MappingProxyType({}))

    @property
    def canonical(self):
        return self.scope.canonical

    @property
    def call_args(self) -> dict:
        return self.scope.call_args

    @property
    def boundaries(self) -> bool:
        return self.kernels is not None

    @property
    def absorbed(self) -> dict:
        """Residual add -> the centring kernel that computes it."""
        return self.kernels.absorbed if self.kernels is not None else {}

    @property
    def low_values(self):
        """Float32 values the rewrite computes in low precision."""
        return self.kernels.low_values if self.kernels is not None else frozenset()

    @property
    def residuals(self):
        """Float32 values kept float32 between kernels."""
        return self.kernels.residuals if self.kernels is not None else frozenset()

    def boundary_read(self, value, consumer) -> bool:
        return self.kernels is not None and self.kernels.boundary_read(value, consumer)

    def rounds_in_reader(self, value, consumer) -> bool:
        return self.kernels is not None and self.kernels.rounds_in_reader(value, consumer)

    def read_in_float32(self, param) -> bool:
        """With kernel boundaries: does every reader of ``param`` compute float32 from it, in
        a call this pass plans (so none reads it in low precision)?"""
        if self.kernels is None:
            return False
        uses = self.kernels.uses.get(self.canonical(param))
        if not uses or None in uses:
            return False
        for var in set(uses):
            plan = self.plans.get(var)
            if (plan is None or plan.category is None or plan.mode != Mode.ORIGINAL
                    or plan.mixed or op_info(plan.op).integer_side
                    or self.scope.dtype_of(var) != "float32"):
                return False
        return True

    def tuple_want(self, var, value):
        """The type a tuple binding is built in: a field in low precision where it is wanted
        so."""
        low, fields = self.scope.low, []
        for index, field in enumerate(value.fields):
            wanted = self.demand.get(var, set()) | self.item_demand.get((var, index), set())
            fields.append(lowered_type(field.ty, low) if low in wanted else field.ty)
        return TupleType(fields)

    def site(self, var, call, mode: Mode) -> OpSite:
        """The view of ``var``'s (emitted) call that an op hook gets in step 3."""
        return self.scope.site(call, mode, self.demand.get(var, ()),
                               self.can_low.get(var, False), self.f32_ready.get(var, False))

    def kept_boundaries(self, signature):
        """``(function name, KeptBoundary)`` of every parameter and result kept float32 at the
        signature of this function (``signature``) and of its nested functions."""
        found = [(signature.name, kept) for kept in (*signature.kept, *self.kept)]
        for inner in self.nested.values():
            found += inner.plan.kept_boundaries(inner.signature)
        return found

    @staticmethod
    def build(scope: Scope, decisions, kernels, demand, kept=(), nested=None) -> FunctionPlan:
        """The plan from the three stages' outputs: each binding's decision (step 1) with the
        mode and reasons the kernel plan (step 1b) and demand (step 2) gave it."""
        fixed = kernels.modes if kernels is not None else {}
        added = kernels.reasons if kernels is not None else {}
        plans = {}
        for var, decided in decisions.plans.items():
            mode = demand.modes.get(var) or fixed.get(var)
            accumulation = demand.accumulation.get(var)
            reasons = added.get(var, ()) + demand.reasons.get(var, ())
            if mode is None and accumulation is None and not reasons:
                plans[var] = decided
                continue
            plans[var] = BindingPlan(  # the constructor: dataclasses.replace costs twice it
                decided.op, decided.name, decided.decision, decided.category,
                decided.reasons + reasons, mode or decided.mode, accumulation, decided.mixed,
                decided.source, decided.float_output, decided.constant_inputs)
        return FunctionPlan(
            scope, MappingProxyType(plans), demand.demand, demand.item_demand, kernels,
            decisions.can_low, decisions.f32_ready, decisions.result_type, kept,
            MappingProxyType(dict(nested or {})))


class NestedFunction(NamedTuple):
    """A nested function's signature (:class:`relay_amp.signature.Signature`) and
    :class:`FunctionPlan`, part of the enclosing function's plan."""

    signature: object
    plan: FunctionPlan


def range_words(value: float, low: str) -> str:
    """How ``value`` misses the range of ``low``, for a reason's text."""
    if abs(value) > max_finite(low):
        return f"exceeds {low} max {max_finite(low):.6g}"
    return f"underflows to zero in {low}"


__all__ = ["Context", "Scope", "BindingPlan", "FunctionPlan", "NestedFunction", "range_words"]
