"""Values that decide discrete outputs compute in float32 (reason code ``decides_discrete``): a
quantization's scale and zero point and the arithmetic that computes them, the operands of a
comparison or of a cast to integers. One rounding flips an integer, a selection or an order,
and nothing downstream repairs it."""

import numpy as np
import pytest
import tvm
from helpers import convert_checked, run_module
from tvm.script import ir as I
from tvm.script import relax as R

from relay_amp.builds.pipeline import compile_module
from relay_amp.dtypes import numpy_dtype
from relay_amp.execution import run


@I.ir_module
class DynamicQuantize:
    """ONNX DynamicQuantizeLinear as TVM's importer writes it."""

    @R.function
    def main(x: R.Tensor((12,), "float32")):
        with R.dataflow():
            lv = R.max(x, axis=None, keepdims=False)
            lv1 = R.maximum(R.const(0.0, "float32"), lv)
            lv2 = R.min(x, axis=None, keepdims=False)
            lv3 = R.minimum(R.const(0.0, "float32"), lv2)
            lv4 = R.subtract(lv1, lv3)
            lv5 = R.divide(lv4, R.const(255.0, "float32"))
            lv6 = R.divide(lv3, lv5)
            lv7 = R.subtract(R.const(0.0, "float32"), lv6)
            lv8 = R.clip(lv7, 0, 255)
            lv9 = R.round(lv8)
            lv10 = R.astype(lv9, "uint8")
            lv11 = R.quantize(x, lv5, lv10, out_dtype="uint8", axis=0)
            gv = lv11, lv5, lv10
            R.output(gv)
        return gv


@I.ir_module
class Threshold:
    """A mask from a comparison of scores with a threshold computed from them, selecting values:
    one rounding of the threshold moves every element of the mask."""

    @R.function
    def main(x: R.Tensor((64,), "float32"), w: R.Tensor((64,), "float32")):
        with R.dataflow():
            score = R.multiply(x, w)
            total = R.sum(score, axis=None, keepdims=False)
            threshold = R.divide(total, R.const(64.0, "float32"))
            keep = R.greater(score, threshold)
            gv = R.where(keep, x, R.const(0.0, "float32"))
            R.output(gv)
        return gv


def _codes(mod, dtype, x):
    return [np.asarray(out) for out in run_module(mod, [x])]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_dynamic_quantization_gives_float32_codes_on_the_same_inputs(dtype):
    converted, report = convert_checked(DynamicQuantize, dtype, keep_io_dtypes=False)
    assert str(converted["main"].params[0].ty.dtype) == dtype
    rng = np.random.default_rng(0)
    reference, low = compile_module(DynamicQuantize), compile_module(converted)
    for trial in range(40):
        x = rng.normal(scale=rng.uniform(0.01, 10), size=12).astype(numpy_dtype(dtype))
        if trial % 3 == 0:
            x = np.abs(x)  # min clamped to 0: the zero point is 0
        want = run(reference, [np.asarray(x, "float32")])
        got = run(low, [x])
        np.testing.assert_array_equal(got[0], want[0])  # the codes
        np.testing.assert_array_equal(got[2], want[2])  # the zero point
    for name in ("lv4", "lv5", "lv6", "lv9"):  # the scale's and zero point's arithmetic
        row = report.find(name)
        assert row.compute_dtype == "float32" and row.code == "decides_discrete", row
        assert row.reason("decides_discrete").values == {"consumer": "lv11", "op": "quantize"}


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_the_scale_is_computed_from_the_inputs_as_they_are(dtype):
    """The arithmetic reads the low-precision input widened to float32 (exact), never a
    low-precision intermediate: no binding of the chain computes in the low dtype."""
    converted, _ = convert_checked(DynamicQuantize, dtype, keep_io_dtypes=False)
    calls = {b.var.name: b.value for b in converted["main"].body.blocks[0].bindings
             if isinstance(b.value, tvm.relax.Call)}
    for name in ("lv4", "lv5"):
        assert str(calls[name].ty.dtype) == "float32"
        for arg in calls[name].args:
            assert str(arg.ty.dtype) == "float32"


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_threshold_that_selects_is_computed_in_float32(dtype):
    converted, report = convert_checked(Threshold, dtype, low_precision_inputs=["x", "w"])
    assert report.find("total").compute_dtype == "float32"  # a sum: float32 by policy
    row = report.find("threshold")
    assert row.code == "decides_discrete" and row.compute_dtype == "float32", row
    rng = np.random.default_rng(1)
    w = np.full(64, 0.5, "float32")
    reference, low = compile_module(Threshold), compile_module(converted)
    for _ in range(10):
        x = (0.5 + rng.uniform(-1e-2, 1e-2, 64)).astype(numpy_dtype(dtype))  # near the mean
        want = run(reference, [np.asarray(x, "float32"), w])[0]
        got = run(low, [x, np.asarray(w, numpy_dtype(dtype))])[0]
        np.testing.assert_array_equal(np.asarray(got, "float32") != 0, want != 0)


def test_an_elementwise_comparison_is_left_to_the_kernel_plan():
    """``greater(score, 0.25)`` flips one element where ``score`` rounds, the error rounding
    ``score`` itself makes: it is not a decision, so a full-size tensor is not kept float32."""

    @I.ir_module
    class Elementwise:
        @R.function
        def main(x: R.Tensor((64,), "float32"), w: R.Tensor((64,), "float32")):
            with R.dataflow():
                score = R.multiply(x, w)
                keep = R.greater(score, R.const(0.25, "float32"))
                gv = R.where(keep, x, R.const(0.0, "float32"))
                R.output(gv)
            return gv

    _, report = convert_checked(Elementwise, "float16", low_precision_inputs=["x", "w"])
    assert "decides_discrete" not in report.find("score").codes


def test_an_equality_with_infinity_is_not_a_decision():
    """``equal(x, -inf)`` (a transformer's mask test) cannot be flipped by rounding a value the
    low dtype holds: the scores it reads are left to the kernel-boundary plan."""

    @I.ir_module
    class Masked:
        @R.function
        def main(x: R.Tensor((8, 8), "float32"), w: R.Tensor((8, 8), "float32")):
            with R.dataflow():
                scores = R.matmul(x, w)
                masked = R.add(scores, R.const(0.0, "float32"))
                test = R.equal(masked, R.const(float("-inf"), "float32"))
                gv = R.where(test, R.const(0.0, "float32"), R.nn.softmax(masked))
                R.output(gv)
            return gv

    _, report = convert_checked(Masked, "float16", target={"kind": "cuda", "arch": "sm_90"})
    assert "decides_discrete" not in report.find("masked").codes
