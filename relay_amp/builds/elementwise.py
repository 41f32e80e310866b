"""A dlight schedule rule for CPU kernels that are all spatial blocks: one loop of vectors, in
parallel.

TVM's CPU pipeline schedules nothing: a batch norm written as a multiply and an add with a
ReLU after them (:mod:`relay_amp.builds.batch_norm`, where no convolution's tile takes it) is
three loop nests over the whole tensor with two intermediate buffers, which LLVM vectorizes,
and unrolls, one by one, on one core. In NHWC their last loop runs over channels, a constant of
hundreds: LLVM unrolled 320 of them into a kernel that took 2 s to compile (cifar_wideresnet16_10,
x86). :class:`Elementwise` inlines the stages into the last block and runs its fused loops as
one loop of vectors of the target's register width, the rest in parallel.
"""

from __future__ import annotations

import tvm

from .neon_tiles import is_aarch64
from .x86_tiles import vector_width


def register_lanes(target, bits: int) -> int | None:
    """Values of ``bits`` bits one vector register of ``target`` holds: 128-bit NEON on
    aarch64, AVX2's or AVX-512's width on x86; None for other CPUs (LLVM keeps its choice)."""
    width = vector_width(target)
    if width:
        return width * 32 // bits
    return 128 // bits if is_aarch64(target) else None


class Elementwise:
    """A dlight schedule rule for ``llvm`` targets: a kernel whose blocks are all spatial (an
    elementwise op, a broadcast, a cast) computes in its last block, the others inlined into it;
    its loops fused, split into vectors of one register of its widest dtype, vectorized, and the
    rest in parallel. Kernels with a reduction, a block that cannot be inlined, several outputs,
    or an extent that is not a multiple of the vector's lanes are left alone.
    dlight's ``ApplyDefaultSchedule`` calls :meth:`apply`.
    """

    def apply(self, func, target, tunable):  # noqa: ARG002 - dlight's rule signature
        from tvm import s_tir

        if not isinstance(func, tvm.tirx.PrimFunc) or target.kind.name != "llvm":
            return None
        sch = s_tir.Schedule(func)
        try:
            *stages, last = sch.get_child_blocks(sch.get_sblock("root"))
            for stage in stages:
                sch.compute_inline(stage)
        except (s_tir.ScheduleError, ValueError):
            return None
        block = sch.get(last)
        loops = sch.get_loops(last)
        if any(int(iv.iter_type) != 0 for iv in block.iter_vars) \
                or len(loops) != len(block.iter_vars) or not loops:
            return None
        bits = max(tvm.DataType(str(region.source.dtype)).bits
                   for region in (*block.reads, *block.writes))
        lanes = register_lanes(target, bits)
        fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
        extent = sch.get(fused).extent
        if not lanes or not isinstance(extent, tvm.tirx.IntImm) or int(extent) % lanes:
            return None
        outer, inner = sch.split(fused, [None, lanes])
        sch.parallel(outer)
        sch.vectorize(inner)
        return sch


__all__ = ["Elementwise", "register_lanes"]
