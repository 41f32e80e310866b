"""Normalizations over an axis that is not the innermost (a softmax over YOLOv8's 16 box bins,
``[1, 16, 4, 2100]`` along axis 1): one pass over the tensor, vectors along its innermost axis.

dlight's CPU ``Reduction`` rule parallelizes the first spatial loops of the kernel's last block
and computes every earlier block under them, assuming those loops are the reductions' spatial
axes too. Where the reduced axis comes before the innermost one, the last block's first loops
include the reduced axis itself, so each of its values recomputed every reduction and every
``exp`` over the whole tensor: YOLOv8n's softmax computed 16 times over took 3.1 ms, one
thread, where the kernel below takes 0.18 ms (x86, AVX2).

:class:`ReductionAlongOuterAxis` instead splits the innermost axis into vectors, runs the
other spatial axes and the vectors' blocks in parallel, and computes each earlier block for one
block of vectors at a time: a reduction adds the vectors of its reduced axis lane by lane, in
the order the plain build adds them, so the sums are the plain build's.
"""

from __future__ import annotations

import tvm

from .elementwise import register_lanes
from .schedule_rules import decide, llvm_blocks, reverse_inlined, uses


def _bindings(sch, block_rv) -> dict:
    """A block's iterators and the loop expressions bound to them."""
    block = sch.get(block_rv)
    realize = sch.get(sch.get_loops(block_rv)[-1]).body
    return dict(zip([iv.var for iv in block.iter_vars], realize.iter_values))


def _innermost_loop(sch, block_rv):
    """The last of ``block_rv``'s loops bound to the iterator that indexes its output's
    innermost axis; None where no one iterator does."""
    block = sch.get(block_rv)
    last = block.writes[0].region[-1].min
    bindings = _bindings(sch, block_rv)
    iters = [var for var in bindings if uses(last, var)]
    if len(iters) != 1:
        return None
    loops = [loop for loop in sch.get_loops(block_rv)
             if uses(bindings[iters[0]], sch.get(loop).loop_var)]
    return loops[-1] if loops else None


def _fold_trailing(sch, infos) -> tuple:
    """``(schedule, infos)`` after each elementwise block that follows another at the kernel's
    end (a
    float16 model's cast of its softmax back to float16) is folded into the block before it,
    so that the kernel ends with the block that reads the reductions (YOLOv8n's float16
    build on aarch64: its softmax with that cast executed 26.1 M instructions, computed as
    dlight's ``Reduction`` schedules it)."""
    from tvm.s_tir.dlight.analysis import normalize_prim_func

    while len(infos) > 2 and infos[-1].is_injective() and infos[-2].is_injective():
        folded = reverse_inlined(sch, infos[-1].block_rv)
        if folded is None:
            break
        sch = folded
        infos = normalize_prim_func(sch) or []
    return sch, infos


def vector_lanes(extent: int, bits: int, target) -> int:
    """Lanes of the vectors along an innermost axis of ``extent`` values of ``bits`` bits: one
    vector register of ``target`` (:func:`~relay_amp.builds.elementwise.register_lanes`; 128
    bits on other CPUs), else the widest power-of-two fraction of it down to 2 that divides the
    axis; 1 (no vectors) where none does."""
    lanes = register_lanes(target, bits) or 128 // bits
    while lanes >= 2 and extent % lanes:
        lanes //= 2
    return max(lanes, 1)


class ReductionAlongOuterAxis:
    """A dlight schedule rule for ``llvm`` targets: a kernel of reductions and elementwise
    blocks ending in an elementwise one (a softmax, a normalization) whose reductions reduce an
    axis other than the innermost of what they read. The last block's innermost loop is split
    into :func:`vector_lanes` vectors; its other spatial loops and the vectors' blocks are fused
    into one parallel loop, above its reduced loops; every earlier block is computed at that
    loop, its own innermost loop (the same axis) vectorized inside its others. Kernels whose
    reductions reduce the innermost axis are left to dlight's ``Reduction``.
    dlight's ``ApplyDefaultSchedule`` calls :meth:`apply`.
    """

    def apply(self, func, target, tunable):  # noqa: ARG002 - dlight's rule signature
        sch, infos = llvm_blocks(func, target) or (None, ())
        if all(info.is_injective() for info in infos):
            return None  # nothing to fold for (and TVM's reverse_compute_inline can fail its
            # own check on an elementwise kernel's broadcast: se_resnet18_v1's)
        count = len(infos)
        sch, infos = _fold_trailing(sch, infos)
        folded = count - len(infos)
        if len(infos) < 2 or not infos[-1].is_injective():
            return None
        reductions = [info for info in infos if not info.is_injective()]
        last = sch.get(infos[-1].block_rv)
        extent = last.writes[0].source.shape[-1]
        if not reductions or not isinstance(extent, tvm.tirx.IntImm):
            return None
        outputs = []
        for info in reductions:
            block = sch.get(info.block_rv)
            reduced = [iv.var for iv in block.iter_vars
                       if iv.iter_type == tvm.tirx.IterVar.CommReduce]
            if any(uses(read.region[-1].min, var) for read in block.reads for var in reduced):
                return None  # along the innermost axis: dlight's Reduction
            shape = block.writes[0].source.shape
            if not isinstance(shape[-1], tvm.tirx.IntImm) or int(shape[-1]) != int(extent):
                return None
            outputs.append(block.writes[0].source)
        bindings = _bindings(sch, infos[-1].block_rv)
        reduced = {var for read in last.reads if any(read.source.same_as(b) for b in outputs)
                   for var in bindings if not any(uses(r.min, var) for r in read.region)}
        loops = sch.get_loops(infos[-1].block_rv)
        inner = _innermost_loop(sch, infos[-1].block_rv)
        if not reduced or inner is None or not sch.get(inner).same_as(sch.get(loops[-1])):
            return None
        reduced_loops = [loop for loop in loops[:-1] if any(
            uses(bindings[var], sch.get(loop).loop_var) for var in reduced)]
        spatial = [loop for loop in loops[:-1]
                   if not any(sch.get(loop).same_as(sch.get(r)) for r in reduced_loops)]
        lanes = vector_lanes(int(extent), last.writes[0].source.dtype.bits, target)
        try:
            outer, vectors = (sch.split(loops[-1], [None, lanes]) if lanes > 1
                              else (loops[-1], None))
            sch.reorder(*spatial, outer, *reduced_loops, *([vectors] if vectors else []))
            tile = sch.fuse(*spatial, outer)
            sch.parallel(tile)
            if vectors is not None:
                sch.vectorize(vectors)
            for info in reversed(infos[:-1]):
                sch.compute_at(info.block_rv, tile, preserve_unit_loops=False)
            for info in infos[:-1] if vectors is not None else ():
                loop = _innermost_loop(sch, info.block_rv)
                if loop is None:
                    return None
                rest = [other for other in sch.get_loops(info.block_rv)[1:]
                        if not sch.get(other).same_as(sch.get(loop))]
                sch.reorder(*rest, loop)
                sch.vectorize(loop)
        except tvm.s_tir.ScheduleError:
            return None
        decide(f"{len(reductions)} reductions over an outer axis, computed once for each "
               f"{lanes} of the innermost axis's {int(extent)} values, in parallel"
               + ("" if vectors is not None else " (no vector length divides the axis)")
               + (f"; {folded} elementwise block(s) after the normalization folded into it"
                  if folded else ""))
        return sch


__all__ = ["ReductionAlongOuterAxis", "vector_lanes"]
