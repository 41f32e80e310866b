"""Step 1b of the algorithm (stated in :mod:`relay_amp.transform`): kernel boundaries. Which
values FuseOps keeps in one kernel's registers (:mod:`relay_amp.fusion_groups`), which cross a
boundary and are stored in low precision, and the mode of each follow op, chosen forward from
how its inputs arrive (:mod:`relay_amp.kernel_rules`): :class:`KernelPlanner` runs the two,
:class:`KernelPlan` is what they hand on."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from types import MappingProxyType

from tvm import relax
from tvm.relax import DataflowVar, SeqExpr, TupleGetItem

from .fusion_groups import FusionGroups
from .kernel_rules import (
    ComputesLow,
    CrossesBoundary,
    FeedsResult,
    FollowOpMode,
    Ranked,
    ReadsStoredLow,
    ResidualStreams,
    Site,
    StoredLow,
)
from .kinds import STORING_KINDS, Category, Mode
from .op_registry import op_info
from .plan import Scope
from .reasons import Reason
from .relax_utils import is_var
from .targets import KernelSettings

#: A float32 value read by more dot products than this, each rounding it in its own kernel,
#: moves more bytes than one cast kernel and low-precision reads (4k > 4 + 2 + 2k for k > 3).
MAX_ROUNDING_READERS = 3


@dataclass(frozen=True)
class KernelPlan:
    """What step 1b hands on: how FuseOps will group the function's bindings into kernels and
    which values cross a kernel boundary in low precision; its methods answer the questions
    step 2 and the rewrite ask of it.

    Attributes
    ----------
    scope : Scope
        The function's bindings.
    decisions : relay_amp.decide.Decisions
        Step 1's output.
    uses : dict
        Var -> its consumers (a call binding's var, or None for any other use).
    tuple_items : dict
        Tuple var -> the vars bound to its items.
    fused : set
        (value, consumer) edges that stay inside one kernel.
    group_kind : dict
        Var -> the FusionKind of the kernel that computes it.
    stored_low : set
        Float32 values stored in low precision between kernels.
    residuals : set
        Float32 values kept float32 between kernels.
    low_values : set
        Float32 values the rewrite computes in low precision.
    absorbed : dict
        Residual add -> the centring kernel that computes it.
    widening_callees : set
        ``call_tir`` bindings of a PrimFunc (an importer's own kernel, of fixed dtypes) into
        whose kernel FuseOps puts an elementwise producer: a value stored in low precision
        reaches them through a widening cast that runs inside their kernel.
    modes : dict
        Follow op var -> the mode how its inputs arrive gives it (demand leaves it as it is).
    reasons : dict
        Var -> the reasons this step adds to its binding's decision, in order.
    """

    scope: Scope
    decisions: object
    uses: dict = field(default_factory=dict)
    tuple_items: dict = field(default_factory=dict)
    fused: set = field(default_factory=set)
    group_kind: dict = field(default_factory=dict)
    stored_low: set = field(default_factory=set)
    residuals: set = field(default_factory=set)
    low_values: set = field(default_factory=set)
    absorbed: dict = field(default_factory=dict)
    widening_callees: set = field(default_factory=set)
    modes: dict = field(default_factory=dict)
    reasons: dict = field(default_factory=dict)

    @property
    def plans(self):
        return self.decisions.plans

    def add_reason(self, var, reason: Reason):
        """Append ``reason`` to ``var``'s reasons (while the plan is built)."""
        self.reasons.setdefault(var, []).append(reason)

    def mode_of(self, var) -> Mode:
        """``var``'s mode as far as steps 1 and 1b chose it."""
        mode = self.modes.get(var)
        return mode if mode is not None else self.decisions.plans[var].mode

    def frozen(self) -> KernelPlan:
        """This plan with read-only containers, as step 1b hands it on."""
        return dataclasses.replace(
            self, uses=MappingProxyType(self.uses), tuple_items=MappingProxyType(self.tuple_items),
            fused=frozenset(self.fused), group_kind=MappingProxyType(self.group_kind),
            stored_low=frozenset(self.stored_low), residuals=frozenset(self.residuals),
            low_values=frozenset(self.low_values), absorbed=MappingProxyType(self.absorbed),
            widening_callees=frozenset(self.widening_callees), modes=MappingProxyType(self.modes),
            reasons=MappingProxyType({var: tuple(r) for var, r in self.reasons.items()}))

    def arrives_low(self, value, consumer) -> bool:
        """Does ``consumer`` read ``value`` in low precision across a kernel boundary?"""
        bound = self.scope.bound.get(value)
        if type(bound) is TupleGetItem and is_var(bound.tuple_value):  # an item of a split
            producer = self.scope.canonical(bound.tuple_value)
            return producer in self.plans and self.mode_of(producer) == Mode.LOW
        low = self.scope.low
        if (value, consumer) in self.fused:
            return value in self.low_values or self.scope.orig_dtype(value) == low
        return (value in self.stored_low or value in self.low_values
                or self.scope.orig_dtype(value) == low or self.writes_both(value))

    def writes_both(self, value) -> bool:
        """Does the kernel of ``value`` write it in float32 and in low precision (a mixed
        kernel whose result is a residual stream that other kernels also read in low
        precision)?"""
        plan = self.plans.get(value)
        return (plan is not None and plan.mixed and value in self.residuals
                and type(value) is DataflowVar)

    def reads_stored(self, consumer) -> bool:
        """Float32 and unknown ops read the float32 value the policy protects for them, and an
        exact op that only feeds the function's result or explicit casts (which choose their own
        dtype) is no kernel (a view) worth a cast."""
        if consumer in self.widening_callees:
            return True
        plan = self.plans.get(consumer)
        if plan is None or plan.category in (None, Category.FP32):
            return False
        return not (op_info(plan.op).exact and all(
            u is None or op_info(getattr(self.plans.get(u), "op", None)).is_cast
            for u in self.readers(consumer)))

    def all_read_stored(self, var) -> bool:
        """Does every reader of ``var`` in another kernel read a stored low-precision copy (and is
        there one)? A float32 op reading it there would need the float32 value as well, and
        FuseOps puts no cast into a kernel whose result has other readers: the copy would cost
        a kernel of its own."""
        crossing = [c for c in self.uses.get(var, ())
                    if c is not None and (var, c) not in self.fused]
        return bool(crossing) and all(self.reads_stored(c) for c in crossing)

    def readers(self, var) -> list:
        """The uses of ``var``, those through the items of a tuple it is (a ``split``) replaced
        by the items' uses."""
        found = list(self.uses.get(var, ()))
        for item in self.tuple_items.get(var, ()):
            found.extend(self.readers(item))
        return found

    def rounds_in_reader(self, value, consumer) -> bool:
        """Does the dot product ``consumer`` round the float32 ``value`` to low precision in its
        own kernel? It does where no kernel writes a low-precision copy of ``value`` for it to
        read (a function input, a residual stream, the result of a reduction, a gather or a
        kernel whose value also leaves the function), since FuseOps never puts a cast into a dot
        product's kernel nor into a producer that has other readers; unless more than
        :data:`MAX_ROUNDING_READERS` dot products read it that way, when one cast kernel moves
        fewer bytes. Where every reader is such a dot product, the cast ends the producer's own
        kernel instead."""
        if (value, consumer) in self.fused:
            return False
        if (value in self.stored_low or value in self.low_values or self.writes_both(value)
                or self.scope.orig_dtype(value) != "float32" or value in self.decisions.folded):
            return False
        uses = self.uses.get(value, ())
        readers = [c for c in set(uses) if c is not None and (value, c) not in self.fused
                   and self._is_dot_product(c)]
        if (type(value) is DataflowVar and self.group_kind.get(value) in STORING_KINDS
                and len(readers) == len(uses)):
            return False  # only dot products read it: the cast ends its producer's kernel
        return len(readers) <= MAX_ROUNDING_READERS

    def _is_dot_product(self, var) -> bool:
        plan = self.plans.get(var)
        return plan is not None and plan.category == Category.LOW_PRECISION_FP32_ACCUMULATE

    def boundary_read(self, value, consumer) -> bool:
        """Does ``consumer`` read the low-precision copy of ``value`` that is stored between
        kernels (widening it in its own kernel where it computes float32)?"""
        return (value in self.stored_low and (value, consumer) not in self.fused
                and self.reads_stored(consumer))


class KernelPlanner:
    """Step 1b for one function: :meth:`plan` groups its bindings into kernels
    (:class:`~relay_amp.fusion_groups.FusionGroups`), then applies the boundary rules
    (:mod:`relay_amp.kernel_rules`) to each binding in order, and returns its
    :class:`KernelPlan`, frozen.

    Parameters
    ----------
    scope : Scope
        The function's bindings.
    decisions : relay_amp.decide.Decisions
        Step 1's output.
    settings : KernelSettings
        The target's kernel settings (``low_precision_residuals``, and ``result_budget``: the
        policy's ``Policy(result_budget=...)``, resolved).
    callee_kinds : dict
        PrimFunc name -> the FusionKind of a ``call_tir`` of it.
    """

    def __init__(self, scope: Scope, decisions, settings: KernelSettings, callee_kinds=None):
        self.scope, self.decisions = scope, decisions
        self.residual_mode = settings.low_precision_residuals
        self.result_budget = settings.result_budget
        self.callee_kinds = callee_kinds or {}

    def group(self, seq: SeqExpr) -> KernelPlan:
        """The plan of ``seq`` being built, its bindings grouped into kernels."""
        kernels = KernelPlan(self.scope, self.decisions)
        FusionGroups(kernels, self.residual_mode, self.callee_kinds).group(seq)
        return kernels

    def rules(self, kernels: KernelPlan, seq: SeqExpr, low_results: bool = False) -> list:
        """The boundary rules of ``seq`` grouped into ``kernels``, in the order they apply to
        each binding."""
        results = set() if low_results else self.result_vars(seq.body)
        return [FollowOpMode(), CrossesBoundary(results), ResidualStreams(self.residual_mode),
                Ranked(), FeedsResult.measure(kernels, self.scope.bindings(seq), results,
                                              self.result_budget, self.callee_kinds),
                StoredLow(), ComputesLow()]

    def sites(self, kernels: KernelPlan, seq: SeqExpr) -> list[Site]:
        """The bindings of ``seq`` the rules apply to, in order: those with a decision, not
        folded, not a residual add a normalization forms in its kernel."""
        plans, folded = self.decisions.plans, self.decisions.folded
        return [Site(var, plans[var]) for _, var, _ in self.scope.bindings(seq)
                if plans.get(var) is not None and var not in folded
                and var not in kernels.absorbed]

    def plan(self, seq: SeqExpr, low_results: bool = False) -> KernelPlan:
        """Kernel boundaries (``low_precision_boundaries``): which values stay in one kernel's
        registers, which cross a boundary and are stored in low precision, and the mode of each
        follow op, chosen forward from how its inputs arrive. A value the function returns in
        float32 (unless ``low_results``) is never stored in low precision for another reader:
        that would round the result."""
        kernels = self.group(seq)
        rules, sites = self.rules(kernels, seq, low_results), self.sites(kernels, seq)
        for site in sites:
            for rule in rules:
                if rule.apply(kernels, site):
                    break
        explain = ReadsStoredLow()  # after the loop: what each binding reads is settled then
        for site in sites:
            explain.apply(kernels, site)
        return kernels.frozen()

    def result_vars(self, expr) -> set:
        """The vars a function result is made of, through tuples and the vars bound to them."""
        found, stack = set(), [expr]
        while stack:
            item = stack.pop()
            if type(item) is relax.Tuple:
                stack.extend(item.fields)
            elif is_var(item):
                var = self.scope.canonical(item)
                if var not in found:
                    found.add(var)
                    bound = self.scope.bound.get(var)
                    if type(bound) is relax.Tuple or is_var(bound):
                        stack.append(bound)
        return found
