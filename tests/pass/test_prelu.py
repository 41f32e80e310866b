"""relay_amp.builds.prelu: a PReLU the TFLite frontend flattened, written back on its tensor."""

import numpy as np
import pytest
import tvm
from tvm import relax

import relay_amp
from relay_amp.builds.prelu import elementwise_prelu

SHAPE = (1, 4, 4, 8)
NEON = {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon"]}


def _flattened(slope_shape=(8,), stored="float32"):
    """conv2d, then TVM's TFLite PReLU: flatten, slope broadcast and flattened, back. A slope
    ``stored`` in float16 is cast to float32 first (MediaPipe's face_landmark)."""
    rng = np.random.default_rng(0)
    x = relax.Var("x", relax.TensorType(SHAPE, "float32"))
    weight = relax.const(rng.standard_normal((1, 1, 8, 8)).astype("float32"))
    slope = relax.const(rng.standard_normal(slope_shape).astype(stored))
    size = int(np.prod(SHAPE))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            y = builder.emit(relax.op.nn.conv2d(x, weight, data_layout="NHWC",
                                                kernel_layout="HWIO"))
            flat = builder.emit(relax.op.reshape(y, (size,)))
            read = slope if stored == "float32" else builder.emit(relax.op.astype(slope,
                                                                                  "float32"))
            wide = builder.emit(relax.op.broadcast_to(read, SHAPE))
            flat_slope = builder.emit(relax.op.reshape(wide, (size,)))
            z = builder.emit(relax.op.nn.prelu(flat, flat_slope, axis=0))
            out = builder.emit_output(relax.op.reshape(z, SHAPE))
        builder.emit_func_output(out)
    return builder.get(), slope


def _expected(slope):
    x = relax.Var("x", relax.TensorType(SHAPE, "float32"))
    before, _ = _flattened()
    weight = before["main"].body.blocks[0].bindings[0].value.args[1]
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            y = builder.emit(relax.op.nn.conv2d(x, weight, data_layout="NHWC",
                                                kernel_layout="HWIO"))
            out = builder.emit_output(relax.op.nn.prelu(
                y, relax.const(slope.value.numpy().astype("float32").reshape(8)), axis=3))
        builder.emit_func_output(out)
    return builder.get()


def _run(mod, x, target="llvm"):
    executable = tvm.compile(mod, target=target)
    return relax.VirtualMachine(executable, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()


@pytest.mark.parametrize("slope_shape, stored", [((8,), "float32"), ((1, 1, 8), "float32"),
                                                 ((1, 1, 8), "float16")])
def test_a_flattened_prelu_is_a_prelu_over_channels(slope_shape, stored):
    before, slope = _flattened(slope_shape, stored)
    after = elementwise_prelu()(before)
    tvm.ir.assert_structural_equal(after, _expected(slope))
    x = np.random.default_rng(1).standard_normal(SHAPE).astype("float32")
    np.testing.assert_array_equal(_run(after, x), _run(before, x))


def test_a_converted_models_cast_before_the_reshape_stays_after_the_prelu():
    """relay_amp.convert keeps the PReLU float32 and casts its flat result to float16 before
    the last reshape: the PReLU is rewritten all the same, the cast after it."""
    mod, slope = _flattened()
    converted, _ = relay_amp.convert(mod, "float16", target=NEON)
    text = converted.script()
    assert "R.nn.prelu" in text and "axis=0" in text
    after = elementwise_prelu()(converted)
    prelus = [line for line in after.script().splitlines() if "R.nn.prelu" in line]
    assert len(prelus) == 1 and "axis=3" in prelus[0], prelus
    x = np.random.default_rng(2).standard_normal(SHAPE).astype("float32")
    np.testing.assert_array_equal(_run(after, x), _run(converted, x))


def test_a_slope_per_element_keeps_tvms_prelu():
    before, _ = _flattened((4, 4, 8))
    tvm.ir.assert_structural_equal(elementwise_prelu()(before), before)


def test_the_convolutions_kernel_computes_the_prelu():
    """In relay_amp's aarch64 build the PReLU is in the convolution's kernel: no kernel of its
    own (TVM's is a scalar loop with a branch an element)."""
    before, _ = _flattened()
    executable = tvm.compile(before, target=tvm.target.Target(NEON),
                             relax_pipeline=relay_amp.cpu_pipeline(NEON))
    asm = "\n".join(m.inspect_source("asm") for m in [executable.mod, *executable.mod.imports]
                    if m.kind == "llvm")
    kernels = {line.split(":")[0] for line in asm.splitlines()
               if line.endswith("_compute_:")}
    assert any("conv2d" in k and "prelu" in k for k in kernels), kernels
    assert not any("prelu" in k and "conv2d" not in k for k in kernels), kernels
