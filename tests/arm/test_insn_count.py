"""Executed-instruction counts on the emulated aarch64 CPU (``ArmEmulator.count``, the QEMU
plugin ``scripts/arm/insn_count.c``): the speed figure measurable without a board.

Needs ``bash scripts/arm/setup_emulator.sh`` (it builds the plugin); skips without it unless
``RELAY_AMP_ARM_REQUIRED=1``. Marker ``arm``.
"""

import functools
import subprocess

import numpy as np
import pytest
import tvm
from helpers import residual_block
from tvm import relax

import relay_amp
from relay_amp.builds import remote
from relay_amp.eval import arm_emulator
from relay_amp.eval.arm_emulator import (
    TARGET_BF16,
    TARGET_FP16,
    TARGET_FP16FML,
    TARGET_FP32,
    EmulatorError,
    InstructionCount,
)

pytestmark = pytest.mark.arm

M, K, N = 32, 64, 48
WEIGHT = (np.random.default_rng(0).standard_normal((K, N)) / 8).astype("float32")
VARIANTS = ("float32", "float16", "float16-fmlal", "float16-acc16", "float16-blocks16",
            "bfloat16")
#: The variants whose products run in half FMAs: float16 accumulation, whole or in blocks.
HALF_SUMS = ("float16-acc16", "float16-blocks16")
#: Multiply-accumulate lanes per instruction of each FMA entry of the mix.
LANES = {"fma s": 1, "fma h": 1, "fma .4s": 4, "fma .8h": 8, "fmlal": 4, "bfdot": 8,
         "bfmmla": 16, "bfmlal": 4}


def matmul_relu():
    """relu(x @ w), x (32, 64), w a (64, 48) float32 constant: 98,304 multiply-accumulates."""
    x = relax.Var("x", relax.TensorType((M, K), "float32"))
    w = relax.const(WEIGHT)
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            y = builder.emit(relax.op.matmul(x, w))
            out = builder.emit_output(relax.op.nn.relu(y))
        builder.emit_func_output(out)
    return builder.get()


def nhwc_block():
    """A MediaPipe block in TFLite's layout: x (1, 8, 8, 32), a pointwise convolution to 48
    channels, relu, a 3x3 depthwise convolution: 98,304 + 27,648 multiply-accumulates."""
    rng = np.random.default_rng(2)
    x = relax.Var("x", relax.TensorType((1, 8, 8, 32), "float32"))
    pointwise = relax.const((rng.standard_normal((1, 1, 32, 48)) / 8).astype("float32"))
    depthwise = relax.const((rng.standard_normal((3, 3, 48, 1)) / 4).astype("float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            y = builder.emit(relax.op.nn.conv2d(x, pointwise, data_layout="NHWC",
                                                kernel_layout="HWIO"))
            y = builder.emit(relax.op.nn.relu(y))
            out = builder.emit_output(relax.op.nn.conv2d(
                y, depthwise, padding=[1, 1], groups=48, data_layout="NHWC",
                kernel_layout="HWOI"))
        builder.emit_func_output(out)
    return builder.get()


NHWC_MACS = 8 * 8 * 32 * 48 + 8 * 8 * 48 * 9


def small_map_block():
    """A ResNet's last stage in small: x (1, 14, 14, 32) NHWC, a 1x1 convolution of stride 2 to
    48 channels on a 7x7 map, relu, a 3x3 convolution of 48 channels."""
    rng = np.random.default_rng(4)
    x = relax.Var("x", relax.TensorType((1, 14, 14, 32), "float32"))
    strided = relax.const((rng.standard_normal((1, 1, 32, 48)) / 8).astype("float32"))
    square = relax.const((rng.standard_normal((3, 3, 48, 48)) / 16).astype("float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            y = builder.emit(relax.op.nn.conv2d(x, strided, strides=[2, 2], data_layout="NHWC",
                                                kernel_layout="HWIO"))
            y = builder.emit(relax.op.nn.relu(y))
            out = builder.emit_output(relax.op.nn.conv2d(
                y, square, padding=[1, 1], data_layout="NHWC", kernel_layout="HWIO"))
        builder.emit_func_output(out)
    return builder.get()


SMALL_MAP_MACS = 7 * 7 * 32 * 48 + 7 * 7 * 48 * 48 * 9
#: The products BFMMLA's tiles compute for it: the 3 x 3 convolution's 56 rows (7 tiles of 8
#: pixels) and 432 products an output rounded up to 448 (whole calls of 8 steps of four); the
#: 1 x 1's 50 rows: its sums in registers, LLVM drops the last tile's three pairs of rows
#: that no output reads (the 49th pixel is the tile's only one).
SMALL_MAP_BFMMLA_MACS = 50 * 32 * 48 + 56 * 448 * 48


RGB_WEIGHT = (np.random.default_rng(8).standard_normal((5, 5, 3, 24)) / 8).astype("float32")


def rgb_block():
    """A network's first layer: an RGB image x (1, 32, 32, 3) NHWC, a 5x5 convolution of
    stride 2 to 24 channels (75 products an output, 3 a pixel)."""
    x = relax.Var("x", relax.TensorType((1, 32, 32, 3), "float32"))
    weight = relax.const(RGB_WEIGHT)
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            out = builder.emit_output(relax.op.nn.conv2d(
                x, weight, strides=[2, 2], padding=[2, 2], data_layout="NHWC",
                kernel_layout="HWIO"))
        builder.emit_func_output(out)
    return builder.get()


RGB_MACS = 16 * 16 * 24 * 75


def depthwise_block():
    """MediaPipe's depthwise convolutions: x (1, 14, 14, 48) NHWC, a 3x3 depthwise convolution,
    relu, a 5x5 depthwise convolution of stride 2."""
    rng = np.random.default_rng(6)
    x = relax.Var("x", relax.TensorType((1, 14, 14, 48), "float32"))
    three = relax.const((rng.standard_normal((3, 3, 48, 1)) / 4).astype("float32"))
    five = relax.const((rng.standard_normal((5, 5, 48, 1)) / 8).astype("float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            y = builder.emit(relax.op.nn.conv2d(x, three, padding=[1, 1], groups=48,
                                                data_layout="NHWC", kernel_layout="HWOI"))
            y = builder.emit(relax.op.nn.relu(y))
            out = builder.emit_output(relax.op.nn.conv2d(
                y, five, strides=[2, 2], padding=[1, 1, 2, 2], groups=48, data_layout="NHWC",
                kernel_layout="HWOI"))
        builder.emit_func_output(out)
    return builder.get()


DEPTHWISE_MACS = 14 * 14 * 48 * 9 + 7 * 7 * 48 * 25


def _library(variant, tmp_path, schedules=False, model=matmul_relu):
    """``variant`` of ``model`` built by TVM's CPU pipeline (or with ``schedules``,
    relay_amp's) and linked for aarch64."""
    mod = model()
    if variant == "float32":
        target = TARGET_FP32
    elif variant == "bfloat16":
        target = TARGET_BF16
        mod, _ = relay_amp.convert(mod, "bfloat16", target=target)
    else:
        target = TARGET_FP16FML if variant == "float16-fmlal" else TARGET_FP16
        policy = relay_amp.Policy("float16")
        if variant == "float16-acc16":
            policy = policy.set_accumulation_dtype("matmul", "float16")
        elif variant == "float16-blocks16":
            policy = policy.set_accumulation_block("matmul", 16)
        mod, _ = relay_amp.convert(mod, "float16", policy=policy, target=target)
    executable = tvm.compile(mod, target=tvm.target.Target(target),
                             relax_pipeline=relay_amp.cpu_pipeline(target, schedules))
    return remote.export_for(executable, tmp_path / f"{model.__name__}_{variant}_{schedules}.so",
                             target)


def _inputs():
    return [np.random.default_rng(1).standard_normal((M, K)).astype("float32")]


@pytest.mark.parametrize("schedules", [False, True], ids=["tvm", "relay_amp"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_each_multiply_accumulate_is_counted_once(counter, variant, schedules, tmp_path):
    """The FMA lanes the run executes are the matmul's multiply-accumulates, in the dtype its
    accumulation asks for: float16 accumulation (whole, or in blocks of 16 products) in half
    FMAs, every other variant in float32;
    one lane per instruction in TVM's build, vectors in relay_amp's (``fmlal`` with
    ``+fp16fml``, ``bfmmla`` with ``+bf16``)."""
    count = counter.count(_library(variant, tmp_path, schedules), _inputs())
    mix = count.mix()
    lanes = {name: mix[name] * LANES[name] for name in LANES}
    assert sum(lanes.values()) == M * K * N, mix
    half = lanes["fma h"] + lanes["fma .8h"]
    assert half == (M * K * N if variant in HALF_SUMS else 0), mix
    assert mix["total"] == count.total > M * K * N
    vector = lanes["fma .4s"] + lanes["fma .8h"] + lanes["fmlal"] + lanes["bfmmla"]
    if schedules or variant != "float16-blocks16":  # LLVM vectorizes the batched blocks itself
        assert vector == (M * K * N if schedules else 0), mix
    assert lanes["fmlal"] == (M * K * N if schedules and variant == "float16-fmlal" else 0), mix
    assert lanes["bfmmla"] == (M * K * N if schedules and variant == "bfloat16" else 0), mix


def test_fmlal_gives_the_widening_builds_sums_in_fewer_instructions(counter, tmp_path):
    """FMLAL multiplies two float16 values exactly and adds the product into a float32 sum
    with one rounding, as the widened operands' ``fmla v.4s`` does: the outputs are the
    ``+fullfp16`` build's bit for bit, with no operand widened in the dot product (``fcvtl``:
    only the result's widening and the input's cast remain) and fewer instructions executed.
    (Against float32, docs/ARM.md counts whole models: on this small matmul the float16
    module's cast kernels and their calls weigh as much as the dot product's saving.)"""
    fmlal = counter.count(_library("float16-fmlal", tmp_path, True), _inputs())
    widened = counter.count(_library("float16", tmp_path, True), _inputs())
    np.testing.assert_array_equal(fmlal.outputs[0], widened.outputs[0])
    assert fmlal.mix()["convert"] < widened.mix()["convert"] / 4, (fmlal.mix(), widened.mix())
    assert fmlal.total < widened.total - M * K * N / 16, (fmlal.total, widened.total)


@pytest.mark.parametrize("variant", ["float32", "float16-fmlal", "bfloat16"])
def test_an_nhwc_block_runs_every_product_in_vector_lanes(counter, variant, tmp_path):
    """The pointwise convolution on the register tile (a vector of input channels per row,
    by element), the depthwise one lane-wise: every multiply-accumulate in ``fmla v.4s``
    (float32) or ``fmlal`` (float16, ``+fp16fml``) lanes, outputs those of TVM's float32
    build (float32) or bit for bit the widening ``+fullfp16`` build (float16). bfloat16
    (``+bf16``): the pointwise convolution on ``bfmmla``, the depthwise one on ``bfmlalb`` and
    ``bfmlalt``, outputs TVM's bfloat16 build's to float32 rounding."""
    inputs = [np.random.default_rng(3).standard_normal((1, 8, 8, 32)).astype("float32")]
    count = counter.count(_library(variant, tmp_path, True, nhwc_block), inputs)
    lanes = {name: n * LANES[name] for name, n in count.mix().items() if name in LANES}
    if variant == "bfloat16":
        pointwise = 8 * 8 * 32 * 48
        assert (lanes["bfmmla"], lanes["bfmlal"], lanes["fma .4s"]) == (
            pointwise, NHWC_MACS - pointwise, 0), lanes
        plain = counter.run(_library("bfloat16", tmp_path, False, nhwc_block), inputs)
        np.testing.assert_allclose(count.outputs[0], plain[0], rtol=0,
                                   atol=1e-5 * np.abs(plain[0]).max())
        return
    assert lanes["fmlal" if variant == "float16-fmlal" else "fma .4s"] == NHWC_MACS, lanes
    if variant == "float32":
        plain = counter.run(_library("float32", tmp_path, False, nhwc_block), inputs)
        np.testing.assert_allclose(count.outputs[0], plain[0], rtol=0,
                                   atol=1e-5 * np.abs(plain[0]).max())
    else:
        widened = counter.run(_library("float16", tmp_path, True, nhwc_block), inputs)
        np.testing.assert_array_equal(count.outputs[0], widened[0])


@pytest.mark.parametrize("variant", ["float32", "float16-fmlal", "bfloat16"])
def test_a_small_map_and_a_strided_convolution_run_on_full_register_tiles(counter, variant,
                                                                         tmp_path):
    """A 7-wide map takes a tile of 7 rows of 8 lanes (4 or 2 rows do not divide it; a tile of
    one row loaded each weight vector for one row), and a stride-2 convolution reads its rows
    two pixels apart in the tile: every product by element on a register tile, no scalar
    loaded on its own (``ldr s``, ``ld1r``), at most 0.3 vector loads an FMA (the runtime's
    calls, which load addresses, weigh much in a layer this small); the outputs are TVM's
    float32 build's (float32), the widening float16 build's bit for bit (FMLAL) or the plain
    bfloat16 build's to float32 rounding. bfloat16 runs on BFMMLA's tiles of 8 pixels: the
    49 pixels are 56 rows (50 in the 1 x 1 convolution), and the 3 x 3 convolution's 108
    steps of four products 112 (:data:`SMALL_MAP_BFMMLA_MACS`, 17 % more than the layers'
    own products), with at most
    0.6 vector loads a ``bfmmla`` (16 products), the packed input's copy included."""
    inputs = [np.random.default_rng(5).standard_normal((1, 14, 14, 32)).astype("float32")]
    count = counter.count(_library(variant, tmp_path, True, small_map_block), inputs)
    fmas = {"float16-fmlal": "fmlal", "bfloat16": "bfmmla"}.get(variant, "fma .4s")
    mix = count.mix()
    macs = SMALL_MAP_BFMMLA_MACS if variant == "bfloat16" else SMALL_MAP_MACS
    assert mix[fmas] * LANES[fmas] == macs, mix
    scalar_loads = {kind: n for kind, n in count.kinds.items()
                    if kind.startswith(("ld1r", "ldr s", "ldr h", "ldur s", "ldur h"))}
    assert sum(scalar_loads.values()) < macs / 400, scalar_loads  # 1 % of fmla v.4s
    assert _vector_loads(count) <= (0.6 if variant == "bfloat16" else 0.3) * mix[fmas], \
        count.kinds
    if variant != "float16-fmlal":
        plain = counter.run(_library(variant, tmp_path, False, small_map_block), inputs)
        np.testing.assert_allclose(count.outputs[0], plain[0], rtol=0,
                                   atol=1e-5 * np.abs(plain[0]).max())
    else:
        widened = counter.run(_library("float16", tmp_path, True, small_map_block), inputs)
        np.testing.assert_array_equal(count.outputs[0], widened[0])


def test_an_rgb_images_three_channels_run_on_the_fmlal_tile(counter, tmp_path):
    """Three channels a pixel is a depth no power of two divides: each row of the FMLAL tile
    reads its three float16 scalars as two overlapping 32-bit loads at immediate offsets and
    multiplies by element, where the per-product kernel loaded each scalar alone (``ld1r``,
    whose address took an instruction of its own: face_detection_short_range's first layer
    executed 4.33 M instructions against float32's 3.22 M). The outputs are the widening
    float16 build's, bit for bit."""
    inputs = [np.random.default_rng(9).standard_normal((1, 32, 32, 3)).astype("float32")]
    count = counter.count(_library("float16-fmlal", tmp_path, True, rgb_block), inputs)
    mix = count.mix()
    assert mix["fmlal"] * LANES["fmlal"] == RGB_MACS, mix
    assert count.kinds.get("ld1r .8h", 0) < mix["fmlal"] / 100, count.kinds
    assert sum(n for kind, n in count.kinds.items()
               if kind.startswith(("ldr s", "ldur s"))) >= mix["fmlal"] / 12, count.kinds
    widened = counter.run(_library("float16", tmp_path, True, rgb_block), inputs)
    np.testing.assert_array_equal(count.outputs[0], widened[0])


def test_an_rgb_images_copy_for_bfdot_stores_a_pixel_a_vector(counter, tmp_path):
    """``+bf16``: the RGB convolution runs on BFDOT over channels padded 3 to 4, in a copy of
    the image that rounds to bfloat16. Each pixel's four channels are one vector store (one
    ``strh`` a channel before, 4,120 on this image; the last pixel, whose vector would read
    past the input, has a branch of its own), and the outputs are the plain bfloat16 build's
    within BFDOT's bound."""
    inputs = [np.random.default_rng(9).standard_normal((1, 32, 32, 3)).astype("float32")]
    count = counter.count(_library("bfloat16", tmp_path, True, rgb_block), inputs, warmup=1)
    plain = counter.run(_library("bfloat16", tmp_path, False, rgb_block), inputs)
    padded = 36 * 36
    assert count.mix()["bfdot"] * LANES["bfdot"] == 16 * 16 * 24 * 5 * 5 * 4, count.mix()
    assert count.kinds.get("str d", 0) >= padded, count.kinds
    assert count.kinds.get("strh w", 0) < padded // 16, count.kinds
    image = np.pad(inputs[0][0], ((2, 2), (2, 2), (0, 0)))
    rows = np.stack([image[2 * i:2 * i + 5, 2 * j:2 * j + 5].reshape(-1)
                     for i in range(16) for j in range(16)])
    difference = np.abs(count.outputs[0].astype(np.float64) - plain[0]).reshape(-1, 24)
    assert (difference <= _bf16_bound(rows, RGB_WEIGHT.reshape(75, 24), 2)).all(), (
        difference.max())


def test_kernels_are_counted_apart_and_add_up_to_the_run(tmp_path):
    """With ``count_kernels`` each function of the library gets its own count: the
    convolution's kernel holds every FMA of the run, and the functions add up to the total."""
    inputs = [np.random.default_rng(5).standard_normal((1, 14, 14, 32)).astype("float32")]
    with arm_emulator.ArmEmulator(count_instructions=True, count_kernels=True) as emulator:
        count = emulator.count(_library("float32", tmp_path, True, small_map_block), inputs,
                               warmup=1)
    kernels = {name: n for name, n in count.kernels.items() if name.endswith("conv2d_relu_compute_")
               or name.endswith("conv2d1_compute_")}
    assert len(kernels) == 2 and min(kernels.values()) >= 49 * 48 * 32 // 4, count.kernels
    assert sum(kernels.values()) >= count.mix()["fma .4s"], (kernels, count.mix())
    assert abs(sum(count.kernels.values()) - count.total) <= count.total / 100, (
        sum(count.kernels.values()), count.total)


def bias_block(size: int = 8, depthwise: bool = False):
    """x (1, size, size, 32) NHWC, a convolution (a 1x1 to 32 channels, or a 3x3 depthwise)
    and a bias per channel, which the bfloat16 build adds in float32 and rounds to bfloat16 for
    the 1x1 convolution after it."""
    rng = np.random.default_rng(8)
    x = relax.Var("x", relax.TensorType((1, size, size, 32), "float32"))
    first = relax.const((rng.standard_normal((3, 3, 32, 1) if depthwise else (1, 1, 32, 32))
                         / 4).astype("float32"))
    bias = relax.const(rng.standard_normal((1, 1, 1, 32)).astype("float32"))
    last = relax.const((rng.standard_normal((1, 1, 32, 32)) / 8).astype("float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            y = builder.emit(relax.op.nn.conv2d(
                x, first, padding=[1, 1] if depthwise else [0, 0], groups=32 if depthwise else 1,
                data_layout="NHWC", kernel_layout="HWOI" if depthwise else "HWIO"))
            y = builder.emit(relax.op.add(y, bias))
            out = builder.emit_output(relax.op.nn.conv2d(y, last, data_layout="NHWC",
                                                         kernel_layout="HWIO"))
        builder.emit_func_output(out)
    return builder.get()


@pytest.mark.parametrize("size, depthwise, on_bfcvtn", [(8, False, True), (7, False, False),
                                                        (14, True, True)],
                         ids=["bfmmla-rows-of-8", "bfmmla-tiles-span-two-rows",
                              "bfmlal-rows-of-7"])
def test_a_tiles_rounding_to_bfloat16_runs_on_bfcvtn(counter, size, depthwise, on_bfcvtn,
                                                      tmp_path):
    """relay_amp.builds.bfcvtn: a tile whose pixels are whole rows of the map (BFMMLA's 8 on a
    map 8 wide, BFMLAL's rows of 7 on one 14 wide) rounds its results on ``bfcvtn`` and
    ``bfcvtn2``, eight values a pair; TVM's integer rounding (``addhn`` or ``addhn2``, one
    an instruction of four values) is left to the input's cast, which the 1 x 1 convolution
    computes in its copy of the input (an input of the function: ``bfdot.shared_casts``), or a
    kernel of its own does (the depthwise one's). BFMMLA's 8 pixels on a map 7
    wide span two rows, where the rounding would cover both whole, so TVM's rounding stays
    (with it, 640 of 1,568 outputs were wrong). The outputs are the plain bfloat16 build's to
    float32 rounding of the sums."""
    block = functools.partial(bias_block, size, depthwise)
    block.__name__ = f"bias_block_{size}_{depthwise}"
    inputs = [np.random.default_rng(9).standard_normal((1, size, size, 32)).astype("float32")]
    count = counter.count(_library("bfloat16", tmp_path, True, block), inputs)
    converts = {}
    for kind, n in count.kinds.items():
        if kind.startswith(("bfcvtn", "addhn")):
            name = "addhn" if kind.startswith("addhn") else kind.split(" ")[0]
            converts[name] = converts.get(name, 0) + n
    vectors = size * size * 32 // 8  # eight values a rounding: the input's, the tile's
    expected = {"addhn": 2 * vectors, "bfcvtn": vectors, "bfcvtn2": vectors} \
        if on_bfcvtn else {"addhn": 4 * vectors}
    assert converts == expected, converts
    plain = counter.run(_library("bfloat16", tmp_path, False, block), inputs)
    np.testing.assert_allclose(count.outputs[0], plain[0], rtol=0,
                               atol=1e-5 * np.abs(plain[0]).max())


def _vector_loads(count) -> int:
    return sum(n for kind, n in count.kinds.items()
               if kind.split(" ")[0] in ("ldr", "ldur", "ldp") and kind[-1] in "qd")


@pytest.mark.parametrize("variant", ["float32", "float16-fmlal", "bfloat16"])
def test_depthwise_rows_share_each_weight_vector(counter, variant, tmp_path):
    """A depthwise convolution computes several output pixels of a row at once: each weight
    vector is loaded once for all of them, and LLVM loads an input vector that neighbouring
    taps share once (at most 0.9 vector loads an FMA, 2 with a pixel at a time; bfloat16's
    BFMLALB/BFMLALT read eight lanes a load for two instructions: at most 0.5); every product
    in vector lanes, the outputs TVM's float32 build's (float32), the widening float16 build's
    bit for bit (FMLAL) or TVM's bfloat16 build's bit for bit (BFMLAL: the products are exact
    in float32 and each sum adds them in the same order)."""
    inputs = [np.random.default_rng(7).standard_normal((1, 14, 14, 48)).astype("float32")]
    count = counter.count(_library(variant, tmp_path, True, depthwise_block), inputs)
    fmas = {"float16-fmlal": "fmlal", "bfloat16": "bfmlal"}.get(variant, "fma .4s")
    mix = count.mix()
    assert mix[fmas] * 4 == DEPTHWISE_MACS, mix
    assert _vector_loads(count) <= (0.5 if variant == "bfloat16" else 0.9) * mix[fmas], \
        count.kinds
    if variant == "float32":
        plain = counter.run(_library("float32", tmp_path, False, depthwise_block), inputs)
        np.testing.assert_allclose(count.outputs[0], plain[0], rtol=0,
                                   atol=1e-5 * np.abs(plain[0]).max())
    elif variant == "bfloat16":
        plain = counter.run(_library("bfloat16", tmp_path, False, depthwise_block), inputs)
        np.testing.assert_array_equal(count.outputs[0], plain[0])
    else:
        widened = counter.run(_library("float16", tmp_path, True, depthwise_block), inputs)
        np.testing.assert_array_equal(count.outputs[0], widened[0])


def pool_block():
    """YOLOv8's SPPF: x (1, 10, 10, 128) NHWC, three 5 x 5 max pools of stride 1 in a row."""
    x = relax.Var("x", relax.TensorType((1, 10, 10, 128), "float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            y = x
            for _ in range(3):
                y = builder.emit(relax.op.nn.max_pool2d(y, 5, 1, 2, layout="NHWC"))
            out = builder.emit_output(y)
        builder.emit_func_output(out)
    return builder.get()


#: The window values the three pools reduce.
POOL_VALUES = 3 * 10 * 10 * 128 * 25


@pytest.mark.parametrize("variant", ["float32", "float16-fmlal", "bfloat16"])
def test_a_pools_window_runs_on_vectors_of_channels(counter, variant, tmp_path):
    """A max pool in NHWC reduces its window outside vectors of channels, its running maximum
    in registers: under one instruction per window value in every dtype, in the steady state
    (bfloat16, whose legalization rounded each step's maximum, executed 9.1 before), the
    outputs TVM's build's bit for bit."""
    inputs = [np.random.default_rng(8).standard_normal((1, 10, 10, 128)).astype("float32")]
    count = counter.count(_library(variant, tmp_path, True, pool_block), inputs, warmup=1)
    assert count.total <= POOL_VALUES, (count.total / POOL_VALUES, count.kinds)
    plain = counter.run(_library(variant, tmp_path, False, pool_block), inputs)
    np.testing.assert_array_equal(count.outputs[0], plain[0])


def _bf16_bound(inputs, weight, products: int):
    """What BFDOT (``products`` 2) or BFMMLA (4) may move each output of ``inputs @ weight``
    by from the plain bfloat16 build: each sums its ``products`` products before adding them
    (a rounding less or more per product) and flushes denormals, so within
    ``products * K * 2**-23 * sum |a * b|`` (float32 roundings of the partial sums), with the
    operands as bfloat16 holds them."""
    import ml_dtypes

    def bf16(a):
        return np.abs(a.astype(ml_dtypes.bfloat16).astype(np.float64))

    return products * inputs.shape[-1] * 2.0 ** -23 * (bf16(inputs) @ bf16(weight))


def narrow_matmul_relu():
    """relu(x @ w) on 4 rows of ``x``: fewer than a BFMMLA tile's 8."""
    x = relax.Var("x", relax.TensorType((4, K), "float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            y = builder.emit(relax.op.matmul(x, relax.const(WEIGHT)))
            out = builder.emit_output(relax.op.nn.relu(y))
        builder.emit_func_output(out)
    return builder.get()


@pytest.mark.parametrize("model, kind, products", [
    (matmul_relu, "bfmmla", 4), (narrow_matmul_relu, "bfdot", 2)], ids=["bfmmla", "bfdot"])
def test_bf16_runs_the_matmul_in_wide_lanes_within_its_rounding(counter, model, kind,
                                                                products, tmp_path):
    """``+bf16``: the 32-row matmul on ``bfmmla`` (16 multiply-accumulates an instruction),
    the 4-row one on ``bfdot`` (8), no operand widened; outputs the plain bfloat16 build's
    within :func:`_bf16_bound`; BFMMLA's in fewer executed instructions than relay_amp's
    float32 build (steady state; the runtime's calls around one small matmul included)."""
    inputs = [_inputs()[0][:4]] if model is narrow_matmul_relu else _inputs()
    rows = inputs[0].shape[0]
    count = counter.count(_library("bfloat16", tmp_path, True, model), inputs, warmup=1)
    plain = counter.run(_library("bfloat16", tmp_path, False, model), inputs)
    float32 = counter.count(_library("float32", tmp_path, True, model), inputs, warmup=1)
    assert count.mix()[kind] * LANES[kind] == rows * K * N, count.mix()
    assert count.mix()["convert"] == 0, count.mix()
    difference = np.abs(count.outputs[0].astype(np.float64) - plain[0])
    assert (difference <= _bf16_bound(inputs[0], WEIGHT, products)).all(), difference.max()
    if kind == "bfmmla":  # four rows: the input's cast weighs as much as the dot product
        assert count.total < 0.9 * float32.total, (count.total, float32.total)


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v not in HALF_SUMS[1:]])
def test_relay_amps_build_executes_at_most_half(counter, variant, tmp_path):
    """relay_amp.cpu_pipeline against TVM's CPU pipeline on the same converted matmul: the same
    outputs in at most half the executed instructions. (Not float16 in blocks: its batched
    matmul, casts and sum are three kernels that neither pipeline fuses; docs/ARM.md.)"""
    plain = counter.count(_library(variant, tmp_path), _inputs())
    scheduled = counter.count(_library(variant, tmp_path, schedules=True), _inputs())
    assert scheduled.total <= 0.5 * plain.total, (scheduled.total, plain.total)
    np.testing.assert_allclose(scheduled.outputs[0], plain.outputs[0], rtol=0,
                               atol=1e-5 * np.abs(plain.outputs[0]).max())


def test_the_count_repeats_and_its_run_is_the_plain_run(counter, tmp_path):
    lib = _library("float16", tmp_path)
    first, second = counter.count(lib, _inputs()), counter.count(lib, _inputs())
    arithmetic = ("fma .8h", "fma .4s", "fma h", "fma s", "fmlal", "convert")
    assert [first.mix()[k] for k in arithmetic] == [second.mix()[k] for k in arithmetic]
    # the session's socket reads take a few hundred instructions more or less with timing
    # (807 of 1.17 M seen on a loaded machine): the total repeats to 0.2 %
    assert abs(first.total - second.total) <= 2e-3 * first.total
    plain = counter.run(lib, _inputs())
    np.testing.assert_array_equal(first.outputs[0], plain[0])
    reference = np.maximum(_inputs()[0] @ WEIGHT, 0)
    assert relay_amp.agreement([reference], list(first.outputs)).relative_l2 < 1e-3


def test_the_steady_state_count_has_the_same_products_per_run(counter, tmp_path):
    """``warmup=1, runs=2``: sessions of 1 and 3 runs, the difference over 2 (the count
    ``scripts/bench_arm_peers.py`` takes): the first run's one-time work is left out, every
    multiply-accumulate stays."""
    lib = _library("float32", tmp_path, True)
    first = counter.count(lib, _inputs())
    steady = counter.count(lib, _inputs(), warmup=1, runs=2)
    assert steady.mix()["fma .4s"] == first.mix()["fma .4s"]
    assert steady.total <= first.total
    np.testing.assert_array_equal(steady.outputs[0], first.outputs[0])
    with pytest.raises(ValueError, match="runs"):
        counter.count(lib, _inputs(), runs=0)


def test_an_emulator_that_does_not_count_says_so(emulator, tmp_path):
    with pytest.raises(EmulatorError, match="count_instructions=True"):
        emulator.count(_library("float32", tmp_path), _inputs())


def test_mix_sums_kinds_by_mnemonic_and_shape():
    count = InstructionCount({"fmla .8h": 3, "fmla .4s": 5, "fmadd h": 7, "fmlal2 .4s": 11,
                              "fcvtl .4s": 13, "ldr q": 17, "add x": 19})
    mix = count.mix()
    assert (mix["fma .8h"], mix["fma .4s"], mix["fma h"], mix["fmlal"], mix["convert"],
            mix["load"]) == (3, 5, 7, 11, 13, 17)
    assert mix["total"] == count.total == 75


#: Instructions the counter must name (the half-precision and bfloat16 ones are decoded from
#: their encoding: the disassembler of Debian's QEMU 7.2 prints ".byte" for them), and neighbours
#: of theirs in the encoding space that it must not take for them.
KNOWN = {
    "fmla v0.8h, v1.8h, v2.8h": "fmla .8h", "fmla v0.4h, v1.4h, v2.4h": "fmla .4h",
    "fmls v0.8h, v1.8h, v2.8h": "fmls .8h", "fmla v0.8h, v1.8h, v2.h[3]": "fmla .8h",
    "fmadd h0, h1, h2, h3": "fmadd h", "fnmadd h0, h1, h2, h3": "fnmadd h",
    "fadd h0, h1, h2": "fadd h", "fmul v0.8h, v1.8h, v2.8h": "fmul .8h",
    "fmlal v0.4s, v1.4h, v2.4h": "fmlal .4s", "fmlal2 v0.4s, v1.4h, v2.4h": "fmlal2 .4s",
    "fmlal v0.4s, v1.4h, v2.h[1]": "fmlal .4s", "bfdot v0.4s, v1.8h, v2.8h": "bfdot .4s",
    "bfdot v0.4s, v1.8h, v2.2h[1]": "bfdot .4s", "bfmmla v0.4s, v1.8h, v2.8h": "bfmmla .4s",
    "bfcvt h0, s1": "bfcvt h", "fmla v0.4s, v1.4s, v2.4s": "fmla .4s",
    "fmadd s0, s1, s2, s3": "fmadd s", "fcvtl v0.4s, v1.4h": "fcvtl .4s",
    "mul v0.4s, v1.4s, v2.s[0]": "mul .4s", "fmul v0.4s, v1.4s, v2.4s": "fmul .4s",
}


def test_the_counter_names_each_instruction(counter, tmp_path):
    """A program that runs each instruction of ``KNOWN`` 100 times, under the counter."""
    source = tmp_path / "known.S"
    body = "\n".join(f"    {instruction}" for instruction in KNOWN)
    source.write_text(f".global _start\n_start:\n    mov x9, #100\n1:\n{body}\n"
                      "    subs x9, x9, #1\n    b.ne 1b\n    mov x0, #0\n    mov x8, #93\n"
                      "    svc #0\n")
    program = tmp_path / "known"
    subprocess.run(["aarch64-linux-gnu-gcc", "-nostdlib", "-static",
                    "-march=armv8.6-a+fp16+fp16fml+bf16", str(source), "-o", str(program)],
                   check=True)
    prefix = tmp_path / "counts"
    subprocess.run([arm_emulator.QEMU_PLUGINS, "-plugin",
                    f"{arm_emulator.counter_path()},out={prefix}", str(program)], check=True)
    (written,) = tmp_path.glob("counts.*")
    counts = {}
    for line in written.read_text().splitlines():
        number, kind = line.split("\t")
        counts[kind] = int(number)
    expected = {}
    for kind in KNOWN.values():
        expected[kind] = expected.get(kind, 0) + 100
    assert {kind: counts.get(kind) for kind in expected} == expected


def test_a_residual_blocks_odd_channels_and_shared_cast_run_on_bfmlal_and_bfdot(counter,
                                                                                 tmp_path):
    """MediaPipe's residual block (``helpers.residual_block``): the float32 tensor the residual
    add reads is rounded to bfloat16 in the depthwise convolution's copy of it, the
    depthwise convolution's 28 channels run as 32 on BFMLALB/BFMLALT and the 1 x 1
    convolution's 42 outputs as 44 on BFDOT. The depthwise sums are the plain bfloat16
    build's bit for bit (exact products, the same order, TVM's rounding), the 1 x 1
    convolution's within BFDOT's bound (:func:`_bf16_bound`); every product on its
    instruction."""
    mod = residual_block()

    def library(schedules):
        executable = tvm.compile(mod, target=tvm.target.Target(TARGET_BF16),
                                 relax_pipeline=relay_amp.cpu_pipeline(TARGET_BF16, schedules))
        return remote.export_for(executable, tmp_path / f"residual_{schedules}.so",
                                 TARGET_BF16)

    inputs = [np.random.default_rng(5).standard_normal((1, 12, 12, 28)).astype("float32")]
    count = counter.count(library(True), inputs, warmup=1)
    plain = counter.run(library(False), inputs)
    mix = count.mix()
    assert mix["bfmlal"] * 4 == 12 * 12 * 32 * 9, mix
    assert mix["bfdot"] * 8 == 12 * 12 * 44 * 28, mix
    np.testing.assert_array_equal(count.outputs[0], plain[0])
    import ml_dtypes

    weight = mod["main"].body.blocks[0].bindings[-2].value.args[1].value.numpy()
    rows = plain[0].astype(ml_dtypes.bfloat16).astype(np.float32).reshape(-1, 28)
    difference = np.abs(count.outputs[1].astype(np.float64) - plain[1]).reshape(-1, 42)
    assert (difference <= _bf16_bound(rows, weight.reshape(28, 42), 2)).all(), difference.max()
