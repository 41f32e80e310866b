"""bfloat16 convolutions and matmuls on BFMMLA (FEAT_BF16, ``+bf16``): sixteen
multiply-accumulates per instruction, where ``bfdot`` does eight and ``fmla v.4s`` four.

``bfmmla v.4s, a.8h, b.8h`` adds to a 2 x 2 block of float32 sums (``v[2i + j]``) the
products of two rows of four bfloat16 values (``a[4i + r]``) and two columns of four
(``b[4j + r]``). Both operands are pairs of four values along the reduction, so both are
packed:

- the weight once, at build time (:func:`packed_weight`): ``W'[k / 4, n / 2, n % 2, k % 4]``;
- the input in the kernel, once per call (:func:`_im2col`): every pair of output pixels'
  receptive fields, four values of the reduction of one pixel beside the same four of the next
  (``A'[m / 2, k / 4, m % 2, k % 4]``), so that a pair of rows is one 128-bit load. A
  convolution's reduction is its window's taps times its input channels, each tap's channels
  rounded up to four with zeros; a matmul's is its last axis.

The sums are kept in the instruction's own layout (``C'[m / 2, n / 2, m % 2, n % 2]``), a
register tile of :data:`TILE_PAIRS` x :data:`TILE_PAIRS` blocks (8 pixels by 8 channels: 16
sums, 4 + 4 loads per 16 ``bfmmla``), and copied to the output in NHWC with the epilogue TVM
fused after the kernel. LLVM selects ``bfmmla`` only from its intrinsic, whose operands TVM's
bfloat16 legalization would turn into float32 vectors: the kernel passes 16-bit patterns to a
function in LLVM IR (:data:`LLVM_IR`) linked into the library and inlined, as
:mod:`relay_amp.builds.bfdot` does.

BFMMLA rounds as BFDOT does (Arm's ``BFMatMulAdd``: the four products of a row and column
summed before they are added, denormals flushed), so the outputs equal the plain bfloat16
build's to float32 rounding of the sums, not bit for bit.
"""

from __future__ import annotations

import tvm

from ..relax_utils import last_line
from .schedule_rules import decide, link_llvm, llvm_blocks
from .tir_script import script

#: ``relay_amp_bfmmla(sums, a, b)``: ``bfmmla sums.4s, a.8h, b.8h`` on 16-bit patterns.
LLVM_IR = "\n".join([
    "define linkonce_odr <4 x float> @relay_amp_bfmmla(<4 x float> %acc, <8 x i16> %a, "
    "<8 x i16> %b) alwaysinline {",
    "  %x = bitcast <8 x i16> %a to <8 x bfloat>",
    "  %y = bitcast <8 x i16> %b to <8 x bfloat>",
    "  %r = call <4 x float> @llvm.aarch64.neon.bfmmla(<4 x float> %acc, <8 x bfloat> %x, "
    "<8 x bfloat> %y)",
    "  ret <4 x float> %r",
    "}",
    "declare <4 x float> @llvm.aarch64.neon.bfmmla(<4 x float>, <8 x bfloat>, <8 x bfloat>)",
])
#: The block annotation that marks a kernel's sums as :func:`_gemm` writes them.
ANNOTATION = "relay_amp_bfmmla"
#: Pairs of rows and of columns in a register tile: 4 x 4 blocks of 2 x 2 sums.
TILE_PAIRS = 4
#: Steps of four along the reduction one call of the tile adds, or all of them where there
#: are fewer (:func:`_steps` rounds the steps up to whole calls).
DEPTH = 8
#: The parallel loop's iterations: tiles of rows are grouped into at most this many, each
#: copying its rows' packed input into a workspace of its own. A workspace a tile of 8 rows
#: cost about 500 instructions of TVM's runtime to allocate and free: 0.86 M of
#: face_detection_short_range's 25 M.
PARALLEL_GROUPS = 16
#: Where BFMMLA pays: at least this many output channels (columns) and input channels (a
#: matmul's reduction), and at least :data:`MIN_PRODUCTS` of the two multiplied. Its packed
#: input is copied once per tile of rows for all the tiles of columns, so the fewer products
#: a copied value feeds, the more the copy weighs; measured per kernel against BFDOT's
#: (instructions, 1 x 1 convolutions at 48-96 pixels square, K -> N channels): 16 -> 16
#: 1.38 x, 32 -> 16 1.14 x, 16 -> 32 1.01 x, 32 -> 32 0.96 x, 24 -> 48 0.98 x, 64 -> 64
#: 0.66 x; 3 x 3: 16 -> 16 1.19 x, 8 -> 32 1.15 x, 16 -> 32 0.93 x, 32 -> 32 0.76 x, 64 -> 64
#: 0.61 x; an RGB image's 5 x 5, 3 -> 24, 1.50 x. After a depthwise convolution, 56 x 56
#: unless said (2026-12-01): 16 -> 24 1.05 x, 24 -> 24 0.94 x, 32 -> 24 0.92 x, 48 -> 24
#: 0.96 x, 96 -> 24 0.74 x, 144 -> 24 0.79 x (28 x 28: 0.82 x), 192 -> 24 (28 x 28) 0.73 x;
#: 32 -> 16 (112 x 112) 1.03 x, 96 -> 16 (28 x 28) 0.85 x.
MIN_COLUMNS = 24
#: A tile's sums: a "global" buffer of 256 bytes is a stack ``alloca`` that LLVM promotes
#: to registers; a "local" one in the parallel loop was a workspace TVM's runtime allocated
#: and freed for every group, and the write-back read it a lane at a time.
SUMS_SCOPE = "global"
#: The sums' buffer where the tile's write-back calls a function (a SiLU's ``exp``): the
#: call takes the vector registers, and sums held there went through the stack around each
#: call (YOLOv8n's bfloat16 executed 1.5 % more with them on the stack: 181.8 M, 179.1 M).
CALLING_SUMS_SCOPE = "local"
MIN_CHANNELS = 16
MIN_PRODUCTS = 512

_REGISTERED: dict = {}


def _ceil(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def packed_weight(weight):
    """``weight`` (``[K, N]``, bfloat16, ``K`` a multiple of 4 and ``N`` of 2) as BFMMLA's
    right operand: ``[K / 4, N / 2, 2, 4]``."""
    import numpy as np

    k, n = weight.shape
    return np.ascontiguousarray(weight.reshape(k // 4, 4, n // 2, 2).transpose(0, 2, 3, 1))


def _steps(quads: int) -> int:
    """The reduction's steps of four, rounded up to a whole number of calls."""
    return quads if quads < DEPTH else _ceil(quads, DEPTH)


def conv_weight(weight):
    """An HWIO weight as the ``[K, N]`` matrix :func:`_im2col`'s reduction reads: each tap's
    input channels rounded up to four, the steps of four rounded up by :func:`_steps`; None
    where the output channels are odd."""
    import numpy as np

    kh, kw, ci, co = weight.shape
    if co % 2:
        return None
    channels = _ceil(ci, 4)
    padded = np.zeros((kh, kw, channels, co), weight.dtype)
    padded[:, :, :ci] = weight
    matrix = padded.reshape(-1, co)
    steps = _steps(matrix.shape[0] // 4)
    return np.concatenate([matrix, np.zeros((4 * steps - matrix.shape[0], co), weight.dtype)])


def bits(value):
    """A bfloat16 ``value``'s 16-bit pattern; a float32 one's rounded to bfloat16 (the rounding
    of a cast :func:`~relay_amp.builds.bfdot.cast_source` found, in the kernel's copy), written
    as TVM's legalization writes a cast to bfloat16 (to nearest even, in 32-bit integers), since
    that legalization computes a kernel's own bfloat16 values in float32 and rounds only what
    it stores in a bfloat16 buffer."""
    from tvm import tirx

    if str(value.dtype) == "bfloat16":
        return tirx.reinterpret("uint16", value)
    word = tirx.reinterpret("uint32", value)
    sixteen = tirx.const(16, "uint32")
    rounded = word + ((word >> sixteen) & tirx.const(1, "uint32")) + tirx.const(0x7FFF, "uint32")
    return (rounded >> sixteen).astype("uint16")


def _group(tiles: int) -> int:
    """Tiles of rows a parallel group computes: the fewest that make at most
    :data:`PARALLEL_GROUPS` groups."""
    return -(-tiles // PARALLEL_GROUPS)


def _pairs(rows, steps: int, element, name: str):
    """``A'[m / 2, k / 4, m % 2, k % 4]``: ``rows`` rows of the reduction's ``4 * steps``
    values in pairs of rows, as 16-bit patterns, the rows rounded up with zeros to whole
    tiles and, a constant count, whole groups of them (:func:`_group`: a split that leaves a
    remainder keeps the tile from being tensorized). A symbolic count (a sequence length) is
    a tile a group. ``element(m, step, lane)`` is ``(value, conditions)``:
    the value of row ``m`` at ``4 * step + lane``, zero where a condition fails (past an
    input's edge or its channels)."""
    from tvm import te, tirx

    symbolic = not isinstance(rows, int)
    tiles = tirx.indexdiv(rows + 2 * TILE_PAIRS - 1, 2 * TILE_PAIRS) if symbolic else \
        _ceil(rows, 2 * TILE_PAIRS) // (2 * TILE_PAIRS)
    padded = tiles * 2 * TILE_PAIRS if symbolic else \
        _ceil(tiles, _group(tiles)) * 2 * TILE_PAIRS

    def value(pair, step, half, lane):
        m = pair * 2 + half
        loaded, conditions = element(m, step, lane)
        if symbolic or padded > rows:
            conditions = [m < rows, *conditions]
        pattern = bits(loaded)
        return tirx.if_then_else(tirx.all(*conditions), pattern, tirx.const(0, "uint16")) \
            if conditions else pattern

    return te.compute((tiles * TILE_PAIRS, steps, 2, 4), value, name=name)


def _im2col(x, window, steps: int):
    """An NHWC input's receptive fields as :func:`_pairs`: a row per output pixel, each tap's
    channels rounded up to four."""
    (kh, kw), (sh, sw), (top, left), (dh, dw), (height, width) = window
    n, in_height, in_width, channels = (int(d) for d in x.shape)
    quads = _ceil(channels, 4) // 4
    pixels = height * width

    def element(p, step, lane):
        tap, c = step // quads, step % quads * 4 + lane
        h = p % pixels // width * sh + tap // kw * dh - top
        w = p % width * sw + tap % kw * dw - left
        conditions = []
        if steps > kh * kw * quads:
            conditions.append(tap < kh * kw)
        if channels % 4:
            conditions.append(c < channels)
        if top or (height - 1) * sh + (kh - 1) * dh - top >= in_height:
            conditions += [h >= 0, h < in_height]
        if left or (width - 1) * sw + (kw - 1) * dw - left >= in_width:
            conditions += [w >= 0, w < in_width]
        return x[p // pixels, h, w, c], conditions

    return _pairs(n * pixels, steps, element, "im2col_pairs")


def _gemm(pairs, weight, quads: int):
    """The sums in BFMMLA's layout, ``C'[m / 2, n / 2, m % 2, n % 2]``, annotated with the
    reduction's steps of four a tap of the window (``quads``)."""
    from tvm import te, tirx

    step = te.reduce_axis((0, weight.shape[0]), "step")
    lane = te.reduce_axis((0, 4), "lane")
    return te.compute(
        (pairs.shape[0], weight.shape[1], 2, 2),
        lambda m, n, i, j: te.sum(
            tirx.reinterpret("bfloat16", pairs[m, step, i, lane]).astype("float32")
            * weight[step, n, j, lane].astype("float32"), axis=[step, lane]),
        name="bfmmla", attrs={ANNOTATION: quads})


def conv2d(x, weight, kernel, strides, padding, dilation):
    """An NHWC convolution (groups 1) over :func:`conv_weight`'s packed ``weight``."""
    from tvm import te

    kh, kw = kernel
    (sh, sw), (top, left, bottom, right), (dh, dw) = strides, padding, dilation
    n, in_height, in_width, _ = (int(d) for d in x.shape)
    height = (in_height + top + bottom - (kh - 1) * dh - 1) // sh + 1
    width = (in_width + left + right - (kw - 1) * dw - 1) // sw + 1
    window = ((kh, kw), (sh, sw), (top, left), (dh, dw), (height, width))
    sums = _gemm(_im2col(x, window, int(weight.shape[0])), weight, _ceil(int(x.shape[3]), 4) // 4)
    return te.compute(
        (n, height, width, int(weight.shape[1]) * 2),
        lambda b, h, w, c: sums[((b * height + h) * width + w) // 2, c // 2,
                                ((b * height + h) * width + w) % 2, c % 2],
        name="conv2d_nhwc")


def _one(extent) -> bool:
    return isinstance(extent, int) and extent == 1


def matmul(x, weight):
    """``x @ W`` (``x``: ``[..., K]``, ``K`` constant) over :func:`packed_weight`'s
    ``weight``, its rows (every axis but the last, symbolic or not) in pairs."""
    from tvm import te

    shape = [int(d) if isinstance(d, tvm.tirx.IntImm) else d for d in x.shape]
    *lead, depth = shape
    steps = int(weight.shape[0])
    rows = 1
    for d in lead:
        rows *= d

    outermost = next((n for n, d in enumerate(lead) if not _one(d)), None)

    def element(m, step, lane):
        # axes of one point stay 0 and the outermost other takes the quotient whole: TVM
        # fuses what follows only into a kernel whose reads it can follow
        index, rest = [], m
        for n in reversed(range(len(lead))):
            d = lead[n]
            index.insert(0, 0 if _one(d) else rest if n == outermost else rest % d)
            rest = rest if _one(d) else rest // d
        k = step * 4 + lane
        conditions = [k < depth] if 4 * steps > depth else []
        return x[(*index, k)], conditions

    sums = _gemm(_pairs(rows, steps, element, "row_pairs"), weight, steps)

    def out(*index):
        m = 0
        for i, d in zip(index[:-1], lead):
            m = m if _one(d) else m * d + i
        c = index[-1]
        return sums[m // 2, c // 2, m % 2, c % 2]

    return te.compute((*lead, int(weight.shape[1]) * 2), out, name="matmul")


def matmul_weight(weight):
    """A ``[K, N]`` weight as :func:`matmul` reads it, ``K`` rounded up by :func:`_steps`;
    None where ``N`` is odd."""
    import numpy as np

    k, n = weight.shape
    if n % 2:
        return None
    steps = _steps(_ceil(k, 4) // 4)
    return np.concatenate([weight, np.zeros((4 * steps - k, n), weight.dtype)])


def rewrite(builder, call, weight, source=None):
    """The ``call_tir`` of a bfloat16 ``call`` with float32 sums and a constant ``weight``
    (its value) on BFMMLA, or None where BFMMLA does not suit it: a groups-1 NHWC/HWIO
    convolution (static shapes) or a matmul by a 2-D weight (its rows symbolic or not), of at
    least :data:`MIN_CHANNELS` input channels and :data:`MIN_COLUMNS` output channels, a
    multiple of a tile's, :data:`MIN_PRODUCTS` of the two multiplied, and at least a tile's
    :data:`TILE_PAIRS` pairs of rows where the count is known (fewer rows run on BFDOT, whose
    eight products an instruction all count). A 1 x 1 convolution's copy of its input reads
    ``source`` where given (the float32 tensor the input is a cast of) and rounds it; a wider
    window's copies each value once a tap, so it rounds once in the cast."""
    from tvm import relax

    from .pipeline import _static

    x, attrs = call.args[0], call.attrs
    shape = _static(x.ty.shape)
    channels = weight.shape[-2] if weight.ndim == 4 else weight.shape[0]
    if weight.shape[-1] % (2 * TILE_PAIRS) or weight.shape[-1] < MIN_COLUMNS \
            or channels * weight.shape[-1] < MIN_PRODUCTS:
        return None
    if call.op.name == "relax.matmul" and weight.ndim == 2:
        rows = 1
        for d in shape[:-1] if shape is not None else ():
            rows *= d
        if shape is None and not isinstance(x.ty.shape[-1], (int, tvm.tirx.IntImm)) \
                or shape is not None and rows < 2 * TILE_PAIRS or weight.shape[0] < MIN_CHANNELS:
            return None
        return builder.call_te(matmul, x, relax.const(packed_weight(matmul_weight(weight))),
                               primfunc_name_hint="matmul_bfmmla")
    if shape is None or call.op.name != "relax.nn.conv2d" or str(attrs.data_layout) != "NHWC" \
            or str(attrs.out_layout) != "NHWC" or str(attrs.kernel_layout) != "HWIO" \
            or int(attrs.groups) != 1 or weight.ndim != 4 or weight.shape[2] < MIN_CHANNELS:
        return None
    out = _static(call.ty.shape)
    if out is None or out[0] * out[1] * out[2] < 2 * TILE_PAIRS:
        return None
    return builder.call_te(
        conv2d, x if source is None or weight.shape[0] * weight.shape[1] > 1 else source,
        relax.const(packed_weight(conv_weight(weight))), weight.shape[:2],
        *([int(n) for n in values] for values in (attrs.strides, attrs.padding, attrs.dilation)),
        primfunc_name_hint="conv2d_nhwc_bfmmla")


def _intrinsic(depth: int, scope: str) -> str:
    """The tile's update: :data:`TILE_PAIRS` squared blocks of sums in a ``scope`` buffer, each
    adding ``depth`` steps of four products, one ``bfmmla`` a block and step."""
    key = (depth, scope)
    if key in _REGISTERED:
        return _REGISTERED[key]
    from tvm.s_tir import TensorIntrin
    from tvm.script import tirx as T

    pairs = TILE_PAIRS

    @script.prim_func(s_tir=True)
    def desc(a: T.handle, b: T.handle, c: T.handle) -> None:
        sa, sb, sb1 = T.int64(), T.int64(), T.int64()
        A = T.match_buffer(a, (depth, pairs, 2, 4), "uint16", offset_factor=1,
                           strides=[sa, 8, 4, 1], scope="local")
        B = T.match_buffer(b, (depth, pairs, 2, 4), "bfloat16", offset_factor=1,
                           strides=[sb, sb1, 4, 1])
        C = T.match_buffer(c, (pairs, pairs, 2, 2), "float32", offset_factor=1, scope=scope)
        with T.sblock("root"):
            T.reads(C[0:pairs, 0:pairs, 0:2, 0:2], A[0:depth, 0:pairs, 0:2, 0:4],
                    B[0:depth, 0:pairs, 0:2, 0:4])
            T.writes(C[0:pairs, 0:pairs, 0:2, 0:2])
            for s, m, n, i, j, r in T.grid(depth, pairs, pairs, 2, 2, 4):
                with T.sblock("update"):
                    vm, vn, vi, vj, vs, vr = T.axis.remap("SSSSRR", [m, n, i, j, s, r])
                    C[vm, vn, vi, vj] = C[vm, vn, vi, vj] + T.Cast(
                        "float32", T.reinterpret("bfloat16", A[vs, vm, vi, vr])) \
                        * T.Cast("float32", B[vs, vn, vj, vr])

    @script.prim_func(s_tir=True)
    def impl(a: T.handle, b: T.handle, c: T.handle) -> None:
        sa, sb, sb1 = T.int64(), T.int64(), T.int64()
        A = T.match_buffer(a, (depth, pairs, 2, 4), "uint16", offset_factor=1,
                           strides=[sa, 8, 4, 1], scope="local")
        B = T.match_buffer(b, (depth, pairs, 2, 4), "bfloat16", offset_factor=1,
                           strides=[sb, sb1, 4, 1])
        C = T.match_buffer(c, (pairs, pairs, 2, 2), "float32", offset_factor=1, scope=scope)
        with T.sblock("root"):
            T.reads(C[0:pairs, 0:pairs, 0:2, 0:2], A[0:depth, 0:pairs, 0:2, 0:4],
                    B[0:depth, 0:pairs, 0:2, 0:4])
            T.writes(C[0:pairs, 0:pairs, 0:2, 0:2])
            for s in T.unroll(depth):
                for m in T.unroll(pairs):
                    for n in T.unroll(pairs):
                        C[m, n, 0, T.ramp(0, 1, 4)] = T.call_pure_extern(
                            "float32x4", "relay_amp_bfmmla", C[m, n, 0, T.ramp(0, 1, 4)],
                            A.vload([s, m, 0, 0], "uint16x8"),
                            T.reinterpret("uint16x8", B.vload([s, n, 0, 0], "bfloat16x8")))

    name = f"relay_amp_bfmmla_{pairs}x{pairs}_d{depth}_{scope}"
    TensorIntrin.register(name, desc, impl, override=True)
    _REGISTERED[key] = name
    return name


class BfmmlaTile:
    """A dlight schedule rule for the kernels :func:`conv2d` and :func:`matmul` write (their
    sums' block carries :data:`ANNOTATION`): tiles of :data:`TILE_PAIRS` pairs of rows in
    at most :data:`PARALLEL_GROUPS` parallel groups, each copying its rows' packed input once
    (four values a vector load) for all their tiles of :data:`TILE_PAIRS` pairs of columns;
    a tile's 16 blocks of sums held in registers through the reduction, which runs in calls
    of :data:`DEPTH` steps tensorized on ``bfmmla``; the sums written back row by row, the
    output's NHWC copy and the epilogue TVM fused after the kernel folded into that
    write-back."""

    def apply(self, func, target, tunable):  # noqa: ARG002 - dlight's rule signature
        from tvm import s_tir

        start = llvm_blocks(func, target)
        if start is None:
            return None
        sch, _ = start
        gemm = next((b for b in _blocks(sch) if ANNOTATION in sch.get(b).annotations), None)
        if gemm is None:
            return None
        _, columns, _, _, steps, _ = sch.get_loops(gemm)
        if int(sch.get(columns).extent) % TILE_PAIRS:
            decide(f"its output channels are not a multiple of {2 * TILE_PAIRS}")
            return None
        depth = min(int(sch.get(steps).extent), DEPTH)
        try:
            sch = self._schedule(sch, gemm, depth, target)
        except s_tir.ScheduleError as err:  # the kernel keeps TVM's loops
            decide(f"not scheduled: {last_line(err)}")
            return None
        decide(f"sums on BFMMLA, {2 * TILE_PAIRS} x {2 * TILE_PAIRS} a tile, {depth} steps of "
               "four a call")
        return sch

    @staticmethod
    def _schedule(sch, gemm, depth: int, target):
        from .bfcvtn import tensorize_rounding
        from .cpu_pipeline import _inline_epilogue, _round_apart, _vectorize_rest
        from .elementwise import calls, calls_a_library

        (pack,) = sch.get_producers(gemm)
        quads_per_tap = int(sch.get(gemm).annotations[ANNOTATION])
        m, n, i, j, s, r = sch.get_loops(gemm)
        extent = sch.get(m).extent
        tiles = int(extent) // TILE_PAIRS if isinstance(extent, tvm.tirx.IntImm) else None
        per_group = 1 if tiles is None else next(
            g for g in range(_group(tiles), tiles + 1) if tiles % g == 0)
        group, rows, inner_rows = sch.split(m, [None, per_group, TILE_PAIRS])
        tile, inner_columns = sch.split(n, [None, TILE_PAIRS])
        outer_steps, inner_steps = sch.split(s, [None, depth])
        sch.reorder(group, rows, tile, outer_steps, inner_steps, inner_rows, inner_columns, i, j, r)
        sch.parallel(group)
        # a tile's pairs of rows side by side: a step's four are adjacent 128-bit loads
        sch.transform_layout(pack, ("write", 0), lambda p, s, h, r: [
            p // TILE_PAIRS, s, p % TILE_PAIRS, h, r])
        sch.compute_at(pack, group)
        sch.set_scope(pack, 0, "local")
        BfmmlaTile._pack(sch, pack, quads_per_tap)
        sums = sch.cache_write(gemm, 0, SUMS_SCOPE)
        sch.reverse_compute_at(sums, tile)
        # written back as a matrix of rows: the output's copy then reads each row's lanes
        sch.transform_layout(sums, ("write", 0), lambda m, n, i, j: [m * 2 + i, n * 2 + j])
        a, b, c, d = sch.get_loops(sums)[-4:]
        sch.reorder(a, c, b, d)
        sch, folded, refused = _inline_epilogue(sch, sums, round_apart=True)
        if folded:
            decide(f"epilogue folded into the write-back: {', '.join(folded)}")
        if refused:
            decide(f"left in loops of their own: {refused}")
        *_, a, c, lanes = [*sch.get_loops(sums)[:-2], sch.fuse(*sch.get_loops(sums)[-2:])]
        sch.vectorize(lanes)
        if calls_a_library(sch.get(sums).body, target):  # GELU's erf: one copy, in a loop
            decide("write-back in a loop: its epilogue calls a library function")
        else:  # constant indices: LLVM keeps the tile's sums in registers, rows by zips
            sch.unroll(a)
            sch.unroll(c)
        scope = SUMS_SCOPE
        if calls(sch.get(sums).body):
            scope = CALLING_SUMS_SCOPE
            sch.set_scope(gemm, 0, scope)
            decide("sums in a local buffer: the write-back calls a function, which takes "
                   "the registers")
        sch, rounding = _round_apart(sch, sums, tile)
        if rounding is None:  # else the rounding was all that was left
            _vectorize_rest(sch, sums, target, True)
        sch.decompose_reduction(gemm, outer_steps)
        sch.tensorize(inner_steps, _intrinsic(depth, scope))
        link_llvm(sch, tile, LLVM_IR)
        if rounding is not None:
            tensorize_rounding(sch, tile, rounding)
        return sch

    @staticmethod
    def _pack(sch, pack, quads: int) -> None:
        """The packed input's copy: four values (one pixel's four channels) a vector, the
        window's taps and the pair's two pixels outside the channels' loop."""
        pair, step, half, lane = sch.get_loops(pack)[-4:]
        tap, quad = sch.split(step, [None, quads])
        sch.reorder(pair, tap, half, quad, lane)
        sch.vectorize(lane)


def _blocks(sch):
    return sch.get_child_blocks(sch.get_sblock("root"))


__all__ = ["ANNOTATION", "DEPTH", "LLVM_IR", "MIN_CHANNELS", "MIN_COLUMNS", "MIN_PRODUCTS",
           "PARALLEL_GROUPS", "TILE_PAIRS", "BfmmlaTile", "conv2d", "conv_weight", "matmul",
           "matmul_weight", "packed_weight", "rewrite"]
