"""A CUDA schedule rule for a row reduction whose result is written more than once.

A normalization that writes its result in float32 and float16 (a post-norm transformer's
layer_norm whose result is the residual stream and a matmul's operand; relay_amp's pair kernel,
or FuseOps fusing a cast into TVM's layer_norm) is one kernel: reductions over the last axes,
then two elementwise blocks. dlight's ``GeneralReduction`` takes a kernel with one elementwise
block at the end only, so such a kernel fell to dlight's ``Fallback``: one thread per row, each
summing 768 values alone, twice. On an H200 that kernel took 232 µs a call in BERT-base float16
(TVM's own layer_norm, scheduled by ``GeneralReduction``, 6.4 µs: docs/GPU.md).

:func:`several_outputs_rule` schedules it the way ``GeneralReduction`` schedules the one-output
form: a thread block per row, the row's reductions split over the block's threads (TVM lowers
them to a cross-thread reduction in shared memory), then every elementwise block of the row
over the same threads.
"""

from __future__ import annotations

#: Threads per block (dlight's ``GeneralReduction`` uses 256 on CUDA).
THREADS = 256
#: Unrolling of each thread's serial part (dlight's value for CUDA).
UNROLL = 256


def _shape(info):
    """``(kinds, extents)`` of a block's iterators, as dlight's analysis gives them."""
    return info.dom_kind(), [it.dom for it in info.iters]


def _fits(infos) -> tuple | None:
    """``(reductions, outputs, leading)`` where ``infos`` is reductions of one shape ``S…SR…R``
    then two or more elementwise blocks over the same domain; None otherwise."""
    import tvm

    reductions = [i for i in infos if "R" in i.dom_kind()]
    outputs = infos[len(reductions):]
    if not reductions or len(outputs) < 2 or any("R" in i.dom_kind() for i in outputs):
        return None
    kinds, extents = _shape(reductions[0])
    leading = len(kinds) - len(kinds.lstrip("S"))
    if leading == 0 or kinds != "S" * leading + "R" * (len(kinds) - leading):
        return None
    analyzer = tvm.sym.Analyzer()

    def same(a, b):
        return len(a) == len(b) and all(analyzer.can_prove_equal(x, y) for x, y in zip(a, b))

    if any(_shape(info)[0] != kinds or not same(_shape(info)[1], extents)
           for info in reductions[1:]):
        return None
    if any(not info.is_injective() or not same(_shape(info)[1], extents)
           for info in outputs):
        return None
    return reductions, outputs, leading


def _spread(sch, loop) -> None:
    """Split ``loop`` over the block's threads, each thread's part serial and unrolled."""
    serial, thread = sch.split(loop, [None, THREADS])
    sch.reorder(thread, serial)
    sch.bind(thread, "threadIdx.x")
    sch.annotate(serial, ann_key="pragma_auto_unroll_max_step", ann_val=UNROLL)
    sch.annotate(serial, ann_key="pragma_unroll_explicit", ann_val=1)


def several_outputs_rule():
    """The rule (a dlight ``ScheduleRule``); see the module docstring."""
    from tvm import s_tir, tirx
    from tvm.s_tir import dlight as dl
    from tvm.s_tir.dlight.analysis import normalize_prim_func
    from tvm.s_tir.dlight.base import try_inline_contiguous_spatial

    class SeveralOutputs(dl.gpu.GeneralReduction):
        """Row reductions that feed two or more elementwise outputs: one block per row."""

        def apply(self, func, target, tunable):
            if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
                return None
            sch = s_tir.Schedule(func)
            infos = try_inline_contiguous_spatial(sch, normalize_prim_func(sch))
            fits = _fits(infos) if infos else None
            if fits is None:
                return None
            reductions, outputs, leading = fits
            first, rest = outputs[0], outputs[1:]
            loops = sch.get_loops(first.block_rv)
            row = sch.fuse(*loops[:leading])
            sch.bind(row, "blockIdx.x")
            _spread(sch, sch.fuse(*loops[leading:]))
            for info in reversed(reductions):
                for index, _ in enumerate(sch.get(info.block_rv).writes):
                    sch.set_scope(info.block_rv, buffer_index=index, storage_scope="shared")
                sch.compute_at(info.block_rv, row, preserve_unit_loops=True)
                reduced = len(info.dom_kind()) - leading
                _spread(sch, sch.fuse(*sch.get_loops(info.block_rv)[-reduced:]))
            for info in rest:
                sch.reverse_compute_at(info.block_rv, row, preserve_unit_loops=True)
                _spread(sch, sch.fuse(*sch.get_loops(info.block_rv)[1:]))
            return sch

    return SeveralOutputs()


__all__ = ["several_outputs_rule", "THREADS"]
