"""The boundary rules of step 1b (:mod:`relay_amp.kernel_plan`), after fusion grouping
(:mod:`relay_amp.fusion_groups`): how each value that crosses a kernel boundary crosses it, and
the mode of each follow op, chosen forward from how its inputs arrive. One small class per
rule, each with one :meth:`BoundaryRule.apply` on one binding, as TVM's dlight schedule rules
(``tvm.s_tir.dlight``); the planner applies them in order to each binding."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from tvm import relax

from .kinds import STORING_KINDS, Category, FusionKind, Mode
from .op_registry import fusion_kind, op_info
from .plan import BindingPlan
from .reasons import Reason
from .relax_utils import GenericConst, float32_bytes, is_var
from .targets import UNCENTRED

if TYPE_CHECKING:
    from .kernel_plan import KernelPlan


@dataclass
class Site:
    """One binding as the boundary rules see it, with what the rules before have said of it.

    Attributes
    ----------
    var : relax.Var
        The binding's var.
    plan : BindingPlan
        Step 1's decision of it.
    crosses_low : bool
        Its value is stored in low precision where it crosses a kernel boundary, unless a
        later rule keeps it float32.
    uncentred_reader : relax.Var, optional
        An op in another kernel that adds to it in float32 where no normalization centres
        the sum.
    """

    var: relax.Var
    plan: BindingPlan
    crosses_low: bool = False
    uncentred_reader: relax.Var | None = None


class BoundaryRule:
    """A rule of step 1b: what it decides of one binding at kernel boundaries."""

    def apply(self, kernels: KernelPlan, site: Site) -> bool:
        """Apply the rule to ``site``, writing into ``kernels`` (the plan being built, fusion
        grouping done, the rules applied to the bindings before ``site``'s).

        Returns
        -------
        bool
            True where the binding's later rules are not applied.
        """
        raise NotImplementedError


class FollowOpMode(BoundaryRule):
    """The mode of a float follow op that step 1 leaves ``ORIGINAL``, from how its inputs
    arrive. An exact op computes in low precision where every input arrives so
    (``exact_arrives_low``), else in float32 registers (``in_float32_registers``); any other
    computes in low precision where it must read a stored copy as it is (``arrives_low``),
    else widens what it reads in its kernel (``widened_in_kernel``) and the copies it would
    have had to read as they are are not stored."""

    def apply(self, kernels: KernelPlan, site: Site) -> bool:
        var, plan, decisions = site.var, site.plan, kernels.decisions
        if not (plan.category == Category.FOLLOW and plan.mode == Mode.ORIGINAL
                and not op_info(plan.op).integer_side and plan.float_output
                and not plan.constant_inputs):
            return False
        low = kernels.scope.low
        kernels.modes[var] = Mode.ORIGINAL
        activations = [leaf for leaf, _ in kernels.scope.float_leaves(var)
                       if is_var(leaf) and leaf not in decisions.folded]
        if op_info(plan.op).exact:
            if activations and decisions.can_low.get(var, False) and all(
                    kernels.arrives_low(leaf, var) for leaf in activations):
                kernels.modes[var] = Mode.LOW
                kernels.add_reason(var, Reason.of("exact_arrives_low", dtype=low))
            else:
                kernels.add_reason(var, Reason.of("in_float32_registers"))
            return False
        absorbed = [leaf for leaf in activations if self._widening_absorbed(kernels, leaf, var)]
        if absorbed and decisions.can_low.get(var, False):
            kernels.modes[var] = Mode.LOW
            kernels.add_reason(var, Reason.of("arrives_low", dtype=low, input=absorbed[0].name))
            return False
        kernels.stored_low.difference_update(absorbed)
        kernels.add_reason(var, Reason.of("widened_in_kernel"))
        return False

    @staticmethod
    def _widening_absorbed(kernels: KernelPlan, value, consumer) -> bool:
        """A value read only by ``consumer`` across a kernel boundary: a float32 copy made
        for the consumer would join the producer's kernel (FuseOps extends a kernel through a
        chain of single-use casts), so the consumer must read the stored copy as it is."""
        return value in kernels.stored_low and kernels.uses.get(value) == [consumer] and (
            value, consumer) not in kernels.fused


class CrossesBoundary(BoundaryRule):
    """A float32 value that may be low precision (not hot, not a float32 result of the
    function), written by a kernel that stores its result, whose every reader in another
    kernel reads a stored low-precision copy, crosses in low precision unless a later rule
    keeps it float32.

    Parameters
    ----------
    results : set
        The vars the function returns in float32: never stored low for another reader, since
        that would round the result.
    """

    def __init__(self, results):
        self.results = results

    def apply(self, kernels: KernelPlan, site: Site) -> bool:
        var, decisions = site.var, kernels.decisions
        site.crosses_low = (kernels.scope.dtype_of(var) == "float32"
                            and decisions.can_low.get(var, False) and var not in decisions.hot
                            and var not in self.results
                            and kernels.group_kind[var] in STORING_KINDS
                            and kernels.all_read_stored(var))
        return False


class ResidualStreams(BoundaryRule):
    """A residual stream keeps float32 between kernels: a value computed in float32
    registers that a normalization in another kernel centres (:attr:`OpInfo.centring`,
    ``residual_centred``), or that an elementwise op in another kernel adds to in float32
    where a normalization centres the sum (``residual_added``). Rounded, the digits that
    survive the subtraction of the mean are those low precision lacks (in a post-norm
    transformer, the normalization's input and result are that stream). A stream that is only
    added to is stored in low precision and added in float32 registers: one rounding per
    block, where TVM's built-in pass rounds every op.

    Parameters
    ----------
    mode : bool or str
        The target's ``low_precision_residuals``: :data:`~relay_amp.targets.UNCENTRED` (the
        GPU default) as above; False keeps every stream an op adds to float32, True none.
    """

    def __init__(self, mode):
        self.mode = mode

    def apply(self, kernels: KernelPlan, site: Site) -> bool:
        if site.crosses_low and self._keeps(kernels, site):
            site.crosses_low = False
        return False

    def _keeps(self, kernels: KernelPlan, site: Site) -> bool:
        if self.mode is True:
            return False
        var, plans = site.var, kernels.decisions.plans
        for consumer in kernels.uses.get(var, ()):
            other = plans.get(consumer)
            if consumer is None or other is None or (var, consumer) in kernels.fused:
                continue
            if consumer in kernels.absorbed and self._is_branch_of(kernels, var, consumer):
                continue  # stored low; the sum is formed in float32 in the normalization
            record = op_info(other.op)
            if (other.category == Category.FOLLOW and not record.exact
                    and record.fusion == FusionKind.ELEMWISE):
                if self.mode == UNCENTRED and not self._centred(kernels, consumer):
                    if site.uncentred_reader is None:
                        site.uncentred_reader = consumer
                    continue
                kernels.add_reason(var, Reason.of("residual_added", consumer=consumer.name))
            elif other.mixed and record.centring and not site.plan.mixed:
                kernels.add_reason(var, Reason.of("residual_centred", consumer=consumer.name,
                                                  op=other.op))
            else:
                continue
            kernels.residuals.add(var)
            return True
        return False

    @staticmethod
    def _centred(kernels: KernelPlan, value) -> bool:
        """Does a normalization centre ``value`` (a residual add: formed in its kernel, or
        read by it)?"""
        if value in kernels.absorbed:
            return True
        plans = kernels.decisions.plans
        return any(c is not None and c in plans and op_info(plans[c].op).centring
                   for c in kernels.uses.get(value, ()))

    @staticmethod
    def _is_branch_of(kernels: KernelPlan, var, add) -> bool:
        """Is ``var`` the branch operand of the absorbed residual ``add`` (its other operand
        is the stream: a residual already, or a parameter)?"""
        others = [arg for arg, _ in kernels.scope.call_args[add] if arg is not var]
        return bool(others) and all(o in kernels.residuals or o not in kernels.decisions.plans
                                    for o in others)


class Ranked(BoundaryRule):
    """A value a ranking op (:attr:`OpInfo.ranking`) reads, directly or through exact follow
    ops, keeps float32 between kernels (``ranked``): rounded, nearly-equal scores swap."""

    def apply(self, kernels: KernelPlan, site: Site) -> bool:
        if not site.crosses_low:
            return False
        plans, seen, stack = kernels.decisions.plans, {site.var}, [site.var]
        while stack:
            for consumer in kernels.uses.get(stack.pop(), ()):
                other = plans.get(consumer)
                if other is None or consumer in seen:
                    continue
                if op_info(other.op).ranking:
                    kernels.add_reason(site.var, Reason.of("ranked", consumer=consumer.name,
                                                           op=other.op))
                    site.crosses_low = False
                    return False
                if other.category == Category.FOLLOW and op_info(other.op).exact:
                    seen.add(consumer)
                    stack.append(consumer)
        return False


class FeedsResult(BoundaryRule):
    """A value that feeds a function result keeps float32 between kernels (``feeds_result``)
    and is left as step 1 decided it: :meth:`measure` finds those values.

    Parameters
    ----------
    kept : dict
        Var -> its ``feeds_result`` reason.
    """

    def __init__(self, kept: dict):
        self.kept = kept

    def apply(self, kernels: KernelPlan, site: Site) -> bool:
        if site.crosses_low and site.var in self.kept:
            kernels.add_reason(site.var, self.kept[site.var])
            return True
        return False

    @classmethod
    def measure(cls, kernels: KernelPlan, items, results, budget: float,
                callee_kinds=None) -> FeedsResult:
        """The rule for one function grouped into kernels: each value a result is computed
        from through elementwise and data-movement follow ops (a sigmoid, a reshape, a
        concatenation), smallest first, while the bytes that keeping them float32 adds stay
        within ``budget`` (the policy's ``result_budget``) of the function's float32 bytes at
        kernel boundaries (``items``: its bindings; ``results``: the vars it returns in
        float32)."""
        plans, scope, found, stack = kernels.decisions.plans, kernels.scope, {}, list(results)
        seen = set(stack)
        while stack:
            var = stack.pop()
            plan = plans.get(var)
            if plan is None:
                continue
            if var not in results:
                found[var] = _saving(kernels, var)
            kind = fusion_kind(plan.op, scope.bound[var], callee_kinds or {})
            if plan.category == Category.FOLLOW and kind in (FusionKind.ELEMWISE,
                                                             FusionKind.INJECTIVE):
                for leaf, _ in scope.float_leaves(var):
                    if is_var(leaf) and leaf not in seen:
                        seen.add(leaf)
                        stack.append(leaf)
        if not any(found.values()):
            return cls({})
        traffic = _boundary_traffic(kernels, items, results)
        spent, kept = 0, {}
        for var, saving in sorted(found.items(), key=lambda item: item[1]):
            if saving == 0 or spent + saving > budget * traffic:
                break
            spent += saving
            kept[var] = Reason.of("feeds_result", dtype=scope.low, saving=saving,
                                  share=saving / traffic, budget=budget)
        return cls(kept)


def _crossing(kernels: KernelPlan, var) -> list:
    return [c for c in kernels.uses.get(var, ()) if (var, c) not in kernels.fused]


def _saving(kernels: KernelPlan, var) -> int:
    """Bytes a low-precision copy of float32 ``var`` saves: half its writes and reads."""
    crossing = _crossing(kernels, var)
    return float32_bytes(var) // 2 * (1 + len(crossing)) if crossing else 0


def _boundary_traffic(kernels: KernelPlan, items, results) -> int:
    """The function's bytes at kernel boundaries with every value float32: each value a
    kernel writes for another kernel or as a result, once written and once per kernel that
    reads it, and each constant and parameter once per reading op."""
    scope, decisions, total = kernels.scope, kernels.decisions, 0
    for _, var, _ in items:
        if var not in scope.call_args or var in decisions.folded:
            continue
        crossing = _crossing(kernels, var)
        if crossing or var in results:
            total += float32_bytes(var) * (1 + len(crossing))
        for _, leaves in scope.call_args[var]:
            total += sum(float32_bytes(leaf) for leaf in leaves
                         if type(leaf) is GenericConst or (is_var(leaf)
                                                            and leaf not in decisions.plans))
    return total


class StoredLow(BoundaryRule):
    """A value that still crosses in low precision is stored so; a residual stream an op
    adds to where no normalization centres the sum says so (``residual_low``)."""

    def apply(self, kernels: KernelPlan, site: Site) -> bool:
        if site.crosses_low:
            kernels.stored_low.add(site.var)
            if site.uncentred_reader is not None:
                kernels.add_reason(site.var, Reason.of(
                    "residual_low", consumer=site.uncentred_reader.name, dtype=kernels.scope.low))
        return False


class ComputesLow(BoundaryRule):
    """The float32 values the rewrite computes in low precision: a mixed kernel's result
    where it is stored low, a low-precision op's, a dot product's that accumulates in low
    precision, a follow op's whose mode is low."""

    def apply(self, kernels: KernelPlan, site: Site) -> bool:
        var, plan = site.var, site.plan
        if kernels.scope.dtype_of(var) != "float32":
            low = False
        elif plan.mixed:
            low = var in kernels.stored_low
        elif plan.category == Category.LOW_PRECISION:
            low = True
        elif plan.category == Category.LOW_PRECISION_FP32_ACCUMULATE:
            low = plan.decision.accumulation_dtype != "float32"
        else:
            low = kernels.mode_of(var) == Mode.LOW
        if low:
            kernels.low_values.add(var)
        return False


class ReadsStoredLow(BoundaryRule):
    """An importer's kernel that reads a stored low-precision value (widening it inside
    itself) says so (``reads_stored_low``). Applied once every binding's boundary is settled:
    what it reads is then final."""

    def apply(self, kernels: KernelPlan, site: Site) -> bool:
        var = site.var
        if var in kernels.widening_callees:
            for leaf, _ in kernels.scope.float_leaves(var):
                if is_var(leaf) and kernels.boundary_read(leaf, var):
                    kernels.add_reason(var, Reason.of("reads_stored_low", input=leaf.name,
                                                      dtype=kernels.scope.low))
        return False
