"""The sweep's per-output errors: a small output's error is not hidden by a large one's, and
the summary states the per-output criterion (relay_amp ≤ 1.1 × the built-in's on every output)."""

import numpy as np
import pytest

from relay_amp.eval import sweep


def test_each_output_has_its_own_error_beside_the_aggregate():
    rng = np.random.default_rng(0)
    big = [rng.normal(0, 100, (4, 64)).astype("float32") for _ in range(2)]
    small = [rng.uniform(0, 1, (1, 1)).astype("float32") for _ in range(2)]
    reference = [[b, s] for b, s in zip(big, small)]
    outputs = [[b, s * 1.01] for b, s in zip(big, small)]  # 1% off on the small output only
    row = sweep.output_agreement(reference, outputs, {})
    assert row["relative_l2"] < 1e-4  # the aggregate hides it
    assert row["relative_l2_per_output"][0] == 0
    assert row["relative_l2_per_output"][1] == pytest.approx(0.01, rel=1e-3)


def _model(ours, theirs):
    return {"fp32": {"status": "ok"}, "variants": {
        "relay_amp:float16": {"status": "ok", "relative_l2": max(ours),
                              "relative_l2_per_output": ours},
        "tvm:float16": {"status": "ok", "relative_l2": max(theirs),
                        "relative_l2_per_output": theirs}}}


def test_the_summary_states_the_per_output_criterion():
    results = {"models": {"a": _model([1e-3, 2e-3], [2e-3, 1e-3]),
                          "b": _model([5e-4, 0.0], [1e-3, 0.0]),
                          "c": _model([1e-4], [0.0])}}
    lines = sweep.summary_lines(results)
    line = next(text for text in lines if text.startswith("per output:"))
    # a: 0.5 and 2.0; b: 0.5 (its exact output left out); c: infinite (the built-in is exact)
    assert line == ("per output: relay_amp float16 error ÷ built-in's above 1.1 on 2 of 4 "
                    "outputs (c output 0; a output 1); largest inf (c output 0)")
    assert sweep.per_output_ratios({"relative_l2_per_output": [1.0]}, {}) == []


def test_effective_batches_say_how_many_inputs_decide_an_output():
    """A probability that is large on one input is measured on that input, whatever the batch
    count; an output of the same size everywhere on every batch."""
    even = [[np.ones((2, 3), "float32"), np.array([[0.001]], "float32")] for _ in range(8)]
    even[5][1] = np.array([[0.5]], "float32")
    counts = sweep.effective_batches(even)
    assert counts[0] == pytest.approx(8.0)
    assert counts[1] == pytest.approx(1.0, abs=1e-3)
    row = sweep.output_agreement(even, even, {})
    assert row["effective_batches_per_output"] == counts
    model = _model([1e-3, 3e-3], [1e-3, 1e-3])
    model["variants"]["relay_amp:float16"]["effective_batches_per_output"] = counts
    line = next(text for text in sweep.summary_lines({"models": {"m": model}})
                if text.startswith("per output:"))
    assert line.endswith("above 1.1 on 1 of 2 outputs (m output 1, 1.0 effective batches); "
                         "largest 3 (m output 1, 1.0 effective batches)")


def test_the_ratio_interval_is_paired_and_narrows_with_inputs():
    rng = np.random.default_rng(3)
    reference = [[rng.normal(size=(1, 8))] for _ in range(200)]
    ours = [[r[0] + rng.normal(scale=1e-3, size=(1, 8))] for r in reference]
    theirs = [[r[0] + rng.normal(scale=2e-3, size=(1, 8))] for r in reference]
    ratio, low, high = sweep.ratio_interval(reference, ours, theirs, 0)
    assert 0.45 < low < ratio < high < 0.55
    few, few_low, few_high = sweep.ratio_interval(reference[:5], ours[:5], theirs[:5], 0)
    assert few_high - few_low > high - low
    assert sweep.ratio_interval(reference, theirs, theirs, 0) == (1.0, 1.0, 1.0)


def test_a_detector_is_held_to_the_criterion_on_what_its_nms_reads():
    """Outputs 0-1 are what NMS selected (a swapped near-tie moves them by more than any
    rounding): left to recall and IoU. Outputs 2-3 are what NMS reads: held to 1.1 ×."""
    reference = [[np.array([1.0, 2.0]), np.array([0.9, 0.8]), np.array([10.0, 20.0]),
                  np.array([0.9, 0.8])]]
    ours = [[np.array([2.0, 1.0]), np.array([0.8, 0.9]), np.array([10.0, 20.1]),
             np.array([0.9, 0.81])]]
    theirs = [[np.array([1.0, 2.0]), np.array([0.9, 0.8]), np.array([10.0, 20.2]),
               np.array([0.9, 0.805])]]
    rows = [sweep.output_agreement(reference, out, {"error_outputs": [2, 3]})
            for out in (ours, theirs)]
    assert rows[0]["error_outputs"] == [2, 3]
    assert [i for i, _ in sweep.per_output_ratios(*rows)] == [2, 3]
    assert sweep.per_output_ratios(*rows)[1][1] == pytest.approx(2.0)
    model = {"fp32": {"status": "ok"}, "variants": {
        "relay_amp:float16": {"status": "ok", **rows[0]},
        "tvm:float16": {"status": "ok", **rows[1]}}}
    line = next(text for text in sweep.summary_lines({"models": {"det": model}})
                if text.startswith("per output:"))
    assert "above 1.1 on 1 of 2 outputs (of 1 detectors, what NMS reads; their 2 outputs " \
           "after NMS are measured by detection recall and IoU) (det output 3" in line
    older = {key: value for key, value in rows[0].items() if key != "error_outputs"}
    assert sweep.measured_outputs(older) == [2, 3]  # a row measured before it was recorded
    assert sweep.measured_outputs({"relative_l2_per_output": [0.1]}) is None
