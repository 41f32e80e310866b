"""x86 dot products on register tiles of AVX-512 or AVX2 vectors: MLAS's and XNNPACK's
micro-kernel, for float32.

:class:`relay_amp.builds.cpu_pipeline.VectorizeDotProduct` leaves a tile's update as rows of
``sums[r, l] += a[r] * b[l]``: one operand a scalar per row (an NHWC convolution's input
channel, a matmul row's element), the other a vector of the lanes (the weights' output
channels). Left to LLVM's SLP vectorizer, the unrolled update becomes vectors of the width LLVM
prefers, which on AVX-512 cores (Skylake-SP to Emerald Rapids, Zen 4) is 256 bits, not 512:
half the multiply-accumulates an instruction, and a tile sized for 32 registers spills.

:func:`register_tile` tensorizes the update into explicit vectors of the target's width
(:func:`vector_width`: 16 float32 lanes with ``avx512f``, 8 with ``avx2``), each row's scalar
broadcast from memory into one register (``vbroadcastss``) and each vector of weights loaded
once for all rows: per reduction step ``rows`` broadcasts and ``lanes / width`` loads feed
``rows * lanes / width`` FMAs. Where the sums leave too few registers for the weight vectors
(AVX2's 16 at 7 rows x 2 vectors), the ones that do not fit are read by each row's FMA as its
memory operand, as MLAS's kernels read their filters (:func:`held_vectors`, :data:`LLVM_IR`).
:func:`tile_shape` chooses the rows and lanes that cost least per FMA within the target's
vector registers (:func:`vector_registers`, :func:`tile_cost`). LLVM legalizes explicit 512-bit
vector arithmetic as such whatever width it prefers for its own vectorizers.

Every output's sum keeps its order; the numbers are the plain build's up to FMA contraction.
"""

from __future__ import annotations

import tvm

from .cpu_features import cpu_has
from .neon_tiles import _operands, operand_dtype, scalar_reduction, tensorized_tile
from .schedule_rules import decide, link_llvm

#: The most rows a tile computes.
TILE_ROWS = 14
#: How many vectors of lanes a tile's row may hold.
TILE_VECTORS = (4, 3, 2, 1)
#: How far apart in the scalar operand a tile's rows may be (a convolution's stride).
STEPS = (1, 2)
#: Reduction steps a tile adds per call, the first that divides the reduction. 2, not 4: on
#: znver4 4 steps a call, unrolled in TIR, took 0.13 s more of resnet18_v2's 1.6 s compile
#: (CommonSubexprElim, Simplify and LLVM over twice the statements) and ran no faster
#: (ResNet-18 and -50, MobileNetV2, YOLOv8n, BERT: 0.998-1.004 x the time, the same outputs
#: bit for bit). The steps are a loop in TIR, the rows and vectors unrolled: unrolled too,
#: they took TVM's TIR passes on resnet18_v2 0.27 s against 0.22 s, for the same library
#: time and outputs (znver5). 3 takes an RGB image's channels, where a depth of 1 does not
#: tensorize.
DEPTHS = (2, 3, 1)
#: A tile's sums take fewer bytes than this: TVM keeps such a buffer on the stack (its
#: ``kMaxStackAlloca``), where LLVM holds it in registers. A larger one is taken from TVM's
#: workspace pool for every tile (``TVMBackendAllocWorkspace``). Over a padded row axis LLVM
#: then cannot tell it from the padded input's, and each FMA loads and stores its sum (AVX-512,
#: a projection over a sequence: 6 x 48 lanes did, 5 x 48 did not); over a constant one the
#: sums stay in registers, yet the kernel is slower: on znver4, a 1 x 1 convolution of 64 to
#: 256 channels at 56 x 56 took 1.28-1.42 ms with 14 x 32 or 8 x 32 sums (1,792 and 1,024
#: bytes) against 0.91-1.00 ms with 7 x 32 or 14 x 16 (896 bytes).
STACK_SUMS_BYTES = 1024
#: What :func:`tile_cost` counts a broadcast (``vbroadcastss`` from memory) and a weight vector
#: streamed from L2 as, in loads: the two weights that order the measured tiles as their times.
BROADCAST_LOADS = 2
STREAMED_LOADS = 2
#: What :func:`tile_shape` counts the padded copy of the input a padded row axis takes, in
#: loads an input element (its load and its store), over the FMAs that read it.
PADDED_COPY_LOADS = 2
#: The register files in which a tile reads weights as the FMAs' memory operands: AVX2's 16,
#: where LLVM keeps 7 x 2 ymm sums, a weight vector and a broadcast in registers. In AVX-512's
#: 32 it spilled 7 x 4 zmm sums beside 2 or 3 held vectors (the assembly for skylake-avx512),
#: and no AVX-512 host was at hand to time the tiles that fit.
MEMORY_OPERAND_REGISTERS = 16

#: ``relay_amp_x86_fma{8,16}(sums, broadcast, weights)``: ``vfmadd231ps`` with the weights
#: as the instruction's memory operand. LLVM would load a weight vector once into a register for
#: all of a tile's rows; in inline assembly it is read by each FMA, which frees the register
#: for a sum. Linked into the library by TVM's ``pragma_import_llvm`` and inlined.
LLVM_IR = "\n".join(line for width in (8, 16) for line in (
    f"define linkonce_odr <{width} x float> @relay_amp_x86_fma{width}(<{width} x float> %acc, "
    f"<{width} x float> %a, ptr %b) alwaysinline {{",
    f'  %r = call <{width} x float> asm "vfmadd231ps $2, $1, $0", "=v,v,*m,0"'
    f"(<{width} x float> %a, ptr elementtype(<{width} x float>) %b, <{width} x float> %acc) "
    "nounwind memory(none)",
    f"  ret <{width} x float> %r",
    "}"))

_REGISTERED: dict = {}
#: Vector registers by float32 lanes a vector: AVX-512's 32, AVX2's 16.
_REGISTERS = {16: 32, 8: 16}


def _x86(target) -> bool:
    triple = target.attrs.get("mtriple") or tvm.target.codegen.llvm_get_system_triple()
    return target.kind.name == "llvm" and str(triple).startswith(("x86_64", "i386", "i686"))


def vector_width(target) -> int | None:
    """Float32 lanes of one vector register of the x86 ``llvm`` target ``target``: 16 with
    AVX-512 (``avx512f``), 8 with AVX2 and FMA; None for other targets and older x86."""
    if not _x86(target):
        return None
    if cpu_has("avx512f", target):
        return 16
    if cpu_has("avx2", target) and cpu_has("fma", target):
        return 8
    return None


def vector_registers(target) -> int:
    """Vector registers the target has: 32 with AVX-512, else 16."""
    return _REGISTERS.get(vector_width(target), 16)


def held_vectors(rows: int, vectors: int, registers: int) -> int:
    """How many of a tile's ``vectors`` weight vectors a reduction step holds in registers
    beside its ``rows * vectors`` sums and one broadcast, within ``registers``: all, where one
    register is left spare; else, in register files of at most
    :data:`MEMORY_OPERAND_REGISTERS`, as many as fit but one, the others read by each row's
    FMA as its memory operand (:data:`LLVM_IR`). Negative where the tile does not fit.

    Both as LLVM allocated them (AVX2): 4 x 3 ymm sums with their 3 weight vectors and a
    broadcast filled the 16 registers and spilled a sum; 7 x 2 sums, one held vector and a
    broadcast filled them and did not."""
    free = registers - rows * vectors - 1
    if free > vectors:
        return vectors
    if registers > MEMORY_OPERAND_REGISTERS or free < 0:
        return -1
    return min(free, vectors - 1)


def tile_cost(rows: int, vectors: int, registers: int) -> float:
    """Loads per FMA of a tile of ``rows`` x ``vectors`` sums, a broadcast and a weight vector
    streamed from L2 counted as two loads each (:func:`tile_shape`)."""
    held = held_vectors(rows, vectors, registers)
    fmas = rows * vectors
    return (held + BROADCAST_LOADS * rows + rows * (vectors - held)) / fmas \
        + STREAMED_LOADS / rows


def tile_shape(extent: int, row_extents, width: int, registers: int,
               paddable: bool = False, outputs: int | None = None) -> tuple | None:
    """``(lanes, rows, n)``: the register tile for an output axis of ``extent`` lanes and row
    axes of ``row_extents`` (``n`` the one taken; None for a symbolic extent, which the
    schedule pads to the rows) that costs least per FMA (:func:`tile_cost`), among those whose
    lanes are 1 to 4 vectors of ``width`` and whose sums and one broadcast fit ``registers``
    (the weight vectors that do not fit beside them are the FMAs' memory operands:
    :func:`held_vectors`). The rows divide their axis or, where it is symbolic or ``paddable``
    (a matmul: the schedule pads it), the axis is padded to them, the padded rows' FMAs and the
    padded copy of the input (:data:`PADDED_COPY_LOADS` for each element, over the
    ``outputs / width`` FMAs that read it; ``outputs``: the lanes of all the tiles in a row,
    ``extent`` unless a packed weight's panels split them) counted as cost. Every tile's sums
    take fewer than :data:`STACK_SUMS_BYTES`. None where no axis takes 2 rows.

    Per reduction step a tile of ``rows`` x ``v`` vectors executes ``rows * v`` FMAs,
    ``rows`` broadcasts, a load of each weight vector it holds and a memory operand for each
    row's FMA on the others; each weight vector is streamed once from L2 (a panel outgrows
    L1). The cost counts a broadcast and a streamed vector as :data:`BROADCAST_LOADS` and
    :data:`STREAMED_LOADS` loads: measured on AVX2 (znver3), ResNet-50's convolutions alone,
    this orders the tiles as their times do (at 14 and 7 wide, 7 rows x 2 vectors, one read
    from memory, took 0.85-0.95 x the time of 2 x 4 and of 7 x 1; at 56 and 28 wide 4 x 2
    took 0.87-0.91 x that of 2 x 4 and 0.90 x that of 7 x 2). Ties go to rows that need no
    padding, then to more rows, then to more lanes, then to the first axis."""
    options = []
    for vectors in TILE_VECTORS:
        lanes = vectors * width
        if extent % lanes:
            continue
        for n, rows_extent in enumerate(row_extents):
            for rows in range(TILE_ROWS, 1, -1):
                padded = rows_extent is None or rows_extent % rows != 0
                if held_vectors(rows, vectors, registers) < 0 \
                        or rows * lanes * 4 >= STACK_SUMS_BYTES \
                        or padded and rows_extent is not None and not paddable:
                    continue
                waste = 1 if rows_extent is None else -(-rows_extent // rows) * rows / rows_extent
                cost = tile_cost(rows, vectors, registers) * waste \
                    + (PADDED_COPY_LOADS * width / (outputs or extent) if padded else 0)
                options.append((round(cost, 9), padded, -rows, -lanes, n))
    if not options:
        return None
    _, _, rows, lanes, n = min(options)
    return -lanes, -rows, n


#: Float32 lanes of the vectors LLVM's SLP vectorizer makes of an update left unrolled (no
#: tile intrinsic): 256 bits, on AVX-512 cores too, where LLVM prefers them. A depthwise
#: convolution's rows sized for zmm registers (14 rows of 32 lanes) became ymm vectors that
#: did not fit in the registers: each FMA loaded and stored its sum.
UNROLLED_WIDTH = 8


def row_vectors(extent: int, width: int) -> int | None:
    """The vectors of ``width`` lanes one row of ``extent`` outputs takes (a matrix times a
    vector: a classifier's last layer at batch 1), each its own chain of FMAs: the most of
    :data:`TILE_VECTORS` that divide it; None where none does."""
    return next((v for v in TILE_VECTORS if extent % (v * width) == 0), None)


def lane_rows(extent: int, channels: int, width: int, registers: int) -> tuple | None:
    """``(lanes, rows)`` for a dot product whose operands are both vectors of the lanes (a
    depthwise convolution: input and weight): ``rows`` adjacent outputs of an axis of
    ``extent`` share each weight vector, so a reduction step loads ``rows`` input vectors (an
    FMA's memory operand) and one weight vector for ``rows`` FMAs. The most rows whose sums and
    weight vectors fit ``registers`` (one left for LLVM), ties to more lanes; None where no two
    rows divide the axis or no vectors of ``width`` divide ``channels``."""
    options = [(-rows, -vectors * width) for vectors in TILE_VECTORS
               if channels % (vectors * width) == 0
               for rows in range(TILE_ROWS, 1, -1)
               if extent % rows == 0 and rows * vectors + vectors <= registers - 1]
    if not options:
        return None
    rows, lanes = min(options)
    return -lanes, -rows


def _tile_function(body, a_shape, b_shape, c_shape, scope: str):
    """A tile intrinsic's ``desc`` or ``impl``: ``C (c_shape, in scope) += A (a_shape) x
    B (b_shape)``, strided rows, its root block's statements those ``body(A, B, C)`` builds.
    Built with TVMScript's IR builder, as its parser would build the same text, without the
    parse: 30-70 ms a function parsed, 1-3 ms built (the first build of a model registers every
    tile shape it uses)."""
    from tvm.script.ir_builder import IRBuilder
    from tvm.script.ir_builder import tirx as builder

    with IRBuilder() as made:
        with builder.prim_func(s_tir=True):
            builder.func_name(body.__name__)
            buffers = []
            for name, shape, where in zip("ABC", (a_shape, b_shape, c_shape),
                                          ("global", "global", scope)):
                handle = builder.arg(name.lower(), builder.handle())
                stride = IRBuilder.name(f"s{name.lower()}", builder.int64())
                buffers.append(IRBuilder.name(name, builder.match_buffer(
                    handle, shape, "float32", offset_factor=1, strides=[stride, 1],
                    scope=where)))
            A, B, C = buffers
            with builder.sblock("root"):
                regions = [buffer[tuple(slice(0, n) for n in buffer.shape)]
                           for buffer in (C, A, B)]
                builder.reads(*regions)
                builder.writes(regions[0])
                body(A, B, C)
    return made.get()


def _intrinsic(rows: int, depth: int, lanes: int, width: int, scope: str, step: int,
               held: int) -> str:
    """The name of the tile intrinsic: ``rows`` x ``lanes`` float32 sums in a ``scope`` buffer,
    each adding ``depth`` products of a row's scalar, broadcast, and a row of the lanes; the
    tile's rows ``step`` rows apart in the scalar operand; the first ``held`` vectors of the
    lanes loaded once for all rows, the others each FMA's memory operand."""
    key = (rows, depth, lanes, width, scope, step, held)
    if key in _REGISTERED:
        return _REGISTERED[key]
    from tvm.s_tir import TensorIntrin
    from tvm.script import tirx as T
    from tvm.script.ir_builder import IRBuilder
    from tvm.script.ir_builder import tirx as builder

    vectors = lanes // width

    def fma(C, A, B, r, k, g):
        return T.call_llvm_pure_intrin(
            f"float32x{width}", f"llvm.fma.v{width}f32",
            B.vload([k, g * width], f"float32x{width}"),
            tvm.tirx.Broadcast(A[r * step, k], width), C[r, T.ramp(g * width, 1, width)])

    def fma_memory(C, A, B, r, k, g):
        return T.call_pure_extern(f"float32x{width}", f"relay_amp_x86_fma{width}",
                                  C[r, T.ramp(g * width, 1, width)],
                                  tvm.tirx.Broadcast(A[r * step, k], width),
                                  T.address_of(B[k, g * width]))

    def desc(A, B, C):
        with builder.grid(depth, rows, lanes) as (k, r, i):
            IRBuilder.name_many(["k", "r", "i"], [k, r, i])
            with builder.sblock("update"):
                vr, vi, vk = builder.axis.remap("SSR", [r, i, k])
                IRBuilder.name_many(["vr", "vi", "vk"], [vr, vi, vk])
                builder.reads(C[vr, vi], A[vr * step, vk], B[vk, vi])
                builder.writes(C[vr, vi])
                builder.buffer_store(C, C[vr, vi] + A[vr * step, vk] * B[vk, vi], [vr, vi])

    def impl(A, B, C):
        with builder.serial(depth) as k, builder.unroll(rows) as r:
            IRBuilder.name_many(["k", "r"], [k, r])
            with builder.unroll(held) as g:
                IRBuilder.name("g", g)
                builder.buffer_store(C, fma(C, A, B, r, k, g),
                                     [r, T.ramp(g * width, 1, width)])
            with builder.unroll(vectors - held) as m:
                IRBuilder.name("m", m)
                builder.buffer_store(C, fma_memory(C, A, B, r, k, held + m),
                                     [r, T.ramp((held + m) * width, 1, width)])

    span = (rows - 1) * step + 1
    desc, impl = (_tile_function(body, (span, depth), (depth, lanes), (rows, lanes), scope)
                  for body in (desc, impl))
    name = f"relay_amp_x86_tile_{rows}x{lanes}_w{width}_k{depth}_s{step}_h{held}_{scope}"
    TensorIntrin.register(name, desc, impl, override=True)
    _REGISTERED[key] = name
    return name


def register_tile(sch, tile, lanes_loop, rows_loop, reduce_loops, lanes: int, rows: int,
                  width: int, scope: str):
    """A copy of ``sch`` whose float32 tile runs on explicit vectors of ``width`` lanes
    (:func:`_intrinsic`), as many weight vectors held in registers as fit beside the sums
    (:func:`held_vectors`; the ``tile`` loop links :data:`LLVM_IR` where
    some do not), or None where the update does not read so (no rows, lanes not a
    multiple of ``width``, an operand other than a scalar per row and a contiguous vector of
    the lanes, strides :data:`STEPS` lacks): the reduction loop of the scalar operand's
    innermost axis is split by a depth of :data:`DEPTHS`, its inner part moved above the rows
    and tensorized."""
    # None too: a packed weight's lanes index (n // lanes, n % lanes) reads as two axes there;
    # tensorize itself checks that the panel is contiguous
    if rows_loop is None or lanes % width or _operands(sch, lanes_loop) not in ((None, 0), None):
        return None
    realize = sch.get(lanes_loop).body
    if not isinstance(realize, tvm.s_tir.SBlockRealize) \
            or operand_dtype(realize.block) != "float32":
        return None
    reduction = scalar_reduction(sch, lanes_loop, rows_loop, reduce_loops)
    if reduction is None or not isinstance(reduction[1], tvm.tirx.IntImm) \
            or reduction[2] not in STEPS:
        return None
    n, extent, step = reduction
    depth = next(d for d in DEPTHS if int(extent) % d == 0)
    held = held_vectors(rows, lanes // width, _REGISTERS[width])
    held = lanes // width if held < 0 else held  # a tile no cost chose: LLVM allocates it
    trial = tensorized_tile(sch, rows_loop, reduce_loops, n, depth,
                            _intrinsic(rows, depth, lanes, width, scope, step, held))
    if trial is not None and held < lanes // width:
        link_llvm(trial, tile, LLVM_IR)
        decide(f"weights: {held} of {lanes // width} vectors held in registers, the others "
               "each FMA's memory operand")
    return trial


__all__ = ["BROADCAST_LOADS", "LLVM_IR", "MEMORY_OPERAND_REGISTERS", "PADDED_COPY_LOADS",
           "STACK_SUMS_BYTES", "STEPS", "STREAMED_LOADS", "TILE_ROWS", "UNROLLED_WIDTH",
           "held_vectors", "lane_rows", "register_tile", "row_vectors", "tile_cost", "tile_shape",
           "vector_registers", "vector_width"]
