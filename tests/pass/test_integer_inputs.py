"""Integer inputs straight in: uint8/int8 data, folded normalization, and QDQ graphs."""

import numpy as np
import pytest
import tvm
import tvm_ffi
from cases import QDQ, Conv, DataBatchNorm
from helpers import IMAGENET_UINT8, convert_checked, host_normalize, run_module
from tvm.script import ir as I
from tvm.script import relax as R

import relay_amp
from relay_amp import execution


def test_uint8_input_is_cast_once_straight_to_the_compute_dtype(dtype):
    @I.ir_module
    class Expected:
        @R.function
        def main(data: R.Tensor((1, 3, 16, 16), "uint8"), w: R.Tensor((8, 3, 3, 3), "float32")):
            with R.dataflow():  # the cast is in the dataflow block, where FuseOps can fuse it
                data1 = R.astype(data, dtype)
                w1 = R.astype(w, dtype)
                lv = R.nn.conv2d(data1, w1, padding=[1, 1], out_dtype="float32")
                lv1 = R.nn.relu(lv)
                gv = R.mean(lv1, axis=[2, 3])
                R.output(gv)
            return gv

    new, report = convert_checked(Conv, dtype, input_dtypes={"data": "uint8"})
    tvm.ir.assert_structural_equal(new, Expected)
    assert report.notes == [f"data: fed as uint8, cast once to {dtype}"]


def test_normalization_is_folded_into_the_one_cast(dtype):
    new, report = convert_checked(Conv, dtype, input_dtypes={"data": "uint8"},
                                  input_normalization={"data": IMAGENET_UINT8})
    prologue = new["main"].body.blocks[0].bindings  # the first binding of the dataflow block
    call = prologue[0].value
    assert call.op.name == "relax.call_tir"
    data, scale, offset = call.args[1].fields
    assert str(data.ty.dtype) == "uint8" and str(prologue[0].var.ty.dtype) == dtype
    assert scale.value.numpy().reshape(-1) == pytest.approx(1 / np.array(IMAGENET_UINT8["std"]))
    assert offset.value.numpy().reshape(-1) == pytest.approx(
        -np.array(IMAGENET_UINT8["mean"]) / np.array(IMAGENET_UINT8["std"]))
    assert "(x - mean) / std per channel folded in" in report.notes[0]


def _float32_tensors(mod):
    found = []

    def visit(expr):
        ty = getattr(expr, "ty", None)
        if isinstance(ty, tvm.relax.TensorType) and str(ty.dtype) == "float32":
            found.append(expr)

    tvm.relax.analysis.post_order_visit(mod["main"], visit)
    return found


def test_no_float32_copy_of_the_input_exists():
    new, _ = relay_amp.convert(Conv, "float16", input_dtypes={"data": "uint8"},
                               input_normalization={"data": IMAGENET_UINT8})
    shapes = {tuple(int(d) for d in e.ty.shape.values) for e in _float32_tensors(new)
              if e.ty.shape is not None}
    assert (1, 3, 16, 16) not in shapes


def test_input_read_only_in_float32_is_cast_to_float32(dtype):
    """With CUDA defaults the decomposed batch_norm computes float32 in the input's kernel:
    the input kernel writes float32, so the input is rounded once (after the batch_norm), as
    float32 pixels would be; without a target the batch_norm reads the low-precision input."""
    cuda = {"kind": "cuda", "arch": "sm_90"}
    options = {"input_dtypes": {"data": "uint8"}, "input_normalization": {"data": IMAGENET_UINT8}}
    new, report = convert_checked(DataBatchNorm, dtype, target=cuda, **options)
    cast = new["main"].body.blocks[0].bindings[0]
    assert str(cast.var.ty.dtype) == "float32"
    assert report.notes[-1].endswith(
        f"; float32, not {dtype}: every reader computes float32 (one rounding)")
    untargeted, _ = convert_checked(DataBatchNorm, dtype, **options)
    assert str(untargeted["main"].body.blocks[0].bindings[0].var.ty.dtype) == dtype

    rng = np.random.default_rng(0)
    batch = rng.integers(0, 256, (1, 3, 16, 16)).astype("uint8")
    inputs = [rng.normal(0, 0.3, (8, 3, 3, 3)).astype("float32"),
              rng.normal(0, 0.5, 3).astype("float32"), rng.uniform(0.5, 2, 3).astype("float32")]
    reference = execution.run(relay_amp.compile_module(DataBatchNorm),
                              [host_normalize(batch), *inputs])
    error = execution.agreement(reference, execution.run(relay_amp.compile_module(new),
                                                         [batch, *inputs])).relative_l2
    twice = execution.agreement(reference, execution.run(relay_amp.compile_module(untargeted),
                                                         [batch, *inputs])).relative_l2
    assert error < {"float16": 1e-3, "bfloat16": 1e-2}[dtype]
    assert error <= twice


def test_qdq_identity_requantize_and_dequantize_to_float16():
    @I.ir_module
    class Expected:
        @R.function
        def main(x: R.Tensor((1, 4, 8, 8), "int8"), w: R.Tensor((4, 4, 3, 3), "float32")):
            with R.dataflow():
                q = x
                d = R.dequantize(q, R.const(0.05, "float32"), R.const(0, "int8"), axis=1,
                                 out_dtype="float16")
                w1 = R.astype(w, "float16")
                c = R.nn.conv2d(d, w1, padding=[1, 1], out_dtype="float32")
                q2 = R.quantize(c, R.const(0.1, "float32"), R.const(0, "int8"), axis=1,
                                out_dtype="int8")
                d2 = R.dequantize(q2, R.const(0.1, "float32"), R.const(0, "int8"), axis=1,
                                  out_dtype="float32")
                q3 = q2
                d3 = R.dequantize(q3, R.const(0.1, "float32"), R.const(0, "int8"), axis=1,
                                  out_dtype="float16")
                q4 = R.quantize(d3, R.const(0.3, "float32"), R.const(0, "int8"), axis=1,
                                out_dtype="int8")
                gv = R.dequantize(q4, R.const(0.3, "float32"), R.const(0, "int8"), axis=1,
                                  out_dtype="float32")
                R.output(gv)
            return gv

    new, report = convert_checked(QDQ, "float16", input_dtypes={"x": "int8"})
    tvm.ir.assert_structural_equal(new, Expected)
    assert report.find("q").reason("identity_input").values == {"input": "x", "dtype": "int8"}
    assert report.find("q3").code == "identity_requantize"
    assert report.find("d").reason("dequantize_low").values == {"dtype": "float16"}
    assert report.find("q4").input_dtypes[0] == "float16"  # requantize without float32


def test_qdq_numerics_match_float32():
    rng = np.random.default_rng(1)
    x = rng.uniform(-3, 3, (1, 4, 8, 8)).astype("float32")
    w = rng.normal(0, 0.3, (4, 4, 3, 3)).astype("float32")
    reference = run_module(QDQ, [x, w])
    new, _ = relay_amp.convert(QDQ, "float16")
    outputs = run_module(new, [x, w])
    # a few values may land on the other side of a quantization step: compare in steps of 0.3
    steps = np.abs(reference[0] - outputs[0]) / 0.3
    assert steps.max() <= 1.0 + 1e-5 and np.mean(steps > 0.5) < 0.05
    quantized = np.clip(np.round(x / 0.05), -128, 127).astype("int8")
    identity, _ = relay_amp.convert(QDQ, "float16", input_dtypes={"x": "int8"})
    assert np.array_equal(run_module(identity, [quantized, w])[0], outputs[0])


def test_qdq_resnet_block_from_onnx(tmp_path):
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from tvm.relax.frontend.onnx import from_onnx

    rng = np.random.default_rng(2)
    c = 8
    inits = []

    def const(name, value):
        inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    nodes = []
    scale = const("s", np.float32(0.05))
    zero = const("z", np.int8(0))

    def qdq(src, dst):
        nodes.append(helper.make_node("QuantizeLinear", [src, scale, zero], [dst + "_q"]))
        nodes.append(helper.make_node("DequantizeLinear", [dst + "_q", scale, zero], [dst]))

    for i in (1, 2):
        weight_q = rng.integers(-20, 20, (c, c, 3, 3)).astype(np.int8)
        const(f"w{i}_q", weight_q)
        const(f"w{i}_s", np.float32(0.01))
        nodes.append(helper.make_node("DequantizeLinear", [f"w{i}_q", f"w{i}_s", zero], [f"w{i}"]))
    qdq("x", "xd")
    nodes.append(helper.make_node("Conv", ["xd", "w1"], ["c1"], pads=[1, 1, 1, 1]))
    nodes.append(helper.make_node("Relu", ["c1"], ["r1"]))
    qdq("r1", "r1d")
    nodes.append(helper.make_node("Conv", ["r1d", "w2"], ["c2"], pads=[1, 1, 1, 1]))
    nodes.append(helper.make_node("Add", ["c2", "xd"], ["sum"]))
    nodes.append(helper.make_node("Relu", ["sum"], ["y"]))
    graph = helper.make_graph(nodes, "qdq_block",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, 8, 8])],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(model)
    mod = from_onnx(model)
    x = rng.uniform(-2, 2, (1, c, 8, 8)).astype("float32")
    reference = run_module(mod, [x])
    new, report = convert_checked(mod, "float16")
    dequantize_rows = [r for r in report.rows if r.op == "dequantize"]
    assert any(r.output_dtype == "float16" for r in dequantize_rows)
    assert all(r.compute_dtype == "float16" for r in report.rows if r.op == "nn.conv2d")
    agreement = execution.agreement(reference, run_module(new, [x]))
    assert agreement.nonfinite == 0 and agreement.relative_l2 < 1e-2, agreement


def test_bfloat16_keeps_qdq_in_float32():
    _, report = relay_amp.convert(QDQ, "bfloat16")
    assert report.find("d").compute_dtype == "float32"
    assert "dequantize produces only float16/float32" in report.find("d").reason(
        "tvm_limitation").values["limitation"]


# ----------------------------------------------------------------------------- bad input
def test_bad_integer_input_declarations_are_clear_errors():
    before = tvm_ffi.structural_hash(Conv)
    with pytest.raises(ValueError, match="'float16' is a float dtype"):
        relay_amp.convert(Conv, "float16", input_dtypes={"data": "float16"})
    with pytest.raises(ValueError, match=r"input_dtypes names \['image'\], which are not "):
        relay_amp.convert(Conv, "float16", input_dtypes={"image": "uint8"})
    with pytest.raises(ValueError, match="has 4 values, but axis 1 of data has 3 channels"):
        relay_amp.convert(Conv, "float16", input_dtypes={"data": "uint8"},
                          input_normalization={"data": {"mean": [1, 2, 3, 4], "std": [1, 1, 1, 1]}})
    with pytest.raises(ValueError, match="mean has 2 values and std 3"):
        relay_amp.Policy(input_dtypes={"data": "uint8"},
                         input_normalization={"data": {"mean": [1, 2], "std": [1, 1, 1]}})
    with pytest.raises(ValueError, match="not in input_dtypes"):
        relay_amp.Policy(input_normalization={"data": {"scale": 0.1}})
    with pytest.raises(ValueError, match="declared uint8 in input_dtypes, but the quantize that "
                                         "reads it produces int8"):
        relay_amp.convert(QDQ, "float16", input_dtypes={"x": "uint8"})
    assert tvm_ffi.structural_hash(Conv) == before
