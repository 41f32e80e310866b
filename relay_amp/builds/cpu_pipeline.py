"""A CPU compile pipeline whose dot products run in vector instructions.

TVM 0.27 compiles a Relax module for a CPU (``relax.backend.cpu_generic``) without any schedule:
each convolution and matmul is the loop nest ``LegalizeOps`` writes, its reduction loops
innermost, and LLVM leaves most of those scalar: one multiply-accumulate per ``fmadd``, two loads
and the loop's bookkeeping around it. On an aarch64 CPU that is five to seven executed
instructions per multiply-accumulate in float32 (counted on five registry models, docs/ARM.md),
more in float16 and bfloat16 (each operand widened on its own), so a converted model executes
more than its float32 original.

:func:`cpu_pipeline` is TVM's CPU pipeline with one schedule rule after fusion,
:class:`VectorizeDotProduct`: the kernel's dot-product block computes a vector of adjacent
outputs at once (the output's last axis), its reductions outside that vector, the partial sums
in a local buffer that LLVM keeps in registers. The order of each output's sum is unchanged, so
the numbers are those of the plain build up to FMA contraction; what changes is how many
instructions compute them.

``tvm.compile(mod, target, relax_pipeline=relay_amp.cpu_pipeline(target))``, or
:func:`relay_amp.builds.pipeline.build`, which takes it for every ``llvm`` target.
"""

from __future__ import annotations

import functools

import tvm

from ..relax_utils import last_line
from .batch_norm import inference_batch_norms
from .bfcvtn import round_in_tile, rounding_after, tensorize_rounding
from .bfdot import bfdot_tile, has_bfdot, packed_bfloat16_weights, tensorize_bfmlal
from .bfmmla import BfmmlaTile
from .constants import numpy_elementwise_constants, numpy_layout_constants
from .elementwise import INLINED_FLOPS, Elementwise, calls, register_lanes, vectorize_blocks
from .fast_math import vector_math
from .flops import expanded_flops
from .kernel_constants import constants_in_one_argument
from .neon_tiles import (
    has_fmlal,
    is_aarch64,
    lane_rows,
    operand_dtype,
    register_tile,
    tensorize_fmlal,
    tile_shape,
)
from .nhwc import nhwc_convolutions
from .outer_reduction import ReductionAlongOuterAxis
from .packed_weights import packed_weights
from .pooling import WindowReduction
from .prelu import elementwise_prelu
from .rounding_last import activations_before_rounding
from .scalar_constants import scalar_constants_inlined
from .schedule_rules import apply_rules, decide, llvm_blocks, uses
from .stacked_constants import stacked_constants
from .x86_tiles import UNROLLED_WIDTH, row_vectors, vector_registers, vector_width
from .x86_tiles import lane_rows as x86_lane_rows
from .x86_tiles import register_tile as x86_register_tile
from .x86_tiles import tile_shape as x86_tile_shape

#: Output lanes one vector of partial sums holds: the widest of these that divides the output's
#: last axis (16 float32 sums are four 128-bit NEON registers) ...
VECTOR_LANES = (16, 12, 8)
#: ... else its widest divisor from 4 to 16 (7 and 14, the last stages of a ResNet; the
#: lanes past a multiple of 4 are computed one by one).
MIN_LANES, MAX_LANES = 4, 16
#: Rows of outputs computed together, widest first (4 rows of 16 float32 lanes are 16 of NEON's
#: 32 vector registers).
BLOCK_ROWS = (4, 2)
#: Lanes of a bfloat16 depthwise tile on BFMLALB/BFMLALT: whole groups of eight channels
#: (:func:`~relay_amp.builds.bfdot.tensorize_bfmlal`).
BFMLAL_LANES = (16, 8)
#: Where a tile's partial sums live, by the target's architecture (measured, docs/PERFORMANCE.md
#: and docs/ARM.md). TVM lowers a CPU buffer of any scope but "global" to a
#: ``TVMBackendAllocWorkspace`` call, whose memory LLVM keeps: each FMA loads and stores its sum.
#: A "global" buffer under 1 KiB is a stack ``alloca`` that LLVM promotes to registers: on x86
#: that is 0.69-0.71 x the time and lets the tiles run in parallel (a workspace would be
#: allocated per tile). On aarch64 the tiles run in order; a tile whose update is tensorized keeps
#: its sums on the stack too, while one left to LLVM's SLP vectorizer keeps the workspace: on the
#: stack SLP rebuilds vectors of sums lane by lane (``ins``/``mov`` per lane;
#: face_detection_short_range's float32 build executed 1.73 x the instructions).
REGISTER_SUMS_ARCHES = ("x86_64", "i386", "i686")
#: The most float operations per output an epilogue folded into a tile's write-back may take,
#: as :func:`~relay_amp.builds.flops.expanded_flops` counts them: an expression read twice
#: counts twice, a ``Let``'s value at each use. Folding a consumer that uses its input k times
#: copies that input's expression k times (the polynomial ``exp`` of
#: :mod:`relay_amp.builds.fast_math` uses it about 25 times, bound once by ``Let``, which TVM's
#: LLVM code generation expands again at each use), so a chain of sigmoids folded whole grows
#: exponentially: 4 ops of a MatMul's epilogue built in 96 s, 10 in over 300 s
#: (docs/PERFORMANCE.md). A convolution's bias and SiLU cost 136, as do a MatMul's ReLU,
#: sigmoid and ReLU; a second sigmoid after them would cost about 8 times that.
EPILOGUE_FLOPS = 256
#: An epilogue costing more float operations per output than this, whose
#: ``EPILOGUE_TEMPORARIES`` vectors (an estimate of what the polynomial ``exp`` keeps live) on
#: all of a tile's lanes would fill the target's vector registers, is computed one register of
#: lanes at a time (:func:`_vectorize_by_registers`). Measured: a SiLU on 16 lanes at once,
#: 4 NEON registers a temporary, spilled (yolov8n_320, aarch64: 430.6 M instructions, 406.0 M a
#: register at a time); on AVX-512's 32 registers, 32 lanes at once did not need it, and the
#: split made yolov8n_320's TIR passes slower. A bias, a residual add or a ReLU6 (at most 4)
#: keeps all of the tile's lanes: split too, MobileNetV2 took 3 % more instructions on aarch64.
REGISTER_EPILOGUE_FLOPS = 16
EPILOGUE_TEMPORARIES = 8


def registers_hold_the_sums(target) -> bool:
    """Whether ``target``'s kernels keep a tile's partial sums in registers (and so run the
    tiles in parallel): :data:`REGISTER_SUMS_ARCHES`, by the target's ``mtriple`` or, without
    one, this machine's."""
    triple = target.attrs.get("mtriple") or tvm.target.codegen.llvm_get_system_triple()
    return str(triple).startswith(REGISTER_SUMS_ARCHES)


def lanes_for(extent: int, multiple: int = 1) -> int | None:
    """How many adjacent outputs of an axis of ``extent`` one vector of partial sums holds
    (None: the axis has no divisor from ``MIN_LANES`` to ``MAX_LANES``). ``multiple``: a
    divisor that is a multiple of it first, where one exists (FMLAL computes 4 lanes at once
    and the rest one by one; BFMLALB/T 8)."""
    for lanes in VECTOR_LANES:
        if extent % lanes == 0 and lanes % multiple == 0:
            return lanes
    for lanes in VECTOR_LANES:
        if extent % lanes == 0:
            return lanes
    divisors = [n for n in range(MIN_LANES, MAX_LANES + 1) if extent % n == 0]
    whole = [n for n in divisors if n % multiple == 0]
    return (whole or divisors or [None])[-1]


def _dot_product(block) -> bool:
    """Whether ``block`` updates its output as ``out = out + a * b`` (casts allowed)."""
    prim = tvm.ir.prim.expr
    body = block.body
    if not isinstance(body, tvm.tirx.BufferStore) or not isinstance(body.value, prim.Add):
        return False
    terms = (body.value.a, body.value.b)

    def uncast(value):
        while isinstance(value, prim.Cast):
            value = value.value
        return value

    accumulates = any(isinstance(t, tvm.ir.expr.TensorLoad) and t.source.same_as(body.buffer)
                      for t in terms)
    return accumulates and any(isinstance(uncast(t), prim.Mul) for t in terms)


def _lanes_in_pairs(block) -> bool:
    """Whether ``block``'s product reads its second operand as a ``(.., C, 1)`` vector of the
    lanes (a depthwise weight), which BFMLALB/BFMLALT read eight lanes at a time."""
    from .neon_tiles import _loads

    load = _loads(block)[1]
    if not isinstance(load, tvm.ir.expr.TensorLoad):
        return False
    last = load.source.shape[-1]
    return isinstance(last, tvm.tirx.IntImm) and int(last) == 1


def _vector_reads(block, axis) -> list:
    """The regions ``block`` reads that the lanes (``axis``) index."""
    return [region for region in block.reads
            if any(uses(r.min, axis.var) for r in region.region)]


def _weights_along_lanes(block, spatial, axis) -> list | None:
    """Which of ``spatial`` besides the lanes (``axis``) what the lanes index depends on (a
    convolution's or a matmul's weight: none; a matmul's packed weight: its panel), where it is
    read the same for some other spatial iterator (output pixels, rows); None where it is not
    (a depthwise convolution's input) or no read has the lanes. The tiles then run one block of
    lanes over all the rows before the next block: the block's weights stay in cache while the
    rows stream, where the other order reads every weight again for each tile of rows (x86,
    one 3 x 3 or 1 x 1 convolution of ResNet-50 alone: 0.78-1.0 x the time)."""
    vector_reads = _vector_reads(block, axis)
    used = [n for n, it in enumerate(spatial) if it is not axis and any(
        uses(r.min, it.var) for region in vector_reads for r in region.region)]
    return used if vector_reads and len(used) < len(spatial) - 1 else None


def _shared_rows(block, spatial, axis) -> list:
    """The spatial iterators whose adjacent values share the vector operand (no read that the
    lanes index depends on them: a convolution's output pixels, a matmul's rows), innermost
    first."""
    vector_reads = _vector_reads(block, axis)
    return [it for it in reversed(spatial) if it is not axis and not any(
        uses(r.min, it.var) for region in vector_reads for r in region.region)]


def _row_block(block, spatial, axis):
    """``(rows, iterator)``: the spatial iterator whose ``rows`` adjacent values share the
    vector operand (:func:`_shared_rows`) and so are computed together, each vector loaded once
    for all of them; where no constant extent divides, a symbolic one (a sequence length, which
    :class:`VectorizeDotProduct` pads to a multiple of the rows); ``(1, None)`` where neither
    exists."""
    shared = _shared_rows(block, spatial, axis)
    for rows in BLOCK_ROWS:
        for it in shared:
            if isinstance(it.dom, (int, tvm.tirx.IntImm)) and int(it.dom) % rows == 0:
                return rows, it
    symbolic = [it for it in shared if not isinstance(it.dom, (int, tvm.tirx.IntImm))]
    return (BLOCK_ROWS[0], symbolic[0]) if symbolic else (1, None)


def _aarch64_tile(block, spatial, axis, shape, kind: str | None, pad_lanes: bool):
    """``(lanes, rows, row iterator)`` of an aarch64 register tile of ``kind`` ("tile": float32
    or FMLAL, "bfdot"; None: no register tile), from ``shape``, the one :func:`_row_block`
    chose: :func:`_register_tile_shape` where the rows are constant, then, without rows,
    :func:`_weight_rows` (for BFMLALB/BFMLALT, 8 lanes: :data:`BFMLAL_LANES`). ``shape``
    itself where the lanes or the rows are padded (a symbolic extent)."""
    lanes, rows, row_axis = shape
    if kind is None or pad_lanes or row_axis is not None and not isinstance(
            row_axis.dom, (int, tvm.tirx.IntImm)):
        return shape
    bfdot = kind == "bfdot"
    if not (bfdot and _lanes_in_pairs(block)):
        lanes, rows, row_axis = _register_tile_shape(block, spatial, axis, lanes, rows,
                                                     row_axis)
    if row_axis is None and (not bfdot or _lanes_in_pairs(block)):
        lanes, rows, row_axis = _weight_rows(
            block, spatial, axis, lanes, rows, row_axis,
            functools.partial(lane_rows, lanes_options=BFMLAL_LANES) if bfdot else lane_rows)
    return lanes, rows, row_axis


def _einsum(block) -> bool:
    """Whether every index ``block`` reads and writes is one of its iterators or a constant (a
    matmul; not a convolution's ``y + ry``): TVM's ``pad_einsum`` can pad its row axes."""
    return all(isinstance(r.min, tvm.tirx.IntImm) or any(r.min.same_as(iv.var)
                                                        for iv in block.iter_vars)
               for region in (*block.reads, *block.writes) for r in region.region)


def _x86_tile(block, spatial, axis, shape, width: int, registers: int, pad_lanes: bool):
    """``(lanes, rows, row iterator)`` of an x86 register tile of ``width``-lane vectors
    (:func:`relay_amp.builds.x86_tiles.tile_shape`) over the constant row axes (padded to the
    tile's rows where the block is an :func:`_einsum` and that loads less an FMA), or over the
    symbolic one (padded to whatever rows the tile takes); without either, rows that share the
    weight vectors (:func:`_weight_rows`); without those, one row (a matrix by a vector: a
    classifier's last layer at batch 1) of as many vectors of lanes as the tile takes, so each
    is a chain of FMAs of its own (one vector's chain waits 4 cycles an FMA: ResNet-50's 2048 x
    1000 layer on znver4 took 0.173 ms with 16 lanes, 0.104 ms with 64, as ONNX Runtime's
    Gemm); ``shape`` itself where none fits or the lanes are padded."""
    lanes, rows, row_axis = shape
    if pad_lanes:
        return shape
    if row_axis is not None and not isinstance(row_axis.dom, (int, tvm.tirx.IntImm)):
        candidates, extents = [row_axis], [None]
    else:
        candidates = [it for it in _shared_rows(block, spatial, axis)
                      if isinstance(it.dom, (int, tvm.tirx.IntImm))]
        extents = [int(it.dom) for it in candidates]
    vector_reads = _vector_reads(block, axis)
    outputs = int(axis.dom)
    for it in spatial:  # a packed weight's panels: the lanes of a row's other tiles
        if it is not axis and isinstance(it.dom, (int, tvm.tirx.IntImm)) and any(
                uses(r.min, it.var) for region in vector_reads for r in region.region):
            outputs *= int(it.dom)
    tile = x86_tile_shape(int(axis.dom), extents, width, registers, paddable=_einsum(block),
                          outputs=outputs)
    if tile is None and row_axis is None:  # a depthwise convolution: rows share its weight
        lanes, rows, row_axis = _weight_rows(
            block, spatial, axis, *shape,
            lambda extent, channels: x86_lane_rows(extent, channels, UNROLLED_WIDTH, registers))
        if row_axis is None:  # one row (a matrix by a vector): a chain of FMAs a vector
            vectors = row_vectors(int(axis.dom), width)
            if vectors is not None:
                lanes = vectors * width
                decide(f"one row: {vectors} vector(s) of lanes, each its own chain of FMAs")
        return lanes, rows, row_axis
    return shape if tile is None else (tile[0], tile[1], candidates[tile[2]])


def _weight_rows(block, spatial, axis, lanes, rows, row_axis, shape_of=lane_rows):
    """``(lanes, rows, row iterator)`` where no row shares both vector operands but one does
    not depend on a constant spatial axis (a depthwise convolution's weight, the same for every
    output pixel): that axis's rows (``shape_of(extent, channels)``: NEON's
    :func:`~relay_amp.builds.neon_tiles.lane_rows`, or x86's) load each weight vector once for
    all of them; else the ones given."""
    vector_reads = _vector_reads(block, axis)
    candidates = [it for it in reversed(spatial) if it is not axis
                  and isinstance(it.dom, (int, tvm.tirx.IntImm)) and any(
                      not any(uses(r.min, it.var) for r in region.region)
                      for region in vector_reads)]
    for it in candidates:
        shape = shape_of(int(it.dom), int(axis.dom))
        if shape is not None:
            return (*shape, it)
    return lanes, rows, row_axis


def _register_tile_shape(block, spatial, axis, lanes, rows, row_axis):
    """``(lanes, rows, row iterator)`` for an aarch64 register tile: :func:`tile_shape` over
    the constant row axes (a 7- or 14-wide feature map gets 7 rows of 8 lanes, not 1 or 2 of
    16), else the ones given."""
    constant = [it for it in _shared_rows(block, spatial, axis)
                if isinstance(it.dom, (int, tvm.tirx.IntImm))]
    shape = tile_shape(int(axis.dom), [int(it.dom) for it in constant])
    if shape is None:
        return lanes, rows, row_axis
    tile_lanes, tile_rows, n = shape
    return tile_lanes, tile_rows, constant[n]


def _is_copy(block) -> bool:
    """Whether ``block`` only copies one buffer into another at the same indices (the
    ``pad_temp`` TVM's convolutions make where there is no padding)."""
    import tvm_ffi

    body = block.body
    if not isinstance(body, tvm.tirx.BufferStore):
        return False
    value = body.value
    return (isinstance(value, tvm.ir.expr.TensorLoad) and len(value.indices) == len(body.indices)
            and all(tvm_ffi.structural_equal(a, b)
                    for a, b in zip(value.indices, body.indices)))


def _input_copies(sch, block_rv, parallel: bool) -> None:
    """The copies a kernel makes of its inputs before its dot product (TVM's ``pad_temp``): one
    without padding is inlined, so the dot product reads the input in place; a padded one is
    vectorized over its last axis (:func:`lanes_for` of it) and, with ``parallel``,
    runs its rows in parallel. TVM's pipeline leaves both a scalar loop over the whole input,
    one load and one store per element."""
    from tvm import s_tir

    for producer in sch.get_producers(block_rv):
        block = sch.get(producer)
        if len(block.reads) == 1 and _is_copy(block):
            try:
                sch.compute_inline(producer)
                continue
            except s_tir.ScheduleError:
                pass
        loops = sch.get_loops(producer)
        extent = sch.get(loops[-1]).extent if loops else None
        if not isinstance(extent, (int, tvm.tirx.IntImm)) or len(loops) < 2:
            continue
        width = lanes_for(int(extent))
        if width is None:
            continue
        try:
            *outer, last = loops
            _, inner = sch.split(last, [None, width])
            sch.vectorize(inner)
            if parallel:
                sch.parallel(sch.fuse(*outer) if len(outer) > 1 else outer[0])
        except s_tir.ScheduleError:
            continue


def _covers(sch, consumer, producer) -> bool:
    """Whether ``consumer`` reads ``producer``'s output at an iterator on every axis of more
    than one point. TVM's ``reverse_compute_inline`` takes a read at a constant for
    elementwise too (a matmul's one real column of 32 computed, ``sums[0, 0, 0]``: its index
    simplified to 0), and the inlined block then wrote every computed column into the one
    output, the last, a zero, winning; a read at an iterator over fewer points (a padded
    result's copy) it guards with a predicate."""
    buffer = sch.get(producer).writes[0].source
    for region in sch.get(consumer).reads:
        if region.source.same_as(buffer) and any(
                isinstance(span.min, tvm.tirx.IntImm) and not (
                    isinstance(extent, tvm.tirx.IntImm) and int(extent) == 1)
                for span, extent in zip(region.region, buffer.shape)):
            return False
    return True


def _fold(sch, consumer, producer) -> str | None:
    """Fold ``consumer`` into ``producer``, the block it reads, in place; the reason it is not
    folded, None where it is."""
    from tvm import s_tir

    if _covers(sch, consumer, producer):
        try:
            sch.reverse_compute_inline(consumer)
            return None
        except s_tir.ScheduleError:  # not elementwise in the tile's output
            pass
        except tvm.error.InternalError as err:  # on a trial copy (_inline_epilogue's)
            # TVM's own bound check fails on some broadcasts (se_resnext50_32x4d's
            # squeeze-and-excitation scale), which cost the whole kernel its tile
            return f"TVM's reverse_compute_inline failed its own check ({last_line(err)})"
    else:
        return ("it reads the tile's result at a constant index on an axis of more than one "
                "point")
    try:  # the copy out of a padded result: the epilogue reads the padded one
        sch.compute_inline(consumer)
    except (s_tir.ScheduleError, tvm.error.InternalError):  # it stays a loop
        return "it is not elementwise in the tile's result"
    return None


def _inline_epilogue(sch, write_back, round_apart: bool = False) -> tuple:
    """Fold the elementwise blocks that read the tile's result (a bias, an activation, a
    residual add: the epilogue TVM fused into the kernel) into its write-back, one consumer at a
    time while each is the only reader and the write-back's arithmetic stays within
    :data:`EPILOGUE_FLOPS`: the epilogue runs on the tile in registers, vectorized and in
    parallel, and no intermediate buffer is left for it to load back. Where several blocks read
    the result (a SiLU's ``x * sigmoid(x)``), one of them is first inlined into its own readers,
    within the same bound, until one is left. The rest stays in loops of its own, as TVM leaves
    it. With ``round_apart``, the kernel's rounding to bfloat16 is left out
    (:func:`~relay_amp.builds.bfcvtn.rounding_after`: it runs on BFCVTN). Returns ``(the
    schedule, the blocks folded or inlined, why the rest was not)``, the reason None where
    nothing is left but such a rounding; the schedule is ``sch`` or the trial's copy that
    folded the last block (its random variables are ``sch``'s)."""
    folded = []
    while consumers := sch.get_consumers(write_back):
        if round_apart and rounding_after(sch, write_back) is not None:
            return sch, folded, None
        names = [sch.get(c).name_hint for c in consumers]
        if len(consumers) == 1:
            trial = sch.copy()
            reason = _fold(trial, consumers[0], write_back)
            flops = _flops(trial, write_back) if reason is None else 0
            if flops > EPILOGUE_FLOPS:
                reason = (f"folded, the write-back would take {flops:.0f} float operations an "
                          f"output, over {EPILOGUE_FLOPS}")
            if reason is not None:
                return sch, folded, f"{names[0]}: {reason}"
            sch = trial
            folded.append(names[0])
            continue
        trials = ((n, sch.copy()) for n in range(len(consumers)))
        inlined = next(((n, trial) for n, trial in trials
                        if _inline_into_readers(trial, consumers[n])), None)
        if inlined is None:
            return sch, folded, (f"{', '.join(names)} read the result, and none inlines into "
                                 f"its readers within {EPILOGUE_FLOPS} float operations an "
                                 "output")
        sch = inlined[1]
        folded.append(names[inlined[0]])
    return sch, folded, None


def _update_on_rows(sch, loops, lanes: int, scope: str, kind: str | None) -> bool:
    """The update of a tile no register tile reads (``loops``: the tile, lanes and rows
    loops): each row on FMLAL or BFMLALB/BFMLALT (``kind``) where it applies, else its rows
    and lanes unrolled for LLVM's vectorizer. Whether it is tensorized."""
    tile, inner, row_inner = loops
    tensorized = True
    if kind == "fmlal" and tensorize_fmlal(sch, inner, lanes, scope):
        decide("update: FMLAL on each row")
    elif kind == "bfmlal" and tensorize_bfmlal(sch, tile, inner, lanes, scope):
        decide("update: BFMLALB/BFMLALT on each row")
    else:
        tensorized = False
        sch.unroll(inner)
        decide("update: rows and lanes unrolled for LLVM's vectorizer (no register tile "
               "reads this update)")
    if row_inner is not None:
        sch.unroll(row_inner)
    return tensorized


def _round_apart(sch, write_back, tile) -> tuple:
    """``(sch, None)``, or ``(a copy of it, its rounding's lanes loop)`` in which the rounding
    to bfloat16 after ``write_back`` (left there by :func:`_inline_epilogue`'s
    ``round_apart``) runs in the ``tile`` (:func:`~relay_amp.builds.bfcvtn.round_in_tile`),
    for :func:`~relay_amp.builds.bfcvtn.tensorize_rounding` once the tile is done. Where it
    cannot, or the write-back calls a function (``exp``: LLVM calls ``expf`` on aarch64, and
    a call takes the vector registers, so the tile's values would go through the stack; a
    library function's write-back is a loop), the rounding is folded into the write-back as
    before: YOLOv8n's SiLUs, rounded apart, executed 1.6 % more instructions."""
    rounding = rounding_after(sch, write_back)
    if rounding is None:
        return sch, None
    if calls(sch.get(write_back).body):
        decide("rounding to bfloat16 folded into the write-back, not on BFCVTN: the epilogue "
               "calls a function, which takes the registers")
    else:
        rounded = round_in_tile(sch, write_back, rounding, tile)
        if rounded is not None:
            return rounded
        decide("rounding to bfloat16 folded into the write-back, not on BFCVTN: it cannot run "
               "in the tile on the values the tile writes alone")
    sch, _, _ = _inline_epilogue(sch, write_back)
    return sch, None


def _inline_into_readers(sch, block) -> bool:
    """Inline ``block`` into the blocks that read it, in place, where each stays within
    :data:`EPILOGUE_FLOPS`; False where it does not (``sch`` is then a trial's copy to drop)."""
    from tvm import s_tir

    readers = sch.get_consumers(block)
    try:
        sch.compute_inline(block)
    except s_tir.ScheduleError:
        return False
    return bool(readers) and all(_flops(sch, r) <= EPILOGUE_FLOPS for r in readers)


def _vectorize_by_registers(sch, block, target, stacked: bool = False) -> None:
    """Vectorize ``block``'s last loop (a tile's write-back, its epilogue folded in, or the
    initialisation of its sums); where the epilogue costs more than
    :data:`REGISTER_EPILOGUE_FLOPS` and its :data:`EPILOGUE_TEMPORARIES` on all of the loop's
    lanes would not fit in the target's vector registers, one register of lanes at a time.
    With ``stacked`` sums (on the stack) whose lanes are not a power of two, one register at
    a time too, unrolled: LLVM promotes the stack buffer to one vector of the accesses'
    width, and the AArch64 backend splits a ``<12 x float>`` lane by lane (face_landmark's
    float16 head, 1,404 outputs on 12 lanes, executed 0.85 M instructions against 0.38 M)."""
    loop = sch.get_loops(block)[-1]
    extent = sch.get(loop).extent
    bits = max(tvm.DataType(str(region.source.dtype)).bits
               for region in (*sch.get(block).reads, *sch.get(block).writes))
    lanes = register_lanes(target, bits)
    registers = vector_registers(target) if vector_width(target) else 32
    whole = lanes and isinstance(extent, (int, tvm.tirx.IntImm)) and int(extent) % lanes == 0
    odd = stacked and whole and int(extent) > lanes and int(extent) & (int(extent) - 1)
    if odd or whole and int(extent) // lanes * EPILOGUE_TEMPORARIES >= registers \
            and _flops(sch, block) > REGISTER_EPILOGUE_FLOPS:
        outer, loop = sch.split(loop, [None, lanes])
        if odd:
            sch.unroll(outer)
    sch.vectorize(loop)


def _vectorize_rest(sch, write_back, target, parallel: bool) -> None:
    """Run the blocks after the epilogue folded into ``write_back`` (what
    :data:`EPILOGUE_FLOPS` left out) as loops of vectors, in parallel with ``parallel``, a
    block inlined into its readers while they stay within
    :data:`~relay_amp.builds.elementwise.INLINED_FLOPS` (:func:`vectorize_blocks`). Left to
    LLVM, a polynomial ``exp`` on 512 outputs, its temporaries bound by ``Let``, was small
    enough for LLVM to unroll whole: a MatMul with 100 ReLU and sigmoid ops after it built in
    102 s, against TVM's 29 s. A loop of at most :data:`REGISTER_EPILOGUE_FLOPS` (a residual
    add and a ReLU) keeps LLVM's own: on 28 channels, one register a step added 0.8 % to
    face_detection_short_range's aarch64 instructions."""
    names, queue = [], [sch.get(b).name_hint for b in sch.get_consumers(write_back)]
    while queue:
        name = queue.pop(0)
        if name not in names:
            names.append(name)
            queue.extend(sch.get(b).name_hint for b in sch.get_consumers(sch.get_sblock(name)))
    vectorize_blocks(sch, names, target, INLINED_FLOPS, parallel, REGISTER_EPILOGUE_FLOPS)


def _rows_beside_lanes(sch, block_rv, row_axis) -> None:
    """Reorder the dimensions of ``block_rv``'s sums buffer (its ``cache_write``) so that the
    tile's rows (``row_axis``) come just before its lanes, the last: a register tile's sums are
    then one ``rows x lanes`` region, as its intrinsic reads them. A matmul whose output is
    ``[rows, weight panel, lanes]`` (:mod:`relay_amp.builds.packed_weights`) or a convolution
    tiled along its height has an axis of one between them, which the intrinsic cannot match."""
    if row_axis is None:
        return
    indices = sch.get(block_rv).writes[0].region
    position = next((n for n, r in enumerate(indices) if r.min.same_as(row_axis.var)), None)
    last = len(indices) - 1
    if position is None or position >= last - 1:
        return
    order = [*range(position), *range(position + 1, last), position, last]
    sch.transform_layout(block_rv, ("write", 0), lambda *dims: [dims[n] for n in order])


def _tile_text(block, axis, lanes: int, rows: int, row_axis, pad_lanes: bool,
               pad_rows: bool) -> str:
    """The tile's shape as the report gives it: output axes by position."""
    position = {r.min.name if hasattr(r.min, "name") else None: n
                for n, r in enumerate(block.writes[0].region)}

    def where(it, count, what, padded):
        extent = it.dom if isinstance(it.dom, (int, tvm.tirx.IntImm)) else f"{it.dom} (symbolic)"
        text = f"{count} {what} of output axis {position.get(it.var.name, '?')} ({extent})"
        return text + (f", padded to a multiple of {count}" if padded else "")

    text = f"tile: {where(axis, lanes, 'lanes', pad_lanes)}"
    return text + (f" x {where(row_axis, rows, 'rows', pad_rows)}" if row_axis is not None
                   else "")


def _flops(sch, block) -> float:
    """Float operations per output of ``block``'s body, an expression read twice counted twice
    (:func:`~relay_amp.builds.flops.expanded_flops`)."""
    return expanded_flops(sch.get(block).body)


def _register_tile(sch, loops, lanes: int, rows: int, scope: str, kind: str | None,
                   width: int | None):
    """A copy of ``sch`` whose tile (``loops``: the tile, lanes, rows and reduction loops) runs
    on the register tile of ``kind`` ("bfdot", "x86" of ``width`` lanes a vector, "tile": the
    aarch64 one), or None where there is none or it does not apply."""
    tile, inner, row_inner, reduce = loops
    if kind == "bfdot":
        return bfdot_tile(sch, tile, inner, row_inner, reduce, lanes, rows, scope)
    if kind == "x86":
        return x86_register_tile(sch, tile, inner, row_inner, reduce, lanes, rows, width, scope)
    if kind == "tile":
        return register_tile(sch, inner, row_inner, reduce, lanes, rows, scope)
    return None


class VectorizeDotProduct:
    """A dlight schedule rule for ``llvm`` targets: a kernel with one dot-product block (a
    convolution, a matmul) computes adjacent outputs of its last axis at once
    (:func:`lanes_for`).

    The loops become ``[spatial loops..., the last axis / lanes, reduction loops..., rows,
    lanes]``: ``rows`` (``BLOCK_ROWS``) adjacent values of another spatial axis that the vector
    operand does not depend on (:func:`_row_block`) reuse each vector it loads. The partial sums
    live in a buffer written back once per tile (``cache_write``; in registers and the tiles in
    parallel where :func:`registers_hold_the_sums`), initialised by a vectorized loop; the
    elementwise epilogue TVM fused after the kernel is computed in the write-back
    (:func:`_inline_epilogue`); the update's rows and lanes are unrolled, which LLVM's SLP
    vectorizer turns into vector FMAs. On aarch64 the update is tensorized instead where
    :mod:`relay_amp.builds.neon_tiles` has an intrinsic for it (a register tile reading the
    scalars as lanes, in float32 and float16; FMLAL for float16 with ``+fp16fml``, whose lanes
    are then a multiple of 4 where the axis allows); on x86 with AVX2 or AVX-512, float32
    tiles run on :mod:`relay_amp.builds.x86_tiles`' explicit vectors of the target's width,
    their shape chosen by :func:`_x86_tile`. Kernels with another reduction, with a
    last axis that has no divisor from 4 to 16 (:func:`lanes_for`), or whose loops are not one
    per block iterator are left alone.
    dlight's ``ApplyDefaultSchedule`` calls :meth:`apply`.
    """

    def apply(self, func, target, tunable):  # noqa: ARG002 - dlight's rule signature
        from tvm import s_tir
        from tvm.s_tir.dlight.analysis import normalize_prim_func

        start = llvm_blocks(func, target)
        if start is None:
            return None
        sch, infos = start
        reductions = [info for info in infos if any(it.kind == "R" for it in info.iters)]
        if len(reductions) != 1 or not _dot_product(sch.get(reductions[0].block_rv)):
            return None
        info = reductions[0]
        block = sch.get(info.block_rv)
        last = block.writes[0].region[-1]
        spatial = [it for it in info.iters if it.kind == "S"]
        reduce = [it for it in info.iters if it.kind == "R"]
        if not all(it.kind in "SR" for it in info.iters) or not spatial:
            decide("its dot product's loops are not one per spatial or reduction iterator")
            return None
        axis = next((it for it in spatial if last.min.same_as(it.var)), None)
        if axis is None:
            decide("its output's last axis is not one of the dot product's loops")
            return None
        dtype = operand_dtype(block)
        fmlal = has_fmlal(target) and dtype == "float16"
        bfdot = has_bfdot(target) and dtype == "bfloat16"
        tiles = fmlal or (dtype == "float32" and is_aarch64(target))
        width = vector_width(target) if dtype == "float32" else None
        # a symbolic last axis (attention's scores over a sequence length) is padded to
        # a multiple of the widest lanes, as a symbolic row axis is to the rows
        pad_lanes = not isinstance(axis.dom, (int, tvm.tirx.IntImm))
        lanes = VECTOR_LANES[0] if pad_lanes else lanes_for(
            int(axis.dom), 8 if bfdot and _lanes_in_pairs(block) else 4 if fmlal or bfdot else 1)
        if lanes is None:
            decide(f"its output's last axis ({axis.dom}) has no divisor from {MIN_LANES} to "
                   f"{MAX_LANES}")
            return None
        in_registers = registers_hold_the_sums(target)
        _input_copies(sch, info.block_rv, in_registers)
        block = sch.get(info.block_rv)
        lanes_outer = _weights_along_lanes(block, spatial, axis)
        rows, row_axis = _row_block(block, spatial, axis)
        lanes, rows, row_axis = _aarch64_tile(block, spatial, axis, (lanes, rows, row_axis),
                                              "bfdot" if bfdot else "tile" if tiles else None,
                                              pad_lanes)
        if width is not None:
            lanes, rows, row_axis = _x86_tile(block, spatial, axis, (lanes, rows, row_axis),
                                              width, vector_registers(target), pad_lanes)
        try:
            pad_rows = row_axis is not None and (
                not isinstance(row_axis.dom, (int, tvm.tirx.IntImm)) or int(row_axis.dom) % rows)
            if pad_rows and bfdot:  # the padded copy would be a bfloat16 buffer of the
                # kernel's own, which TVM stores in float32: bfdot reads one row at a time
                rows, row_axis, pad_rows = 1, None, False
                decide("one row a tile: BFDOT cannot read a padded bfloat16 copy")
            decide(_tile_text(block, axis, lanes, rows, row_axis, pad_lanes, pad_rows))
            stacked = not in_registers and is_aarch64(target)
            decide("sums in registers, tiles in parallel" if in_registers else
                   "sums on the stack, tiles in order (registers_hold_the_sums)" if stacked else
                   "sums in a local buffer, tiles in order (registers_hold_the_sums)")
            if pad_rows or pad_lanes:
                # a symbolic extent (a sequence length), or a constant one no tile divides,
                # is padded to a multiple of the rows or lanes: the padded outputs are zeros
                # computed and never written out
                position = {id(it): n for n, it in enumerate(info.iters)}
                sch.pad_einsum(info.block_rv, [
                    rows if it is row_axis and pad_rows else lanes if it is axis and pad_lanes
                    else 1 for it in info.iters])
                info = next(i for i in normalize_prim_func(sch) or ()
                            if any(it.kind == "R" for it in i.iters))
                spatial = [info.iters[position[id(it)]] for it in spatial]
                reduce = [info.iters[position[id(it)]] for it in reduce]
                axis = info.iters[position[id(axis)]]
                if row_axis is not None:
                    row_axis = info.iters[position[id(row_axis)]]
            outer, inner = sch.split(axis.loop_rv, [None, lanes])
            row_outer = row_inner = None
            if row_axis is not None:
                row_outer, row_inner = sch.split(row_axis.loop_rv, [None, rows])
            loops = [row_outer if it is row_axis else it.loop_rv
                     for n, it in enumerate(spatial) if it is not axis
                     and (lanes_outer is None or n not in lanes_outer)]
            order = [*loops, outer] if lanes_outer is None else [
                *(spatial[n].loop_rv for n in lanes_outer), outer, *loops]
            sch.reorder(*order, *(it.loop_rv for it in reduce),
                        *([row_inner] if row_inner is not None else []), inner)
            tile = sch.fuse(*order) if len(order) > 1 else outer
            if in_registers:
                sch.parallel(tile)
            scope = "global" if in_registers or stacked else "local"
            write_back = sch.cache_write(info.block_rv, 0, scope)
            _rows_beside_lanes(sch, info.block_rv, row_axis)
            sch.reverse_compute_at(write_back, tile)
            sch, folded, refused = _inline_epilogue(sch, write_back, round_apart=bfdot)
            if folded:
                decide(f"epilogue folded into the write-back: {', '.join(folded)}")
            if refused:
                decide(f"left in loops of their own: {refused}")
            init = sch.decompose_reduction(info.block_rv, reduce[0].loop_rv)
            _vectorize_by_registers(sch, init, target, stacked)
            _vectorize_by_registers(sch, write_back, target, stacked)
            sch, rounding = _round_apart(sch, write_back, tile)
            if rounding is None:  # else the rounding was all that was left
                _vectorize_rest(sch, write_back, target, in_registers)
            tiled = _register_tile(sch, (tile, inner, row_inner, [it.loop_rv for it in reduce]),
                                   lanes, rows, scope,
                                   "bfdot" if bfdot else "x86" if width else "tile" if tiles
                                   else None, width)
            if tiled is None:
                tiled = sch
                if not _update_on_rows(sch, (tile, inner, row_inner), lanes, scope,
                                       "fmlal" if fmlal else "bfmlal" if bfdot else None) \
                        and stacked:
                    # LLVM's SLP vectorizer rebuilds vectors of sums on the stack lane by lane
                    sch.set_scope(info.block_rv, 0, "local")
                    decide("sums in a local buffer: the update is left to LLVM's vectorizer")
            if rounding is not None:
                tensorize_rounding(tiled, tile, rounding)
            return tiled
        except s_tir.ScheduleError as err:  # a kernel this cannot schedule keeps TVM's loops
            decide(f"not scheduled: {last_line(err)}")
            return None
        return sch


def cpu_pipeline(target, relay_amp_schedules: bool = True, rule_log=None):
    """TVM's CPU compile pipeline with :class:`VectorizeDotProduct` after fusion, then
    :class:`~relay_amp.builds.outer_reduction.ReductionAlongOuterAxis` (softmax and
    normalizations over an axis other than the innermost),
    :class:`~relay_amp.builds.pooling.WindowReduction` (pooling in NHWC), dlight's CPU
    ``Reduction`` rule
    (the others: rows in parallel, elementwise parts vectorized, the sums in their order),
    :class:`~relay_amp.builds.elementwise.Elementwise` (kernels of spatial blocks only: one
    parallel loop of vectors) and, before legalization, inference batch_norm as elementwise
    ops (:mod:`relay_amp.builds.batch_norm`) and, on aarch64 and on x86 with AVX2 or
    AVX-512, convolutions in NHWC (:mod:`relay_amp.builds.nhwc`); on x86, their float32
    weights packed in panels of the tile's lanes (:mod:`relay_amp.builds.packed_weights`);
    with ``+bf16``, a ReLU or clip of a value rounded to bfloat16 applied before the rounding
    (:mod:`relay_amp.builds.rounding_last`) and bfloat16 convolutions and matmuls over weights
    packed for BFMMLA or BFDOT (:mod:`relay_amp.builds.bfmmla`, :mod:`relay_amp.builds.bfdot`),
    the BFMMLA kernels scheduled first by :class:`~relay_amp.builds.bfmmla.BfmmlaTile`.
    Before legalization, elementwise ops and layouts of constants are computed in numpy
    (:func:`~relay_amp.builds.constants.numpy_elementwise_constants`,
    :func:`~relay_amp.builds.constants.numpy_layout_constants`), where ``FoldConstant`` would
    compile a kernel for each. After fusion and before the rules, a kernel's 0-d constants
    become immediates (:mod:`relay_amp.builds.scalar_constants`) and its constant tensors of
    one shape one stacked argument (:mod:`relay_amp.builds.stacked_constants`).

    Parameters
    ----------
    target : tvm.target.Target or dict
        An ``llvm`` target (any CPU: aarch64, x86).
    relay_amp_schedules : bool
        False: TVM's CPU pipeline as ``tvm.compile`` runs it.
    rule_log : relay_amp.builds.schedule_rules.RuleLog, optional
        A rule that raises on a kernel leaves it as TVM legalized it instead of failing the
        build; this log records which rule raised on which kernel.

    Returns
    -------
    tvm.transform.Pass
        For ``tvm.compile(mod, target, relax_pipeline=...)``.
    """
    from tvm.relax.backend.cpu_generic import pipeline
    from tvm.s_tir.dlight import cpu as dlight_cpu

    target = target if isinstance(target, tvm.target.Target) else tvm.target.Target(target)
    rules = [*([BfmmlaTile()] if has_bfdot(target) else []), VectorizeDotProduct(),
             ReductionAlongOuterAxis(), WindowReduction(), dlight_cpu.Reduction(), Elementwise()]
    schedules = [apply_rules(rules, rule_log)] if relay_amp_schedules else []
    layouts = [nhwc_convolutions(rule_log)] if relay_amp_schedules and (
        is_aarch64(target) or vector_width(target)) else []
    if relay_amp_schedules and vector_width(target):
        layouts.append(packed_weights(target))
    if relay_amp_schedules and has_bfdot(target):
        # the activations first: the layouts move a clip as the kernel it is then
        layouts = [activations_before_rounding(rule_log), *layouts,
                   packed_bfloat16_weights(rule_log)]
    if relay_amp_schedules:
        # exp after the layouts: ConvertLayout sees relax.sigmoid, not a kernel
        layouts = [inference_batch_norms(), elementwise_prelu(), *layouts,
                   vector_math(polynomial_erf_tanh=not is_aarch64(target)),
                   numpy_elementwise_constants(), numpy_layout_constants()]
    passes = tvm.transform.Sequential(
        pipeline.library_dispatch_passes(target) + layouts + pipeline.legalize_passes(target)
        + ([scalar_constants_inlined(rule_log), stacked_constants(rule_log)]
           if relay_amp_schedules else []) + schedules
        # not on aarch64: there a view's offset took paired loads (``ldp q``) out of reach of
        # a weight or of a bias, and the float32 builds executed up to 2 % more (docs/ARM.md)
        + ([constants_in_one_argument(rule_log)]
           if relay_amp_schedules and not is_aarch64(target) else [])
        + pipeline.dataflow_lower_passes(target) + pipeline.finalize_passes(target))

    @tvm.transform.module_pass(opt_level=0, name="relay_amp.cpu_pipeline")
    def _pipeline(mod, context):
        with target:
            return passes(mod)

    return _pipeline


__all__ = ["BLOCK_ROWS", "EPILOGUE_FLOPS", "REGISTER_EPILOGUE_FLOPS", "REGISTER_SUMS_ARCHES",
           "VECTOR_LANES", "VectorizeDotProduct", "cpu_pipeline", "lanes_for",
           "registers_hold_the_sums"]
