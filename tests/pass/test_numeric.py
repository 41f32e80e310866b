"""Numeric agreement with the float32 module on llvm (host CPU), next to TVM's built-in pass."""

import numpy as np
import pytest
from helpers import builtin_convert, random_inputs, run_module
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

import relay_amp
from relay_amp import execution

TOLERANCE = {"float16": 1e-3, "bfloat16": 1e-2}


def _graphs():
    @I.ir_module
    class ConvReluConv:
        @R.function
        def main(x: R.Tensor((1, 8, 12, 12), "float32"), w: R.Tensor((8, 8, 3, 3), "float32")):
            with R.dataflow():
                lv = R.nn.conv2d(x, w, padding=[1, 1])
                lv1 = R.nn.relu(lv)
                gv = R.nn.conv2d(lv1, w, padding=[1, 1])
                R.output(gv)
            return gv

    @I.ir_module
    class MiniResNet:
        @R.function
        def main(x: R.Tensor((2, 8, 12, 12), "float32"), w: R.Tensor((8, 8, 3, 3), "float32"),
                 g: R.Tensor((8,), "float32"), b: R.Tensor((8,), "float32"),
                 fc: R.Tensor((8, 10), "float32")):
            with R.dataflow():
                lv = R.nn.conv2d(x, w, padding=[1, 1])
                lv1 = R.nn.batch_norm(lv, g, b, b, g, axis=1, training=False)
                lv2 = R.nn.relu(lv1[0])
                lv3 = R.nn.max_pool2d(lv2, pool_size=[2, 2], strides=[2, 2])
                lv4 = R.nn.conv2d(lv3, w, padding=[1, 1])
                lv5 = R.add(lv4, lv3)
                lv6 = R.nn.relu(lv5)
                lv7 = R.mean(lv6, axis=[2, 3])
                gv = R.matmul(lv7, fc)
                R.output(gv)
            return gv

    @I.ir_module
    class AttentionLike:
        @R.function
        def main(q: R.Tensor((2, 16, 32), "float32"), k: R.Tensor((2, 16, 32), "float32"),
                 v: R.Tensor((2, 16, 32), "float32")):
            with R.dataflow():
                lv = R.matmul(q, R.permute_dims(k, [0, 2, 1]))
                lv1 = R.multiply(lv, R.const(0.17677669, "float32"))
                lv2 = R.nn.softmax(lv1, axis=-1)
                gv = R.matmul(lv2, v)
                R.output(gv)
            return gv

    @I.ir_module
    class MLP:
        @R.function
        def main(x: R.Tensor((4, 32), "float32"), w1: R.Tensor((32, 64), "float32"),
                 b1: R.Tensor((64,), "float32"), w2: R.Tensor((64, 16), "float32")):
            with R.dataflow():
                lv = R.matmul(x, w1)
                lv1 = R.add(lv, b1)
                lv2 = R.nn.gelu(lv1)
                gv = R.matmul(lv2, w2)
                R.output(gv)
            return gv

    @I.ir_module
    class LayerNormBlock:
        @R.function
        def main(x: R.Tensor((4, 16, 32), "float32"), g: R.Tensor((32,), "float32"),
                 b: R.Tensor((32,), "float32"), w: R.Tensor((32, 32), "float32")):
            with R.dataflow():
                lv = R.nn.layer_norm(x, g, b, axes=[-1])
                lv1 = R.matmul(lv, w)
                lv2 = R.nn.relu(lv1)
                lv3 = R.add(lv2, x)
                gv = R.nn.rms_norm(lv3, g, axes=[-1])
                R.output(gv)
            return gv

    @I.ir_module
    class Attention:
        @R.function
        def main(q: R.Tensor((1, 8, 2, 16), "float32"), k: R.Tensor((1, 8, 2, 16), "float32"),
                 v: R.Tensor((1, 8, 2, 16), "float32"), b: R.Tensor((1, 2, 8, 8), "float32")):
            with R.dataflow():
                gv = R.nn.attention(q, k, v, b, scale=0.3, causal_mask="TopLeft")
                R.output(gv)
            return gv

    @I.ir_module
    class ConvTransposeDepthwise:
        @R.function
        def main(x: R.Tensor((1, 8, 8, 8), "float32"), w: R.Tensor((8, 8, 3, 3), "float32"),
                 dw: R.Tensor((8, 1, 3, 3), "float32")):
            with R.dataflow():
                lv = R.nn.conv2d_transpose(x, w, strides=[2, 2], padding=[1, 1, 0, 0])
                lv1 = R.nn.conv2d(lv, dw, padding=[1, 1], groups=8)
                lv2 = R.sigmoid(lv1)
                gv = R.nn.avg_pool2d(lv2, pool_size=[2, 2], strides=[2, 2])
                R.output(gv)
            return gv

    @I.ir_module
    class Shapes:
        @R.function
        def main(x: R.Tensor((4, 8, 6), "float32"), w: R.Tensor((12, 12), "float32")):
            with R.dataflow():
                lv = R.reshape(x, (4, 48))
                lv1 = R.split(lv, 4, axis=1)
                lv2 = R.concat((lv1[0], lv1[2]), axis=0)
                lv3 = R.matmul(R.nn.relu(lv2), w)
                lv4 = R.permute_dims(lv3, [1, 0])
                gv = R.tanh(lv4)
                R.output(gv)
            return gv

    @I.ir_module
    class Embedding:
        @R.function
        def main(table: R.Tensor((20, 16), "float32"), ids: R.Tensor((6,), "int64"),
                 w: R.Tensor((16, 16), "float32")):
            with R.dataflow():
                lv = R.matmul(table, w)
                lv1 = R.take(lv, ids, axis=0)
                lv2 = R.where(R.greater(lv1, R.const(0.0, "float32")), lv1,
                              R.multiply(lv1, R.const(0.1, "float32")))
                lv3 = R.clip(lv2, -0.5, 0.5)
                gv = R.matmul(lv3, w)
                R.output(gv)
            return gv

    @I.ir_module
    class OuterProduct:
        @R.function
        def main(a: R.Tensor((16,), "float32"), b: R.Tensor((12,), "float32"),
                 w: R.Tensor((12, 8), "float32")):
            with R.dataflow():
                lv = R.outer(a, b)
                gv = R.matmul(lv, w)
                R.output(gv)
            return gv

    @I.ir_module
    class Conv1dConv3d:
        @R.function
        def main(x: R.Tensor((1, 4, 16), "float32"), w: R.Tensor((4, 4, 3), "float32"),
                 y: R.Tensor((1, 2, 4, 6, 6), "float32"), v: R.Tensor((2, 2, 3, 3, 3), "float32")):
            with R.dataflow():
                lv = R.nn.conv1d(x, w, padding=[1])
                lv1 = R.nn.silu(lv)
                lv2 = R.nn.conv3d(y, v, padding=[1, 1, 1])
                gv = (lv1, lv2)
                R.output(gv)
            return gv

    @I.ir_module
    class ReductionsAndMax:
        @R.function
        def main(x: R.Tensor((4, 32), "float32"), w: R.Tensor((32, 32), "float32")):
            with R.dataflow():
                lv = R.matmul(x, w)
                lv1 = R.max(lv, axis=[1], keepdims=True)
                lv2 = R.subtract(lv, lv1)
                lv3 = R.sum(R.exp(lv2), axis=[1], keepdims=True)
                gv = R.divide(R.exp(lv2), lv3)
                R.output(gv)
            return gv

    return {name: mod for name, mod in locals().items()}


GRAPHS = _graphs()


SEEDS = range(6)


def _reference(mod, seeds=(1,)):
    inputs = [random_inputs(mod, seed=seed) for seed in seeds]
    vm = relay_amp.compile_module(mod)
    return inputs, [out for batch in inputs for out in execution.run(vm, batch)]


def _outputs(mod, inputs):
    vm = relay_amp.compile_module(mod)
    return [out for batch in inputs for out in execution.run(vm, batch)]


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_small_graphs_agree_with_float32(name, dtype):
    """Over several input batches: within tolerance, finite, and not worse than TVM's pass."""
    mod = GRAPHS[name]
    inputs, reference = _reference(mod, SEEDS)
    converted, report = relay_amp.convert(mod, dtype)
    assert report.converted, "nothing ran in low precision"
    ours = execution.agreement(reference, _outputs(converted, inputs))
    assert ours.nonfinite == 0
    assert ours.relative_l2 <= TOLERANCE[dtype], ours
    if dtype == "float16":
        try:
            builtin_mod = builtin_convert(mod)
        except Exception:  # TVM's pass crashes on some graphs (R.outer): nothing to compare
            return
        builtin = execution.agreement(reference, _outputs(builtin_mod, inputs))
        # equal computations give equal errors; 2% covers rounding noise between equal-quality
        # computations on outputs of a few hundred values
        assert ours.relative_l2 <= builtin.relative_l2 * 1.02 + 1e-7, (ours, builtin)


def test_exp_after_matmul_stays_finite_where_the_builtin_overflows():
    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((1, 4), "float32"), w: R.Tensor((4, 4), "float32")):
            with R.dataflow():
                lv = R.matmul(x, w)
                gv = R.exp(lv)
                R.output(gv)
            return gv

    inputs = [np.full((1, 4), 3.0, "float32"), np.ones((4, 4), "float32")]  # exp(12) > 65504
    reference = run_module(Before, inputs)
    converted = relay_amp.convert(Before, "float16")[0]
    ours = execution.agreement(reference, run_module(converted, inputs))
    builtin = execution.agreement(reference, run_module(builtin_convert(Before), inputs))
    assert ours.nonfinite == 0 and ours.relative_l2 < 1e-3
    assert builtin.nonfinite > 0


def test_attention_attributes_survive_where_the_builtin_drops_them():
    mod = GRAPHS["Attention"]
    inputs = random_inputs(mod, seed=1)
    reference = run_module(mod, inputs)
    ours = execution.agreement(reference, run_module(relay_amp.convert(mod, "float16")[0], inputs))
    builtin = execution.agreement(reference, run_module(builtin_convert(mod), inputs))
    assert ours.relative_l2 < 1e-3
    assert builtin.relative_l2 > 0.1  # scale, causal mask and bias were dropped


def test_scaled_attention_feeds_low_precision_consumers(dtype):
    """TVM legalizes attention with a scale to float32; the pinned result still feeds a float16
    or bfloat16 add and matmul, compiles, and matches float32."""

    @I.ir_module
    class Before:
        @R.function
        def main(q: R.Tensor(("n", 8, 2, 16), "float32"), w: R.Tensor((32, 32), "float32")):
            n = T.int64()
            with R.dataflow():
                lv = R.nn.attention(q, q, q, scale=0.25)
                lv1 = R.add(lv, q)
                lv2 = R.reshape(lv1, (n * 8, 32))
                gv = R.matmul(lv2, w)
                R.output(gv)
            return gv

    q = np.random.default_rng(3).uniform(-1, 1, (2, 8, 2, 16)).astype("float32")
    w = np.random.default_rng(4).normal(0, 0.2, (32, 32)).astype("float32")
    converted, report = relay_amp.convert(Before, dtype)
    assert report.find("lv").compute_dtype == dtype
    assert "attention_pinned" in report.find("lv").codes
    assert report.find("lv1").compute_dtype == dtype
    result = execution.agreement(run_module(Before, [q, w]), run_module(converted, [q, w]))
    assert result.relative_l2 < TOLERANCE[dtype], result


def test_bfloat16_ops_tvm_cannot_compile_stay_float32():
    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((4, 16), "float32"), w: R.Tensor((16, 16), "float32"),
                 a: R.Tensor((16,), "float32")):
            with R.dataflow():
                lv = R.matmul(x, w)
                lv1 = R.nn.prelu(lv, a)
                lv2 = R.argmax(lv1, axis=1)
                lv3 = R.matmul(lv1, w)
                gv = (lv2, lv3)
                R.output(gv)
            return gv

    inputs = random_inputs(Before, seed=1)
    reference = run_module(Before, inputs)
    converted, report = relay_amp.convert(Before, "bfloat16")
    for name in ("lv1", "lv2"):
        row = report.find(name)
        assert row.compute_dtype == "float32" and row.code == "tvm_limitation", row
    outputs = run_module(converted, inputs)
    np.testing.assert_array_equal(outputs[0], reference[0])
    assert execution.agreement(reference[1:], outputs[1:]).relative_l2 < 1e-2
