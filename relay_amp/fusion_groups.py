"""Fusion grouping, the first part of step 1b (:mod:`relay_amp.kernel_plan`): which values
FuseOps keeps in one kernel's registers, before the boundary rules
(:mod:`relay_amp.kernel_rules`) decide how the others cross."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tvm import relax
from tvm.ir import Call
from tvm.relax import DataflowVar, SeqExpr, TupleGetItem

from .kinds import Category, FusionKind, Mode
from .op_registry import fuses, fusion_kind, op_info, widens_in_own_kernel
from .reasons import Reason
from .relax_utils import is_var

if TYPE_CHECKING:
    from .kernel_plan import KernelPlan


class FusionGroups:
    """How FuseOps groups one function's bindings into kernels, written into the
    :class:`~relay_amp.kernel_plan.KernelPlan` being built by :meth:`group`: ``uses``,
    ``tuple_items``, ``absorbed`` (with the ``absorbed_add`` reasons), ``fused``,
    ``group_kind`` and ``widening_callees``.

    Parameters
    ----------
    kernels : KernelPlan
        The plan being built (its ``scope`` and ``decisions`` are read).
    residual_mode : bool or str
        The target's ``low_precision_residuals``: with True no normalization forms the
        residual add that feeds it.
    callee_kinds : dict
        PrimFunc name -> the FusionKind of a ``call_tir`` of it.
    """

    def __init__(self, kernels: KernelPlan, residual_mode, callee_kinds=None):
        self.out, self.scope, self.decisions = kernels, kernels.scope, kernels.decisions
        self.residual_mode = residual_mode
        self.callee_kinds = callee_kinds or {}
        self.kernel_root: dict = {}  # var -> a later binding of its kernel (itself: the last)

    def group(self, seq: SeqExpr) -> None:
        """Group the bindings of ``seq``: the uses of each value (a call binding's var, None
        for any other use, the function's result included), the items of each tuple, then
        each kernel in binding order."""
        items = self.scope.bindings(seq)
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
                self.out.add_reason(source, Reason.of("absorbed_add", kernel=var.name,
                                                      op=plan.op))

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
