"""ONNX models whose weights live in files beside them (how models past protobuf's 2 GB limit
ship): ``relay-amp convert`` reads them, and a missing or truncated weight file is one line
naming the file, exit 2, nothing written."""

import json
import os

import numpy as np
import pytest

from relay_amp.cli import main

onnx = pytest.importorskip("onnx")  # requirements-test.txt installs it


def _model():
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.normal(0, 0.3, (64, 32)).astype(np.float32), "w")
    bias = numpy_helper.from_array(rng.normal(0, 0.1, (32,)).astype(np.float32), "b")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]),
             helper.make_node("Add", ["m", "b"], ["a"]),
             helper.make_node("Relu", ["a"], ["out"])]
    graph = helper.make_graph(
        nodes, "external", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 32])], [weight, bias])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def _save(folder, model) -> str:
    """``model`` saved in ``folder`` with every tensor in ``weights.bin`` beside it."""
    folder.mkdir()
    path = str(folder / "model.onnx")
    onnx.save_model(onnx.ModelProto.FromString(model.SerializeToString()), path,
                    save_as_external_data=True, all_tensors_to_one_file=True,
                    location="weights.bin", size_threshold=0)
    return path


def _convert(path, out, capsys):
    code = main(["convert", path, "--dtype", "float16", "--target", "llvm", "--quiet",
                 "-o", str(out)])
    return code, capsys.readouterr().err


def test_a_model_with_external_weights_converts(tmp_path, capsys):
    path = _save(tmp_path / "whole", _model())
    assert os.path.getsize(tmp_path / "whole" / "weights.bin") == (64 * 32 + 32) * 4
    assert os.path.getsize(path) < 1000  # the weights are not in the model file
    code, err = _convert(path, tmp_path / "out", capsys)
    assert code == 0, err
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["model"]["path"] == os.path.abspath(path)
    # the library computes with the weights from the file (a weight read as zeros would not)
    import tvm
    from onnx import numpy_helper

    weights = {t.name: numpy_helper.to_array(t) for t in _model().graph.initializer}
    x = np.random.default_rng(1).normal(0, 1, (1, 64)).astype(np.float32)
    vm = tvm.relax.VirtualMachine(tvm.runtime.load_module(str(tmp_path / "out" / "model.so")),
                                  tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(x)).numpy().astype(np.float32)
    want = np.maximum(x @ weights["w"] + weights["b"], 0)
    assert np.abs(want).max() > 0.1
    np.testing.assert_allclose(got, want, atol=2e-2 * np.abs(want).max())


def test_a_missing_weight_file_is_named_exit_2(tmp_path, capsys):
    path = _save(tmp_path / "missing", _model())
    os.remove(tmp_path / "missing" / "weights.bin")
    code, err = _convert(path, tmp_path / "out", capsys)
    assert code == 2
    line = err.strip().splitlines()[-1]
    assert line.startswith("relay-amp convert:") and "'weights.bin'" in line
    assert "does not exist" in line and "'w'" in line
    assert not (tmp_path / "out").exists()


def test_a_truncated_weight_file_is_named_exit_2(tmp_path, capsys):
    path = _save(tmp_path / "truncated", _model())
    weights = tmp_path / "truncated" / "weights.bin"
    weights.write_bytes(weights.read_bytes()[:1000])
    code, err = _convert(path, tmp_path / "out", capsys)
    assert code == 2
    line = err.strip().splitlines()[-1]
    assert "'weights.bin'" in line and "truncated" in line and "the file has 1000" in line
    assert not (tmp_path / "out").exists()


def _large_model(list_initializers_as_inputs: bool = False):
    """A weight of 128 KiB (a weight :func:`frontends._load_external_data` leaves in its file)
    and a small bias (loaded into the protobuf as before)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(2)
    weight = numpy_helper.from_array(rng.normal(0, 0.1, (256, 128)).astype(np.float32), "w")
    bias = numpy_helper.from_array(rng.normal(0, 0.1, (128,)).astype(np.float32), "b")
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 256])]
    if list_initializers_as_inputs:  # as exporters before ONNX IR 4 wrote them
        inputs += [helper.make_tensor_value_info("w", TensorProto.FLOAT, [256, 128]),
                   helper.make_tensor_value_info("b", TensorProto.FLOAT, [128])]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]),
             helper.make_node("Add", ["m", "b"], ["out"])]
    graph = helper.make_graph(
        nodes, "large", inputs,
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [2, 128])], [weight, bias])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def _run_library(out, x):
    import tvm

    vm = tvm.relax.VirtualMachine(tvm.runtime.load_module(str(out / "model.so")), tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x)).numpy().astype(np.float32)


@pytest.mark.parametrize("listed", [False, True], ids=["initializers", "listed_as_inputs"])
def test_a_large_weight_is_read_once_and_never_into_the_protobuf(tmp_path, capsys, monkeypatch,
                                                                 listed):
    import tvm.relax.frontend.onnx as onnx_frontend
    from onnx import numpy_helper

    from relay_amp.cli import frontends

    reads, imported = [], []
    real_read, real_from_onnx = frontends.ExternalWeight.read, onnx_frontend.from_onnx

    def read(weight):
        reads.append(weight.name)
        return real_read(weight)

    def from_onnx(model, *args, **kwargs):
        imported.append(sum(len(t.raw_data) for t in model.graph.initializer))
        return real_from_onnx(model, *args, **kwargs)

    monkeypatch.setattr(frontends.ExternalWeight, "read", read)
    monkeypatch.setattr(onnx_frontend, "from_onnx", from_onnx)
    path = _save(tmp_path / "large", _large_model(listed))
    code, err = _convert(path, tmp_path / "out", capsys)
    assert code == 0, err
    assert reads == ["w"]  # the weight, once; the 512-byte bias went through the protobuf
    assert imported and max(imported) == 128 * 4  # what from_onnx saw: the bias's bytes alone
    weights = {t.name: numpy_helper.to_array(t) for t in _large_model().graph.initializer}
    x = np.random.default_rng(3).normal(0, 1, (2, 256)).astype(np.float32)
    want = x @ weights["w"] + weights["b"]
    np.testing.assert_allclose(_run_library(tmp_path / "out", x), want,
                               atol=2e-2 * np.abs(want).max())
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert [i["name"] for i in report["model"]["inputs"]] == ["x"]
