"""The accuracy warning advises only what it measured: on a model whose float16 error is spread
over many bindings, the ``--exclude`` it names, when followed, gives the error it states."""

import json
import re

import numpy as np
import pytest

from relay_amp.cli import main
from relay_amp.cli.convert import MAX_ADVISED

onnx = pytest.importorskip("onnx")  # requirements-test.txt installs it

LAYERS = 10
TARGET = "llvm -mattr=+avx512fp16"  # float16 compute; measured on this CPU either way


def _spread_model(path) -> None:
    """Ten equal matmul + bias layers on a (1, 64) input: each rounds about as much."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, weights, value = [], [], "x"
    for i in range(LAYERS):
        weights.append(numpy_helper.from_array(
            (rng.normal(0, 1, (64, 64)) / 8).astype(np.float32), f"w{i}"))
        weights.append(numpy_helper.from_array(rng.normal(0, 0.1, (64,)).astype(np.float32),
                                               f"b{i}"))
        nodes += [helper.make_node("MatMul", [value, f"w{i}"], [f"m{i}"]),
                  helper.make_node("Add", [f"m{i}", f"b{i}"], [f"y{i}"])]
        value = f"y{i}"
    graph = helper.make_graph(
        nodes, "spread", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info(value, TensorProto.FLOAT, [1, 64])], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))


def _convert(tmp_path, capsys, out, *extra):
    code = main(["convert", str(tmp_path / "spread.onnx"), "--dtype", "float16", "--target",
                 TARGET, "--calibrate", str(tmp_path / "data.npz"), "--quiet", "-o",
                 str(tmp_path / out), *extra])
    err = capsys.readouterr().err
    assert code == 0, err
    return json.loads((tmp_path / out / "report.json").read_text()), err.strip()


def test_the_advice_when_followed_gives_the_error_it_states(tmp_path, capsys):
    _spread_model(tmp_path / "spread.onnx")
    np.savez(tmp_path / "data.npz",
             x=np.random.default_rng(1).normal(0, 1, (4, 1, 64)).astype(np.float32))
    first, _ = _convert(tmp_path, capsys, "plain", "--warn-above", "1")
    error = first["accuracy"]["relative_l2"]
    assert 1e-4 < error < 1e-2
    goal = 0.5 * error  # half the error: several of the ten layers must stay float32
    saved, warning = _convert(tmp_path, capsys, "warned", "--warn-above", f"{goal:.6g}")
    assert warning == saved["accuracy_warning"] and warning.startswith("warning: accuracy lost")
    advice = json.loads((tmp_path / "warned" / "accuracy.json").read_text())["advice"]
    assert 2 <= len(advice["exclude"]) <= MAX_ADVISED
    stated = re.search(r"with --exclude (\S+) it measured relative L2 (\S+) on this data",
                       warning)
    assert stated and stated.group(1) == ",".join(advice["exclude"])
    followed, rest = _convert(tmp_path, capsys, "followed", "--warn-above", f"{goal:.6g}",
                              "--exclude", stated.group(1))
    measured = followed["accuracy"]["relative_l2"]
    assert measured == pytest.approx(advice["measured_relative_l2"], rel=1e-6)
    assert f"{measured:.3g}" == stated.group(2).rstrip(",;")
    if measured <= goal:
        assert "still above" not in warning and rest == ""  # within: no warning at all
    else:
        assert "still above" in warning


def test_without_a_set_that_reaches_it_the_warning_says_so(tmp_path, capsys):
    _spread_model(tmp_path / "spread.onnx")
    np.savez(tmp_path / "data.npz",
             x=np.random.default_rng(1).normal(0, 1, (4, 1, 64)).astype(np.float32))
    saved, warning = _convert(tmp_path, capsys, "strict", "--warn-above", "1e-12")
    assert "--exclude" not in warning and "--tolerance finds the fewest" in warning
    assert json.loads((tmp_path / "strict" / "accuracy.json").read_text())["advice"] is None
