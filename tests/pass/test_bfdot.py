"""relay_amp.builds.bfdot: bfloat16 matmuls and NHWC convolutions on BFDOT with ``+bf16``.

The packing pass writes the same sums over a packed weight (checked by running both on this
machine); the aarch64 build runs every product of those kernels in ``bfdot`` by element, with
no operand widened (read off the assembly). tests/arm counts them on the emulated CPU."""

import re

import numpy as np
import pytest
import tvm
from helpers import asm_kernel, residual_block
from tvm import relax

import relay_amp
from relay_amp.builds.bfdot import has_bfdot, packed_bfloat16_weights
from relay_amp.builds.nhwc import nhwc_convolutions
from relay_amp.execution import run

BF16 = {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon", "+bf16"]}
NEON = {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon"]}
A64_BFDOT_BY_ELEMENT = r"\bbfdot\s+v\d+\.4s,\s*v\d+\.8h,\s*v\d+\.2h\[\d\]"
A64_WIDEN = r"\b(shll2?|fcvtl2?)\s+v\d+\.4s"


def conv_matmul(padding=1, strides=1, channels=16):
    """An NCHW convolution (``channels`` -> 36 channels, 3x3) with relu, and a (4, 32) @
    (32, 24) matmul, float32 constants: both on BFDOT (36 channels and 4 rows do not fill
    BFMMLA's tiles of 8, tests/pass/test_bfmmla.py)."""
    rng = np.random.default_rng(0)
    x = relax.Var("x", relax.TensorType((1, channels, 8, 8), "float32"))
    y = relax.Var("y", relax.TensorType((4, 32), "float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x, y]):
        with builder.dataflow():
            c = builder.emit(relax.op.nn.conv2d(
                x, relax.const(rng.standard_normal((36, channels, 3, 3)).astype("float32")),
                strides=strides, padding=padding))
            r = builder.emit(relax.op.nn.relu(c))
            m = builder.emit(relax.op.matmul(
                y, relax.const(rng.standard_normal((32, 24)).astype("float32"))))
            out = builder.emit_output(relax.Tuple([r, m]))
        builder.emit_func_output(out)
    return builder.get()


def _inputs(channels=16):
    rng = np.random.default_rng(1)
    return [rng.standard_normal((1, channels, 8, 8)).astype("float32"),
            rng.standard_normal((4, 32)).astype("float32")]


def _converted(target=BF16, **kwargs):
    mod, _ = relay_amp.convert(conv_matmul(**kwargs), "bfloat16", target=target)
    return mod


def _packed(mod, target=BF16):
    with tvm.target.Target(target):
        return packed_bfloat16_weights()(nhwc_convolutions()(mod))


def _kernels(mod):
    return sorted(gvar.name_hint for gvar, func in mod.functions_items()
                  if isinstance(func, tvm.tirx.PrimFunc))


def test_the_targets_with_bfdot():
    assert has_bfdot(tvm.target.Target(BF16))
    assert has_bfdot(tvm.target.Target({"kind": "llvm", "mtriple": "aarch64-linux-gnu",
                                        "mcpu": "neoverse-v1"}))
    assert not has_bfdot(tvm.target.Target(NEON))
    assert not has_bfdot(tvm.target.Target({"kind": "llvm", "mtriple": "aarch64-linux-gnu",
                                            "mcpu": "neoverse-n1"}))
    assert not has_bfdot(tvm.target.Target({"kind": "llvm", "mcpu": "sapphirerapids",
                                            "mtriple": "x86_64-linux-gnu"}))


@pytest.mark.parametrize("padding", [0, 1])
def test_weights_are_packed_in_pairs_after_the_output_channel(padding):
    """The matmul's (32, 24) weight becomes (16, 24, 2), the convolution's HWIO (3, 3, 16, 36)
    (3, 3, 8, 36, 2): ``W'[.., p, n, t] == W[.., 2p + t, n]``; both ops become kernels over
    them, and nothing else changes."""
    mod = _converted(padding=padding)
    text = mod.script()
    packed = _packed(mod)
    assert mod.script() == text  # the input unchanged
    assert _kernels(packed) == ["conv2d_nhwc_bfdot", "matmul_bfdot"]
    constants = {}

    def visit(expr):
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) \
                and expr.op.name == "relax.call_tir":
            constants[expr.args[0].name_hint] = expr.args[1][1].value.numpy()

    relax.analysis.post_order_visit(packed["main"], visit)
    assert constants["matmul_bfdot"].shape == (16, 24, 2)
    assert constants["conv2d_nhwc_bfdot"].shape == (3, 3, 8, 36, 2)
    weight = [c.value.numpy() for c in _constants(mod) if c.value.numpy().shape == (32, 24)][0]
    np.testing.assert_array_equal(constants["matmul_bfdot"][5, :, 1], weight[11])


def _constants(mod):
    found = []
    relax.analysis.post_order_visit(
        mod["main"], lambda e: found.append(e) if isinstance(e, tvm.ir.expr.GenericConst) else None)
    return found


@pytest.mark.parametrize("padding, strides, channels", [(0, 1, 16), (1, 1, 16), (1, 2, 16),
                                                        (0, 1, 3), (1, 2, 3)])
def test_the_packed_kernels_compute_the_same_sums(padding, strides, channels):
    """Built for this machine (no BFDOT: TVM widens the operands), the packed module gives
    the unpacked one's outputs: each output sums the same products in the same order (an
    odd channel count with a zero channel added to the input and the weight)."""
    mod = _converted(padding=padding, strides=strides, channels=channels)
    host = {"kind": "llvm"}
    plain = _run(tvm.compile(mod, target="llvm"), channels)
    with tvm.target.Target(BF16):
        packed_mod = packed_bfloat16_weights()(nhwc_convolutions()(mod))
    packed = _run(tvm.compile(packed_mod, target=tvm.target.Target(host)), channels)
    for got, want in zip(packed, plain):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6 * np.abs(want).max())


def _run(executable, channels=16):
    return run(relax.VirtualMachine(executable, tvm.cpu()), _inputs(channels))


def test_without_bf16_nothing_is_packed():
    mod = _converted(target=NEON)
    executable = tvm.compile(mod, target=tvm.target.Target(NEON),
                             relax_pipeline=relay_amp.cpu_pipeline(NEON))
    assert not re.search(r"\bbfdot\b", executable.mod.imports[0].inspect_source("asm")
                         if executable.mod.imports else executable.mod.inspect_source("asm"))


@pytest.mark.parametrize("padding, strides, channels", [(0, 1, 16), (1, 1, 16), (0, 2, 16),
                                                        (1, 2, 16), (1, 2, 3)])
def test_every_product_runs_in_bfdot_by_element(padding, strides, channels):
    """The aarch64 ``+bf16`` build: both kernels on ``bfdot v.4s, v.8h, v.2h[j]`` (no
    ``dup`` of each pair), no operand widened by ``shll`` in a dot product; with stride 2 the
    tile's rows are two input pixels apart; 3 input channels are read as 4."""
    executable = tvm.compile(_converted(padding=padding, strides=strides, channels=channels),
                             target=tvm.target.Target(BF16),
                             relax_pipeline=relay_amp.cpu_pipeline(BF16))
    lib = executable.mod.imports[0] if executable.mod.imports else executable.mod
    asm = lib.inspect_source("asm")
    for kernel in ("conv2d_nhwc_bfdot", "matmul_bfdot"):
        body = asm_kernel(asm, kernel)
        assert re.search(A64_BFDOT_BY_ELEMENT, body), kernel
        assert not re.search(A64_WIDEN, body), kernel
        # between its first and last bfdot: the copy before it may dup an index vector
        at = [m.start() for m in re.finditer(r"^\s*bfdot\s", body, re.M)]
        products = body[at[0]:at[-1]]
        assert not re.search(r"\bdup\s+v\d+\.4s", products), kernel


def test_a_symbolic_row_count_runs_one_row_at_a_time_on_bfdot():
    """A matmul over a sequence length (rows symbolic) to 44 columns (BFMMLA's tiles take 8):
    packed, and built for ``+bf16`` on
    ``bfdot`` one row at a time (padding the rows would copy the input into a bfloat16 buffer
    of the kernel's own, which TVM stores in float32); on this machine the packed module gives
    the unpacked one's outputs."""
    rng = np.random.default_rng(4)
    x = relax.Var("x", relax.TensorType((tvm.tirx.Var("n", "int64"), 32), "float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            out = builder.emit_output(relax.op.matmul(
                x, relax.const(rng.standard_normal((32, 44)).astype("float32"))))
        builder.emit_func_output(out)
    mod, _ = relay_amp.convert(builder.get(), "bfloat16", target=BF16)
    executable = tvm.compile(mod, target=tvm.target.Target(BF16),
                             relax_pipeline=relay_amp.cpu_pipeline(BF16))
    lib = executable.mod.imports[0] if executable.mod.imports else executable.mod
    assert re.search(A64_BFDOT_BY_ELEMENT, asm_kernel(lib.inspect_source("asm"), "matmul_bfdot"))
    inputs = [rng.standard_normal((5, 32)).astype("float32")]
    plain = run(relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu()), inputs)
    packed = run(relax.VirtualMachine(tvm.compile(_packed(mod), target="llvm"), tvm.cpu()),
                 inputs)
    assert _kernels(_packed(mod)) == ["matmul_bfdot"]
    np.testing.assert_allclose(packed[0], plain[0], rtol=1e-6, atol=1e-6 * np.abs(plain[0]).max())


@pytest.mark.parametrize(("channels", "size", "strides"), [(48, 14, 1), (24, 16, 2)])
def test_a_depthwise_tile_runs_rows_of_pixels_on_bfmlal(channels, size, strides):
    """A bfloat16 depthwise convolution (NHWC) on BFMLALB/BFMLALT: eight channels by rows of
    output pixels that share each weight vector, every sum kept as the even channels' four and
    the odd channels' four, so that each instruction updates one register (with the sums a
    stride of 2 apart, rows were 3 x the instructions and the tile took one pixel); no operand
    widened (the outputs: tests/arm, ``test_depthwise_rows_share_each_weight_vector``)."""
    rng = np.random.default_rng(2)
    x = relax.Var("x", relax.TensorType((1, size, size, channels), "float32"))
    weight = (rng.standard_normal((3, 3, channels, 1)) / 3).astype("float32")
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            out = builder.emit_output(relax.op.nn.conv2d(
                x, relax.const(weight), strides=strides, padding=1, groups=channels,
                data_layout="NHWC", kernel_layout="HWOI"))
        builder.emit_func_output(out)
    mod, _ = relay_amp.convert(builder.get(), "bfloat16", target=BF16)
    log = relay_amp.builds.schedule_rules.RuleLog()
    executable = tvm.compile(mod, target=tvm.target.Target(BF16),
                             relax_pipeline=relay_amp.cpu_pipeline(BF16, rule_log=log))
    (text,) = [s.text() for s in log.schedules if "bfmlal" in s.kernel]
    assert re.search(r"tile: 8 lanes of output axis 3 \(\d+\) x [2-8] rows", text), text
    assert "BFMLALB/BFMLALT on each row" in text, text
    lib = executable.mod.imports[0] if executable.mod.imports else executable.mod
    body = asm_kernel(lib.inspect_source("asm"), "depthwise_conv2d_nhwc_bfmlal")
    assert re.search(r"\bbfmlalb\s+v\d+\.4s", body) and re.search(r"\bbfmlalt\s+v\d+\.4s", body)
    assert not re.search(A64_WIDEN, body)
    assert not re.search(r"\b(zip|uzp)[12]\s", body.split("bfmlalb", 1)[1].rsplit(
        "bfmlalt", 1)[0]), "sums shuffled between taps"


def _calls(mod):
    """``(callee, the dtypes of its tensor arguments)`` of every call in ``main``."""
    found = []

    def visit(expr):
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op):
            if expr.op.name == "relax.call_tir":
                found.append((expr.args[0].name_hint,
                              [str(a.ty.dtype) for a in expr.args[1].fields]))
            else:
                found.append((expr.op.name, [str(a.ty.dtype) for a in expr.args
                                             if isinstance(a.ty, relax.TensorType)]))

    relax.analysis.post_order_visit(mod["main"], visit)
    return found


def _host_outputs(mod):
    x = np.random.default_rng(3).standard_normal((1, 12, 12, 28)).astype("float32")
    return run(relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu()), [x])


@pytest.mark.parametrize("shared", [True, False])
def test_a_cast_read_elsewhere_too_is_rounded_in_the_kernels_copy(shared):
    """A float32 tensor that a residual add reads and whose cast to bfloat16 a depthwise
    convolution reads: the cast would be a kernel of its own, a pass over the tensor; the
    depthwise convolution copies its input (the padding) anyway, so it reads the float32
    tensor and rounds in that copy, as TVM rounds a cast (outputs bit for bit). Where nothing
    else reads the tensor, its cast stays in its producer's kernel (TVM fuses it there). The
    build's report names the cast it folded."""
    mod = residual_block(shared=shared)
    log = relay_amp.builds.schedule_rules.RuleLog()
    with tvm.target.Target(BF16):
        packed = packed_bfloat16_weights(log)(mod)
    reported = [d for s in log.schedules for d in s.decisions if "no kernel of its own" in d]
    assert len(reported) == int(shared), reported
    calls = _calls(packed)
    (depthwise,) = [dtypes for name, dtypes in calls if name == "depthwise_conv2d_nhwc_bfmlal"]
    casts = [dtypes for name, dtypes in calls if name == "relax.astype"]
    assert depthwise[0] == ("float32" if shared else "bfloat16")
    assert len(casts) == (1 if shared else 2)  # the cast of the sum stays: its kernel is d's
    plain, got = _host_outputs(mod), _host_outputs(packed)
    np.testing.assert_array_equal(got[0], plain[0])
    np.testing.assert_allclose(got[1], plain[1], rtol=1e-6, atol=1e-6 * np.abs(plain[1]).max())


def test_channels_no_vector_divides_are_computed_to_whole_vectors():
    """28 depthwise channels (BFMLALB/BFMLALT take groups of 8) and 42 outputs of a 1 x 1
    convolution (BFDOT's vectors of 4): the weights get zero channels (32, 44), the kernels
    compute them and write the real ones only; both run on their instructions on aarch64 and
    give the unpadded module's outputs on this machine."""
    mod = residual_block()
    with tvm.target.Target(BF16):
        packed = packed_bfloat16_weights()(mod)
    shapes = {}

    def visit(expr):
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) \
                and expr.op.name == "relax.call_tir":
            shapes[expr.args[0].name_hint] = (
                expr.args[1][1].value.numpy().shape, tuple(int(d) for d in expr.ty.shape))

    relax.analysis.post_order_visit(packed["main"], visit)
    assert shapes["depthwise_conv2d_nhwc_bfmlal"] == ((3, 3, 32, 1), (1, 12, 12, 28))
    assert shapes["conv2d_nhwc_bfdot"] == ((1, 1, 14, 44, 2), (1, 12, 12, 42))
    plain, got = _host_outputs(mod), _host_outputs(packed)
    np.testing.assert_array_equal(got[0], plain[0])
    np.testing.assert_allclose(got[1], plain[1], rtol=1e-6, atol=1e-6 * np.abs(plain[1]).max())
    log = relay_amp.builds.schedule_rules.RuleLog()
    tvm.compile(mod, target=tvm.target.Target(BF16),
                relax_pipeline=relay_amp.cpu_pipeline(BF16, rule_log=log))
    texts = {s.kernel: s.text() for s in log.schedules}
    (dw,) = [t for k, t in texts.items() if "depthwise_conv2d_nhwc_bfmlal" in k]
    (pw,) = [t for k, t in texts.items() if "conv2d_nhwc_bfdot" in k]
    assert "of output axis 3 (32)" in dw and "BFMLALB/BFMLALT on each row" in dw, dw
    assert "of output axis 3 (44)" in pw and "tensor intrinsic relay_amp_bfdot" in pw, pw
    for text in (dw, pw):
        assert "sums on the stack" in text and "_unpadded" in text, text


def test_a_kernels_own_rounding_is_tvms_bit_for_bit():
    """:func:`relay_amp.builds.bfmmla.bits` of float32 values (ties, NaNs, infinities,
    denormals, the largest finite) is the 16-bit pattern TVM's own cast to bfloat16 stores."""
    from tvm import te

    from relay_amp.builds.bfmmla import bits

    words = np.array([0x3F808000, 0x3F818000, 0x3F80FFFF, 0x7F7FFFFF, 0xFF7FFFFF, 0x7F800000,
                      0xFF800000, 0x7FC00000, 0x7FFFFFFF, 0xFFC00001, 0x00000001, 0x807FFFFF,
                      0x00000000, 0x80000000], dtype=np.uint32)
    rng = np.random.default_rng(4)
    values = np.concatenate([words.view(np.float32),
                             rng.standard_normal(50).astype(np.float32) * 1e3])
    n = values.size
    x = te.placeholder((n,), "float32", name="x")
    ours = te.compute((n,), lambda i: bits(x[i]), name="ours")
    tvms = te.compute((n,), lambda i: x[i].astype("bfloat16"), name="tvms")
    got, want = tvm.runtime.empty((n,), "uint16"), tvm.runtime.empty((n,), "bfloat16")
    tvm.compile(te.create_prim_func([x, ours]), target="llvm")(tvm.runtime.tensor(values), got)
    tvm.compile(te.create_prim_func([x, tvms]), target="llvm")(tvm.runtime.tensor(values), want)
    np.testing.assert_array_equal(got.numpy(), want.numpy().view(np.uint16))


def test_a_tiles_sums_and_rounding_live_on_the_stack():
    """On aarch64 a tensorized tile's sums, and the values BFCVTN rounds, are buffers of the
    tile on the stack, which LLVM keeps in registers: TVM allocates a buffer of any scope but
    "global" with ``TVMBackendAllocWorkspace``, whose stores LLVM keeps (MobileNetV2's
    bfloat16 build executed 7 % more). The only workspace left is the depthwise convolution's
    padded copy of its input."""
    mod = residual_block(channels=32, shared=False, both=False)
    log = relay_amp.builds.schedule_rules.RuleLog()
    executable = tvm.compile(mod, target=tvm.target.Target(BF16),
                             relax_pipeline=relay_amp.cpu_pipeline(BF16, rule_log=log))
    (dw,) = [s.text() for s in log.schedules if "depthwise_conv2d_nhwc_bfmlal" in s.kernel]
    assert "sums on the stack" in dw and "rounding to bfloat16: BFCVTN" in dw, dw
    lib = executable.mod.imports[0] if executable.mod.imports else executable.mod
    workspaces = re.findall(r"%(\w+) = tail call ptr %\d+\(i32 1, i32 %dev_id",
                            lib.inspect_source("ll"))
    assert workspaces == ["pad_temp"], workspaces
