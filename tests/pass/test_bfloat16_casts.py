"""relay_amp.builds.bfloat16_casts: float32 → bfloat16 casts rounded as TVM rounds them, the
value's bits bound once, so a folded SiLU's bfloat16 build vectorizes."""

import numpy as np
import tvm
from tvm import relax

import relay_amp
from relay_amp.builds.bfloat16_casts import rounded_bfloat16_casts

BF16 = {"kind": "llvm", "mtriple": "aarch64-linux-gnu",
        "mattr": ["+neon", "+fullfp16", "+fp16fml", "+bf16"]}


def _cast(dtype, source="float32", shape=(4096,)):
    x = relax.Var("x", relax.TensorType(shape, source))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            out = builder.emit_output(relax.op.astype(x, dtype))
        builder.emit_func_output(out)
    return builder.get()


def _run(mod, x):
    executable = tvm.compile(mod, target="llvm")
    return relax.VirtualMachine(executable, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()


def test_only_float32_to_bfloat16_casts_are_rewritten():
    for dtype, source, rewritten in (("bfloat16", "float32", True), ("float16", "float32", False),
                                     ("float32", "bfloat16", False)):
        text = rounded_bfloat16_casts()(_cast(dtype, source)).script()
        assert ("R.astype" not in text) == rewritten, text


def test_the_bits_are_tvms_cast():
    """Ties to even both ways, the largest finite values, infinities, NaN, denormals, and
    random values: each output bit for bit TVM's own cast."""
    rng = np.random.default_rng(0)
    bits = np.concatenate([
        np.array([0x3F808000, 0x3F818000, 0x7F7FFFFF, 0xFF7FFFFF, 0x7F800000, 0xFF800000,
                  0x7FC00000, 0x00000001, 0x807FFFFF, 0x00008000, 0], "uint32"),
        rng.integers(0, 2**32, 4096 - 11, dtype="uint64").astype("uint32")])
    x = bits.view("float32")
    mod = _cast("bfloat16")
    ours, tvms = (_run(m, x).view("uint16") for m in (rounded_bfloat16_casts()(mod), mod))
    np.testing.assert_array_equal(ours, tvms)


def _conv_silu_bfloat16():
    rng = np.random.default_rng(1)
    x = relax.Var("x", relax.TensorType((1, 16, 10, 10), "float32"))
    w1, w2 = (relax.const((rng.standard_normal((16, 16, 3, 3)) / 8).astype("float32"))
              for _ in range(2))
    bias = relax.const(rng.standard_normal((1, 16, 1, 1)).astype("float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            y = builder.emit(relax.op.add(relax.op.nn.conv2d(x, w1, padding=1), bias))
            y = builder.emit(relax.op.multiply(y, relax.op.sigmoid(y)))
            out = builder.emit_output(relax.op.nn.conv2d(y, w2, padding=1))
        builder.emit_func_output(out)
    converted, _ = relay_amp.convert(builder.get(), "bfloat16", target=BF16)
    return converted


def test_a_silu_folded_before_a_bfloat16_cast_builds_for_aarch64():
    """A convolution with a bias and a SiLU whose result is cast to bfloat16 for the next one:
    the cast folds into the tile's write-back with the SiLU's ``exp``. Legalized by TVM, the
    cast wrote that expression out twice and ``VectorizeLoop`` failed."""
    executable = tvm.compile(_conv_silu_bfloat16(), target=tvm.target.Target(BF16),
                             relax_pipeline=relay_amp.cpu_pipeline(BF16))
    asm = "\n".join(m.inspect_source("asm") for m in [executable.mod, *executable.mod.imports]
                    if m.kind == "llvm")
    assert "bfdot" in asm or "bfmlal" in asm
