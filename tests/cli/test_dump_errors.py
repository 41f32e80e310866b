"""``relay-amp convert --dump-errors``: on a model whose float16 error starts in one known
binding, the dump names it, and its ``--exclude``, followed, gives the error it states."""

import json

import numpy as np
import pytest

from relay_amp.cli import main
from relay_amp.cli.error_dump import JUMP_FACTOR, find_jumps, unit_roundoff

onnx = pytest.importorskip("onnx")  # requirements-test.txt installs it

TARGET = "llvm -mattr=+avx512fp16"  # float16 compute; measured on this CPU either way
WIDTH = 64
OFFSET = 1000.0  # float16's spacing there is 0.5: the signal added to it is mostly rounded off


def _cancelling_model(path) -> None:
    """MatMul, ReLU, + OFFSET, MatMul, - OFFSET @ W2, MatMul: the second MatMul reads its input
    in float16, where OFFSET swamps the signal, and the subtraction after it (the last Add)
    exposes what was lost; everything before that rounds as float16 always does."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w1, w2, w3 = ((rng.normal(0, 1, (WIDTH, WIDTH)) / 8).astype(np.float32) for _ in range(3))
    offset = np.full((WIDTH,), OFFSET, np.float32)
    weights = [numpy_helper.from_array(array, name) for array, name in (
        (w1, "w1"), (offset, "offset"), (w2, "w2"), (-(offset @ w2), "back"), (w3, "w3"))]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["m1"]),
             helper.make_node("Relu", ["m1"], ["r1"]),
             helper.make_node("Add", ["r1", "offset"], ["shifted"]),
             helper.make_node("MatMul", ["shifted", "w2"], ["m2"]),
             helper.make_node("Add", ["m2", "back"], ["cancelled"]),
             helper.make_node("MatMul", ["cancelled", "w3"], ["y"])]
    graph = helper.make_graph(
        nodes, "cancelling", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, WIDTH])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, WIDTH])], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("dump")
    _cancelling_model(folder / "model.onnx")
    np.savez(folder / "data.npz",
             x=np.random.default_rng(1).normal(0, 1, (4, 1, WIDTH)).astype(np.float32))
    return folder


def _convert(model, out, capsys, *extra):
    code = main(["convert", str(model / "model.onnx"), "--dtype", "float16", "--target", TARGET,
                 "--calibrate", str(model / "data.npz"), "--quiet", "-o", str(model / out),
                 *extra])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return json.loads((model / out / "report.json").read_text()), captured.out


@pytest.fixture(scope="module")
def dumped(model):
    code = main(["convert", str(model / "model.onnx"), "--dtype", "float16", "--target", TARGET,
                 "--calibrate", str(model / "data.npz"), "--quiet", "--warn-above", "1e-3",
                 "--dump-errors", "-o", str(model / "dumped")])
    assert code == 0
    return (json.loads((model / "dumped" / "report.json").read_text()),
            json.loads((model / "dumped" / "errors.json").read_text()))


def test_one_row_per_binding_in_execution_order(model, dumped):
    from relay_amp.cli.frontends import import_model

    saved, dump = dumped
    mod = import_model(str(model / "model.onnx"), "onnx", {}).mod
    names = [b.var.name for block in mod["main"].body.blocks for b in block.bindings]
    assert [row["binding"] for row in dump["rows"]] == names
    assert [row["index"] for row in dump["rows"]] == list(range(len(names)))
    rows = {row["name"]: row for row in saved["conversion"]["rows"]}
    for row in dump["rows"]:  # the report's decisions, beside each error
        assert row["compute"] == rows[row["binding"]]["compute_dtype"]
        assert row["rule"] == rows[row["binding"]]["rule"]
    # the last binding is the output: its error is the accuracy the convert measured
    assert dump["rows"][-1]["error"] == pytest.approx(saved["accuracy"]["relative_l2"],
                                                      rel=1e-3)


def test_the_jump_names_the_binding_where_the_error_starts(dumped):
    saved, dump = dumped
    adds = [row["name"] for row in saved["conversion"]["rows"] if row["op"] == "add"]
    cancelling = adds[-1]
    assert dump["jumps"][0] == cancelling
    rows = {row["binding"]: row for row in dump["rows"]}
    before = [row["error"] for row in dump["rows"][:rows[cancelling]["index"]]]
    assert max(before) < 4 * unit_roundoff("float16")  # float16 rounding, nothing more
    assert rows[cancelling]["error"] > JUMP_FACTOR * max(before)
    assert rows[cancelling]["jump"] and sum(row["jump"] for row in dump["rows"]) == 1


def test_the_exclude_when_followed_gives_the_error_the_dump_states(model, dumped, capsys):
    saved, dump = dumped
    suggestion = dump["suggestion"]
    assert suggestion["exclude"][0] == dump["jumps"][0]  # the jump is kept first
    assert suggestion["measured_relative_l2"] <= dump["goal"] < dump["relative_l2"]
    markdown = (model / "dumped" / "report.md").read_text()
    assert f"--exclude {','.join(suggestion['exclude'])}\n" in markdown
    assert f"| {dump['jumps'][0]} |" in markdown
    followed, _ = _convert(model, "followed", capsys, "--exclude",
                           ",".join(suggestion["exclude"]))
    assert followed["accuracy"]["relative_l2"] == pytest.approx(
        suggestion["measured_relative_l2"], rel=1e-6)


def test_report_errors_prints_every_binding(model, dumped, capsys):
    _, dump = dumped
    assert main(["report", "--errors", str(model / "dumped")]) == 0
    printed = capsys.readouterr().out.splitlines()
    table = printed[printed.index(next(line for line in printed if line.startswith("#  "))):]
    assert [line.split()[1] for line in table[1:]] == [row["binding"] for row in dump["rows"]]
    jumped = [line.split()[1] for line in table[1:] if " JUMP " in line]
    assert jumped == dump["jumps"]


def test_without_data_or_a_dump_it_is_a_usage_error(model, capsys):
    code = main(["convert", str(model / "model.onnx"), "--dtype", "float16", "--dump-errors",
                 "--quiet", "-o", str(model / "nodata")])
    err = capsys.readouterr().err
    assert code == 2 and "--dump-errors" in err and "--calibrate" in err
    assert not (model / "nodata").exists()
    _convert(model, "plain", capsys)
    assert main(["report", "--errors", str(model / "plain")]) == 2
    err = capsys.readouterr().err
    assert "no errors.json" in err and "--dump-errors" in err


def test_an_error_that_builds_up_has_no_jump():
    u = unit_roundoff("float16")
    gradual = [{"error": e} for e in (u, 2 * u, None, 3 * u, 9 * u, 0.0, 20 * u)]
    assert find_jumps(gradual, "float16") == []
    sudden = gradual + [{"error": 300 * u}, {"error": 400 * u}, {"error": float("inf")}]
    assert [row["error"] for row in find_jumps(sudden, "float16")] == [300 * u, float("inf")]


def test_after_the_search_the_dump_measures_what_the_search_kept(model, capsys):
    saved, _ = _convert(model, "searched", capsys, "--tolerance", "1e-3", "--dump-errors")
    dump = json.loads((model / "searched" / "errors.json").read_text())
    kept = saved["conversion"]["search"]["fp32_bindings"]
    assert dump["goal_from"] == "--tolerance" and dump["goal"] == 1e-3 and kept
    assert dump["rows"][-1]["error"] == pytest.approx(saved["accuracy"]["relative_l2"], rel=1e-3)
    assert dump["rows"][-1]["error"] <= 1e-3
    rows = {row["binding"]: row for row in dump["rows"]}
    assert all(rows[name]["effect"] is None and rows[name]["compute"] == "float32"
               for name in kept)  # float32 already: nothing to exclude there
    assert dump["suggestion"] is None or not set(dump["suggestion"]["exclude"]) & set(kept)
