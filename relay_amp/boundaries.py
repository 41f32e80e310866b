"""Step 1b of the algorithm (stated in :mod:`relay_amp.rewriter`): kernel boundaries. Which
values FuseOps keeps in one kernel's registers, which cross a boundary and are stored in low
precision, and the mode of each follow op, chosen forward from how its inputs arrive."""

from __future__ import annotations

from tvm import relax
from tvm.ir import Call
from tvm.relax import (
    DataflowVar,
    SeqExpr,
)

from .op_hooks import hooks_of
from .op_tables import (
    CENTRING_OPS,
    EXACT_OPS,
    FUSION_KINDS,
    RANKING_OPS,
    Category,
    FusionKind,
    fuses,
)
from .plan import STORING_KINDS, Mode, Plan
from .reasons import Reason
from .relax_utils import (
    GenericConst,
    is_var,
)


class BoundaryPlanner:
    """Step 1b of :class:`relay_amp.planner.FunctionPlanner` (whose state it reads)."""

    def plan_boundaries(self, seq: SeqExpr, low_results: bool = False):
        """Kernel boundaries (``low_precision_boundaries``): which values stay in one kernel's
        registers, which cross a boundary and are stored in low precision, and the mode of each
        follow op, chosen forward from how its inputs arrive. A value the function returns in
        float32 (unless ``low_results``) is never stored in low precision for another reader:
        that would round the result."""
        items = self.bindings(seq)
        results = set() if low_results else self._result_vars(seq.body)
        uses = self.uses
        for _, var, value in items:
            if type(value) is Call and var in self.call_args:
                for _, leaves in self.call_args[var]:
                    for leaf in leaves:
                        if is_var(leaf):
                            uses.setdefault(leaf, []).append(var)
            else:
                for free in relax.analysis.free_vars(value):
                    uses.setdefault(self.canonical(free), []).append(None)
        for free in relax.analysis.free_vars(seq.body):
            uses.setdefault(self.canonical(free), []).append(None)
        self._plan_absorbed_adds(items)
        for _, var, value in items:
            plan = self.plans.get(var)
            if plan is None:
                continue
            if var in self.absorbed:
                self.group_kind[var] = FusionKind.OPAQUE  # inside its normalization's kernel
            elif all(type(leaf) is GenericConst or leaf in self.folded
                   for _, leaves in self.call_args[var] for leaf in leaves
                   if is_var(leaf) or type(leaf) is GenericConst):
                self.folded.add(var)  # FoldConstant computes it at build time: no kernel
            else:
                self._fuse_inputs(var, plan)
        for _, var, value in items:
            plan = self.plans.get(var)
            if plan is None or var in self.folded or var in self.absorbed:
                continue
            if (plan.category == Category.FOLLOW and plan.mode == Mode.ORIGINAL
                    and not hooks_of(plan.op).integer_side and plan.float_output
                    and not plan.constant_inputs):
                self._boundary_follow_mode(var, plan)
            if (self.dtype_of(var) == "float32" and self.can_low.get(var, False)
                    and var not in self.hot and var not in results
                    and self.group_kind[var] in STORING_KINDS
                    and any(c is not None and (var, c) not in self.fused and self._reads_stored(c)
                            for c in uses.get(var, ()))
                    and not self._keeps_residual(var, plan)
                    and not self._ranked(var, plan)):
                self.stored_low.add(var)
            if self._computes_low(var, plan):
                self.low_values.add(var)

    def _keeps_residual(self, var, plan: Plan) -> bool:
        """A residual stream keeps float32 between kernels (unless ``low_precision_residuals``):
        a value computed in float32 registers that an elementwise op in another kernel adds to
        in float32, or that a normalization in another kernel centres (:data:`CENTRING_OPS`).
        Stored in low precision it would be rounded once more per block, on the path that
        carries the sum through the network (in a post-norm transformer, the normalization's
        input and result are that path)."""
        if self.settings.low_precision_residuals:
            return False
        for consumer in self.uses.get(var, ()):
            other = self.plans.get(consumer)
            if consumer is None or other is None or (var, consumer) in self.fused:
                continue
            if consumer in self.absorbed and self._is_branch_of(var, consumer):
                continue  # stored low; the sum is formed in float32 in the normalization
            if (other.category == Category.FOLLOW and other.op not in EXACT_OPS
                    and FUSION_KINDS.get(other.op) == FusionKind.ELEMWISE):
                plan.reasons.append(Reason.of("residual_added", consumer=consumer.name))
            elif other.mixed and other.op in CENTRING_OPS and not plan.mixed:
                plan.reasons.append(Reason.of("residual_centred", consumer=consumer.name,
                                              op=other.op))
            else:
                continue
            self.residuals.add(var)
            return True
        return False

    def _ranked(self, var, plan: Plan) -> bool:
        """A value a ranking op (:data:`RANKING_OPS`) reads, directly or through exact follow ops,
        keeps float32 between kernels."""
        seen, stack = {var}, [var]
        while stack:
            for consumer in self.uses.get(stack.pop(), ()):
                other = self.plans.get(consumer)
                if other is None or consumer in seen:
                    continue
                if other.op in RANKING_OPS:
                    plan.reasons.append(Reason.of("ranked", consumer=consumer.name, op=other.op))
                    return True
                if other.category == Category.FOLLOW and other.op in EXACT_OPS:
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
                var = self.canonical(item)
                if var not in found:
                    found.add(var)
                    bound = self.bound.get(var)
                    if type(bound) is relax.Tuple or is_var(bound):
                        stack.append(bound)
        return found

    def _plan_absorbed_adds(self, items):
        """A centring normalization computes the residual add that feeds it in its own kernel
        (float32 registers): the sum, which in a post-norm transformer is the residual
        stream, then never crosses a kernel boundary, and the branch result it adds (a dot
        product's) crosses one in low precision."""
        if self.settings.low_precision_residuals:
            return
        for _, var, _ in items:
            plan = self.plans.get(var)
            if plan is None or not plan.mixed or plan.op not in CENTRING_OPS:
                continue
            source = self.call_args[var][0][0]
            producer = self.plans.get(source)
            if (producer is not None and producer.op == "add"
                    and producer.category == Category.FOLLOW and producer.mode == Mode.ORIGINAL
                    and type(source) is DataflowVar and self.uses.get(source) == [var]
                    and self.dtype_of(source) == "float32"
                    and all(is_var(arg) and len(leaves) == 1
                            for arg, leaves in self.call_args[source])):
                self.absorbed[source] = var
                producer.reasons.append(Reason.of("absorbed_add", kernel=var.name, op=plan.op))

    def _is_branch_of(self, var, add) -> bool:
        """Is ``var`` the branch operand of the absorbed residual ``add`` (its other operand
        is the stream: a residual already, or a parameter)?"""
        others = [arg for arg, _ in self.call_args[add] if arg is not var]
        return bool(others) and all(o in self.residuals or o not in self.plans for o in others)

    def _fuse_inputs(self, var, plan: Plan):
        kind = FusionKind.ANCHOR if plan.mixed else FUSION_KINDS.get(plan.op, FusionKind.OPAQUE)
        candidates = []
        for _, leaves in self.call_args[var]:
            for leaf in leaves:
                if (is_var(leaf) and leaf in self.group_kind and self.uses.get(leaf) == [var]
                        and fuses(self.group_kind[leaf], kind)):
                    candidates.append((leaf, self.group_kind[leaf]))
        # FuseOps puts at most one anchor kernel in a group: the first one reached
        anchor = next((leaf for leaf, k in candidates if k == FusionKind.ANCHOR), None)
        group = kind
        for leaf, producer in candidates:
            if anchor is not None and (producer == FusionKind.INJECTIVE or (
                    producer == FusionKind.ANCHOR and leaf is not anchor)):
                continue
            self.fused.add((leaf, var))
            if kind == FusionKind.ELEMWISE and producer in (FusionKind.ANCHOR,
                                                            FusionKind.INJECTIVE):
                group = FusionKind.ANCHOR if anchor is not None else producer
        self.group_kind[var] = group

    def _reads_stored(self, consumer) -> bool:
        """Float32 and unknown ops read the float32 value the policy protects for them, and an
        exact op that only feeds the function's result or explicit casts (which choose their own
        dtype) is no kernel (a view) worth a cast."""
        plan = self.plans.get(consumer)
        if plan is None or plan.category in (None, Category.FP32):
            return False
        return not (plan.op in EXACT_OPS and all(
            u is None or hooks_of(getattr(self.plans.get(u), "op", None)).is_cast
            for u in self.uses.get(consumer, ())))

    def arrives_low(self, value, consumer) -> bool:
        """Does ``consumer`` read ``value`` in low precision across a kernel boundary?"""
        if (value, consumer) in self.fused:
            return value in self.low_values or self._orig_dtype(value) == self.low
        return (value in self.stored_low or value in self.low_values
                or self._orig_dtype(value) == self.low)

    def _boundary_follow_mode(self, var, plan: Plan):
        plan.mode_fixed = True
        activations = [leaf for leaf, _ in self._float_leaves(var)
                       if is_var(leaf) and leaf not in self.folded]
        if plan.op in EXACT_OPS:
            if activations and self.can_low.get(var, False) and all(
                    self.arrives_low(leaf, var) for leaf in activations):
                plan.mode = Mode.LOW
                plan.reasons.append(Reason.of("exact_arrives_low", dtype=self.low))
            else:
                plan.reasons.append(Reason.of("in_float32_registers"))
            return
        absorbed = [leaf for leaf in activations if self._widening_absorbed(leaf, var)]
        if absorbed and self.can_low.get(var, False):
            plan.mode = Mode.LOW
            plan.reasons.append(Reason.of("arrives_low", dtype=self.low, input=absorbed[0].name))
            return
        self.stored_low.difference_update(absorbed)
        plan.reasons.append(Reason.of("widened_in_kernel"))

    def _widening_absorbed(self, value, consumer) -> bool:
        """A value read only by ``consumer`` across a kernel boundary: a float32 copy made
        for the consumer would join the producer's kernel (FuseOps extends a kernel through a
        chain of single-use casts), so the consumer must read the stored copy as it is."""
        return value in self.stored_low and self.uses.get(value) == [consumer] and (
            value, consumer) not in self.fused

    def _computes_low(self, var, plan: Plan) -> bool:
        """Will the rewrite compute this float32 value in low precision?"""
        if self.dtype_of(var) != "float32":
            return False
        if plan.mixed:
            return var in self.stored_low
        if plan.category == Category.LOW_PRECISION:
            return True
        if plan.category == Category.LOW_PRECISION_FP32_ACCUMULATE:
            return plan.decision.accumulation_dtype != "float32"
        return plan.mode == Mode.LOW

    def boundary_read(self, value, consumer) -> bool:
        """Does ``consumer`` read the low-precision copy of ``value`` that is stored between
        kernels (widening it in its own kernel where it computes float32)?"""
        return (value in self.stored_low and (value, consumer) not in self.fused
                and self._reads_stored(consumer))

    def read_in_float32(self, param) -> bool:
        """With kernel boundaries: does every reader of ``param`` compute float32 from it, in
        a call this pass plans (so none reads it in low precision)?"""
        uses = self.uses.get(self.canonical(param))
        if not uses or None in uses:
            return False
        for var in set(uses):
            plan = self.plans.get(var)
            if (plan is None or plan.category is None or plan.mode != Mode.ORIGINAL
                    or plan.mixed or hooks_of(plan.op).integer_side
                    or self.dtype_of(var) != "float32"):
                return False
        return True
