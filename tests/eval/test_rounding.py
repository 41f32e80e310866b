"""relay_amp.eval.rounding: a whole model's float32 build against TVM's plain build, within the
rounding of reordered sums; and scripts/bench_build_time.py, which checks it on the registry."""

import json
import pathlib
import sys

import numpy as np
import pytest
import tvm
from tvm import relax

import relay_amp
from relay_amp.eval import rounding

sys.path.insert(0, str(pathlib.Path(__file__).parents[2] / "scripts"))

import bench_build_time  # noqa: E402
from bench_peers import _build  # noqa: E402


def _model(weights=None):
    """A convolution of 8 channels to 16 (3 x 3: 72 terms an output), a ReLU and a matmul of
    16 * 7 * 7 = 784 terms: 856 summed terms."""
    rng = np.random.default_rng(0)
    conv, dense = weights or (rng.standard_normal((16, 8, 3, 3)).astype("float32"),
                              rng.standard_normal((784, 10)).astype("float32"))
    x = relax.Var("x", relax.TensorType((1, 8, 14, 14), "float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            y = builder.emit(relax.op.nn.conv2d(x, relax.const(conv), strides=[2, 2],
                                                padding=[1, 1]))
            y = builder.emit(relax.op.reshape(relax.op.nn.relu(y), (1, 784)))
            out = builder.emit_output(relax.op.matmul(y, relax.const(dense)))
        builder.emit_func_output(out)
    return builder.get(), (conv, dense)


def test_reduction_terms_add_every_kernels_sum_length():
    mod, _ = _model()
    assert rounding.reduction_terms(mod) == 8 * 3 * 3 + 784
    before = mod.script()
    rounding.reduction_terms(mod)
    assert mod.script() == before


def test_compare_holds_within_the_bound_and_fails_past_it():
    plain = np.array([1.0, -4.0, 2.0], "float32")
    bound = rounding.reordering_bound(1000, plain)
    assert bound == pytest.approx(4.0 * 1000 * 2.0 ** -23)
    close = plain + np.array([0, bound, 0], "float32") * 0.5
    far = plain + np.array([0, bound, 0], "float32") * 4
    assert rounding.compare([close], [plain], 1000)[0]["within"]
    row = rounding.compare([far], [plain], 1000)[0]
    assert not row["within"] and row["max_abs"] > row["bound"]
    nan = plain.copy()
    nan[0] = np.nan
    assert not rounding.compare([nan], [plain], 1000)[0]["within"]
    assert rounding.compare([nan], [nan.copy()], 1000)[0]["within"]
    assert not rounding.compare([np.array([1, 2])], [np.array([1, 3])], 1000)[0]["within"]
    with pytest.raises(ValueError, match="2 outputs against 1"):
        rounding.compare([plain, plain], [plain], 1000)
    with pytest.raises(ValueError, match="shape"):
        rounding.compare([plain[:2]], [plain], 1000)


def test_relay_amps_build_is_within_the_bound_and_a_wrong_one_is_not(tmp_path):
    mod, (conv, dense) = _model()
    target = tvm.target.Target(relay_amp.host_target())
    x = np.random.default_rng(1).standard_normal((1, 8, 14, 14)).astype("float32")
    plain = bench_build_time._outputs(_build(mod, target, False, str(tmp_path))[0], [x])
    ours = bench_build_time._outputs(_build(mod, target, True, str(tmp_path))[0], [x])
    terms = rounding.reduction_terms(mod)
    assert rounding.compare(ours, plain, terms)[0]["within"]
    swapped = conv.copy()
    swapped[[0, 1]] = swapped[[1, 0]]  # two output channels' weights exchanged
    wrong, _ = _model((swapped, dense))
    (tmp_path / "wrong").mkdir()  # dlopen of a path already loaded returns the loaded library
    wrong_out = bench_build_time._outputs(_build(wrong, target, True, str(tmp_path / "wrong"))[0],
                                          [x])
    assert not rounding.compare(wrong_out, plain, terms)[0]["within"]


@pytest.mark.zoo
def test_the_build_time_benchmark_checks_a_registry_models_outputs(tmp_path):
    path = tmp_path / "rows.json"
    assert bench_build_time.main(["--models", "squeezenet1.1", "--json", str(path),
                                  "--markdown", str(tmp_path / "rows.md")]) == 0
    (row,) = json.loads(path.read_text())["rows"]
    assert row["status"] == "ok" and row["terms"] > 0 and row["within"]
    assert row["outputs"][0]["max_abs"] <= row["outputs"][0]["bound"]
    assert "| squeezenet1.1 |" in (tmp_path / "rows.md").read_text()


def _detections(seed=0):
    """A detector's ranked outputs for a batch of one: class ids, scores (rows 2 and 3 tie),
    boxes."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 80, (1, 6, 1)).astype("float32")
    scores = np.array([0.9, 0.8, 0.7, 0.7, 0.5, 0.4], "float32").reshape(1, 6, 1)
    return [ids, scores, (rng.random((1, 6, 4)) * 300).astype("float32")]


def _swapped(outputs, i, j):
    swapped = [o.copy() for o in outputs]
    for o in swapped:
        o[0, [i, j]] = o[0, [j, i]]
    return swapped


def test_ranked_rows_that_tie_may_swap_and_no_others():
    """Two detections whose scores tie within rounding are listed in either order: the same
    rows, swapped, hold (and say so). Rows swapped across different scores, or a swapped row
    whose box moved past the bound, do not."""
    plain = _detections()
    rows = rounding.compare(_swapped(plain, 2, 3), plain, 1000)
    assert all(row["within"] and row["rows_moved"] == 2 for row in rows)
    assert rows[2]["max_abs"] > rows[2]["bound"]  # in place, the boxes differ
    assert not all(row["within"] for row in rounding.compare(_swapped(plain, 1, 2), plain, 1000))
    wrong = _swapped(plain, 2, 3)
    wrong[2][0, 2, 0] += 1.0
    assert not all(row["within"] for row in rounding.compare(wrong, plain, 1000))
    assert "rows_moved" not in rounding.compare(plain, plain, 1000)[0]
