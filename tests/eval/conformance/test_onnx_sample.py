"""A fixed sample of the ONNX backend test suite in every mode (the script runs all of it), and
the harness's own machinery: attribution, test-data discovery, the resumable parallel run."""

import json
import os

import numpy as np
import pytest

from relay_amp.eval import conformance

pytestmark = pytest.mark.zoo  # the model zoo: pip install -r requirements.txt

#: Per mode, cases that exercise it. default: where TVM's pass breaks (tuple-valued ops,
#: shape-valued arguments, call_tir, If) and dot products; the low-precision modes: a float op of
#: each kind (dot products, reductions, norms, pools, activations, data movement, QDQ).
SAMPLE = {
    "default": ["test_batchnorm_epsilon", "test_dropout_default", "test_unsqueeze_axis_0",
                "test_squeeze", "test_range_float_type_positive_delta", "test_clip",
                "test_if", "test_basic_conv_with_padding", "test_gemm_default_matrix_bias"],
    "low_io": ["test_reduce_prod_default_axes_keepdims_example", "test_matmul_2d",
               "test_maxpool_2d_default", "test_concat_2d_axis_0", "test_where_example",
               "test_gemm_alpha", "test_relu", "test_reduce_max_default_axes_keepdim_example"],
    "all_low": ["test_exp", "test_instancenorm_example", "test_averagepool_2d_default",
                "test_gelu_default_1", "test_logsoftmax_axis_0", "test_lrn", "test_sigmoid"],
    "all_low_io": ["test_conv_with_strides_padding", "test_convtranspose", "test_tanh",
                   "test_gather_0", "test_erf", "test_log",
                   "test_reduce_min_default_axes_keepdims_example"],
}
def _paths() -> dict:
    """Case folders by name, in the installed onnx's own test data."""
    return {os.path.basename(p): p for p in conformance.case_dirs(["node"])}


CASES = [(mode, name) for mode, names in SAMPLE.items() for name in names]


@pytest.mark.parametrize(("mode", "name"), CASES, ids=[f"{m}-{n}" for m, n in CASES])
def test_sample_case_in_its_mode(mode, name):
    row = conformance.run_case(_paths()[name], modes=(mode,))
    assert row["outcome"] == "ok", row  # TVM imports and runs every sampled case in float32
    outcome, results = conformance.mode_outcome(row, mode)
    assert outcome == "pass", results
    if mode != "default" and "reduce_prod" not in name:  # (12! stays float32: see below)
        assert all(r["low_ops"] >= 1 for r in results.values()), results
    variant = conformance.MODES[mode].builtin
    if variant:  # the built-in pass ran side by side (ConvertToDataflow first)
        assert row["units"][f"builtin/{variant}"]["outcome"] in ("pass", "fail", "crash")


def test_reduce_prod_keeps_its_float32_result_in_low_precision_io():
    """The issue's case: 12! = 4.79e8 is not stored as float16 inf, and the row says why."""
    row = conformance.run_case(_paths()["test_reduce_prod_default_axes_keepdims_example"],
                               modes=("low_io",), dtypes=("float16",))
    result = row["units"]["low_io/float16"]
    assert result["outcome"] == "pass", result
    assert result["boundary"] == [
        "result (gv): observed max 4.79e+08 exceeds float16 max 65504 (with a 2x margin)"]


def test_attribution_tells_conversion_from_input_rounding():
    assert conformance.attribute(None, None, True) == {"outcome": "pass"}
    rounding = conformance.attribute(None, "output 0 differs by 1", True)
    assert rounding["cause"] == "input rounding" and rounding["outcome"] == "fail"
    assert conformance.attribute("output 0 differs by 1", "output 0 differs by 1",
                                 True)["cause"] == "conversion"
    assert conformance.attribute(None, "output 0 differs by 1", False)["cause"] == "conversion"
    assert conformance._died("low_io/float16", "convert", "x")["cause"] == "relay_amp"
    assert conformance._died("low_io/float16", "run", "x") == {
        "outcome": "fail", "cause": "TVM", "reason": "x"}
    assert conformance._died("base", "float32 run", "x")["outcome"] == "skip"
    assert conformance._died("builtin/float32_io", "convert", "x")["outcome"] == "crash"


def test_comparison_at_dtype_tolerance():
    reference = [np.array([1.0, 2.0, 100.0], "float32")]
    assert conformance._compare(reference, [reference[0] * (1 + 1e-3)], "float16") is None
    assert "differs" in conformance._compare(reference, [reference[0] + 5.0], "float16")
    assert "differs" in conformance._compare([np.array([1, 2])], [np.array([1, 3])], "float16")


def _write_case(folder, model_file, nodes, inputs, outputs, input_kinds=None):
    """A case in the layout of the onnx wheel's backend test data, built with onnx.helper."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    os.makedirs(os.path.join(folder, "test_data_set_0"))
    graph_inputs = []
    for (name, array), kind in zip(inputs.items(), input_kinds or ["tensor"] * len(inputs)):
        tensor = helper.make_tensor_type_proto(TensorProto.FLOAT, array.shape)
        graph_inputs.append(helper.make_value_info(
            name, helper.make_sequence_type_proto(tensor) if kind == "sequence" else tensor))
    graph = helper.make_graph(
        nodes, "g", graph_inputs,
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, a.shape) for n, a in outputs.items()])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]),
              os.path.join(folder, model_file))
    for prefix, arrays in (("input", inputs), ("output", outputs)):
        for i, array in enumerate(arrays.values()):
            with open(os.path.join(folder, "test_data_set_0", f"{prefix}_{i}.pb"), "wb") as f:
                f.write(numpy_helper.from_array(array).SerializeToString())


@pytest.fixture
def custom_data(tmp_path, monkeypatch):
    """A data directory laid out as another onnx version might: a suite name the harness does
    not know, a model file not called model.onnx, a sequence input, a folder with no case."""
    from onnx import helper

    x = np.linspace(-1, 1, 6, dtype="float32").reshape(2, 3)
    y = np.full((2, 3), 0.5, "float32")
    suite = tmp_path / "newer_suite"
    _write_case(str(suite / "test_add"), "graph.onnx", [helper.make_node("Add", ["x", "y"], ["z"])],
                {"x": x, "y": y}, {"z": x + y})
    _write_case(str(suite / "test_relu"), "model.onnx", [helper.make_node("Relu", ["x"], ["z"])],
                {"x": x}, {"z": np.maximum(x, 0)})
    _write_case(str(suite / "test_sequence_input"), "model.onnx",
                [helper.make_node("Identity", ["x"], ["z"])], {"x": x}, {"z": x}, ["sequence"])
    (tmp_path / "real" / "test_downloaded").mkdir(parents=True)  # a model to download: no case
    monkeypatch.setenv("RELAY_AMP_ONNX_DATA", str(tmp_path))
    return tmp_path


def test_any_data_layout_is_discovered_and_run(custom_data):
    assert conformance.suites() == ["newer_suite"]
    paths = {conformance.case_name(p): p for p in conformance.case_dirs()}
    assert sorted(paths) == ["newer_suite/test_add", "newer_suite/test_relu",
                             "newer_suite/test_sequence_input"]
    row = conformance.run_case(paths["newer_suite/test_add"], modes=("all_low",))
    assert conformance.mode_outcome(row, "all_low")[0] == "pass"
    assert all(r["low_ops"] == 1 for r in row["units"].values()), row
    skipped = conformance.run_case(paths["newer_suite/test_sequence_input"])
    assert skipped["outcome"] == "skip" and "is a sequence" in skipped["reason"]


def test_parallel_run_is_resumable_and_keeps_one_line_per_unit(custom_data, tmp_path):
    paths = conformance.case_dirs()
    out = str(tmp_path / "results.jsonl")
    rows = conformance.run_suite(paths, out, workers=2, modes=("low_io",), dtypes=("float16",))
    assert [r["case"] for r in rows] == [conformance.case_name(p) for p in paths]
    assert [r["outcome"] for r in rows] == ["ok", "ok", "skip"]
    relu = rows[1]["units"]
    assert relu["low_io/float16"]["outcome"] == "pass" and relu["low_io/float16"]["low_ops"] == 1
    assert relu["builtin/float16_inputs"]["outcome"] in ("pass", "fail", "crash")
    with open(out, encoding="utf-8") as handle:
        records = [json.loads(line) for line in handle]
    assert all("start" not in r for r in records) and len(records) == 2 * 3 + 1
    assert not any(name.startswith("results.jsonl.") for name in os.listdir(tmp_path))
    again = conformance.run_suite(paths, out, workers=2, modes=("low_io",), dtypes=("float16",))
    assert again == rows  # nothing left to run
