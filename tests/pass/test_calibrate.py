"""Calibrated ranges: measurement, the overflow they prevent, and bad input."""

import numpy as np
import pytest
from cases import Overflowing
from helpers import convert_checked, run_module
from tvm.script import ir as I
from tvm.script import relax as R

import relay_amp
from relay_amp import execution


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    return [rng.uniform(40, 50, (2, 8)).astype("float32"),
            rng.uniform(90, 100, (8, 8)).astype("float32")]


def test_ranges_match_numpy():
    batches = [_inputs(0), _inputs(1)]
    calibration = relay_amp.calibrate(Overflowing, batches)
    assert calibration.batches == 2
    lv = [b[0] @ b[1] for b in batches]
    expected = {"lv": max(np.abs(v).max() for v in lv),
                "lv1": max(np.abs(2 * v).max() for v in lv),
                "lv2": max(np.abs(np.maximum(2 * v, 0)).max() for v in lv)}
    for name, value in expected.items():
        assert calibration.observed_max("main", name) == pytest.approx(value, rel=1e-5), name
    assert calibration.min_abs[("main", "lv")] == pytest.approx(
        min(np.abs(v).min() for v in lv), rel=1e-5)
    again = relay_amp.Calibration.from_json(calibration.to_json())
    assert again.max_abs == calibration.max_abs and again.margin == calibration.margin


def test_calibration_turns_overflow_into_finite_outputs():
    inputs = _inputs(0)
    reference = run_module(Overflowing, inputs)
    plain, _ = relay_amp.convert(Overflowing, "float16")
    assert execution.agreement(reference, run_module(plain, inputs)).nonfinite > 0
    calibration = relay_amp.calibrate(Overflowing, [inputs])
    calibrated, report = convert_checked(Overflowing, "float16", calibration=calibration)
    result = execution.agreement(reference, run_module(calibrated, inputs))
    assert result.nonfinite == 0 and result.relative_l2 < 1e-3
    assert report.find("lv").compute_dtype == "float16"  # inputs in range, fp32 accumulator
    assert report.find("lv").reason("result_kept_float32").values["why"].startswith(
        "observed max")
    assert report.find("lv1").reason("out_of_range").values["why"].startswith("observed max 6.9")
    assert "exceeds float16 max 65504" in report.find("gv").reason(
        "input_out_of_range").values["why"]
    # bfloat16 has float32's range: calibration changes nothing there
    bf16, bf16_report = relay_amp.convert(Overflowing, "bfloat16", calibration=calibration)
    assert bf16_report.find("gv").compute_dtype == "bfloat16"


def test_underflowing_values_stay_float32():
    @I.ir_module
    class Tiny:
        @R.function
        def main(x: R.Tensor((2, 8), "float32"), w: R.Tensor((8, 8), "float32")):
            with R.dataflow():
                lv = R.matmul(x, w)
                gv = R.matmul(lv, w)
                R.output(gv)
            return gv

    inputs = [np.full((2, 8), 1e-4, "float32"), np.full((8, 8), 1e-3, "float32")]
    calibration = relay_amp.calibrate(Tiny, [inputs])
    _, report = relay_amp.convert(Tiny, "float16", calibration=calibration)
    assert "below float16's smallest normal" in report.find("gv").reason(
        "input_out_of_range").values["why"]


def test_bad_calibration_input_is_a_clear_error():
    with pytest.raises(ValueError, match="at least one batch"):
        relay_amp.calibrate(Overflowing, [])
    with pytest.raises(ValueError, match="input 'w' has shape \\(4, 8\\)"):
        relay_amp.calibrate(Overflowing, [[np.zeros((2, 8), "float32"),
                                           np.zeros((4, 8), "float32")]])
    with pytest.raises(ValueError, match="has 1 arrays; the function takes 2"):
        relay_amp.calibrate(Overflowing, [[np.zeros((2, 8), "float32")]])
    with pytest.raises(ValueError, match="no input for parameter"):
        relay_amp.calibrate(Overflowing, [{"x": np.zeros((2, 8), "float32")}])
    with pytest.raises(ValueError, match="margin"):
        relay_amp.calibrate(Overflowing, [_inputs()], margin=0.5)
    with pytest.raises(ValueError, match="no function 'nope'"):
        relay_amp.calibrate(Overflowing, [_inputs()], func="nope")
    with pytest.raises(TypeError, match="relay_amp.Calibration"):
        relay_amp.convert(Overflowing, "float16", calibration={"lv": 1.0})
