"""The named ONNX repairs: each on a small graph with the construct MXNet's exporter writes,
checked against onnxruntime on the original graph and through TVM's importer and compile."""

import copy

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from tvm import relax  # noqa: E402
from tvm.relax.frontend.onnx import from_onnx  # noqa: E402

import relay_amp  # noqa: E402
from relay_amp import execution  # noqa: E402
from relay_amp.eval import onnx_repairs  # noqa: E402

pytestmark = pytest.mark.zoo  # the model zoo: pip install -r requirements.txt


def _const(name, value, dtype=np.int64):
    return numpy_helper.from_array(np.array(value, dtype), name)


def _model(nodes, inputs, outputs, initializers=(), opset=13):
    graph = helper.make_graph(nodes, "test", inputs, outputs, list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _ort(model, feeds):
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _tvm(model, feeds):
    mod = from_onnx(model, shape_dict={k: list(v.shape) for k, v in feeds.items()})
    return execution.run(relay_amp.compile_module(mod), list(feeds.values()))


def _tensor(name, shape, dtype=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dtype, shape)


# ------------------------------------------------------------------------------ Resize
def _resize_model(scales, sizes):
    inits = [_const("roi", [], np.float32), _const("scales", scales, np.float32)]
    inputs = ["x", "roi", "scales"]
    if sizes is not None:
        inits.append(_const("sizes", sizes))
        inputs.append("sizes")
    node = helper.make_node("Resize", inputs, ["y"], mode="linear",
                            coordinate_transformation_mode="align_corners")
    return _model([node], [_tensor("x", [1, 2, 4, 4])], [_tensor("y", None)], inits)


def test_resize_with_empty_scales_keeps_sizes_and_matches_onnxruntime():
    model = _resize_model([], [1, 2, 8, 6])
    x = np.random.default_rng(0).normal(size=(1, 2, 4, 4)).astype(np.float32)
    expected = _ort(model, {"x": x})[0]
    with pytest.raises(AssertionError, match="Only one of scales and sizes"):
        from_onnx(copy.deepcopy(model), shape_dict={"x": [1, 2, 4, 4]})
    assert onnx_repairs.keep_one_resize_target(model) == 1
    assert list(model.graph.node[0].input) == ["x", "roi", "", "sizes"]
    out = _tvm(model, {"x": x})[0]
    assert out.shape == (1, 2, 8, 6)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


def test_resize_with_real_scales_and_sizes_keeps_sizes():
    model = _resize_model([1.0, 1.0, 3.0, 3.0], [1, 2, 8, 8])
    assert onnx_repairs.keep_one_resize_target(model) == 1
    assert list(model.graph.node[0].input) == ["x", "roi", "", "sizes"]
    out = _tvm(model, {"x": np.ones((1, 2, 4, 4), np.float32)})[0]
    assert out.shape == (1, 2, 8, 8)  # the sizes, not the scales' 12 x 12


def test_resize_with_empty_sizes_keeps_scales():
    model = _resize_model([1.0, 1.0, 2.0, 2.0], [])
    assert onnx_repairs.keep_one_resize_target(model) == 1
    assert list(model.graph.node[0].input) == ["x", "roi", "scales"]
    assert _tvm(model, {"x": np.ones((1, 2, 4, 4), np.float32)})[0].shape == (1, 2, 8, 8)


def test_resize_with_one_target_is_left_alone():
    model = _resize_model([1.0, 1.0, 2.0, 2.0], None)
    before = model.SerializeToString()
    assert onnx_repairs.keep_one_resize_target(model) == 0
    assert model.SerializeToString() == before


# ------------------------------------------------------------------------------ LpNormalization
@pytest.mark.parametrize("opset,axis,power", [(13, 1, 2), (13, -1, 1), (11, 1, 2), (11, 2, 1)])
def test_lp_normalization_decomposed_matches_onnxruntime(opset, axis, power):
    node = helper.make_node("LpNormalization", ["x"], ["y"], axis=axis, p=power, name="norm")
    model = _model([node], [_tensor("x", [2, 3, 5])], [_tensor("y", [2, 3, 5])], opset=opset)
    x = np.random.default_rng(1).normal(size=(2, 3, 5)).astype(np.float32)
    expected = _ort(model, {"x": x})[0]
    reference = x / np.linalg.norm(x, ord=power, axis=axis, keepdims=True)
    np.testing.assert_allclose(expected, reference, rtol=1e-5)
    with pytest.raises(Exception, match="LpNormalization"):
        from_onnx(copy.deepcopy(model), shape_dict={"x": [2, 3, 5]})
    assert onnx_repairs.decompose_lp_normalization(model) == 1
    assert "LpNormalization" not in [n.op_type for n in model.graph.node]
    np.testing.assert_allclose(_ort(model, {"x": x})[0], expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(_tvm(model, {"x": x})[0], expected, rtol=1e-5, atol=1e-6)


def test_lp_normalization_with_unsupported_power_is_an_error():
    node = helper.make_node("LpNormalization", ["x"], ["y"], axis=1, p=3)
    model = _model([node], [_tensor("x", [1, 3])], [_tensor("y", [1, 3])])
    with pytest.raises(ValueError, match="p must be 1 or 2"):
        onnx_repairs.decompose_lp_normalization(model)


# ------------------------------------------------------------------------------ Split
def _split_model(opset, with_sizes=False):
    inputs = ["x", "sizes"] if with_sizes else ["x"]
    node = helper.make_node("Split", inputs, ["a", "b"], axis=0)
    inits = [_const("sizes", [2, 2])] if with_sizes else []
    return _model([node], [_tensor("x", [4], TensorProto.INT64)],
                  [_tensor("a", [2], TensorProto.INT64), _tensor("b", [2], TensorProto.INT64)],
                  inits, opset=opset)


def test_split_without_num_outputs_gets_it():
    model = _split_model(18)
    with pytest.raises(Exception, match="num_outputs"):
        _ort(model, {"x": np.arange(4)})
    assert onnx_repairs.set_split_num_outputs(model) == 1
    assert helper.get_attribute_value(model.graph.node[0].attribute[-1]) == 2
    a, b = _ort(model, {"x": np.arange(4)})
    assert a.tolist() == [0, 1] and b.tolist() == [2, 3]
    assert [o.tolist() for o in _tvm(model, {"x": np.arange(4)})] == [[0, 1], [2, 3]]
    assert onnx_repairs.set_split_num_outputs(model) == 0  # already there


@pytest.mark.parametrize("opset,with_sizes", [(13, False), (18, True)])
def test_split_that_needs_no_num_outputs_is_left_alone(opset, with_sizes):
    model = _split_model(opset, with_sizes)
    assert onnx_repairs.set_split_num_outputs(model) == 0


# ------------------------------------------------------------------------------ Pad
def _padded_to_8x8(data_dependent=False):
    """Pad x (1, 3, H, W) at the end to 8 x 8, with pads computed from its shape at run time
    (or, with ``data_dependent``, from the number of its nonzero values)."""
    inits = [_const("zeros4", [0, 0, 0, 0]), _const("zeros2", [0, 0]), _const("eight", [8, 8]),
             _const("s2", [2]), _const("s4", [4])]
    nodes = [helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Slice", ["shape", "s2", "s4"], ["hw"])]
    if data_dependent:
        nodes += [helper.make_node("NonZero", ["x"], ["nonzero"]),
                  helper.make_node("Shape", ["nonzero"], ["nz_shape"]),
                  helper.make_node("Slice", ["nz_shape", "s2", "s4"], ["unused"]),
                  helper.make_node("Add", ["hw", "unused"], ["hw_plus"])]
        hw = "hw_plus"
    else:
        hw = "hw"
    nodes += [helper.make_node("Sub", ["eight", hw], ["after"]),
              helper.make_node("Concat", ["zeros4", "zeros2", "after"], ["pads"], axis=0),
              helper.make_node("Pad", ["x", "pads"], ["y"], name="pad")]
    return _model(nodes, [_tensor("x", [1, 3, 4, 5])], [_tensor("y", None)], inits)


def test_runtime_pads_are_folded_at_the_input_shape():
    model = _padded_to_8x8()
    x = np.random.default_rng(2).normal(size=(1, 3, 4, 5)).astype(np.float32)
    expected = _ort(model, {"x": x})[0]
    assert expected.shape == (1, 3, 8, 8)
    with pytest.raises(Exception):  # noqa: B017 - whichever TVM raises: the repair is needed
        _tvm(copy.deepcopy(model), {"x": x})
    assert onnx_repairs.fold_runtime_pads(model, {"x": [1, 3, 4, 5]}) == 1
    assert [n.op_type for n in model.graph.node] == ["Pad"]  # the shape arithmetic is gone
    np.testing.assert_array_equal(_tvm(model, {"x": x})[0], expected)


def test_pad_of_a_shape_is_folded_whole():
    inits = [_const("pads", [0, 2]), _const("fill", 1)]
    nodes = [helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Pad", ["shape", "pads", "fill"], ["padded"]),
             helper.make_node("Reshape", ["x", "padded"], ["y"])]
    model = _model(nodes, [_tensor("x", [2, 3])], [_tensor("y", None)], inits)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert onnx_repairs.fold_runtime_pads(model, {"x": [2, 3]}) == 1
    assert [n.op_type for n in model.graph.node] == ["Reshape"]
    assert numpy_helper.to_array(model.graph.initializer[-1]).tolist() == [2, 3, 1, 1]
    assert _tvm(model, {"x": x})[0].shape == (2, 3, 1, 1)


def test_data_dependent_pads_and_constant_pads_are_left_alone():
    model = _padded_to_8x8(data_dependent=True)
    assert not onnx_repairs.shape_derived(model, "pads")
    assert onnx_repairs.fold_runtime_pads(model, {"x": [1, 3, 4, 5]}) == 0
    constant = _model([helper.make_node("Pad", ["x", "pads"], ["y"])], [_tensor("x", [2])],
                      [_tensor("y", [4])], [_const("pads", [1, 1])])
    assert onnx_repairs.fold_runtime_pads(constant, {"x": [2]}) == 0


def test_folding_needs_the_input_shape():
    with pytest.raises(ValueError, match="input shapes needed for x"):
        onnx_repairs.fold_runtime_pads(_padded_to_8x8(), {})


# ------------------------------------------------------------------------------ box_nms
def _box_nms_model(boxes=6):
    """MXNet's box_nms as its ONNX exporter writes it, for a (1, boxes, 6) table of
    [class id, score, x1, y1, x2, y2] rows."""
    inits = [_const("cs", [2]), _const("ce", [6]), _const("ax", [-1]), _const("si", [1]),
             _const("se", [2]), _const("sshape", [0, 1, -1]), _const("topk", [4]),
             _const("iou", [0.45], np.float32), _const("thr", [0.01], np.float32),
             _const("z", [0]), _const("three", [3]), _const("two", [2]), _const("one", [1]),
             _const("pad", [0, 0, 1, 0]), _const("fill", -1.0, np.float32), _const("z_s", 0),
             _const("one_s", 1), _const("bn", [1, boxes]), _const("k", [boxes])]
    nodes = [
        helper.make_node("Slice", ["data", "cs", "ce", "ax"], ["boxes"]),
        helper.make_node("Slice", ["data", "si", "se", "ax"], ["scores_raw"]),
        helper.make_node("Reshape", ["scores_raw", "sshape"], ["scores"]),
        helper.make_node("NonMaxSuppression", ["boxes", "scores", "topk", "iou", "thr"],
                         ["nms"]),
        helper.make_node("Slice", ["nms", "z", "three", "ax", "two"], ["sliced"]),
        helper.make_node("GatherND", ["data", "sliced"], ["candidates"]),
        helper.make_node("Pad", ["candidates", "pad", "fill"], ["padded"]),
        helper.make_node("Shape", ["nms"], ["nms_shape"]),
        helper.make_node("Slice", ["nms_shape", "z", "one"], ["count"]),
        helper.make_node("Squeeze", ["count", "z"], ["count_scalar"]),
        helper.make_node("Range", ["z_s", "count_scalar", "one_s"], ["ranks"]),
        helper.make_node("Expand", ["count", "bn"], ["base"]),
        helper.make_node("ScatterND", ["base", "sliced", "ranks"], ["ranked"]),
        helper.make_node("TopK", ["ranked", "k"], ["sorted", "unused"], axis=-1, largest=0,
                         sorted=1),
        helper.make_node("Gather", ["padded", "sorted"], ["table"], name="gather"),
    ]
    return _model(nodes, [_tensor("data", [1, boxes, 6])], [_tensor("table", [1, boxes, 6])],
                  inits)


BOX_TABLE = np.array([[[0, 0.9, 0, 0, 10, 10], [0, 0.8, 1, 1, 10, 10], [0, 0.7, 20, 20, 30, 30],
                       [0, 0.6, 21, 21, 30, 31], [0, 0.5, 50, 50, 60, 60],
                       [0, 0.005, 70, 70, 80, 80]]], np.float32)


@pytest.mark.parametrize("rows", [BOX_TABLE, BOX_TABLE[:, [4, 2, 0, 1, 3, 5]],
                                  BOX_TABLE * np.array([1, 0, 1, 1, 1, 1], np.float32)],
                         ids=["sorted", "shuffled", "none-selected"])
def test_box_nms_table_built_with_static_shapes(rows):
    model = _box_nms_model()
    expected = _ort(model, {"data": rows})[0]
    with pytest.raises(Exception):  # noqa: B017 - the importer's bound shape meets the real one
        _tvm(copy.deepcopy(model), {"data": rows})
    assert onnx_repairs.static_nms_gather(model) == 1
    ops = [n.op_type for n in model.graph.node]
    assert "Pad" not in ops and "GatherND" not in ops and "Range" not in ops
    np.testing.assert_array_equal(_ort(model, {"data": rows})[0], expected)
    np.testing.assert_array_equal(_tvm(model, {"data": rows})[0], expected)


def test_box_nms_table_keeps_the_nms_order():
    expected = BOX_TABLE[0][[0, 2, 4]]  # boxes 1 and 3 overlap 0 and 2; box 5 scores 0.005
    model = _box_nms_model()
    onnx_repairs.static_nms_gather(model)
    table = _tvm(model, {"data": BOX_TABLE})[0][0]
    np.testing.assert_array_equal(table[:3], expected)
    assert (table[3:] == -1).all()


def test_a_gather_that_is_not_box_nms_is_left_alone():
    nodes = [helper.make_node("Gather", ["x", "i"], ["y"])]
    model = _model(nodes, [_tensor("x", [3])], [_tensor("y", [2])], [_const("i", [0, 2])])
    assert onnx_repairs.static_nms_gather(model) == 0


def test_nms_inputs_become_outputs_of_the_converted_module(dtype):
    from relay_amp.eval.models import expose_nms_inputs

    model = _box_nms_model()
    onnx_repairs.static_nms_gather(model)
    model.graph.node.append(helper.make_node("Neg", ["data"], ["negated"]))
    model.graph.output.append(_tensor("negated", [1, 6, 6]))  # a tuple of results
    mod = from_onnx(model, shape_dict={"data": [1, 6, 6]})
    converted, _ = relay_amp.convert(mod, dtype, target={"kind": "cuda", "arch": "sm_90"})
    for module in (mod, converted, relax.transform.Normalize()(relax.transform.ToNonDataflow()(
            mod))):
        exposed, count = expose_nms_inputs(module)
        assert count == 2
        relax.analysis.well_formed(exposed)
        table, negated, boxes, scores = execution.run(relay_amp.compile_module(exposed),
                                                      [BOX_TABLE])
        np.testing.assert_array_equal(negated, -BOX_TABLE)
        np.testing.assert_array_equal(boxes, BOX_TABLE[:, :, 2:])  # every anchor, in order
        np.testing.assert_array_equal(scores.reshape(-1), BOX_TABLE[0, :, 1])
        np.testing.assert_array_equal(table[0, :3], BOX_TABLE[0][[0, 2, 4]])
    plain = from_onnx(_model([helper.make_node("Relu", ["x"], ["y"])], [_tensor("x", [2])],
                             [_tensor("y", [2])]), shape_dict={"x": [2]})
    assert expose_nms_inputs(plain) == (plain, 0)


# ------------------------------------------------------------------------------ all of them
def test_repair_reports_what_it_changed():
    model = _box_nms_model()
    model.graph.node.append(helper.make_node("LpNormalization", ["table"], ["normed"], axis=-1))
    model.graph.output[0].CopyFrom(_tensor("normed", None))
    notes = onnx_repairs.repair(model, {"data": [1, 6, 6]})
    assert notes == ["ONNX repair: LpNormalization decomposed (1 node)",
                     "ONNX repair: NMS box table gathered with static shapes (1 node)"]
    assert onnx_repairs.repair(model, {"data": [1, 6, 6]}) == []  # idempotent


# ------------------------------------------------------------------------------ MXNet export
def _pyramid_block():
    mx = pytest.importorskip("mxnet")

    class Pyramid(mx.gluon.HybridBlock):
        def hybrid_forward(self, F, x):
            pooled = [F.contrib.AdaptiveAvgPooling2D(x, output_size=size) for size in (1, 2, 3)]
            return F.concat(*[F.flatten(p) for p in pooled], dim=1)

    return mx, Pyramid()


def test_adaptive_pooling_exports_as_average_pool(tmp_path):
    from relay_amp.eval import models

    mx, block = _pyramid_block()
    x = np.random.default_rng(3).normal(size=(1, 2, 6, 6)).astype(np.float32)
    expected = block(mx.nd.array(x)).asnumpy()
    path = models.gluon_to_onnx(block, x, str(tmp_path), "pyramid")
    model = onnx.load(path)
    pools = [n for n in model.graph.node if n.op_type == "AveragePool"]
    assert sorted(helper.get_attribute_value(n.attribute[0]) for n in pools) == [[2, 2], [3, 3]]
    assert "GlobalAveragePool" in [n.op_type for n in model.graph.node]  # output 1 as before
    np.testing.assert_allclose(_ort(model, {model.graph.input[0].name: x})[0], expected,
                               rtol=1e-5, atol=1e-6)
    initializers = {i.name for i in model.graph.initializer}
    feeds = {[i.name for i in model.graph.input if i.name not in initializers][0]: x}
    np.testing.assert_allclose(_tvm(model, feeds)[0], expected, rtol=1e-5, atol=1e-6)


def test_adaptive_pooling_of_a_size_it_does_not_divide_is_an_error(tmp_path):
    from relay_amp.eval import models

    _, block = _pyramid_block()
    x = np.zeros((1, 2, 7, 7), np.float32)
    with pytest.raises(NotImplementedError, match="input 7x7 is not a multiple of the output 2x2"):
        models.gluon_to_onnx(block, x, str(tmp_path), "pyramid")


@pytest.mark.parametrize("ops,order", [(("TopK", "Cast", "Mul"), [1, 0, 2]),
                                       (("Slice", "Slice", "Slice"), [0, 1, 2])],
                         ids=["centernet", "ssd-yolo"])
def test_detection_output_order(tmp_path, ops, order):
    from relay_amp.eval import models

    inits = [_const("k", [2]), _const("s0", [0]), _const("s1", [1]), _const("two", 2.0, np.float32)]
    makers = {"TopK": lambda out: helper.make_node("TopK", ["x", "k"], [out, out + "_i"]),
              "Cast": lambda out: helper.make_node("Cast", ["x"], [out], to=TensorProto.FLOAT),
              "Mul": lambda out: helper.make_node("Mul", ["x", "two"], [out]),
              "Slice": lambda out: helper.make_node("Slice", ["x", "s0", "s1"], [out])}
    nodes = [makers[op](f"out{i}") for i, op in enumerate(ops)]
    model = _model(nodes, [_tensor("x", [1, 4])], [_tensor(f"out{i}", None) for i in range(3)],
                   inits)
    path = str(tmp_path / "detector.onnx")
    onnx.save(model, path)
    assert models.detection_output_order(path) == order
