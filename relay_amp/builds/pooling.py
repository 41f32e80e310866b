"""Pooling over windows in NHWC: the window's taps outside, the channels inside as vectors whose
partial results stay in registers.

TVM legalizes a pooling into a loop nest whose window loops are innermost: each output value
reduces its window one value at a time, which LLVM vectorizes poorly or not at all (aarch64,
one thread: a 3 × 3 average pool over 28 × 28 × 64 executed 4.5 M instructions; a 2 × 2 max
pool with its add and ReLU over 56 × 56 × 64, 1.7 M). In bfloat16 it is worse: TVM's
``BF16ComputeLegalize`` rounds each step's maximum back to bfloat16, and YOLOv8n's three
5 × 5 pools over 128 channels executed 8.7 M instructions, 11 × float32's 0.78 M. In NHWC
the channels are the innermost axis of every tensor the pool reads, so the window loops can
run outside vectors of channels instead (0.41, 0.24 and 0.82 M): :class:`WindowReduction`.
Its running result is a buffer of the kernel's own, which that legalization computes in
float32, so bfloat16 rounds once per output. Each output reduces its window in the same order:
the outputs are the plain build's.
"""

from __future__ import annotations

import tvm

from ..relax_utils import last_line
from .elementwise import INLINED_FLOPS, _along, inline_within, vector_step, vectorize_loops
from .schedule_rules import decide, llvm_blocks, reverse_inlined, uses


def _window_reduction(block) -> bool:
    """Whether ``block`` reduces into one output whose last index is its last spatial iterator,
    and reads every tensor at that same last index (a vector of channels), with no reduction
    iterator in it."""
    spatial = [iv.var for iv in block.iter_vars if int(iv.iter_type) == 0]
    reduced = [iv.var for iv in block.iter_vars if int(iv.iter_type) == 2]
    if not spatial or not reduced or len(spatial) + len(reduced) != len(block.iter_vars) \
            or len(block.writes) != 1:
        return False
    last = spatial[-1]
    return all(region.region and region.region[-1].min.same_as(last)
               and isinstance(region.region[-1].extent, tvm.tirx.IntImm)
               and int(region.region[-1].extent) == 1
               for region in (*block.reads, *block.writes)) \
        and not any(uses(region.region[-1].min, var) for region in block.reads
                    for var in reduced)


def _lanes(block, target) -> int | None:
    """Channels one step computes (:func:`~relay_amp.builds.elementwise.vector_step` over the
    block's last spatial axis)."""
    return vector_step(block, [iv for iv in block.iter_vars
                               if int(iv.iter_type) == 0][-1].dom.extent, target)


class WindowReduction:
    """A dlight schedule rule for ``llvm`` targets: a kernel with one reduction whose every
    read is along its output's last axis (a max or average pool in NHWC, a sum over a window),
    with elementwise blocks before it (its input's padding) and after it. The reduction's
    channel loop is split into vectors of up to four registers, its window loops moved between
    the two, the running result kept in a buffer of one block written back at the channel
    block; where :func:`~relay_amp.builds.cpu_pipeline.registers_hold_the_sums`, the other
    spatial loops and the channel blocks run in parallel (elsewhere the buffer is ``local``,
    which a parallel loop would allocate once an iteration). The blocks before it are one
    loop of vectors (:func:`~relay_amp.builds.elementwise.vectorize_loops`); those after it
    are inlined into each other (:func:`~relay_amp.builds.elementwise.inline_within`) and into
    the write-back where they read it value for value, else left a loop of vectors.
    Kernels whose reductions reduce along the last axis, or whose channels no vector divides,
    are passed on. dlight's ``ApplyDefaultSchedule`` calls :meth:`apply`.
    """

    def apply(self, func, target, tunable):  # noqa: ARG002 - dlight's rule signature
        from tvm import s_tir

        from .cpu_pipeline import registers_hold_the_sums  # it imports this module

        sch, infos = llvm_blocks(func, target) or (None, ())
        reductions = [i for i, info in enumerate(infos) if not info.is_injective()]
        if len(reductions) != 1:
            return None
        at = reductions[0]
        block_rv = infos[at].block_rv
        block = sch.get(block_rv)
        if not _window_reduction(block) or not all(
                _along(sch.get(info.block_rv)) for i, info in enumerate(infos) if i != at):
            return None
        lanes = _lanes(block, target)
        if lanes is None:
            decide("no vector of registers divides the channels: left to the next rule")
            return None
        before = [sch.get(info.block_rv).name_hint for info in infos[:at]]
        after = [sch.get(info.block_rv).name_hint for info in infos[at + 1:]]
        loops = sch.get_loops(block_rv)
        spatial = sum(int(iv.iter_type) == 0 for iv in block.iter_vars)
        bound = sch.get(loops[-1]).body.iter_values if loops else ()
        if len(loops) != len(block.iter_vars) or any(
                not value.same_as(sch.get(loop).loop_var) for value, loop in zip(bound, loops)) \
                or any(int(iv.iter_type) != 0 for iv in block.iter_vars[:spatial]):
            return None
        in_registers = registers_hold_the_sums(target)
        try:
            channels, vectors = sch.split(loops[spatial - 1], [None, lanes])
            sch.reorder(channels, *loops[spatial:], vectors)
            tile = sch.fuse(*loops[:spatial - 1], channels) if spatial > 1 else channels
            if in_registers:  # before the reduction is decomposed, which parallel refuses
                sch.parallel(tile)
            write_back = sch.cache_write(block_rv, 0, "global" if in_registers else "local")
            sch.reverse_compute_at(write_back, tile, preserve_unit_loops=False)
            sch.vectorize(vectors)
            init = sch.decompose_reduction(block_rv, loops[spatial])
            sch.vectorize(sch.get_loops(init)[-1])
            sch, folded = _epilogue(sch, write_back, after, target, in_registers)
            sch.vectorize(sch.get_loops(write_back)[-1])
            for name in before:  # in parallel too, SPPF's 20 x 20 pools took 1.05 x at 2 threads
                vectorize_loops(sch, sch.get_sblock(name), target, parallel=False)
        except s_tir.ScheduleError as err:
            decide(f"not scheduled: {last_line(err)}")
            return None
        decide(f"window of {len(loops) - spatial} loop(s) outside vectors of {lanes} channels, "
               + ("in parallel" if in_registers else "in order, the running result local")
               + (f"; {folded} folded into its write-back" if folded else ""))
        return sch


def _epilogue(sch, write_back, names, target, parallel: bool) -> tuple:
    """Inline the blocks ``names`` after the reduction into each other, then the one left into
    ``write_back`` where it reads it value for value (else a loop of vectors); the schedule
    and what was folded into the write-back."""
    left = [name for name in names
            if not inline_within(sch, sch.get_sblock(name), INLINED_FLOPS)]
    folded = []
    for name in left:
        trial = reverse_inlined(sch, sch.get_sblock(name))
        if trial is None:
            vectorize_loops(sch, sch.get_sblock(name), target, parallel=parallel)
            continue
        sch = trial
        folded.append(name)
    return sch, ", ".join(folded)


__all__ = ["WindowReduction"]
