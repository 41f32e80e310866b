"""Step 1b of the algorithm (stated in :mod:`relay_amp.transform`): kernel boundaries. Which
values FuseOps keeps in one kernel's registers, which cross a boundary and are stored in low
precision (:class:`KernelPlan`), and the mode of each follow op, chosen forward from how its
inputs arrive."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from types import MappingProxyType

from tvm import relax
from tvm.ir import Call
from tvm.relax import (
    DataflowVar,
    SeqExpr,
    TupleGetItem,
)

from .kinds import STORING_KINDS, Category, FusionKind, Mode
from .op_registry import fuses, fusion_kind, op_info, widens_in_own_kernel
from .plan import Scope
from .reasons import Reason
from .relax_utils import (
    GenericConst,
    float32_bytes,
    is_var,
)
from .targets import UNCENTRED, KernelSettings

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
    """Step 1b for one function: :meth:`plan` returns its :class:`KernelPlan`, frozen, with the
    mode of each follow op whose mode follows from how its inputs arrive.

    Parameters
    ----------
    scope : Scope
        The function's bindings.
    decisions : relay_amp.decide.Decisions
        Step 1's output.
    settings : KernelSettings
        The target's kernel settings (``low_precision_residuals``, ``result_budget``).
    callee_kinds : dict
        PrimFunc name -> the FusionKind of a ``call_tir`` of it.
    """

    def __init__(self, scope: Scope, decisions, settings: KernelSettings, callee_kinds=None):
        self.scope, self.decisions = scope, decisions
        self.out = KernelPlan(scope, decisions)
        self.residual_mode = settings.low_precision_residuals
        self.result_budget = settings.result_budget
        self.callee_kinds = callee_kinds or {}
        self.kernel_root: dict = {}  # var -> a later binding of its kernel (itself: the last)
        self.uncentred_streams: dict = {}  # residual stream stored low -> an op adding to it

    def _reason(self, var, reason: Reason):
        self.out.reasons.setdefault(var, []).append(reason)

    def plan(self, seq: SeqExpr, low_results: bool = False) -> KernelPlan:
        """Kernel boundaries (``low_precision_boundaries``): which values stay in one kernel's
        registers, which cross a boundary and are stored in low precision, and the mode of each
        follow op, chosen forward from how its inputs arrive. A value the function returns in
        float32 (unless ``low_results``) is never stored in low precision for another reader:
        that would round the result."""
        items = self.scope.bindings(seq)
        results = set() if low_results else self._result_vars(seq.body)
        uses = self.out.uses
        for _, var, value in items:
            if type(value) is Call and var in self.scope.call_args:
                for _, leaves in self.scope.call_args[var]:
                    for leaf in leaves:
                        if is_var(leaf):
                            uses.setdefault(leaf, []).append(var)
            elif type(value) is TupleGetItem and is_var(value.tuple_value):
                source = self.scope.canonical(value.tuple_value)
                self.out.tuple_items.setdefault(source, []).append(var)
            else:
                for free in relax.analysis.free_vars(value):
                    uses.setdefault(self.scope.canonical(free), []).append(None)
        for free in relax.analysis.free_vars(seq.body):
            uses.setdefault(self.scope.canonical(free), []).append(None)
        self._plan_absorbed_adds(items)
        for _, var, _ in items:
            plan = self.decisions.plans.get(var)
            if plan is None:
                continue
            if var in self.out.absorbed:
                self.out.group_kind[var] = FusionKind.OPAQUE  # inside its normalization's kernel
            elif var not in self.decisions.folded:
                self._fuse_inputs(var, plan)
        feeders = {} if low_results else self.result_feeders(items, results)
        for _, var, _ in items:
            plan = self.decisions.plans.get(var)
            if plan is None or var in self.decisions.folded or var in self.out.absorbed:
                continue
            if (plan.category == Category.FOLLOW and plan.mode == Mode.ORIGINAL
                    and not op_info(plan.op).integer_side and plan.float_output
                    and not plan.constant_inputs):
                self._boundary_follow_mode(var, plan)
            if (self.scope.dtype_of(var) == "float32" and self.decisions.can_low.get(var, False)
                    and var not in self.decisions.hot and var not in results
                    and self.out.group_kind[var] in STORING_KINDS
                    and self.out.all_read_stored(var)
                    and not self._keeps_residual(var, plan)
                    and not self._ranked(var, plan)):
                if var in feeders:
                    self._reason(var, feeders[var])
                    continue
                self.out.stored_low.add(var)
                if var in self.uncentred_streams:
                    self._reason(var, Reason.of(
                        "residual_low", consumer=self.uncentred_streams[var].name,
                        dtype=self.scope.low))
            if self._computes_low(var, plan):
                self.out.low_values.add(var)
        self._explain_stored_reads(items)
        return self.out.frozen()

    def _explain_stored_reads(self, items):
        """The reason of each importer's kernel that reads a stored low-precision value."""
        for _, var, _ in items:
            if var not in self.out.widening_callees:
                continue
            for leaf, _ in self.scope.float_leaves(var):
                if is_var(leaf) and self.out.boundary_read(leaf, var):
                    self._reason(var, Reason.of("reads_stored_low", input=leaf.name,
                                                dtype=self.scope.low))

    def result_feeders(self, items, results) -> dict:
        """The values that keep float32 between kernels because they feed a function result:
        each value a result is computed from through elementwise and data-movement follow ops
        (a sigmoid, a reshape, a concatenation), smallest first, while the bytes that keeping
        them float32 adds stay within the policy's ``result_budget`` of the function's
        float32 bytes at kernel boundaries. Returns var -> its reason."""
        plans, found, stack = self.decisions.plans, {}, list(results)
        seen = set(stack)
        while stack:
            var = stack.pop()
            plan = plans.get(var)
            if plan is None:
                continue
            if var not in results:
                found[var] = self._saving(var)
            kind = fusion_kind(plan.op, self.scope.bound[var], self.callee_kinds)
            if plan.category == Category.FOLLOW and kind in (FusionKind.ELEMWISE,
                                                             FusionKind.INJECTIVE):
                for leaf, _ in self.scope.float_leaves(var):
                    if is_var(leaf) and leaf not in seen:
                        seen.add(leaf)
                        stack.append(leaf)
        if not any(found.values()):
            return {}
        traffic = self._boundary_traffic(items, results)
        share = self.result_budget
        budget, spent, kept = share * traffic, 0, {}
        for var, saving in sorted(found.items(), key=lambda item: item[1]):
            if saving == 0 or spent + saving > budget:
                break
            spent += saving
            kept[var] = Reason.of("feeds_result", dtype=self.scope.low, saving=saving,
                                  share=saving / traffic, budget=share)
        return kept

    def _crossing(self, var) -> list:
        return [c for c in self.out.uses.get(var, ()) if (var, c) not in self.out.fused]

    def _saving(self, var) -> int:
        """Bytes a low-precision copy of float32 ``var`` saves: half its writes and reads."""
        crossing = self._crossing(var)
        return float32_bytes(var) // 2 * (1 + len(crossing)) if crossing else 0

    def _boundary_traffic(self, items, results) -> int:
        """The function's bytes at kernel boundaries with every value float32: each value a
        kernel writes for another kernel or as a result, once written and once per kernel that
        reads it, and each constant and parameter once per reading op."""
        plans, total = self.decisions.plans, 0
        for _, var, _ in items:
            if var not in self.scope.call_args or var in self.decisions.folded:
                continue
            crossing = self._crossing(var)
            if crossing or var in results:
                total += float32_bytes(var) * (1 + len(crossing))
            for _, leaves in self.scope.call_args[var]:
                total += sum(float32_bytes(leaf) for leaf in leaves
                             if type(leaf) is GenericConst or (is_var(leaf)
                                                                and leaf not in plans))
        return total

    def _keeps_residual(self, var, plan) -> bool:
        """A residual stream keeps float32 between kernels: a value computed in float32
        registers that a normalization in another kernel centres (:attr:`OpInfo.centring`), or that
        an elementwise op in another kernel adds to in float32 where a normalization centres the
        sum (``low_precision_residuals`` :data:`~relay_amp.targets.UNCENTRED`, the GPU default;
        with it False every stream an op adds to keeps float32, with True none does). Rounded,
        the digits that survive the subtraction of the mean are those low precision lacks (in a
        post-norm transformer, the normalization's input and result are that stream). A stream
        that is only added to is stored in low precision and added in float32 registers: one
        rounding per block, where TVM's built-in pass rounds every op."""
        mode = self.residual_mode
        if mode is True:
            return False
        for consumer in self.out.uses.get(var, ()):
            other = self.decisions.plans.get(consumer)
            if consumer is None or other is None or (var, consumer) in self.out.fused:
                continue
            if consumer in self.out.absorbed and self._is_branch_of(var, consumer):
                continue  # stored low; the sum is formed in float32 in the normalization
            record = op_info(other.op)
            if (other.category == Category.FOLLOW and not record.exact
                    and record.fusion == FusionKind.ELEMWISE):
                if mode == UNCENTRED and not self._centred(consumer):
                    self.uncentred_streams.setdefault(var, consumer)
                    continue
                self._reason(var, Reason.of("residual_added", consumer=consumer.name))
            elif other.mixed and record.centring and not plan.mixed:
                self._reason(var, Reason.of("residual_centred", consumer=consumer.name,
                                            op=other.op))
            else:
                continue
            self.out.residuals.add(var)
            return True
        return False

    def _centred(self, value) -> bool:
        """Does a normalization centre ``value`` (a residual add: formed in its kernel, or read
        by it)?"""
        if value in self.out.absorbed:
            return True
        plans = self.decisions.plans
        return any(c is not None and c in plans and op_info(plans[c].op).centring
                   for c in self.out.uses.get(value, ()))

    def _ranked(self, var, plan) -> bool:
        """A value a ranking op (:attr:`OpInfo.ranking`) reads, directly or through exact
        follow ops, keeps float32 between kernels."""
        seen, stack = {var}, [var]
        while stack:
            for consumer in self.out.uses.get(stack.pop(), ()):
                other = self.decisions.plans.get(consumer)
                if other is None or consumer in seen:
                    continue
                if op_info(other.op).ranking:
                    self._reason(var, Reason.of("ranked", consumer=consumer.name, op=other.op))
                    return True
                if other.category == Category.FOLLOW and op_info(other.op).exact:
                    seen.add(consumer)
                    stack.append(consumer)
        return False

    def _result_vars(self, expr) -> set:
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

    def _plan_absorbed_adds(self, items):
        """A centring normalization computes the residual add that feeds it in its own kernel
        (float32 registers): the sum, which in a post-norm transformer is the residual
        stream, then never crosses a kernel boundary, and the branch result it adds (a dot
        product's) crosses one in low precision."""
        if self.residual_mode is True:
            return
        for _, var, _ in items:
            plan = self.decisions.plans.get(var)
            if plan is None or not plan.mixed or not op_info(plan.op).centring:
                continue
            source = self.scope.call_args[var][0][0]
            producer = self.decisions.plans.get(source)
            if (producer is not None and op_info(producer.op).residual_add
                    and producer.category == Category.FOLLOW and producer.mode == Mode.ORIGINAL
                    and type(source) is DataflowVar and self.out.uses.get(source) == [var]
                    and self.scope.dtype_of(source) == "float32"
                    and all(is_var(arg) and len(leaves) == 1
                            for arg, leaves in self.scope.call_args[source])):
                self.out.absorbed[source] = var
                self._reason(source, Reason.of("absorbed_add", kernel=var.name, op=plan.op))

    def _is_branch_of(self, var, add) -> bool:
        """Is ``var`` the branch operand of the absorbed residual ``add`` (its other operand
        is the stream: a residual already, or a parameter)?"""
        others = [arg for arg, _ in self.scope.call_args[add] if arg is not var]
        return bool(others) and all(o in self.out.residuals or o not in self.decisions.plans
                                    for o in others)

    def _fuse_inputs(self, var, plan):
        """Which inputs FuseOps puts in ``var``'s kernel: a producer whose every reader is
        ``var`` or already in ``var``'s kernel (a chain, or a diamond that re-converges at
        ``var``, as SiLU's ``x * sigmoid(x)``) where the kinds allow it, and at most one anchor
        (the first reached)."""
        kind = (FusionKind.ANCHOR if plan.mixed
                else fusion_kind(plan.op, self.scope.bound[var], self.callee_kinds))
        if widens_in_own_kernel(plan.op, kind):
            self.out.widening_callees.add(var)
        self.kernel_root[var] = var
        single, shared = [], []
        for _, leaves in self.scope.call_args[var]:
            for leaf in leaves:
                if (not is_var(leaf) or leaf not in self.out.group_kind or leaf in single
                        or leaf in shared or not fuses(self.out.group_kind[leaf], kind)):
                    continue
                readers = set(self.out.uses.get(leaf, ()))
                if readers == {var}:
                    single.append(leaf)
                elif None not in readers:
                    shared.append(leaf)
        group = kind
        anchor = next((leaf for leaf in single if self.out.group_kind[leaf] == FusionKind.ANCHOR),
                      None)
        for leaf in single:
            group, anchor = self._join(leaf, [var], var, kind, group, anchor)
        for leaf in shared:
            readers = set(self.out.uses[leaf])
            if all(self._kernel(reader) is var for reader in readers):
                group, anchor = self._join(leaf, readers, var, kind, group, anchor)
        self.out.group_kind[var] = group

    def _join(self, leaf, readers, var, kind, group, anchor):
        """Put ``leaf``'s kernel into ``var``'s (its ``readers`` read it there), unless the
        kernel already has an anchor and ``leaf``'s is another one or injective (FuseOps keeps
        one anchor per kernel and never puts data movement in front of it). Returns the
        kernel's kind and anchor."""
        producer = self.out.group_kind[leaf]
        if anchor is not None and (producer == FusionKind.INJECTIVE or (
                producer == FusionKind.ANCHOR and leaf is not anchor)):
            return group, anchor
        if producer == FusionKind.ANCHOR:
            anchor = leaf
        for reader in readers:
            self.out.fused.add((leaf, reader))
        self.kernel_root[leaf] = var
        if kind == FusionKind.ELEMWISE and producer in (FusionKind.ANCHOR, FusionKind.INJECTIVE):
            group = FusionKind.ANCHOR if anchor is not None else producer
        return group, anchor

    def _kernel(self, var):
        """The last binding of the kernel ``var`` is in (so far)."""
        while self.kernel_root.get(var, var) is not var:
            var = self.kernel_root[var]
        return var

    def _boundary_follow_mode(self, var, plan):
        modes = self.out.modes
        modes[var] = Mode.ORIGINAL
        activations = [leaf for leaf, _ in self.scope.float_leaves(var)
                       if is_var(leaf) and leaf not in self.decisions.folded]
        if op_info(plan.op).exact:
            if activations and self.decisions.can_low.get(var, False) and all(
                    self.out.arrives_low(leaf, var) for leaf in activations):
                modes[var] = Mode.LOW
                self._reason(var, Reason.of("exact_arrives_low", dtype=self.scope.low))
            else:
                self._reason(var, Reason.of("in_float32_registers"))
            return
        absorbed = [leaf for leaf in activations if self._widening_absorbed(leaf, var)]
        if absorbed and self.decisions.can_low.get(var, False):
            modes[var] = Mode.LOW
            self._reason(var, Reason.of("arrives_low", dtype=self.scope.low,
                                        input=absorbed[0].name))
            return
        self.out.stored_low.difference_update(absorbed)
        self._reason(var, Reason.of("widened_in_kernel"))

    def _widening_absorbed(self, value, consumer) -> bool:
        """A value read only by ``consumer`` across a kernel boundary: a float32 copy made
        for the consumer would join the producer's kernel (FuseOps extends a kernel through a
        chain of single-use casts), so the consumer must read the stored copy as it is."""
        return value in self.out.stored_low and self.out.uses.get(value) == [consumer] and (
            value, consumer) not in self.out.fused

    def _computes_low(self, var, plan) -> bool:
        """Will the rewrite compute this float32 value in low precision?"""
        if self.scope.dtype_of(var) != "float32":
            return False
        if plan.mixed:
            return var in self.out.stored_low
        if plan.category == Category.LOW_PRECISION:
            return True
        if plan.category == Category.LOW_PRECISION_FP32_ACCUMULATE:
            return plan.decision.accumulation_dtype != "float32"
        return self.out.mode_of(var) == Mode.LOW
