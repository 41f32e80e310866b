"""A value the low dtype cannot hold is never stored in it at a function's signature either:
outputs, tuple outputs, If results and low-precision parameters keep float32 there (reason code
``fp32_boundary``), or the conversion raises under ``strict_io_dtypes``."""

# The Expected modules name the dtype only in annotations: TVMScript finds such names in the
# enclosing test function when annotations are strings.
from __future__ import annotations

import json

import numpy as np
import pytest
import tvm
from cases import Branchy, ProdAndRelu, ReduceProd
from helpers import convert_checked, run_module
from tvm.script import ir as I
from tvm.script import relax as R

import relay_amp
from relay_amp.reasons import FP32_BOUNDARY

F16_MAX, BF16_MAX = 65504.0, 3.3895313892515355e38


def _big(dtype):
    """Twelve values whose product the dtype cannot hold, even though each value fits."""
    if dtype == "float16":
        return np.arange(1, 13, dtype="float32")  # 12! = 4.79e8
    x = np.ones(12, "float32")
    x[:2] = 1e19, 2e19  # 2e38, twice that beyond bfloat16's 3.39e38
    return x


def _bound(dtype):
    return F16_MAX if dtype == "float16" else BF16_MAX


def _low(array, dtype):
    return array.astype(relay_amp.dtypes.numpy_dtype(dtype))


def test_reduce_prod_result_keeps_float32_with_the_reason(dtype):
    batch = [_big(dtype)]
    calibration = relay_amp.calibrate(ReduceProd, [batch])
    assert calibration.observed_max("main", "gv") == pytest.approx(np.prod(batch[0]), rel=1e-6)

    @I.ir_module
    class Expected:
        @R.function
        def main(data: R.Tensor((12,), dtype)) -> R.Tensor((1,), "float32"):
            with R.dataflow():
                data_f32 = R.astype(data, "float32")
                gv = R.prod(data_f32, axis=None, keepdims=True)
                R.output(gv)
            return gv

    new, report = convert_checked(ReduceProd, dtype, keep_io_dtypes=False,
                                  calibration=calibration)
    tvm.ir.assert_structural_equal(new, Expected)
    (record,) = report.boundary
    assert (record.function, record.kind, record.where, record.value, record.code) == (
        "main", "result", "result", "gv", FP32_BOUNDARY)
    assert record.magnitude == pytest.approx(np.prod(batch[0]), rel=1e-6)
    assert record.bound == pytest.approx(_bound(dtype), rel=1e-6)
    note = f"main: result (gv) kept float32, not {dtype} [fp32_boundary]: observed max "
    assert any(n.startswith(note) and f"exceeds {dtype} max" in n for n in report.notes)
    assert "fp32_boundary" in report.find("gv").codes
    assert report.find("gv").output_dtype == "float32"
    assert json.loads(report.to_json())["boundary"][0]["code"] == FP32_BOUNDARY
    (out,) = run_module(new, [_low(batch[0], dtype)])
    expected = np.prod(_low(batch[0], dtype).astype("float64"))
    assert out.dtype == np.float32 and np.isfinite(out).all()
    np.testing.assert_allclose(out, [expected], rtol=1e-6)


def test_without_calibration_the_result_would_be_inf():
    """What the boundary rule prevents: the same conversion without calibration stores inf.
    (bfloat16's value above is within its range; the 2x calibration margin keeps it float32.)"""
    plain, report = convert_checked(ReduceProd, "float16", keep_io_dtypes=False)
    assert report.boundary == [] and str(plain["main"].ret_ty.dtype) == "float16"
    (out,) = run_module(plain, [_low(_big("float16"), "float16")])
    assert np.isinf(out).all()


def test_tuple_result_keeps_only_the_field_out_of_range(dtype):
    @I.ir_module
    class Expected:
        @R.function
        def main(x: R.Tensor((12,), dtype)) -> R.Tuple(R.Tensor((), "float32"),
                                                       R.Tensor((12,), dtype)):
            with R.dataflow():
                x_f32 = R.astype(x, "float32")
                lv = R.prod(x_f32, axis=None, keepdims=False)
                lv1 = R.nn.relu(x)
                gv = (lv, lv1)
                R.output(gv)
            return gv

    batch = [_big(dtype)]
    calibration = relay_amp.calibrate(ProdAndRelu, [batch])
    new, report = convert_checked(ProdAndRelu, dtype, keep_io_dtypes=False,
                                  calibration=calibration)
    tvm.ir.assert_structural_equal(new, Expected)
    assert [(b.where, b.value) for b in report.boundary] == [("result[0]", "lv")]
    product, relu = run_module(new, [_low(batch[0], dtype)])
    assert np.isfinite(product).all() and str(relu.dtype) in (dtype, "float32")


def test_inline_tuple_result(dtype):
    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((12,), "float32")):
            with R.dataflow():
                lv = R.nn.relu(x)
                gv = R.prod(x, axis=None, keepdims=False)
                R.output(lv, gv)
            return (lv, gv)

    @I.ir_module
    class Expected:
        @R.function
        def main(x: R.Tensor((12,), dtype)) -> R.Tuple(R.Tensor((12,), dtype),
                                                       R.Tensor((), "float32")):
            with R.dataflow():
                lv = R.nn.relu(x)
                x_f32 = R.astype(x, "float32")
                gv = R.prod(x_f32, axis=None, keepdims=False)
                R.output(lv, gv)
            return (lv, gv)

    calibration = relay_amp.calibrate(Before, [[_big(dtype)]])
    new, report = convert_checked(Before, dtype, keep_io_dtypes=False, calibration=calibration)
    tvm.ir.assert_structural_equal(new, Expected)
    assert [b.where for b in report.boundary] == ["result[1]"]


def test_if_result_keeps_float32(dtype):
    @I.ir_module
    class Expected:
        @R.function
        def main(cond: R.Tensor((), "bool"), x: R.Tensor((12,), dtype)) -> R.Tensor(
                (), "float32"):
            if cond:
                x_f32 = R.astype(x, "float32")
                y_then = R.prod(x_f32, axis=None, keepdims=False)
                y = y_then
            else:
                x_f321 = R.astype(x, "float32")
                y_else = R.max(x_f321, axis=None, keepdims=False)
                y = y_else
            return y

    batch = [np.array(True), _big(dtype)]
    calibration = relay_amp.calibrate(Branchy, [batch])
    assert ("main", "y") in calibration.max_abs  # an If result is measured
    new, report = convert_checked(Branchy, dtype, keep_io_dtypes=False, calibration=calibration)
    tvm.ir.assert_structural_equal(new, Expected)
    assert [(b.where, b.value) for b in report.boundary] == [("result", "y")]
    # Only the then branch runs here: TVM 0.27's VM segfaults when an else branch allocates an
    # intermediate tensor, even in a float32 module that relay_amp never touched.
    (out,) = run_module(new, [batch[0], _low(batch[1], dtype)])
    assert np.isfinite(out).all() and out == pytest.approx(np.prod(_low(batch[1], dtype).astype(
        "float64")), rel=1e-6)


def test_if_branch_returning_a_constant_out_of_range(dtype):
    """No calibration: the constant shows the value, so the result stays float32."""
    big = 1e5 if dtype == "float16" else 3.4e38

    @I.ir_module
    class Before:
        @R.function
        def main(cond: R.Tensor((), "bool"), x: R.Tensor((4,), "float32")) -> R.Tensor(
                (4,), "float32"):
            if cond:
                y = R.nn.relu(x)
            else:
                y = R.const(np.full(4, big, "float32"))
            return y

    new, report = convert_checked(Before, dtype, keep_io_dtypes=False)
    assert str(new["main"].ret_ty.dtype) == "float32"
    (record,) = report.boundary
    assert record.value == "y" and record.magnitude == pytest.approx(big, rel=1e-6)
    assert f"constant {big:.4g} exceeds {dtype} max" in record.reason
    (out,) = run_module(new, [np.array(False), np.ones(4, relay_amp.dtypes.numpy_dtype(dtype))])
    np.testing.assert_allclose(out, np.full(4, big, "float32"), rtol=1e-6)


@pytest.mark.parametrize("case", ["result", "tuple", "if", "parameter"])
def test_strict_io_dtypes_raises_instead(case, dtype):
    x = _big(dtype)
    if case == "result":
        mod, batch = ReduceProd, [x]
    elif case == "tuple":
        mod, batch = ProdAndRelu, [x]
    elif case == "if":
        mod, batch = Branchy, [np.array(True), x]
    else:  # the input itself is beyond the dtype's range
        mod, batch = ReduceProd, [np.full(12, 1e5 if dtype == "float16" else 2e38, "float32")]
    calibration = relay_amp.calibrate(mod, [batch])
    kwargs = {"keep_io_dtypes": False} if case != "parameter" else {
        "low_precision_inputs": ["data"]}
    with pytest.raises(ValueError, match=r"^main: .* cannot be .*strict_io_dtypes is set"):
        relay_amp.convert(mod, dtype, calibration=calibration, strict_io_dtypes=True, **kwargs)
    relay_amp.convert(mod, dtype, calibration=calibration, **kwargs)  # default: kept float32


def test_parameter_out_of_range_stays_float32(dtype):
    scale = 1e4 if dtype == "float16" else 1.5e37  # max 1.2e5 (1.8e38, 3.6e38 with the margin)

    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((12,), "float32"), w: R.Tensor((12, 4), "float32")):
            with R.dataflow():
                lv = R.reshape(x, (1, 12))
                gv = R.matmul(lv, w)
                R.output(gv)
            return gv

    @I.ir_module
    class Expected:
        @R.function
        def main(x: R.Tensor((12,), "float32"), w: R.Tensor((12, 4), dtype)):
            with R.dataflow():
                lv = R.reshape(x, (1, 12))
                w_f32 = R.astype(w, "float32")
                gv = R.matmul(lv, w_f32)
                R.output(gv)
            return gv

    batch = [np.arange(1, 13, dtype="float32") * scale, np.full((12, 4), 1e-3, "float32")]
    calibration = relay_amp.calibrate(Before, [batch])
    assert calibration.observed_max("main", "x") == pytest.approx(12 * scale, rel=1e-6)
    new, report = convert_checked(Before, dtype, low_precision_inputs=["x", "w"],
                                  calibration=calibration)
    tvm.ir.assert_structural_equal(new, Expected)
    (record,) = report.boundary
    assert (record.kind, record.where) == ("parameter", "x")
    assert any(n.startswith(f"main: parameter x kept float32, not {dtype} [fp32_boundary]")
               for n in report.notes)
    reason = report.find("gv").reason("input_out_of_range")  # the reshape of x
    assert reason.values["input"] == "lv" and reason.values["why"].startswith("observed max")
    (out,) = run_module(new, [batch[0], _low(batch[1], dtype)])
    assert np.isfinite(out).all()

    # a calibration that measured only the bindings: the reshape holds x's values
    bindings_only = relay_amp.Calibration(
        max_abs={k: v for k, v in calibration.max_abs.items() if k != ("main", "x")})
    again, again_report = convert_checked(Before, dtype, low_precision_inputs=["x", "w"],
                                          calibration=bindings_only)
    tvm.ir.assert_structural_equal(again, Expected)
    assert "its consumer lv (reshape" in again_report.boundary[0].reason


def test_in_range_calibration_changes_nothing(dtype):
    """Where no value is out of range, calibration leaves the low-precision signature as it is."""
    batch = [np.linspace(0.5, 1.5, 12, dtype="float32")]
    for mod in (ReduceProd, ProdAndRelu):
        calibration = relay_amp.calibrate(mod, [batch])
        plain, _ = convert_checked(mod, dtype, keep_io_dtypes=False)
        calibrated, report = convert_checked(mod, dtype, keep_io_dtypes=False,
                                             calibration=calibration)
        tvm.ir.assert_structural_equal(calibrated, plain)
        assert report.boundary == [] and not any("fp32_boundary" in n for n in report.notes)


def test_strict_io_dtypes_in_policy_json():
    policy = relay_amp.Policy("float16", strict_io_dtypes=True)
    assert policy.to_dict()["strict_io_dtypes"] is True
    assert relay_amp.Policy.from_json(policy.to_json()) == policy
    assert "strict_io_dtypes" not in relay_amp.Policy("float16").to_dict()
    with pytest.raises(TypeError, match="strict_io_dtypes must be True or False"):
        relay_amp.Policy("float16", strict_io_dtypes="yes")


def test_inf_nan_and_empty_values_are_not_out_of_range(dtype):
    """Every float dtype stores inf and NaN, and an empty tensor holds nothing: calibration
    counts finite values only, so such inputs and results keep the low-precision signature."""

    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((4,), "float32")):
            with R.dataflow():
                lv = R.nn.relu(x)
                lv1 = R.strided_slice(x, axes=[0], begin=[4], end=[4])
                gv = (lv, lv1)
                R.output(gv)
            return gv

    batch = [np.array([np.inf, -3.0, np.nan, 0.5], "float32")]
    calibration = relay_amp.calibrate(Before, [batch])
    assert calibration.observed_max("main", "x") == 3.0
    assert calibration.observed_max("main", "lv1") == 0.0  # the empty slice
    plain, _ = convert_checked(Before, dtype, keep_io_dtypes=False)
    calibrated, report = convert_checked(Before, dtype, keep_io_dtypes=False,
                                         calibration=calibration)
    tvm.ir.assert_structural_equal(calibrated, plain)
    assert report.boundary == []
