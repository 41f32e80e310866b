"""relay_amp.builds.bfmmla: bfloat16 convolutions and matmuls on BFMMLA with ``+bf16``.

The packing pass writes the same sums over a packed weight and a packed input (checked by
running both on this machine); the aarch64 build runs those kernels' products in ``bfmmla``
(read off the assembly); ops BFMMLA does not suit stay on BFDOT. tests/arm counts them on the
emulated CPU."""

import re

import ml_dtypes
import numpy as np
import pytest
import tvm
from helpers import asm_functions
from tvm import relax

import relay_amp
from relay_amp.builds import bfmmla
from relay_amp.builds.bfdot import packed_bfloat16_weights
from relay_amp.builds.nhwc import nhwc_convolutions
from relay_amp.builds.schedule_rules import RuleLog
from relay_amp.execution import run

BF16 = {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon", "+bf16"]}
A64_BFMMLA = r"\bbfmmla\s+v\d+\.4s,\s*v\d+\.8h,\s*v\d+\.8h"
A64_WIDEN = r"\b(shll2?|fcvtl2?)\s+v\d+\.4s"
A64_LANE_LOAD = r"\bld1\s+\{\s*v\d+\.s\s*\}\[\d\]|\bldr\s+s\d+, \[x\d+, w\d+"


def conv(channels=16, out_channels=32, size=8, kernel=3, padding=1, strides=1, dilation=1,
         then_pointwise=False, activation=relax.op.nn.relu):
    """An NCHW convolution with ``activation``, float32 constants; ``then_pointwise``: a 1 x 1
    convolution after it, so the first stores its result in bfloat16 (a cast in its
    epilogue)."""
    rng = np.random.default_rng(0)
    x = relax.Var("x", relax.TensorType((1, channels, size, size), "float32"))
    weight = rng.standard_normal((out_channels, channels, kernel, kernel)).astype("float32")
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            y = builder.emit(relax.op.nn.conv2d(x, relax.const(weight), strides=strides,
                                                padding=padding, dilation=dilation))
            out = activation(y)
            if then_pointwise:
                out = relax.op.nn.conv2d(builder.emit(out), relax.const(rng.standard_normal(
                    (out_channels, out_channels, 1, 1)).astype("float32")))
            out = builder.emit_output(out)
        builder.emit_func_output(out)
    return builder.get(), [rng.standard_normal((1, channels, size, size)).astype("float32")]


def matmul(rows=12, depth=30, columns=32):
    """``x @ W``, x ``(1, rows, depth)``, a float32 constant W."""
    rng = np.random.default_rng(1)
    count = rows if isinstance(rows, int) else tvm.tirx.Var(rows, "int64")
    x = relax.Var("x", relax.TensorType((1, count, depth), "float32"))
    weight = rng.standard_normal((depth, columns)).astype("float32")
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            out = builder.emit_output(relax.op.matmul(x, relax.const(weight)))
        builder.emit_func_output(out)
    size = rows if isinstance(rows, int) else 5
    return builder.get(), [rng.standard_normal((1, size, depth)).astype("float32")]


def _packed(mod):
    with tvm.target.Target(BF16):
        return packed_bfloat16_weights()(nhwc_convolutions()(mod))


def _kernels(mod):
    return sorted(gvar.name_hint for gvar, func in mod.functions_items()
                  if isinstance(func, tvm.tirx.PrimFunc))


def _converted(model):
    mod, inputs = model
    converted, _ = relay_amp.convert(mod, "bfloat16", target=BF16)
    return converted, inputs


def _call_constants(mod):
    found = {}

    def visit(expr):
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) \
                and expr.op.name == "relax.call_tir":
            found[expr.args[0].name_hint] = expr.args[1][1].value.numpy()

    relax.analysis.post_order_visit(mod["main"], visit)
    return found


def test_the_weights_are_packed_as_bfmmla_reads_them():
    """``W'[s, n / 2, n % 2, r] == W[4s + r, n]``: the convolution's (3, 3, 16, 32) HWIO
    weight as a (144, 32) matrix (tap-major, as the plain convolution sums), its 36 steps of
    four rounded up to 40 with zeros; the matmul's (30, 32) weight with two zero rows."""
    mod, _ = _converted(conv())
    text = mod.script()
    packed = _call_constants(_packed(mod))["conv2d_nhwc_bfmmla"]
    assert mod.script() == text  # the input unchanged
    assert packed.shape == (40, 16, 2, 4)
    weight = np.random.default_rng(0).standard_normal((32, 16, 3, 3)).astype("float32")
    matrix = np.concatenate([weight.transpose(2, 3, 1, 0).reshape(144, 32),
                             np.zeros((16, 32), weight.dtype)])
    np.testing.assert_array_equal(packed.transpose(0, 3, 1, 2).reshape(160, 32),
                                  matrix.astype(ml_dtypes.bfloat16))

    mod, _ = _converted(matmul())
    packed = _call_constants(_packed(mod))["matmul_bfmmla"]
    assert packed.shape == (8, 16, 2, 4)
    assert not packed.transpose(0, 3, 1, 2).reshape(32, 32)[30:].any()


@pytest.mark.parametrize("model", [
    conv(), conv(padding=0), conv(strides=2), conv(channels=20, kernel=5, padding=2, strides=2),
    conv(channels=18), conv(channels=20, kernel=1, padding=0), conv(dilation=2, padding=2),
    conv(size=7, kernel=1, padding=0), conv(size=18), matmul(),
    matmul(rows=16, depth=64, columns=40), matmul(rows="n"),
    conv(channels=24, out_channels=24, kernel=1, padding=0)],
    ids=["3x3", "no-padding", "stride-2", "5x5-odd-steps", "18-channels", "five-steps",
         "dilation-2", "7x7-map", "41-tiles", "matmul", "matmul-16-rows", "symbolic-rows",
         "24-columns"])
def test_the_packed_kernels_compute_the_same_sums(model):
    """Built for this machine (no BFMMLA: TVM widens the operands), the packed module gives
    the unpacked one's outputs: each output sums the same products in the same order; the
    zeros past the input's edges, its channels and the tile's rows add nothing."""
    mod, inputs = _converted(model)
    packed = _packed(mod)
    assert [k for k in _kernels(packed) if "bfmmla" in k], _kernels(packed)
    plain = run(relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu()), inputs)
    got = run(relax.VirtualMachine(tvm.compile(packed, target="llvm"), tvm.cpu()), inputs)
    np.testing.assert_allclose(got[0], plain[0], rtol=1e-6, atol=1e-6 * np.abs(plain[0]).max())


@pytest.mark.parametrize("model, kernel", [
    (conv(out_channels=36), "conv2d_nhwc_bfdot"),
    (conv(out_channels=24), "conv2d_nhwc_bfdot"),
    (conv(channels=3, kernel=5, padding=2, strides=2), "conv2d_nhwc_bfdot"),
    (conv(channels=8), "conv2d_nhwc_bfdot"),
    (matmul(depth=8), "matmul_bfdot"),
    (conv(size=2, padding=0, kernel=1), "conv2d_nhwc_bfdot"),
    (matmul(rows=4), "matmul_bfdot"),
    (matmul(columns=20), "matmul_bfdot")],
    ids=["36-columns", "24-columns", "rgb", "8-channels", "8-deep", "4-pixels", "4-rows",
         "20-columns"])
def test_what_bfmmla_does_not_suit_stays_on_bfdot(model, kernel):
    """Output channels not a multiple of a tile's 8 or fewer than ``bfmmla.MIN_COLUMNS``,
    input channels fewer than ``bfmmla.MIN_CHANNELS`` (an RGB image's three), fewer than
    ``bfmmla.MIN_PRODUCTS`` of the two multiplied (16 -> 24), fewer rows than
    a tile (BFDOT's eight products an instruction all count): BFDOT's kernels."""
    mod, _ = _converted(model)
    assert _kernels(_packed(mod)) == [kernel]


@pytest.mark.parametrize("model", [conv(), conv(channels=20, kernel=5, padding=2, strides=2),
                                   conv(channels=20, kernel=1, padding=0), conv(size=18),
                                   matmul(rows=16, depth=64, columns=40), matmul(rows="n")],
                         ids=["3x3", "5x5-odd-steps", "five-steps", "41-tiles", "matmul",
                              "symbolic-rows"])
def test_every_product_runs_in_bfmmla(model):
    """The aarch64 ``+bf16`` build: the kernel's products on ``bfmmla`` (no ``bfdot``, no
    float32 FMA, no operand widened), scheduled by the BFMMLA rule with the epilogue in the
    tile's write-back, as the build's report says; 324 pixels are 41 tiles of 8 rows, in 14
    parallel groups of 3 once padded to 42 (a group's remainder kept the tile from being
    tensorized)."""
    mod, _ = _converted(model)
    log = RuleLog()
    executable = tvm.compile(mod, target=tvm.target.Target(BF16),
                             relax_pipeline=relay_amp.cpu_pipeline(BF16, rule_log=log))
    lib = executable.mod.imports[0] if executable.mod.imports else executable.mod
    body = "\n".join(code for code in asm_functions(lib.inspect_source("asm")).values()
                     if re.search(A64_BFMMLA, code))  # the kernels' (a symbolic one's too)
    assert len(re.findall(A64_BFMMLA, body)) >= bfmmla.TILE_PAIRS ** 2
    assert not re.search(r"\b(bfdot|fmla)\b", body)
    assert not re.search(A64_WIDEN, body)
    schedules = [s.text() for s in log.schedules if "bfmmla" in s.kernel]
    assert schedules and all("scheduled by BfmmlaTile" in text and "sums on BFMMLA, 8 x 8 a tile"
                             in text for text in schedules), schedules
    assert not log.errors


@pytest.mark.parametrize("activation", [relax.op.nn.relu, relax.op.nn.silu],
                         ids=["relu", "silu"])
def test_a_bfloat16_result_is_written_back_from_registers(activation):
    """A convolution whose result the next one reads in bfloat16 (a cast in its epilogue):
    the write-back reads the tile's sums from registers, rows gathered by shuffles, not a lane
    at a time from the stack (its loops unrolled: with a loop over the tile's rows, the
    gather's indices were computed, and hand_landmark_lite's first expansion, 16 -> 96
    channels, executed 1.6 x BFDOT's instructions). A SiLU's sigmoid calls no library
    function, so its write-back is unrolled too (YOLOv8n: 190.4 -> 182.8 M instructions).
    With the ReLU before the rounding (:mod:`relay_amp.builds.rounding_last`), the rounding
    runs on BFCVTN and LLVM reloads one of the tile's 64 values from the stack: the whole
    module then executes 567,688 instructions on the emulated CPU, against 569,398 with the
    ReLU after TVM's rounding and none reloaded."""
    mod, _ = _converted(conv(then_pointwise=True, activation=activation))
    executable = tvm.compile(mod, target=tvm.target.Target(BF16),
                             relax_pipeline=relay_amp.cpu_pipeline(BF16))
    lib = executable.mod.imports[0] if executable.mod.imports else executable.mod
    kernels = {name: code for name, code in asm_functions(lib.inspect_source("asm")).items()
               if re.search(A64_BFMMLA, code)}
    assert len(kernels) == 2, list(kernels)
    for name, code in kernels.items():
        assert len(re.findall(A64_LANE_LOAD, code)) <= 1, name


def _workspaces(mod, log=None) -> list:
    """The buffers the ``+bf16`` build of ``mod`` allocates with ``TVMBackendAllocWorkspace``
    (read off the LLVM IR), its rules' decisions recorded in ``log``."""
    executable = tvm.compile(mod, target=tvm.target.Target(BF16),
                             relax_pipeline=relay_amp.cpu_pipeline(BF16, rule_log=log))
    lib = executable.mod.imports[0] if executable.mod.imports else executable.mod
    return re.findall(r"%(\w+) = tail call ptr %\d+\(i32 1, i32 %dev_id", lib.inspect_source("ll"))


@pytest.mark.parametrize("model", [conv(), matmul(rows=16, depth=64, columns=40)],
                         ids=["3x3", "matmul"])
def test_a_tiles_sums_live_on_the_stack(model):
    """A tile's 8 x 8 sums are a "global" buffer of 256 bytes, which TVM puts on the stack
    and LLVM in registers: as a "local" buffer in the parallel loop they were a
    ``TVMBackendAllocWorkspace`` call a group, about 500 instructions each on the emulated
    CPU, and the write-back read them a lane at a time (iris_landmark's bfloat16 build:
    10.71 -> 9.76 M). The workspaces left are the panel the tile reads (4 KiB in a
    convolution, more than TVM's 1 KiB stack bound) and a convolution's padded input."""
    workspaces = _workspaces(_converted(model)[0])
    assert workspaces and not [w for w in workspaces if w.startswith("bfmmla")], workspaces


def test_a_write_back_that_calls_a_function_keeps_its_sums_local():
    """A SiLU after the convolution (YOLOv8n's): its ``exp`` is a call in the write-back,
    which takes the vector registers, so the sums stay a "local" buffer (held on the stack
    they went through it around every call: YOLOv8n's bfloat16 build 179.1 -> 181.8 M); the
    report says why, and the ReLU's tile keeps its sums on the stack."""
    def silu(y):
        return relax.op.multiply(y, relax.op.sigmoid(y))

    for activation, local in ((silu, True), (relax.op.nn.relu, False)):
        log = RuleLog()
        workspaces = _workspaces(_converted(conv(activation=activation))[0], log)
        assert any(w.startswith("bfmmla") for w in workspaces) == local, workspaces
        texts = " ".join(schedule.text() for schedule in log.schedules)
        assert ("sums in a local buffer: the write-back calls a function" in texts) == local, texts
