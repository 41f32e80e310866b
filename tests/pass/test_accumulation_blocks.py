"""Dot products summed in blocks (``Policy.set_accumulation_block``): the Relax form the rewrite
emits, the calls it refuses with a reason, and the numbers, for float16 and bfloat16."""

import json

import numpy as np
import pytest
import tvm
from helpers import convert_checked, random_inputs, run_module
from tvm.script import ir as I
from tvm.script import relax as R

import relay_amp
from relay_amp import Policy


def _policy(dtype, block, *ops):
    policy = Policy(dtype)
    for op in ops or ("matmul", "nn.conv2d"):
        policy.set_accumulation_block(op, block)
    return policy


def test_a_matmul_sums_blocks_of_its_reduction_in_the_low_dtype(dtype):
    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((2, 5, 64), "float32"), w: R.Tensor((64, 8), "float32")):
            with R.dataflow():
                gv = R.matmul(x, w)
                R.output(gv)
            return gv

    @I.ir_module
    class Expected:
        @R.function
        def main(x: R.Tensor((2, 5, 64), "float32"), w: R.Tensor((64, 8), "float32")):
            with R.dataflow():
                lv = R.astype(x, dtype)
                lv1 = R.astype(w, dtype)
                lv2 = R.reshape(lv, R.shape([2, 5, 4, 16]))
                lv3 = R.permute_dims(lv2, axes=[0, 2, 1, 3])
                lv4 = R.reshape(lv1, R.shape([4, 16, 8]))
                lv5 = R.matmul(lv3, lv4, out_dtype=dtype)
                lv6 = R.astype(lv5, "float32")
                gv = R.sum(lv6, axis=[-3])
                R.output(gv)
            return gv

    new, report = convert_checked(Before, dtype, policy=_policy(dtype, 16))
    tvm.ir.assert_structural_equal(new, Expected)
    row = report.find("gv")
    assert (row.compute_dtype, row.accumulation_dtype) == (dtype, "float32")
    assert row.reasons[-1] == relay_amp.reasons.Reason.of(
        "blocked_accumulation", dtype=dtype, block=16, blocks=4)


def test_a_convolution_sums_runs_of_input_channels_as_groups(dtype):
    """32 input channels, a 3x3 window, blocks of 32: runs of 2 channels (18 products), one
    grouped convolution of 16 groups into the low dtype, the 16 partial outputs summed."""

    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((1, 32, 8, 8), "float32"), w: R.Tensor((4, 32, 3, 3), "float32")):
            with R.dataflow():
                gv = R.nn.conv2d(x, w, padding=[1, 1, 1, 1])
                R.output(gv)
            return gv

    @I.ir_module
    class Expected:
        @R.function
        def main(x: R.Tensor((1, 32, 8, 8), "float32"), w: R.Tensor((4, 32, 3, 3), "float32")):
            with R.dataflow():
                lv = R.astype(x, dtype)
                lv1 = R.astype(w, dtype)
                lv2 = R.reshape(lv1, R.shape([1, 4, 16, 2, 3, 3]))
                lv3 = R.permute_dims(lv2, axes=[0, 2, 1, 3, 4, 5])
                lv4 = R.reshape(lv3, R.shape([64, 2, 3, 3]))
                lv5 = R.nn.conv2d(lv, lv4, padding=[1, 1, 1, 1], groups=16, out_layout="NCHW",
                                  out_dtype=dtype)
                lv6 = R.reshape(lv5, R.shape([1, 1, 16, 4, 8, 8]))
                lv7 = R.astype(lv6, "float32")
                lv8 = R.sum(lv7, axis=[2])
                gv = R.reshape(lv8, R.shape([1, 4, 8, 8]))
                R.output(gv)
            return gv

    new, report = convert_checked(Before, dtype, policy=_policy(dtype, 32))
    tvm.ir.assert_structural_equal(new, Expected)
    assert report.find("gv").reasons[-1].values == {"dtype": dtype, "block": 18, "blocks": 16}


def test_a_reduction_within_one_block_is_summed_in_the_low_dtype_and_widened(dtype):
    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((1, 8, 6, 6), "float32"), w: R.Tensor((8, 1, 3, 3), "float32")):
            with R.dataflow():
                gv = R.nn.conv2d(x, w, groups=8)
                R.output(gv)
            return gv

    @I.ir_module
    class Expected:
        @R.function
        def main(x: R.Tensor((1, 8, 6, 6), "float32"), w: R.Tensor((8, 1, 3, 3), "float32")):
            with R.dataflow():
                lv = R.astype(x, dtype)
                lv1 = R.astype(w, dtype)
                lv2 = R.nn.conv2d(lv, lv1, groups=8, out_dtype=dtype)
                gv = R.astype(lv2, "float32")
                R.output(gv)
            return gv

    new, report = convert_checked(Before, dtype, policy=_policy(dtype, 16))
    tvm.ir.assert_structural_equal(new, Expected)
    assert report.find("gv").reasons[-1].values == {"dtype": dtype, "block": 9, "blocks": 1}


@pytest.mark.parametrize("shape, weight, block, why", [
    ((1, 8, 6, 6), (4, 8, 5, 5), 16, "its window of 25 products is larger than the block"),
    ((1, 6, 40), None, 16, "its reduction of 40 is no multiple of the block"),
])
def test_calls_that_do_not_split_keep_float32_accumulation_with_the_reason(dtype, shape, weight,
                                                                           block, why):
    import tvm.relax as relax

    builder = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    w = relax.Var("w", relax.TensorType(weight or (shape[-1], 8), "float32"))
    with builder.function("main", [x, w]):
        with builder.dataflow():
            call = relax.op.nn.conv2d(x, w) if weight else relax.op.matmul(x, w)
            gv = builder.emit_output(call, "gv")
        builder.emit_func_output(gv)
    new, report = convert_checked(builder.get(), dtype, policy=_policy(dtype, block))
    row = report.find("gv")
    assert row.reasons[-1] == relay_amp.reasons.Reason.of(
        "blocked_accumulation_refused", block=block, why=why)
    (binding,) = [b for b in new["main"].body.blocks[0].bindings if b.var.name == "gv"]
    assert str(binding.value.attrs.out_dtype) == "float32"  # the plain float32 accumulation
    assert "blocks of 16 asked, not made" in report.find("gv").rule


def test_an_op_without_a_blocked_form_says_so(dtype):
    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((1, 4, 8), "float32"), w: R.Tensor((4, 2, 3), "float32")):
            with R.dataflow():
                gv = R.nn.conv1d_transpose(x, w)
                R.output(gv)
            return gv

    _, report = convert_checked(Before, dtype, policy=_policy(dtype, 8, "nn.conv1d_transpose"))
    assert report.find("gv").reasons[-1].values["why"] == "nn.conv1d_transpose has no blocked form"


@pytest.mark.parametrize("block", [4, 8, 16, 32])
def test_blocks_compute_what_a_float_model_of_them_computes(dtype, block):
    """The built module against numpy summing the same low-precision operands block by block
    (each block's sum rounded to the low dtype, the blocks added in float32)."""
    import ml_dtypes

    @I.ir_module
    class Net:
        @R.function
        def main(x: R.Tensor((3, 96), "float32"), w: R.Tensor((96, 5), "float32")):
            with R.dataflow():
                gv = R.matmul(x, w)
                R.output(gv)
            return gv

    low = np.float16 if dtype == "float16" else ml_dtypes.bfloat16
    new, _ = convert_checked(Net, dtype, policy=_policy(dtype, block))
    x, w = random_inputs(Net, seed=block)
    (got,) = run_module(new, [x, w])
    a, b = x.astype(low).astype(np.float64), w.astype(low).astype(np.float64)
    want = np.zeros((3, 5))
    for start in range(0, 96, block):
        part = a[:, start:start + block] @ b[start:start + block]
        want += part.astype(low).astype(np.float64)
    scale = np.abs(a) @ np.abs(b)
    # each block's sum rounds once in the model; the build may round each partial sum
    unit = 2.0 ** (-8 if dtype == "bfloat16" else -11)
    assert np.all(np.abs(got - want) <= block * unit * scale + 1e-6)
    (plain,) = run_module(relay_amp.convert(Net, dtype)[0], [x, w])
    assert not np.array_equal(got, plain)


def test_the_policy_round_trips_and_the_later_setting_wins():
    policy = Policy().set_accumulation_block("matmul", 16)
    again = Policy.from_json(policy.to_json())
    assert again == policy and json.loads(policy.to_json())["accumulation_blocks"] == {
        "matmul": 16}
    assert policy.decide("matmul", "lv", None).accumulation_block == 16
    (line,) = [line for line in policy.describe().splitlines() if line.split()[:1] == ["matmul"]]
    assert "(accumulate float32, blocks of 16 in float16)" in line
    policy.set_accumulation_dtype("matmul", "float16")
    assert policy.decide("matmul", "lv", None).accumulation_block is None
    with pytest.raises(ValueError, match="must be a positive int"):
        Policy().set_accumulation_block("matmul", 0)


@pytest.mark.parametrize("data_layout, kernel_layout", [("NHWC", "HWIO"), ("NHWC", "OHWI")])
def test_other_layouts_sum_the_same_blocks(dtype, data_layout, kernel_layout):
    """TFLite's layouts: the runs of channels are taken on the kernel's I axis and the partial
    outputs on the output's C axis, so the blocks are NCHW's (the same outputs to the rounding
    of a block's sum in its own order)."""
    import tvm.relax as relax

    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 32, 6, 6)).astype("float32")
    w = (rng.standard_normal((8, 32, 3, 3)) / 16).astype("float32")

    def conv(layout, kernel):
        data = relax.Var("x", relax.TensorType(
            [dict(zip("NCHW", x.shape))[a] for a in layout], "float32"))
        weight = relax.const(np.transpose(w, ["OIHW".index(a) for a in kernel]))
        builder = relax.BlockBuilder()
        with builder.function("main", [data]):
            with builder.dataflow():
                gv = builder.emit_output(relax.op.nn.conv2d(
                    data, weight, padding=[1, 1], data_layout=layout, kernel_layout=kernel), "gv")
            builder.emit_func_output(gv)
        new, report = convert_checked(builder.get(), dtype, policy=_policy(dtype, 16))
        assert report.find("gv").reasons[-1].values == {"dtype": dtype, "block": 9,
                                                         "blocks": 32}
        (out,) = run_module(new, [np.transpose(x, ["NCHW".index(a) for a in layout])])
        return np.transpose(out, [layout.index(a) for a in "NCHW"])

    nchw, other = conv("NCHW", "OIHW"), conv(data_layout, kernel_layout)
    unit = 2.0 ** (-8 if dtype == "bfloat16" else -11)
    assert np.abs(other - nchw).max() <= 16 * unit * np.abs(nchw).max()
