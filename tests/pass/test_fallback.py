"""Accuracy-driven fallback, the bisection baseline, and the NaN/Inf debug guard."""

import numpy as np
import pytest
from cases import MatmulReluMatmulSoftmax, Planted
from helpers import run_module

import relay_amp
from relay_amp import fallback


def _batches(count=2, seed=0):
    rng = np.random.default_rng(seed)
    batches = []
    for _ in range(count):
        x = rng.normal(size=(4, 16)).astype("float32")
        pairs = np.repeat(rng.normal(size=(4, 8)), 2, axis=1).astype("float32")
        wc = np.empty((16, 16), "float32")
        wc[0::2] = 1000 + rng.normal(0, 0.3, (8, 16))
        wc[1::2] = -1000 + rng.normal(0, 0.3, (8, 16))
        batches.append([x, pairs, wc, rng.normal(0, 0.3, (16, 16)).astype("float32")])
    return batches


def test_local_errors_single_out_the_planted_op():
    errors = fallback.local_errors(Planted, _batches(), ["a", "b", "e", "gv"], "float16")
    assert errors["a"] > 0.1
    assert max(errors[n] for n in ("b", "e", "gv")) < 1e-3


def test_auto_fallback_keeps_only_the_planted_op_in_float32():
    batches = _batches()
    plain, _ = relay_amp.convert(Planted, "float16")
    reference = [run_module(Planted, b)[0] for b in batches]
    converted_all = [run_module(plain, b)[0] for b in batches]
    assert relay_amp.agreement(reference, converted_all).relative_l2 > 0.1
    new, report = fallback.auto_mixed_precision(Planted, batches, tolerance=1e-2)
    search = report.search
    assert search.met and search.fp32_bindings == ["a"] and search.evaluations <= 3
    assert report.find("a").compute_dtype == "float32"
    assert report.find("a").code == "search_fallback"
    assert report.find("a").reason("search_fallback").values["rank"] >= 1
    assert all(report.find(n).compute_dtype == "float16" for n in ("b", "e", "gv"))
    outputs = [run_module(new, b)[0] for b in batches]
    assert relay_amp.agreement(reference, outputs).relative_l2 <= 1e-2
    baseline = fallback.bisect_fallback(Planted, batches, tolerance=1e-2)
    assert baseline.met and baseline.fp32_bindings == ["a"]
    assert baseline.evaluations > search.evaluations


def test_the_returned_module_takes_the_output_policy_with_the_search_on_top():
    """The search evaluates with ``policy``; the module it returns is converted with
    ``output_policy`` (here float16 input and output, which its float32 batches cannot feed),
    the bindings it found excluded, and the report carries the search's reasons."""
    output = relay_amp.Policy("float16", keep_io_dtypes=False)
    new, report = fallback.auto_mixed_precision(Planted, _batches(), tolerance=1e-2,
                                                output_policy=output)
    assert report.search.fp32_bindings == ["a"] and report.find("a").code == "search_fallback"
    assert [str(p.ty.dtype) for p in new["main"].params] == ["float16"] * 4
    assert str(new["main"].ret_ty.dtype) == "float16"
    plain, _ = fallback.auto_mixed_precision(Planted, _batches(), tolerance=1e-2)
    assert [str(p.ty.dtype) for p in plain["main"].params] == ["float32"] * 4


def test_tolerance_met_without_fallback_costs_one_evaluation():
    _, report = fallback.auto_mixed_precision(Planted, _batches(), tolerance=10.0)
    assert report.search.evaluations == 1 and report.search.fp32_bindings == []


def test_bad_fallback_arguments_are_clear_errors():
    batches = _batches(1)
    for bad in (0, -1.0, float("nan"), float("inf"), "0.1", True):
        with pytest.raises(ValueError, match="tolerance must be a positive finite number"):
            fallback.auto_mixed_precision(Planted, batches, tolerance=bad)
    with pytest.raises(ValueError, match="at least one batch"):
        fallback.auto_mixed_precision(Planted, [], tolerance=0.1)
    with pytest.raises(ValueError, match="input 'wc' has shape"):
        fallback.auto_mixed_precision(Planted, [[b if b.shape != (16, 16) else b[:8] for b in
                                                 batches[0]]], tolerance=0.1)
    with pytest.raises(ValueError, match="metric must be one of"):
        fallback.auto_mixed_precision(Planted, batches, tolerance=0.1, metric="cosine")
    with pytest.raises(ValueError, match="max_evaluations"):
        fallback.auto_mixed_precision(Planted, batches, tolerance=0.1, max_evaluations=0)
    with pytest.raises(RuntimeError, match="not met within 1 evaluations"):
        fallback.auto_mixed_precision(Planted, batches, tolerance=1e-9, max_evaluations=1)


Overflow = MatmulReluMatmulSoftmax


def test_debug_guard_names_the_first_overflowing_binding():
    guarded, report = relay_amp.convert(Overflow, "float16", debug_guard=True)
    assert not guarded["main"].is_pure
    assert "debug_guard" in report.notes[-1]
    fine = [np.full((2, 8), 0.1, "float32"), np.full((8, 8), 0.1, "float32")]
    np.testing.assert_allclose(run_module(guarded, fine)[0], run_module(Overflow, fine)[0],
                               rtol=1e-3)
    big = [np.full((2, 8), 100.0, "float32"), np.full((8, 8), 100.0, "float32")]
    with pytest.raises(Exception, match="debug_guard: the float16 copy of lv in main "
                                        "produced NaN or Inf"):
        run_module(guarded, big)
    plain, _ = relay_amp.convert(Overflow, "float16")
    assert plain["main"].is_pure  # off by default: nothing added
    assert "assert_op" not in plain.script()


def test_auto_fallback_takes_a_calibration_and_reports_each_evaluation(monkeypatch):
    batches = _batches()
    calibration = relay_amp.calibrate(Planted, batches)
    monkeypatch.setattr(fallback, "calibrate", lambda *a, **k: pytest.fail("calibrated twice"))
    seen = []
    _, report = fallback.auto_mixed_precision(
        Planted, batches, tolerance=1e-2, calibrated=calibration,
        on_evaluation=lambda fp32, value: seen.append((list(fp32), value)))
    assert len(seen) == report.search.evaluations and seen[-1][0] == ["a"]
    assert seen[-1][1] == pytest.approx(report.search.metric_value)
    assert seen[0][0] == [] and seen[0][1] > 1e-2
