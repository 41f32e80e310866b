"""A dlight schedule rule for CPU kernels that are all spatial blocks: one loop of vectors, in
parallel.

TVM's CPU pipeline schedules nothing: a batch norm written as a multiply and an add with a
ReLU after them (:mod:`relay_amp.builds.batch_norm`, where no convolution's tile takes it) is
three loop nests over the whole tensor with two intermediate buffers, left to LLVM's
vectorizers, on one core. In NHWC their last loop runs over channels, a constant of hundreds:
one such kernel of cifar_wideresnet16_10 (320 channels) took 2.2 s to build for x86.
:class:`Elementwise` inlines the stages into the last block and runs its fused loops as one
loop of vectors of the target's register width, the rest in parallel.
"""

from __future__ import annotations

import tvm

from .neon_tiles import is_aarch64
from .x86_tiles import vector_width

#: Registers of the widest dtype one step of the loop computes, most first where the extent
#: allows, so the loop's own instructions are amortized. Measured on aarch64: with one register
#: a step (and every kernel taken, read along its last axis or not) the float16 builds of
#: face_detection_short_range and face_landmark executed 1.6-2.0 M more instructions than
#: with LLVM's loops; with these and only kernels read along the last axis, within 1 %.
REGISTERS = (4, 2, 1)


def register_lanes(target, bits: int) -> int | None:
    """Values of ``bits`` bits one vector register of ``target`` holds: 128-bit NEON on
    aarch64, AVX2's or AVX-512's width on x86; None for other CPUs (LLVM keeps its choice)."""
    width = vector_width(target)
    if width:
        return width * 32 // bits
    return 128 // bits if is_aarch64(target) else None


def _reads_along(region, var) -> bool:
    """Whether ``region`` is one element whose last index is ``var`` or a constant (a vector
    load, a broadcast scalar), so a vector of ``var``'s values reads it contiguously."""
    ranges = region.region
    if not ranges:
        return True
    last = ranges[-1].min
    return all(isinstance(r.extent, tvm.tirx.IntImm) and int(r.extent) == 1 for r in ranges) \
        and (last.same_as(var) or isinstance(last, tvm.tirx.IntImm))


def _along(block) -> bool:
    """Whether ``block`` is spatial and reads and writes every tensor along its last axis."""
    if not block.iter_vars or any(int(iv.iter_type) != 0 for iv in block.iter_vars):
        return False
    last = block.iter_vars[-1].var
    return all(_reads_along(region, last) for region in (*block.reads, *block.writes))


class Elementwise:
    """A dlight schedule rule for ``llvm`` targets: a kernel whose blocks are all spatial (an
    elementwise op, a broadcast, a cast) computes in its last block, the others inlined into it;
    its loops fused, split into vectors of up to :data:`REGISTERS` registers of its widest
    dtype, vectorized, and the rest in parallel. Kernels with a reduction, a block that cannot
    be inlined, several outputs, a tensor read other than along the last axis (a transpose, a
    concatenation, a resize: LLVM's own loops gather better), or a last axis that is not a
    multiple of one register's lanes are left alone.
    dlight's ``ApplyDefaultSchedule`` calls :meth:`apply`.
    """

    def apply(self, func, target, tunable):  # noqa: ARG002 - dlight's rule signature
        from tvm import s_tir

        if not isinstance(func, tvm.tirx.PrimFunc) or target.kind.name != "llvm":
            return None
        sch = s_tir.Schedule(func)
        try:
            *stages, last = blocks = sch.get_child_blocks(sch.get_sblock("root"))
            if not all(_along(sch.get(block)) for block in blocks):
                return None  # before inlining: a fused detection head has hundreds of stages
            for stage in stages:
                sch.compute_inline(stage)
        except (s_tir.ScheduleError, ValueError):
            return None
        block = sch.get(last)
        loops = sch.get_loops(last)
        if len(loops) != len(block.iter_vars) or not loops or not _along(block):
            return None
        bits = max(tvm.DataType(str(region.source.dtype)).bits
                   for region in (*block.reads, *block.writes))
        lanes, extent = register_lanes(target, bits), block.iter_vars[-1].dom.extent
        if not lanes or not isinstance(extent, tvm.tirx.IntImm):
            return None
        lanes = next((lanes * n for n in REGISTERS if int(extent) % (lanes * n) == 0), None)
        if lanes is None:
            return None
        fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
        outer, inner = sch.split(fused, [None, lanes])
        sch.parallel(outer)
        sch.vectorize(inner)
        return sch


__all__ = ["Elementwise", "register_lanes"]
