"""A dlight schedule rule for CPU kernels that are all spatial blocks: one loop of vectors, in
parallel.

TVM's CPU pipeline schedules nothing: a batch norm written as a multiply and an add with a
ReLU after them (:mod:`relay_amp.builds.batch_norm`, where no convolution's tile takes it) is
three loop nests over the whole tensor with two intermediate buffers, left to LLVM's
vectorizers, on one core. In NHWC their last loop runs over channels, a constant of hundreds:
one such kernel of cifar_wideresnet16_10 (320 channels) took 2.2 s to build for x86.
:class:`Elementwise` inlines the stages into their readers while a loop stays within
:data:`INLINED_FLOPS` and runs each loop left as vectors of the target's register width, the
rest in parallel; :func:`vectorize_blocks` does the same for what a tile's write-back leaves.
"""

from __future__ import annotations

import tvm

from .neon_tiles import is_aarch64
from .schedule_rules import decide
from .x86_tiles import vector_width

#: Registers of the widest dtype one step of the loop computes, most first where the extent
#: allows, so the loop's own instructions are amortized. Measured on aarch64: with one register
#: a step (and every kernel taken, read along its last axis or not) the float16 builds of
#: face_detection_short_range and face_landmark executed 1.6-2.0 M more instructions than
#: with LLVM's loops; with these and only kernels read along the last axis, within 1 %.
REGISTERS = (4, 2, 1)
#: The most float operations per output a loop takes by inlining the blocks before it
#: (:func:`inline_within`), counted as ``EPILOGUE_FLOPS`` is: a sigmoid and the ops around it,
#: never one ``exp`` inside another.
INLINED_FLOPS = 256


def register_lanes(target, bits: int) -> int | None:
    """Values of ``bits`` bits one vector register of ``target`` holds: 128-bit NEON on
    aarch64, AVX2's or AVX-512's width on x86; None for other CPUs (LLVM keeps its choice)."""
    width = vector_width(target)
    if width:
        return width * 32 // bits
    return 128 // bits if is_aarch64(target) else None


def _reads_along(region, var) -> bool:
    """Whether ``region`` is one element whose last index is ``var`` or a constant (a vector
    load, a broadcast scalar), or a few such elements in rows of its first axis (a stack of
    constants, :mod:`relay_amp.builds.stacked_constants`, whose rows a block that inlined
    another reads together), so a vector of ``var``'s values reads it contiguously."""
    ranges = region.region
    if not ranges:
        return True
    last = ranges[-1].min

    def one(r) -> bool:
        return isinstance(r.extent, tvm.tirx.IntImm) and int(r.extent) == 1

    rows = ranges[0]
    return all(one(r) for r in ranges[1:]) \
        and (one(rows) or len(ranges) > 1 and isinstance(rows.min, tvm.tirx.IntImm)
             and isinstance(rows.extent, tvm.tirx.IntImm)) \
        and (last.same_as(var) or isinstance(last, tvm.tirx.IntImm))


def _along(block) -> bool:
    """Whether ``block`` is spatial and reads and writes every tensor along its last axis."""
    if not block.iter_vars or any(int(iv.iter_type) != 0 for iv in block.iter_vars):
        return False
    last = block.iter_vars[-1].var
    return all(_reads_along(region, last) for region in (*block.reads, *block.writes))


def inline_within(sch, block_rv, flops) -> bool:
    """Inline ``block_rv`` into its readers, in place, where it and they are spatial and read
    along their last axis and each reader's float operations per output stay within ``flops``,
    as :func:`~relay_amp.builds.flops.expanded_flops` counts them (the block's at each load of
    it, a ``Let``'s value at each use). Counted so, a polynomial ``exp`` inlined into another
    costs 25 times its own, and is refused: TVM's code generation binds each ``Let`` in an
    ``arith::Analyzer`` whose cost grows with their nesting, and a chain of 50 sigmoids
    inlined into one loop did not build in 300 s. A block that calls a function is not inlined
    into a reader that stores bfloat16 (:func:`calls`). False, ``sch`` untouched, otherwise."""
    from tvm import s_tir

    from .flops import expanded_flops

    readers = sch.get_consumers(block_rv)
    block = sch.get(block_rv)
    if not readers or len(block.writes) != 1 or not _along(block) \
            or not isinstance(block.body, tvm.tirx.BufferStore):
        return False
    inlined = {block.writes[0].source: expanded_flops(block.body)}
    calling = calls(block.body.value)
    for reader in (sch.get(r) for r in readers):
        if not (_along(reader) and isinstance(reader.body, tvm.tirx.BufferStore)) \
                or expanded_flops(reader.body, inlined) > flops:
            return False
        if calling and str(reader.body.buffer.dtype) == "bfloat16":
            decide(f"{block.name_hint} kept out of {reader.name_hint}: it calls a function, "
                   "which bfloat16's rounding would call twice")
            return False
    try:
        sch.compute_inline(block_rv)
    except s_tir.ScheduleError:
        return False
    return True


def calls(expr) -> bool:
    """Whether ``expr`` calls a function (``erf``: a ``libm`` call on aarch64). TVM's
    ``BF16ComputeLegalize`` writes the value it rounds to bfloat16 out twice, and no pass
    merges the two calls: BERT's bfloat16 GELU, inlined into its cast, called ``erf`` twice an
    element (296 M instructions in ``libm`` against float32's 148 M)."""
    import tvm_ffi

    found = []
    tvm_ffi.structural_walk(expr, lambda node: found.append(isinstance(node, tvm.ir.expr.Call)))
    return any(found)


def calls_a_library(stmt, target) -> bool:
    """Whether ``stmt``, its intrinsics lowered for ``target`` as TVM's ``LowerIntrin`` lowers
    them, calls a function outside the kernel: on aarch64 GELU's ``erf`` becomes libm's
    ``erff``, while a sigmoid becomes arithmetic around LLVM's ``exp`` intrinsic."""
    import tvm_ffi
    from tvm import tirx

    func = tirx.PrimFunc([], stmt).with_attr("target", target) \
        .with_attr("global_symbol", "relay_amp_calls")
    lowered = tirx.transform.LowerIntrin()(tvm.IRModule({"relay_amp_calls": func}))
    external = (tvm.ir.Op.get("tirx.call_pure_extern"), tvm.ir.Op.get("tirx.call_extern"))
    found = []
    tvm_ffi.structural_walk(lowered["relay_amp_calls"].body, lambda node: found.append(
        isinstance(node, tvm.ir.expr.Call) and any(node.op.same_as(op) for op in external)))
    return any(found)


def vectorize_blocks(sch, names, target, flops, parallel: bool,
                     above: float = -1.0) -> list[str]:
    """Inline each of the blocks ``names`` (in order) into its readers while they stay within
    ``flops`` (:func:`inline_within`), then run each one left whose arithmetic is over
    ``above`` as a loop of vectors (:func:`vectorize_loops`); the names of the blocks left."""
    from tvm import s_tir

    from .flops import expanded_flops

    left = [name for name in names if not inline_within(sch, sch.get_sblock(name), flops)]
    for name in left:
        if expanded_flops(sch.get(sch.get_sblock(name)).body) <= above:
            continue
        try:
            vectorize_loops(sch, sch.get_sblock(name), target, parallel)
        except s_tir.ScheduleError:
            continue
    return left


def vector_step(block, extent, target) -> int | None:
    """Values of an axis of ``extent`` one step of ``block``'s loop computes: up to
    :data:`REGISTERS` vector registers of its widest dtype, as many as divide the axis; None
    where none does, the extent is not constant, or ``target`` has no known register width."""
    bits = max(tvm.DataType(str(region.source.dtype)).bits
               for region in (*block.reads, *block.writes))
    lanes = register_lanes(target, bits)
    if not lanes or not isinstance(extent, tvm.tirx.IntImm):
        return None
    return next((lanes * n for n in REGISTERS if int(extent) % (lanes * n) == 0), None)


def vectorize_loops(sch, block_rv, target, parallel: bool) -> bool:
    """Run ``block_rv``'s loops, in place, as one loop of vectors of up to :data:`REGISTERS`
    registers of its widest dtype, the rest in parallel with ``parallel``; False, ``sch``
    untouched, where the block is not spatial and read along its last axis with one loop per
    iterator, or its last axis is not a multiple of one register's lanes."""
    block = sch.get(block_rv)
    loops = sch.get_loops(block_rv)
    if len(loops) != len(block.iter_vars) or not loops or not _along(block):
        return False
    lanes = vector_step(block, block.iter_vars[-1].dom.extent, target)
    if lanes is None:
        return False
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    outer, inner = sch.split(fused, [None, lanes])
    if parallel:
        sch.parallel(outer)
    sch.vectorize(inner)
    return True


class Elementwise:
    """A dlight schedule rule for ``llvm`` targets: a kernel whose blocks are all spatial (an
    elementwise op, a broadcast, a cast) has each stage inlined into its readers while they
    stay within :data:`INLINED_FLOPS` (:func:`inline_within`); each loop left is fused, split
    into vectors of up to :data:`REGISTERS` registers of its widest dtype, vectorized, and the
    rest run in parallel. Kernels with a reduction, a tensor read other than along the last
    axis (a transpose, a concatenation, a resize: LLVM's own loops gather better), or whose
    last block's axis is not a multiple of one register's lanes are left alone.
    dlight's ``ApplyDefaultSchedule`` calls :meth:`apply`.
    """

    def apply(self, func, target, tunable):  # noqa: ARG002 - dlight's rule signature
        from tvm import s_tir

        if not isinstance(func, tvm.tirx.PrimFunc) or target.kind.name != "llvm":
            return None
        sch = s_tir.Schedule(func)
        try:
            blocks = sch.get_child_blocks(sch.get_sblock("root"))
        except s_tir.ScheduleError:  # no root block: a kernel written as loops (TVM's NMS)
            return None
        if not all(_along(sch.get(block)) for block in blocks):
            return None  # before inlining: a fused detection head has hundreds of stages
        names = [sch.get(block).name_hint for block in blocks]
        left = vectorize_blocks(sch, names, target, INLINED_FLOPS, parallel=True)
        return sch if left and _vectorized(sch, left[-1]) else None


def _vectorized(sch, name) -> bool:
    loops = sch.get_loops(sch.get_sblock(name))
    return bool(loops) and sch.get(loops[-1]).kind == tvm.tirx.ForKind.VECTORIZED


__all__ = ["INLINED_FLOPS", "Elementwise", "calls", "calls_a_library", "inline_within",
           "register_lanes", "vector_step", "vectorize_blocks", "vectorize_loops"]
