"""relay_amp.builds.x86_tiles and packed_weights: x86 convolutions in NHWC on a register tile
of explicit AVX-512/AVX2 vectors, over weights packed at build time in panels of the tile's
lanes. Structure from the assembly (compiled for named CPUs, so it holds on any host);
numbers on this host against TVM's own build."""

import re

import numpy as np
import pytest
import tvm
from helpers import asm_kernel, projection
from tvm import relax

import relay_amp
from relay_amp.builds.constants import numpy_layout_constants
from relay_amp.builds.cpu_pipeline import cpu_pipeline
from relay_amp.builds.nhwc import nhwc_convolutions
from relay_amp.builds.packed_weights import packed_weights, padded_outputs
from relay_amp.builds.x86_tiles import (
    STACK_SUMS_BYTES,
    held_vectors,
    tile_shape,
    vector_registers,
    vector_width,
)
from relay_amp.builds.x86_tiles import lane_rows as x86_lane_rows

AVX512 = {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "skylake-avx512"}
AVX2 = {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "haswell"}
SSE = {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "x86-64"}
NEON = {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon"]}
VECTOR_FMA = {16: r"\bvfmadd\d+ps\s+[^\n]*%zmm", 8: r"\bvfmadd\d+ps\s+[^\n]*%ymm"}
SCALAR_FMA = r"\bvfmadd\d+ss\b"
BROADCAST = r"\bvbroadcastss\s+-?(?:0x)?[0-9a-f]*\("
VECTOR_LOAD = r"\bvmov[au]ps\s+-?(?:0x)?[0-9a-f]*\([^\n]*%[yz]mm"


def _conv(channels=32, outputs=64, size=14, stride=1, seed=0, kernel=3, relu=True):
    """An NCHW convolution (as the frontends import it) with a constant weight, bias and relu
    (none with ``relu`` False: a projection, or a classifier over a pooled pixel)."""
    rng = np.random.default_rng(seed)
    x = relax.Var("x", relax.TensorType((1, channels, size, size), "float32"))
    w = relax.const((rng.standard_normal((outputs, channels, kernel, kernel)) / 8)
                    .astype("float32"))
    b = relax.const(rng.standard_normal((1, outputs, 1, 1)).astype("float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            conv = builder.emit(relax.op.nn.conv2d(x, w, strides=stride, padding=kernel // 2))
            out = relax.op.add(conv, b)
            out = builder.emit_output(relax.op.nn.relu(out) if relu else out)
        builder.emit_func_output(out)
    return builder.get()


def _assembly(mod, target):
    executable = tvm.compile(mod, target=tvm.target.Target(target),
                             relax_pipeline=cpu_pipeline(target))
    modules = [executable.mod, *executable.mod.imports]
    return "\n".join(m.inspect_source("asm") for m in modules if m.kind == "llvm")


@pytest.mark.parametrize(("target", "width"), [(AVX512, 16), (AVX2, 8), (SSE, None),
                                               (NEON, None)])
def test_vector_width_is_the_targets(target, width):
    target = tvm.target.Target(target)
    assert vector_width(target) == width
    assert vector_registers(target) == (32 if width == 16 else 16)


@pytest.mark.parametrize("width, registers", [(16, 32), (8, 16)])
@pytest.mark.parametrize("extent", [16, 32, 64, 96, 256, 512, 1000])
@pytest.mark.parametrize("rows", [[7, 7, 1], [14, 14, 1], [56, 56, 1], [3, 1], [1]])
def test_the_tile_fits_the_registers_and_divides_its_axes(extent, rows, width, registers):
    shape = tile_shape(extent, rows, width, registers)
    if shape is None:
        assert extent % width or all(n < 2 for n in rows)
        return
    lanes, tile_rows, n = shape
    vectors = lanes // width
    assert extent % lanes == 0 and lanes % width == 0 and 1 <= vectors <= 4
    assert rows[n] % tile_rows == 0 and tile_rows >= 2
    held = held_vectors(tile_rows, vectors, registers)
    assert 0 <= held <= vectors
    # a tile that holds all its weight vectors leaves a register spare; one that reads some as
    # memory operands does so only in AVX2's 16 registers, where LLVM was seen to fit it
    assert tile_rows * vectors + held + 1 <= registers - (held == vectors)
    assert held == vectors or registers == 16
    assert tile_rows * lanes * 4 < STACK_SUMS_BYTES  # on the stack, not a workspace


def test_the_tile_costs_least_per_fma():
    """A 14-wide map of 256 channels on AVX-512: 7 rows of two zmm vectors, as at 7 wide (14
    rows of two would take 1,792 bytes of sums, which TVM allocates from its workspace).
    On AVX2 (16 registers) 7 rows of two ymm vectors, one held and one each FMA's memory
    operand (14 sums in flight; 2 rows x 4 vectors, all held, stream each weight vector from
    L2 for 2 FMAs). At 56 wide, 4 rows of two, both held."""
    assert tile_shape(256, [14, 14, 1], 16, 32) == (32, 7, 0)
    assert tile_shape(512, [7, 7, 1], 16, 32) == (32, 7, 0)
    assert tile_shape(64, [56, 56, 1], 16, 32) == (32, 7, 0)
    assert tile_shape(192, [28, 28, 1], 16, 32) == (48, 4, 0)
    assert tile_shape(256, [14, 14, 1], 8, 16) == (16, 7, 0)
    assert tile_shape(512, [7, 7, 1], 8, 16) == (16, 7, 0)
    assert held_vectors(7, 2, 16) == 1 and held_vectors(14, 2, 32) == 2
    assert tile_shape(64, [56, 56, 1], 8, 16) == (16, 4, 0) and held_vectors(4, 2, 16) == 2


def test_padding_rows_costs_its_copy_and_ties_go_to_more_rows():
    """A 16-row matmul of 32 lanes on AVX2: 6 rows x 2 vectors over 18 padded rows would cost
    less per FMA than 4 x 2, but not with the padded copy of its input (a load and a store
    for each element, over 4 FMAs that read it): 4 rows. 18 rows take 6 unpadded. Two row
    axes that both take the tile: the first."""
    assert tile_shape(32, [16], 8, 16, paddable=True) == (16, 4, 0)
    assert tile_shape(32, [18], 8, 16, paddable=True) == (16, 6, 0)
    assert tile_shape(64, [56, 56, 1], 8, 16) == (16, 4, 0)


def test_convolution_weights_are_packed_in_panels_of_the_tiles_lanes():
    """After the NHWC layout, the convolution's HWIO weight becomes one constant
    ``[outputs / lanes, kh, kw, channels, lanes]``: each tile's panel contiguous."""
    target = tvm.target.Target(AVX512)
    mod = _conv(channels=32, outputs=64, size=14)
    before = mod.script()
    with target:
        packed = packed_weights(target)(nhwc_convolutions()(mod))
    shapes = []
    relax.analysis.post_order_visit(packed["main"], lambda e: shapes.append(
        tuple(e.value.shape)) if isinstance(e, tvm.ir.expr.Constant)
        and hasattr(e.value, "numpy") else None)
    assert (2, 3, 3, 32, 32) in shapes
    assert (64, 32, 3, 3) not in shapes and (3, 3, 32, 64) not in shapes
    text = packed.script()
    assert "conv2d_nhwc_packed" in text and "R.nn.conv2d" not in text
    assert mod.script() == before  # the passes leave their input alone


def _projection(rows):
    """A transformer's projection: ``rows`` tokens times a constant ``[64, 96]`` weight."""
    return projection(rows, 64, 96, seed=3)


@pytest.mark.parametrize("target", [AVX512, AVX2])
def test_matmul_weights_are_packed_in_panels_of_the_tiles_lanes(target):
    """A ``[64, 96]`` weight becomes ``[96 / lanes, 64, lanes]``, lanes the tile's: for 14
    rows 32 with AVX-512 (7 x 2 zmm vectors; 7 x 48 would take 1,344 bytes of sums, beyond the
    stack's 1 KiB) and 16 with AVX2 (7 x 2 vectors, one of them each FMA's memory operand);
    for a symbolic row count, which the schedule pads to the tile's rows, those of the tile
    that costs least per FMA within 1 KiB of sums (5 x 48; 6 x 16), and for a prime row count
    where padding costs less. Outputs: the unpacked build's, for row counts the tile divides
    and for those it pads."""
    target = tvm.target.Target(target)

    def constants(mod):
        return [tuple(e.value.shape) for e in _constants(mod)]

    with target:
        packed = packed_weights(target)(_projection(14))
        symbolic = packed_weights(target)(_projection("n"))
    width, registers = vector_width(target), vector_registers(target)
    assert tile_shape(96, [14], width, registers)[0] == (32 if width == 16 else 16)
    lanes = tile_shape(96, [14], width, registers, paddable=True)[0]
    assert lanes == (32 if width == 16 else 16)
    assert (96 // lanes, 64, lanes) in constants(packed) and (64, 96) not in constants(packed)
    assert tile_shape(96, [None], width, registers)[:2] == ((48, 5) if width == 16 else (16, 6))
    lanes = tile_shape(96, [None], width, registers)[0]
    assert (96 // lanes, 64, lanes) in constants(symbolic)
    assert (64, 96) not in constants(symbolic)
    # 13 rows (a prime, as ViT's 197 tokens): padded to the tile where that costs less an
    # FMA, its copy counted; unpadded, the only rows are all 13: 13 x 1 zmm (13 x 2 would take
    # 1,664 bytes of sums; padded: 5 x 3 over 15 rows), 13 x 1 ymm (against 5 x 2 over 15)
    assert tile_shape(96, [13], width, registers)[1] == 13
    assert tile_shape(96, [13], width, registers, paddable=True)[:2] == (
        (48, 5) if width == 16 else (16, 5))
    with target:
        prime = packed_weights(target)(_projection(13))
    lanes = tile_shape(96, [13], width, registers, paddable=True)[0]
    assert (96 // lanes, 64, lanes) in constants(prime)
    for rows, mod in ((14, _projection(14)), (14, _projection("n")), (5, _projection("n")),
                      (13, _projection(13))):
        x = np.random.default_rng(4).standard_normal((rows, 64)).astype("float32")
        plain, tiled = (relay_amp.execution.run(relay_amp.compile_module(mod, None, schedules),
                                                [x])[0] for schedules in (False, True))
        np.testing.assert_allclose(tiled, plain, rtol=0,
                                   atol=64 * 2.0**-23 * np.abs(plain).max())


@pytest.mark.parametrize(("target", "width"), [(AVX512, 16), (AVX2, 8)])
@pytest.mark.parametrize("rows", ["n", 13])
def test_a_symbolic_or_prime_row_count_runs_on_the_register_tile(target, width, rows):
    """A projection over a symbolic row count (a transformer's sequence) or a prime one
    (ViT's 197 tokens) runs on the register tile, its rows padded: every multiply-accumulate a
    vector FMA of the target's width, each row's scalar a broadcast, and a tile step loads at
    most 0.55 vectors a FMA with AVX-512 (5 x 3 zmm: 8 loads for 15 FMAs; 13 rows take 13 x 2,
    whose broadcasts LLVM folds into FMAs), 0.67 with AVX2 (6 x 2 ymm: 8 for 12): the sums stay
    in registers."""
    # the module's one kernel; TVM runs its tiles in a local parallel lambda, not `_compute_`
    asm = _assembly(_projection(rows), target)
    fmas = re.findall(VECTOR_FMA[width], asm)
    assert len(fmas) >= 9 and not re.findall(SCALAR_FMA, asm)
    assert re.findall(BROADCAST, asm)
    loop = asm.split("vfmadd", 1)[1].rsplit("vfmadd", 1)[0]
    in_loop = len(re.findall(r"\bvbroadcastss\b|\bvmov[au]ps\s+-?(?:0x)?[0-9a-f]*\(", loop))
    assert in_loop <= {16: 0.55, 8: 0.67}[width] * loop.count("vfmadd") + 2


@pytest.mark.parametrize(("target", "width"), [(AVX512, 16), (AVX2, 8)])
@pytest.mark.parametrize("stride", [1, 2])
def test_the_convolution_runs_on_the_register_tile(target, width, stride):
    """Every multiply-accumulate of the kernel is a vector FMA of the target's full width
    (zmm with AVX-512, whatever width LLVM prefers), each row's scalar a broadcast from memory,
    and a tile step loads at most 0.65 vectors a FMA with AVX-512 (7 x 2 zmm: 9 loads for 14
    FMAs), 0.75 with AVX2 (2 x 4 ymm: 6 loads for 8 FMAs; 16 registers). The sums are on the
    stack: no tile takes a buffer from TVM's workspace pool (14 x 2 zmm did)."""
    asm = asm_kernel(_assembly(_conv(channels=32, outputs=64, size=28, stride=stride), target),
                     "conv2d")
    fmas = re.findall(VECTOR_FMA[width], asm)
    assert fmas and not re.findall(SCALAR_FMA, asm)
    assert len(fmas) >= 8
    loads = re.findall(BROADCAST, asm) + re.findall(VECTOR_LOAD, asm)
    loop = asm.split("vfmadd", 1)[1].rsplit("vfmadd", 1)[0]  # the tile's steps
    in_loop = len(re.findall(r"\bvbroadcastss\b|\bvmov[au]ps\s+-?(?:0x)?[0-9a-f]*\(", loop))
    assert loads and in_loop <= {16: 0.65, 8: 0.75}[width] * loop.count("vfmadd") + 2
    # the padded input is one workspace a call; a tile's sums would be one each tile
    tiles = re.split(r"^\.L__tvm_parallel_lambda[.\d]*:", asm, flags=re.M)[1:]
    assert tiles and not any("TVMBackendAllocWorkspace" in body for body in tiles)


def test_a_14_wide_tile_reads_a_weight_vector_as_each_fmas_memory_operand():
    """AVX2, a 14-wide map: 7 rows x 2 vectors, 14 sums, one weight vector held and the other
    read by every row's FMA from memory (``vfmadd231ps mem, ...``), so the sums, the held
    vector and a broadcast fit the 16 registers: half the FMAs take a memory operand, and no
    sum is spilled to the stack. AVX-512 holds its weights (no memory-operand tile there). The
    report says so."""
    from relay_amp.builds.schedule_rules import RuleLog

    mod = _conv(channels=32, outputs=64, size=14)
    log = RuleLog()
    with tvm.target.Target(AVX2):
        cpu_pipeline(AVX2, rule_log=log)(mod)
    (conv,) = [s for s in log.schedules if "conv2d" in s.kernel]
    assert "update: tensor intrinsic relay_amp_x86_tile_7x16_w8_k2_s1_h1_global" in \
        conv.decisions
    assert any("1 of 2 vectors held in registers" in d for d in conv.decisions)
    memory_fma = r"\bvfmadd231ps\s+-?(?:0x)?[0-9a-f]*\([^\n]*%ymm"
    for target, share in ((AVX2, 0.5), (AVX512, 0.0)):
        asm = asm_kernel(_assembly(mod, target), "conv2d")
        loop = asm.split("vfmadd", 1)[1].rsplit("vfmadd", 1)[0]
        fmas = loop.count("vfmadd") + 2
        assert fmas >= 2 * 14  # a call: 2 reduction steps of 14 sums
        assert abs(len(re.findall(memory_fma, loop)) / fmas - share) < 0.05
        assert not re.findall(r"\bvmov[au]ps\s+%[yz]mm\d+, -?(?:0x)?[0-9a-f]*\(%rsp\)", loop)


@pytest.mark.parametrize(("size", "stride", "outputs"), [(14, 1, 64), (28, 2, 32), (7, 1, 96)])
def test_outputs_are_tvms_own_builds(size, stride, outputs):
    """On this host (whichever vector width it has): the packed, tiled build's outputs are TVM's
    build's to float32 rounding of the same sums in the same order (FMA contraction aside)."""
    mod = _conv(channels=32, outputs=outputs, size=size, stride=stride)
    rng = np.random.default_rng(size)
    x = rng.standard_normal((1, 32, size, size)).astype("float32")
    plain, tiled = (relay_amp.execution.run(relay_amp.compile_module(mod, None, schedules),
                                            [x])[0] for schedules in (False, True))
    scale = np.abs(plain).max()
    np.testing.assert_allclose(tiled, plain, rtol=0, atol=32 * 9 * 2.0**-23 * scale)


def test_an_rgb_images_three_channels_run_on_the_tile():
    """A first layer's 3 input channels a pixel: the tile adds 3 reduction steps a call (a
    depth of 1 does not tensorize; the kernel was left to LLVM's vectorizer, YOLOv8n's first
    convolution among them). Outputs against TVM's build on this host."""
    from relay_amp.builds.schedule_rules import RuleLog

    mod = _conv(channels=3, outputs=16, size=32, stride=2)
    log = RuleLog()
    with tvm.target.Target(AVX2):
        cpu_pipeline(AVX2, rule_log=log)(mod)
    (conv,) = [s for s in log.schedules if "conv2d" in s.kernel]
    assert "update: tensor intrinsic relay_amp_x86_tile_4x16_w8_k3_s2_h2_global" in conv.decisions
    x = np.random.default_rng(7).standard_normal((1, 3, 32, 32)).astype("float32")
    plain, tiled = (relay_amp.execution.run(relay_amp.compile_module(mod, None, schedules),
                                            [x])[0] for schedules in (False, True))
    np.testing.assert_allclose(tiled, plain, rtol=0, atol=27 * 2.0**-23 * np.abs(plain).max())


def _depthwise(channels=96, size=28):
    """A depthwise 3 x 3 convolution (MobileNetV2's) with a constant weight and bias."""
    rng = np.random.default_rng(5)
    x = relax.Var("x", relax.TensorType((1, channels, size, size), "float32"))
    w = relax.const((rng.standard_normal((channels, 1, 3, 3)) / 4).astype("float32"))
    b = relax.const(rng.standard_normal((1, channels, 1, 1)).astype("float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            conv = builder.emit(relax.op.nn.conv2d(x, w, padding=1, groups=channels))
            out = builder.emit_output(relax.op.add(conv, b))
        builder.emit_func_output(out)
    return builder.get()


@pytest.mark.parametrize(("target", "width"), [(AVX2, 8), (AVX512, 16)])
def test_a_depthwise_convolutions_rows_share_each_weight_vector(target, width):
    """Both operands are vectors of the channels: no broadcast tile reads it. Rows of output
    pixels along the width share each weight vector (x86 ``lane_rows``, sized for the 256-bit
    vectors LLVM makes of the unrolled update: 14 rows of one ymm vector on AVX2, of 16 lanes
    on AVX-512), so the kernel loads a weight vector per 14 FMAs, the inputs as the FMAs'
    memory operands. On AVX2, 126 FMAs and 35 other vector loads in the kernel, where one row
    had 18 FMAs and 30 loads; on AVX-512, rows sized for zmm registers (14 x 32 lanes) made
    56 ymm FMAs and 141 stores of their sums. The outputs are TVM's build's (this host)."""
    assert x86_lane_rows(28, 96, 8, 16) == (8, 14)
    assert x86_lane_rows(28, 96, 8, 32) == (16, 14)
    assert x86_lane_rows(7, 960, 8, 16) == (8, 7)
    assert x86_lane_rows(17, 96, 8, 16) is None and x86_lane_rows(28, 12, 8, 16) is None
    asm = asm_kernel(_assembly(_depthwise(), target), "conv2d")
    fmas = re.findall(VECTOR_FMA[width], asm)
    with_memory = re.findall(r"\bvfmadd\d+ps\s+-?(?:0x)?[0-9a-f]*\(", asm)
    assert len(fmas) >= 9 * 14 and not re.findall(SCALAR_FMA, asm)
    loads = re.findall(VECTOR_LOAD, asm)
    stores = re.findall(r"\bvmov[au]ps\s+%[yz]mm\d+, ", asm)
    assert len(with_memory) >= 9 * 12 and len(loads) <= len(fmas) / 3, (len(loads), len(fmas))
    assert len(stores) <= len(fmas) / 2  # the padded input and the write-back
    mod = _depthwise(channels=48, size=14)
    x = np.random.default_rng(6).standard_normal((1, 48, 14, 14)).astype("float32")
    plain, tiled = (relay_amp.execution.run(relay_amp.compile_module(mod, None, schedules),
                                            [x])[0] for schedules in (False, True))
    np.testing.assert_allclose(tiled, plain, rtol=0, atol=9 * 2.0**-23 * np.abs(plain).max())


def _clipped_convs(seed=0, activation="clip"):
    """Two convolutions with a ReLU6 between them as TVM's ONNX frontend writes Clip: two
    kernels of its own (``emit_te``), a max and a min with 0-d bounds; or with a sigmoid as
    :mod:`relay_amp.builds.fast_math` writes it (three stages in one kernel); or a leaky ReLU,
    a Relax op that ``ConvertLayout`` has no layout rule for."""
    from tvm import topi

    from relay_amp.builds.fast_math import _sigmoid

    rng = np.random.default_rng(seed)
    x = relax.Var("x", relax.TensorType((1, 16, 8, 8), "float32"))
    w1, w2 = (relax.const((rng.standard_normal((16, 16, 3, 3)) / 8).astype("float32"))
              for _ in range(2))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            conv = builder.emit(relax.op.nn.conv2d(x, w1, padding=1))
            if activation == "clip":
                low = builder.emit_te(topi.maximum, conv, relax.const(0.0, "float32"))
                high = builder.emit_te(topi.minimum, low, relax.const(6.0, "float32"))
            elif activation == "sigmoid":
                high = builder.emit_te(_sigmoid, conv)
            else:
                high = builder.emit(relax.op.nn.leakyrelu(conv, 0.1))
            out = builder.emit_output(relax.op.nn.conv2d(high, w2, padding=1))
        builder.emit_func_output(out)
    return builder.get()


@pytest.mark.parametrize("activation", ["clip", "sigmoid", "leakyrelu"])
@pytest.mark.parametrize("target", [AVX512, NEON], ids=["x86", "aarch64"])
def test_elementwise_kernels_between_convolutions_stay_in_nhwc(target, activation):
    """``ConvertLayout`` cannot see into a frontend's own elementwise kernels and wrapped each
    in transposes back to NCHW and again to NHWC: the kernels now compute in NHWC, and only
    the model's input and output are transposed (the weights at build time, by numpy)."""
    mod = _clipped_convs(activation=activation)
    with tvm.target.Target(target):
        converted = numpy_layout_constants()(nhwc_convolutions()(mod))
    text = converted["main"].script()
    assert text.count("R.permute_dims") == 2, text
    assert text.count("R.call_tir") == {"clip": 2, "sigmoid": 1, "leakyrelu": 1}[activation]
    x = np.random.default_rng(1).standard_normal((1, 16, 8, 8)).astype("float32") * 4
    before, after = (relay_amp.execution.run(relay_amp.compile_module(m, None, False), [x])[0]
                     for m in (mod, converted))
    np.testing.assert_allclose(after, before, rtol=1e-6, atol=1e-5)


def _residual_leaky_block(seed=0):
    """darknet53's block: a leaky ReLU after each of two convolutions, their sum into a third
    (``ConvertLayout`` has no layout rule for the leaky ReLU, and keeps the sum of two NCHW
    values in NCHW)."""
    rng = np.random.default_rng(seed)
    x = relax.Var("x", relax.TensorType((1, 16, 8, 8), "float32"))
    w1, w2, w3 = (relax.const((rng.standard_normal((16, 16, 3, 3)) / 8).astype("float32"))
                  for _ in range(3))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            first = builder.emit(relax.op.nn.leakyrelu(relax.op.nn.conv2d(x, w1, padding=1), 0.1))
            second = builder.emit(relax.op.nn.leakyrelu(
                builder.emit(relax.op.nn.conv2d(first, w2, padding=1)), 0.1))
            total = builder.emit(relax.op.add(first, second))
            out = builder.emit_output(relax.op.nn.conv2d(total, w3, padding=1))
        builder.emit_func_output(out)
    return builder.get()


@pytest.mark.parametrize("target", [AVX512, NEON], ids=["x86", "aarch64"])
def test_ops_with_no_layout_rule_and_their_sums_stay_in_nhwc(target):
    """Each leaky ReLU and the sum of two of them are lowered to their kernels and computed in
    NHWC: only the model's input and output are transposed (darknet53 kept 102 transposes
    between its convolutions, its build 1.3 x TVM's)."""
    from relay_amp.builds.schedule_rules import RuleLog

    mod, log = _residual_leaky_block(), RuleLog()
    with tvm.target.Target(target):
        converted = numpy_layout_constants()(nhwc_convolutions(log)(mod))
    text = converted["main"].script()
    assert text.count("R.permute_dims") == 2, text
    assert "R.nn.leakyrelu" not in text and "R.add" not in text
    (report,) = [s.text() for s in log.schedules if s.kernel == "<relax: nhwc_convolutions>"]
    assert "relax.nn.leakyrelu computed in its input's layout" in report and "(2 calls)" in report
    assert "relax.add computed" in report
    assert not mod.same_as(converted) and "R.nn.leakyrelu" in mod["main"].script()
    x = np.random.default_rng(3).standard_normal((1, 16, 8, 8)).astype("float32")
    before, after = (relay_amp.execution.run(relay_amp.compile_module(m, None, False), [x])[0]
                     for m in (mod, converted))
    np.testing.assert_allclose(after, before, rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_conversions_casts_stay_in_nhwc(dtype):
    """A converted model casts between the Clip kernels and the next convolution: the cast of
    a transpose is moved after it as a kernel is, so the transposes still meet and vanish
    (MobileNetV2's float16 build on aarch64 kept 68 of them)."""
    mod, _ = relay_amp.convert(_clipped_convs(), dtype)
    with tvm.target.Target(NEON):
        converted = numpy_layout_constants()(nhwc_convolutions()(mod))
    text = converted["main"].script()
    assert "R.astype" in text and text.count("R.permute_dims") == 2, text
    x = np.random.default_rng(2).standard_normal((1, 16, 8, 8)).astype("float32") * 4
    before, after = (relay_amp.execution.run(relay_amp.compile_module(m, None, False), [x])[0]
                     for m in (mod, converted))
    # the same products summed in float32 in NHWC's order: reordering rounds only
    np.testing.assert_allclose(after, before, rtol=0, atol=1e-4 * np.abs(before).max())


@pytest.mark.parametrize(("outputs", "width", "padded"), [
    (77, 16, 80), (77, 8, 80), (24, 16, 32), (24, 8, 24), (1000, 16, 1024), (1000, 8, 1000),
    (255, 16, 256), (50257, 16, 50304), (50257, 8, 50272)])
def test_zero_columns_fill_the_widest_tile_that_wastes_at_most_an_eighth(outputs, width, padded):
    """Columns no vector divides are padded to the widest tile lanes (4, 3, 2 vectors) whose
    zero columns are at most an eighth of the real ones, else to one vector: a 1,000-class
    head gets four chains of FMAs, MobileNetV2's 24 channels one zmm vector more, not 40
    lanes more."""
    assert padded_outputs(outputs, width) == padded


@pytest.mark.parametrize(("target", "width"), [(AVX512, 16), (AVX2, 8)])
def test_a_weight_whose_columns_no_vector_divides_is_padded_with_zeros(target, width):
    """A ``[64, 77]`` weight (as GPT-2's 50,257-word head) is packed with zero columns up to
    :func:`padded_outputs`, runs on the register tile (before, no lanes divided 77 and the
    kernel kept TVM's scalar loops), and writes its 77 columns: the unpacked build's."""
    target = tvm.target.Target(target)
    mod = projection(13, 64, 77, seed=5)
    with target:
        packed = packed_weights(target)(mod)
    shapes = [tuple(e.value.shape) for e in _constants(packed)]
    (panel,) = [s for s in shapes if len(s) == 3]
    assert panel[0] * panel[2] == padded_outputs(77, width) == 80
    assert panel[1] == 64 and packed["main"].ret_ty.shape[-1] == 77
    asm = _assembly(mod, target)
    assert len(re.findall(VECTOR_FMA[width], asm)) >= 8 and not re.findall(SCALAR_FMA, asm)
    x = np.random.default_rng(6).standard_normal((13, 64)).astype("float32")
    plain, tiled = (relay_amp.execution.run(relay_amp.compile_module(mod, None, schedules),
                                            [x])[0] for schedules in (False, True))
    np.testing.assert_allclose(tiled, plain, rtol=0, atol=64 * 2.0**-23 * np.abs(plain).max())


@pytest.mark.parametrize(("target", "width"), [(AVX512, 16), (AVX2, 8)])
@pytest.mark.parametrize(("channels", "outputs", "size"), [(48, 24, 8), (160, 100, 1)])
def test_a_convolution_whose_channels_no_vector_divides_is_padded_with_zeros(
        target, width, channels, outputs, size):
    """A convolution's output channels are padded as a matmul's columns: MobileNetV2's 24
    channels on AVX-512 and a classifier's 1 x 1 convolution of one pixel (100 classes here)
    are packed (on AVX2, 24 channels are 3 vectors and need no zeros), run on vector FMAs
    with no scalar one (before: 12 lanes that LLVM vectorized as it could, and 8 lanes of one
    strided chain), and write only the real channels: the plain build's."""
    target = tvm.target.Target(target)
    mod = _conv(channels, outputs, size, seed=7, kernel=1, relu=False)
    with target:
        packed = packed_weights(target)(nhwc_convolutions()(mod))
    (panel,) = [tuple(e.value.shape) for e in _constants(packed) if e.value.ndim == 5]
    assert panel[0] * panel[4] == padded_outputs(outputs, width) >= outputs
    assert packed["main"].ret_ty.shape[1] == outputs
    asm = _assembly(mod, target)  # LLVM vectorizes one row's unrolled lanes as it likes
    assert len(re.findall(r"\bvfmadd\d+ps\s+[^\n]*%[xyz]mm", asm)) >= 4
    assert not re.findall(SCALAR_FMA, asm)
    x = np.random.default_rng(8).standard_normal((1, channels, size, size)).astype("float32")
    plain, tiled = (relay_amp.execution.run(relay_amp.compile_module(mod, None, schedules),
                                            [x])[0] for schedules in (False, True))
    np.testing.assert_allclose(tiled, plain, rtol=0,
                               atol=channels * 2.0**-23 * np.abs(plain).max())


def _constants(mod):
    found = []
    relax.analysis.post_order_visit(mod["main"], lambda e: found.append(e) if isinstance(
        e, tvm.ir.expr.Constant) and hasattr(e.value, "numpy") else None)
    return found


def test_a_tile_intrinsic_is_built_as_its_tvmscript_reads():
    """The intrinsics are built with TVMScript's IR builder, not parsed (25 ms a function
    parsed, about 1 built): what the impl builds is this text, 4 rows x 16 lanes of AVX2 vectors,
    2 steps (a loop: the rows and vectors are unrolled), rows 2 apart, one vector held and one
    each FMA's memory operand."""
    from tvm.s_tir import TensorIntrin
    from tvm.script import tirx as T

    from relay_amp.builds.x86_tiles import _intrinsic

    @T.prim_func(s_tir=True)
    def impl(a: T.handle, b: T.handle, c: T.handle) -> None:
        sa, sb, sc = T.int64(), T.int64(), T.int64()
        A = T.match_buffer(a, (7, 2), "float32", offset_factor=1, strides=[sa, 1])
        B = T.match_buffer(b, (2, 16), "float32", offset_factor=1, strides=[sb, 1])
        C = T.match_buffer(c, (4, 16), "float32", offset_factor=1, strides=[sc, 1],
                           scope="local")
        with T.sblock("root"):
            T.reads(C[0:4, 0:16], A[0:7, 0:2], B[0:2, 0:16])
            T.writes(C[0:4, 0:16])
            for k in T.serial(2):
                for r in T.unroll(4):
                    for g in T.unroll(1):
                        C[r, T.ramp(g * 8, 1, 8)] = T.call_llvm_pure_intrin(
                            "float32x8", "llvm.fma.v8f32", B.vload([k, g * 8], "float32x8"),
                            T.Broadcast(A[r * 2, k], 8), C[r, T.ramp(g * 8, 1, 8)])
                    for m in T.unroll(1):
                        C[r, T.ramp((1 + m) * 8, 1, 8)] = T.call_pure_extern(
                            "float32x8", "relay_amp_x86_fma8", C[r, T.ramp((1 + m) * 8, 1, 8)],
                            T.Broadcast(A[r * 2, k], 8), T.address_of(B[k, (1 + m) * 8]))

    built = TensorIntrin.get(_intrinsic(4, 2, 16, 8, "local", 2, 1))
    tvm.ir.assert_structural_equal(built.impl, impl)  # the desc: every tensorize test
    assert built.impl.script() == impl.script()  # its loops' names too, as kernels print them


@pytest.mark.parametrize(("target", "width"), [(AVX512, 16), (AVX2, 8)])
def test_one_row_times_a_matrix_runs_four_chains_of_fmas(target, width):
    """A batch-1 dense layer (one row, so no register tile): 4 vectors of lanes a tile, each
    sum its own chain of FMAs, not one vector's chain that waits for each FMA's result. LLVM
    vectorizes the unrolled lanes at 256 bits, so AVX-512's 64 lanes are 8 ymm sums. Outputs:
    the plain build's."""
    from relay_amp.builds.schedule_rules import RuleLog

    mod = projection(1, 256, 512, seed=5)
    log = RuleLog()
    with tvm.target.Target(target):
        cpu_pipeline(target, rule_log=log)(mod)
    (matmul,) = [s for s in log.schedules if "matmul" in s.kernel]
    assert any(d.startswith(f"tile: {4 * width} lanes") for d in matmul.decisions)
    assert "one row: 4 vector(s) of lanes, each its own chain of FMAs" in matmul.decisions
    asm = asm_kernel(_assembly(mod, target), "matmul")
    sums = set(re.findall(r"\bvfmadd\d+ps\s+[^\n]*,\s*(%[yz]mm\d+)\n", asm))
    assert len(sums) >= 4
    x = np.random.default_rng(6).standard_normal((1, 256)).astype("float32")
    plain, tiled = (relay_amp.execution.run(relay_amp.compile_module(mod, None, schedules),
                                            [x])[0] for schedules in (False, True))
    np.testing.assert_allclose(tiled, plain, rtol=0, atol=256 * 2.0**-23 * np.abs(plain).max())
