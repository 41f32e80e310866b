"""Before/Expected structural tests of the rewrite, for float16 and bfloat16."""

import numpy as np
import pytest
import tvm
from helpers import builtin_convert, convert_checked
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

import relay_amp


def check(before, expected, dtype, **kwargs):
    new, report = convert_checked(before, dtype, **kwargs)
    tvm.ir.assert_structural_equal(new, expected)
    return report


def test_single_conv2d(dtype):
    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((1, 3, 8, 8), "float32"), w: R.Tensor((4, 3, 3, 3), "float32")):
            with R.dataflow():
                gv = R.nn.conv2d(x, w)
                R.output(gv)
            return gv

    @I.ir_module
    class Expected:
        @R.function
        def main(x: R.Tensor((1, 3, 8, 8), "float32"), w: R.Tensor((4, 3, 3, 3), "float32")):
            with R.dataflow():
                lv = R.astype(x, dtype)
                lv1 = R.astype(w, dtype)
                gv = R.nn.conv2d(lv, lv1, out_dtype="float32")
                R.output(gv)
            return gv

    report = check(Before, Expected, dtype)
    row = report.find("gv")
    assert (row.compute_dtype, row.accumulation_dtype, row.output_dtype) == (
        dtype, "float32", "float32")
    assert report.casts == 2
    assert report.summary() == f"converted 1/1 ops (100.0% of MACs) to {dtype} using 2 casts"


def test_conv2d_relu_stays_float32_for_a_float32_result(dtype):
    """relu's only consumer is the float32 result: it runs on the float32 accumulator directly."""

    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((1, 3, 8, 8), "float32"), w: R.Tensor((4, 3, 3, 3), "float32")):
            with R.dataflow():
                lv = R.nn.conv2d(x, w, out_dtype="float32")
                gv = R.nn.relu(lv)
                R.output(gv)
            return gv

    @I.ir_module
    class Expected:
        @R.function
        def main(x: R.Tensor((1, 3, 8, 8), "float32"), w: R.Tensor((4, 3, 3, 3), "float32")):
            with R.dataflow():
                lv0 = R.astype(x, dtype)
                lv1 = R.astype(w, dtype)
                lv = R.nn.conv2d(lv0, lv1, out_dtype="float32")
                gv = R.nn.relu(lv)
                R.output(gv)
            return gv

    report = check(Before, Expected, dtype)
    assert {"rounds_once", "float32_wanted", "inputs_float32", "float32_activation",
            "nothing_wants_low"} & set(report.find("gv").codes)


def test_relu_between_convs_runs_low_precision(dtype):
    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((1, 4, 8, 8), "float32"), w: R.Tensor((4, 4, 3, 3), "float32")):
            with R.dataflow():
                lv = R.nn.relu(x)
                lv1 = R.nn.conv2d(lv, w, padding=[1, 1])
                lv2 = R.nn.relu(lv1)
                gv = R.nn.conv2d(lv2, w, padding=[1, 1])
                R.output(gv)
            return gv

    @I.ir_module
    class Expected:
        @R.function
        def main(x: R.Tensor((1, 4, 8, 8), "float32"), w: R.Tensor((4, 4, 3, 3), "float32")):
            with R.dataflow():
                lv = R.nn.relu(x)
                lv_1 = R.astype(lv, dtype)
                w_1 = R.astype(w, dtype)
                lv1 = R.nn.conv2d(lv_1, w_1, padding=[1, 1], out_dtype="float32")
                lv1_1 = R.astype(lv1, dtype)
                lv2 = R.nn.relu(lv1_1)
                gv = R.nn.conv2d(lv2, w_1, padding=[1, 1], out_dtype="float32")
                R.output(gv)
            return gv

    report = check(Before, Expected, dtype)
    assert report.find("lv2").compute_dtype == dtype
    # the first relu reads a function parameter: no low-precision input, so float32
    assert report.find("lv").compute_dtype == "float32"


def test_conv_batch_norm_relu(dtype):
    """batch_norm reads the float32 accumulator (no round trip); relu feeds a conv in low."""

    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((1, 4, 8, 8), "float32"), w: R.Tensor((4, 4, 3, 3), "float32"),
                 g: R.Tensor((4,), "float32")):
            with R.dataflow():
                lv = R.nn.conv2d(x, w, padding=[1, 1], out_dtype="float32")
                lv1 = R.nn.batch_norm(lv, g, g, g, g, axis=1, training=False)
                lv2 = lv1[0]
                lv3 = R.nn.relu(lv2)
                gv = R.nn.conv2d(lv3, w, padding=[1, 1], out_dtype="float32")
                R.output(gv)
            return gv

    @I.ir_module
    class Expected:
        @R.function
        def main(x: R.Tensor((1, 4, 8, 8), "float32"), w: R.Tensor((4, 4, 3, 3), "float32"),
                 g: R.Tensor((4,), "float32")):
            with R.dataflow():
                x1 = R.astype(x, dtype)
                w1 = R.astype(w, dtype)
                lv = R.nn.conv2d(x1, w1, padding=[1, 1], out_dtype="float32")
                lv1 = R.nn.batch_norm(lv, g, g, g, g, axis=1, training=False)
                lv2 = lv1[0]
                lv2_1 = R.astype(lv2, dtype)
                lv3 = R.nn.relu(lv2_1)
                gv = R.nn.conv2d(lv3, w1, padding=[1, 1], out_dtype="float32")
                R.output(gv)
            return gv

    report = check(Before, Expected, dtype)
    assert report.find("lv1").category == "accumulate"


def test_batch_norm_constants_stay_float32_and_the_report_says_how_to_fold_them(dtype):
    scale = tvm.relax.const(np.ones(16, "float32"))

    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((1, 16, 4, 4), "float32"), w: R.Tensor((16, 16, 1, 1), "float32")):
            with R.dataflow():
                lv = R.nn.conv2d(x, w)
                lv1 = R.nn.batch_norm(lv, scale, scale, scale, scale, axis=1)
                gv = lv1[0]
                R.output(gv)
            return gv

    new, report = convert_checked(Before, dtype)
    assert any("1 batch_norm ops keep 6.4e-05 MB of float32 parameters" in note
               and "FoldBatchnormToConv2D" in note for note in report.notes)


def test_training_batch_norm_is_fp32_by_condition(dtype):
    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((2, 4, 8, 8), "float32"), g: R.Tensor((4,), "float32")):
            with R.dataflow():
                lv = R.nn.batch_norm(x, g, g, g, g, axis=1, training=True)
                gv = lv[0]
                R.output(gv)
            return gv

    _, report = convert_checked(Before, dtype)
    row = report.find("lv")
    assert row.category == "fp32" and row.code == "builtin_condition"
    assert "training" in row.reason("builtin_condition").values["condition"]


def test_conv_softmax_single_cast_no_round_trip(dtype):
    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((1, 3, 8, 8), "float32"), w: R.Tensor((4, 3, 3, 3), "float32")):
            with R.dataflow():
                lv = R.nn.conv2d(x, w, out_dtype="float32")
                gv = R.nn.softmax(lv, axis=1)
                R.output(gv)
            return gv

    @I.ir_module
    class Expected:
        @R.function
        def main(x: R.Tensor((1, 3, 8, 8), "float32"), w: R.Tensor((4, 3, 3, 3), "float32")):
            with R.dataflow():
                x1 = R.astype(x, dtype)
                w1 = R.astype(w, dtype)
                lv = R.nn.conv2d(x1, w1, out_dtype="float32")
                gv = R.nn.softmax(lv, axis=1)
                R.output(gv)
            return gv

    check(Before, Expected, dtype)


def test_builtin_pass_round_trips_where_we_do_not():
    """TVM's pass emits conv(f32) -> f16 -> f32 before softmax; relay_amp reads the f32 result."""

    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((1, 3, 8, 8), "float32"), w: R.Tensor((4, 3, 3, 3), "float32")):
            with R.dataflow():
                lv = R.nn.conv2d(x, w, out_dtype="float32")
                lv1 = R.nn.relu(lv)
                gv = R.nn.softmax(lv1, axis=1)
                R.output(gv)
            return gv

    def round_trips(mod):
        casts = {}
        found = 0
        for block in mod["main"].body.blocks:
            for binding in block.bindings:
                value = binding.value
                if (isinstance(value, tvm.ir.Call)
                        and getattr(value.op, "name", "") == "relax.astype"):
                    casts[binding.var] = value.args[0]
                    source = value.args[0]
                    if source in casts and str(casts[source].ty.dtype) == str(value.ty.dtype):
                        found += 1
        return found

    ours, _ = relay_amp.convert(Before, "float16")
    assert round_trips(ours) == 0
    assert sum(1 for b in builtin_convert(Before)["main"].body.blocks[0].bindings
               if "astype" in str(b.value)) > sum(
        1 for b in ours["main"].body.blocks[0].bindings if "astype" in str(b.value))


def test_matmul_add_param_gelu(dtype):
    """The tail feeds a float32 result: matmul hands its float32 accumulator to add and gelu."""

    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((2, 8), "float32"), w: R.Tensor((8, 16), "float32"),
                 b: R.Tensor((16,), "float32")):
            with R.dataflow():
                lv = R.matmul(x, w)
                lv1 = R.add(lv, b)
                gv = R.nn.gelu(lv1)
                R.output(gv)
            return gv

    @I.ir_module
    class Expected:
        @R.function
        def main(x: R.Tensor((2, 8), "float32"), w: R.Tensor((8, 16), "float32"),
                 b: R.Tensor((16,), "float32")):
            with R.dataflow():
                x1 = R.astype(x, dtype)
                w1 = R.astype(w, dtype)
                lv = R.matmul(x1, w1, out_dtype="float32")
                lv1 = R.add(lv, b)
                gv = R.nn.gelu(lv1)
                R.output(gv)
            return gv

    check(Before, Expected, dtype)


def test_arithmetic_after_an_accumulator_rounds_once_before_the_next_matmul(dtype):
    """add and gelu read matmul's float32 accumulator: they compute in float32 and one cast
    hands the result to the next matmul (the bias is not cast at all)."""

    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((2, 8), "float32"), w: R.Tensor((8, 8), "float32"),
                 b: R.Tensor((8,), "float32")):
            with R.dataflow():
                lv = R.matmul(x, w)
                lv1 = R.add(lv, b)
                lv2 = R.nn.gelu(lv1)
                gv = R.matmul(lv2, w)
                R.output(gv)
            return gv

    @I.ir_module
    class Expected:
        @R.function
        def main(x: R.Tensor((2, 8), "float32"), w: R.Tensor((8, 8), "float32"),
                 b: R.Tensor((8,), "float32")):
            with R.dataflow():
                x1 = R.astype(x, dtype)
                w1 = R.astype(w, dtype)
                lv = R.matmul(x1, w1, out_dtype="float32")
                lv1 = R.add(lv, b)
                lv2 = R.nn.gelu(lv1)
                lv2_1 = R.astype(lv2, dtype)
                gv = R.matmul(lv2_1, w1, out_dtype="float32")
                R.output(gv)
            return gv

    check(Before, Expected, dtype)


def test_concat_param_and_low_precision_tensor(dtype):
    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((2, 4), "float32"), w: R.Tensor((4, 4), "float32"),
                 p: R.Tensor((2, 4), "float32")):
            with R.dataflow():
                lv = R.matmul(x, w)
                lv1 = R.concat((lv, p), axis=0)
                gv = R.matmul(lv1, w)
                R.output(gv)
            return gv

    @I.ir_module
    class Expected:
        @R.function
        def main(x: R.Tensor((2, 4), "float32"), w: R.Tensor((4, 4), "float32"),
                 p: R.Tensor((2, 4), "float32")):
            with R.dataflow():
                x1 = R.astype(x, dtype)
                w1 = R.astype(w, dtype)
                lv = R.matmul(x1, w1, out_dtype="float32")
                lv_1 = R.astype(lv, dtype)
                p1 = R.astype(p, dtype)
                lv1 = R.concat((lv_1, p1), axis=0)
                gv = R.matmul(lv1, w1, out_dtype="float32")
                R.output(gv)
            return gv

    check(Before, Expected, dtype)


def test_split_and_tuple_get_item(dtype):
    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((2, 8), "float32"), w: R.Tensor((8, 8), "float32")):
            with R.dataflow():
                lv = R.matmul(x, w)
                lv1 = R.split(lv, 2, axis=1)
                lv2 = lv1[0]
                lv3 = lv1[1]
                lv4 = R.concat((lv2, lv3), axis=1)
                gv = R.matmul(lv4, w)
                R.output(gv)
            return gv

    @I.ir_module
    class Expected:
        @R.function
        def main(x: R.Tensor((2, 8), "float32"), w: R.Tensor((8, 8), "float32")):
            with R.dataflow():
                x1 = R.astype(x, dtype)
                w1 = R.astype(w, dtype)
                lv = R.matmul(x1, w1, out_dtype="float32")
                lv_1 = R.astype(lv, dtype)
                lv1 = R.split(lv_1, 2, axis=1)
                lv2 = lv1[0]
                lv3 = lv1[1]
                lv4 = R.concat((lv2, lv3), axis=1)
                gv = R.matmul(lv4, w1, out_dtype="float32")
                R.output(gv)
            return gv

    check(Before, Expected, dtype)


def test_tuple_outputs_keep_their_dtypes(dtype):
    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((2, 8), "float32"), w: R.Tensor((8, 8), "float32")):
            with R.dataflow():
                lv = R.matmul(x, w)
                lv1 = R.nn.attention(R.reshape(x, (1, 2, 1, 8)), R.reshape(x, (1, 2, 1, 8)),
                                     R.reshape(x, (1, 2, 1, 8)))
                gv = (lv, (lv1, x))
                R.output(gv)
            return gv

    new, report = convert_checked(Before, dtype)
    ret = new["main"].ret_ty
    assert str(ret.fields[0].dtype) == "float32"
    assert str(ret.fields[1].fields[0].dtype) == "float32"
    assert [r.compute_dtype for r in report.rows if r.op == "nn.attention"] == [dtype]


def test_symbolic_batch_dim(dtype):
    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor(("n", 3, 8, 8), "float32"), w: R.Tensor((4, 3, 3, 3), "float32")):
            n = T.int64()
            with R.dataflow():
                lv = R.nn.conv2d(x, w, out_dtype="float32")
                lv1 = R.nn.relu(lv)
                gv = R.nn.conv2d(lv1, R.const(np.ones((2, 4, 1, 1), "float32")),
                                 out_dtype="float32")
                R.output(gv)
            return gv

    @I.ir_module
    class Expected:
        @R.function
        def main(x: R.Tensor(("n", 3, 8, 8), "float32"), w: R.Tensor((4, 3, 3, 3), "float32")):
            n = T.int64()
            with R.dataflow():
                x1 = R.astype(x, dtype)
                w1 = R.astype(w, dtype)
                lv = R.nn.conv2d(x1, w1, out_dtype="float32")
                lv_1 = R.astype(lv, dtype)
                lv1 = R.nn.relu(lv_1)
                gv = R.nn.conv2d(lv1, R.const(_ones_low(dtype)), out_dtype="float32")
                R.output(gv)
            return gv

    check(Before, Expected, dtype)


def _ones_low(dtype):
    from relay_amp.dtypes import numpy_dtype

    return np.ones((2, 4, 1, 1), numpy_dtype(dtype))


def test_if_branches_are_converted_and_keep_their_result_dtype(dtype):
    @I.ir_module
    class Before:
        @R.function
        def main(c: R.Tensor((), "bool"), x: R.Tensor((2, 8), "float32"),
                 w: R.Tensor((8, 8), "float32")) -> R.Tensor((2, 8), "float32"):
            if c:
                lv = R.matmul(x, w)
                lv1 = R.nn.relu(lv)
                gv = R.matmul(lv1, w)
                r = gv
            else:
                r = R.nn.softmax(x)
            return r

    @I.ir_module
    class Expected:
        @R.function
        def main(c: R.Tensor((), "bool"), x: R.Tensor((2, 8), "float32"),
                 w: R.Tensor((8, 8), "float32")) -> R.Tensor((2, 8), "float32"):
            if c:
                x1 = R.astype(x, dtype)
                w1 = R.astype(w, dtype)
                lv = R.matmul(x1, w1, out_dtype="float32")
                lv_1 = R.astype(lv, dtype)
                lv1 = R.nn.relu(lv_1)
                gv = R.matmul(lv1, w1, out_dtype="float32")
                r = gv
            else:
                r = R.nn.softmax(x)
            return r

    check(Before, Expected, dtype)


def test_non_dataflow_function(dtype):
    @I.ir_module
    class Before:
        @R.function(pure=False)
        def main(x: R.Tensor((2, 8), "float32"), w: R.Tensor((8, 8), "float32")):
            lv = R.matmul(x, w)
            lv1 = R.nn.relu(lv)
            gv = R.matmul(lv1, w)
            return gv

    @I.ir_module
    class Expected:
        @R.function(pure=False)
        def main(x: R.Tensor((2, 8), "float32"), w: R.Tensor((8, 8), "float32")):
            x1 = R.astype(x, dtype)
            w1 = R.astype(w, dtype)
            lv = R.matmul(x1, w1, out_dtype="float32")
            lv_1 = R.astype(lv, dtype)
            lv1 = R.nn.relu(lv_1)
            gv = R.matmul(lv1, w1, out_dtype="float32")
            return gv

    check(Before, Expected, dtype)


def test_two_functions_and_a_call_between_them(dtype):
    @I.ir_module
    class Before:
        @R.function
        def helper(x: R.Tensor((2, 8), "float32"), w: R.Tensor((8, 8), "float32")):
            with R.dataflow():
                gv = R.matmul(x, w)
                R.output(gv)
            return gv

        @R.function
        def main(x: R.Tensor((2, 8), "float32"), w: R.Tensor((8, 8), "float32")):
            cls = Before
            with R.dataflow():
                lv = cls.helper(x, w)
                gv = R.matmul(lv, w)
                R.output(gv)
            return gv

    @I.ir_module
    class Expected:
        @R.function
        def helper(x: R.Tensor((2, 8), "float32"), w: R.Tensor((8, 8), "float32")):
            with R.dataflow():
                x1 = R.astype(x, dtype)
                w1 = R.astype(w, dtype)
                gv = R.matmul(x1, w1, out_dtype="float32")
                R.output(gv)
            return gv

        @R.function
        def main(x: R.Tensor((2, 8), "float32"), w: R.Tensor((8, 8), "float32")):
            cls = Expected
            with R.dataflow():
                lv = cls.helper(x, w)
                lv_1 = R.astype(lv, dtype)
                w1 = R.astype(w, dtype)
                gv = R.matmul(lv_1, w1, out_dtype="float32")
                R.output(gv)
            return gv

    check(Before, Expected, dtype)
    _, report = relay_amp.convert(Before, dtype, keep_io_dtypes=False)
    assert any("helper: signature kept" in note for note in report.notes)


def test_take_with_int_indices(dtype):
    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((4, 8), "float32"), w: R.Tensor((8, 8), "float32"),
                 i: R.Tensor((3,), "int64")):
            with R.dataflow():
                lv = R.matmul(x, w)
                lv1 = R.take(lv, i, axis=0)
                gv = R.matmul(lv1, w)
                R.output(gv)
            return gv

    @I.ir_module
    class Expected:
        @R.function
        def main(x: R.Tensor((4, 8), "float32"), w: R.Tensor((8, 8), "float32"),
                 i: R.Tensor((3,), "int64")):
            with R.dataflow():
                x1 = R.astype(x, dtype)
                w1 = R.astype(w, dtype)
                lv = R.matmul(x1, w1, out_dtype="float32")
                lv_1 = R.astype(lv, dtype)
                lv1 = R.take(lv_1, i, axis=0)
                gv = R.matmul(lv1, w1, out_dtype="float32")
                R.output(gv)
            return gv

    check(Before, Expected, dtype)


def test_clip_bounds_outside_float16_stay_float32():
    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((2, 8), "float32"), w: R.Tensor((8, 8), "float32")):
            with R.dataflow():
                lv = R.matmul(x, w)
                lv1 = R.clip(lv, -1e5, 1e5)
                lv2 = R.clip(lv, -6.0, 6.0)
                lv3 = R.matmul(lv1, w)
                gv = R.matmul(lv2, w)
                R.output(lv3, gv)
            return (lv3, gv)

    new, report = convert_checked(Before, "float16")
    assert report.find("lv1").compute_dtype == "float32"
    reason = report.find("lv1").reason("scalar_out_of_range")
    assert reason.values["value"] == -1e5 and reason.values["bound"] == "exceeds float16 max 65504"
    assert report.find("lv2").compute_dtype == "float16"
    # bfloat16 holds 1e5: both clips run low
    _, report_bf16 = convert_checked(Before, "bfloat16")
    assert report_bf16.find("lv1").compute_dtype == "bfloat16"


def test_out_of_range_constant_keeps_its_consumer_float32():
    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((2, 8), "float32"), w: R.Tensor((8, 8), "float32")):
            with R.dataflow():
                lv = R.matmul(x, w)
                lv1 = R.multiply(lv, R.const(7.0e4, "float32"))
                lv2 = R.add(lv, R.const(1.0, "float32"))
                gv = R.matmul(lv2, w)
                R.output(lv1, gv)
            return (lv1, gv)

    @I.ir_module
    class Expected:
        @R.function
        def main(x: R.Tensor((2, 8), "float32"), w: R.Tensor((8, 8), "float32")):
            with R.dataflow():
                x1 = R.astype(x, "float16")
                w1 = R.astype(w, "float16")
                lv = R.matmul(x1, w1, out_dtype="float32")
                lv1 = R.multiply(lv, R.const(7.0e4, "float32"))
                lv2 = R.add(lv, R.const(1.0, "float32"))
                lv2_1 = R.astype(lv2, "float16")
                gv = R.matmul(lv2_1, w1, out_dtype="float32")
                R.output(lv1, gv)
            return (lv1, gv)

    report = check(Before, Expected, "float16")
    assert report.find("lv1").rule == "fp32: constant 7e+04 exceeds float16 max 65504"


def test_constant_used_by_float32_and_low_precision_consumers_exists_once_in_each(dtype):
    weight = tvm.relax.const(np.full((8, 8), 0.5, "float32"))

    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((8, 8), "float32")):
            with R.dataflow():
                lv = R.matmul(x, weight)
                lv1 = R.matmul(lv, weight)
                gv = R.add(lv1, weight)
                R.output(gv)
            return gv

    new, report = convert_checked(Before, dtype)
    constants = {}
    for binding in new["main"].body.blocks[0].bindings:
        for arg in getattr(binding.value, "args", []):
            if isinstance(arg, type(weight)):
                constants.setdefault(str(arg.ty.dtype), []).append(arg)
    assert len(constants[dtype]) == 2 and constants[dtype][0].same_as(constants[dtype][1])
    assert [c.same_as(weight) for c in constants["float32"]] == [True]  # the add is float32
    assert report.constants_converted == 1


def test_transposed_constant_weight_is_stored_low_and_transposed_in_low_precision(dtype):
    """ONNX Gemm imports as matmul(x, permute_dims(W)): the transpose of a constant is exact in
    either dtype, so the weight is stored once, in low precision, with no run-time cast."""
    weight = tvm.relax.const(np.linspace(-1, 1, 12, dtype="float32").reshape(3, 4))

    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((2, 4), "float32")):
            with R.dataflow():
                lv = R.permute_dims(weight, [1, 0])
                gv = R.matmul(x, lv)
                R.output(gv)
            return gv

    new, report = convert_checked(Before, dtype)
    low_weight = tvm.relax.const(weight.value.numpy().astype(
        relay_amp.dtypes.numpy_dtype(dtype)), dtype)

    @I.ir_module
    class Expected:
        @R.function
        def main(x: R.Tensor((2, 4), "float32")):
            with R.dataflow():
                lv = R.permute_dims(low_weight, [1, 0])
                x1 = R.astype(x, dtype)
                gv = R.matmul(x1, lv, out_dtype="float32")
                R.output(gv)
            return gv

    tvm.ir.assert_structural_equal(new, Expected)
    assert report.find("lv").compute_dtype == dtype
    assert "constant_copy" in report.find("lv").codes
    assert report.casts == 1 and report.constants_converted == 1


def test_attention_keeps_scale_causal_mask_and_bias(dtype):
    @I.ir_module
    class Before:
        @R.function
        def main(q: R.Tensor((1, 4, 2, 8), "float32"), k: R.Tensor((1, 4, 2, 8), "float32"),
                 v: R.Tensor((1, 4, 2, 8), "float32"), b: R.Tensor((1, 2, 4, 4), "float32")):
            with R.dataflow():
                gv = R.nn.attention(q, k, v, b, scale=0.25, causal_mask="TopLeft")
                R.output(gv)
            return gv

    @I.ir_module
    class Expected:
        @R.function
        def main(q: R.Tensor((1, 4, 2, 8), "float32"), k: R.Tensor((1, 4, 2, 8), "float32"),
                 v: R.Tensor((1, 4, 2, 8), "float32"), b: R.Tensor((1, 2, 4, 4), "float32")):
            with R.dataflow():
                q1 = R.astype(q, dtype)
                k1 = R.astype(k, dtype)
                v1 = R.astype(v, dtype)
                b1 = R.astype(b, dtype)
                gv = R.nn.attention(q1, k1, v1, b1, scale=0.25, causal_mask="TopLeft")
                gv1 = R.astype(gv, dtype)  # pins TVM's float32 legalization of a scaled attention
                gv2 = R.astype(gv1, "float32")
                R.output(gv, gv1, gv2)
            return gv2

    check(Before, Expected, dtype)


def test_outer_converts_where_the_builtin_pass_crashes(dtype):
    @I.ir_module
    class Before:
        @R.function
        def main(a: R.Tensor((4,), "float32"), b: R.Tensor((3,), "float32")):
            with R.dataflow():
                gv = R.outer(a, b)
                R.output(gv)
            return gv

    @I.ir_module
    class Expected:
        @R.function
        def main(a: R.Tensor((4,), "float32"), b: R.Tensor((3,), "float32")):
            with R.dataflow():
                a1 = R.astype(a, dtype)
                b1 = R.astype(b, dtype)
                gv = R.outer(a1, b1)
                gv1 = R.astype(gv, "float32")
                R.output(gv, gv1)
            return gv1

    check(Before, Expected, dtype)
    with pytest.raises(Exception, match="attr_map"):
        builtin_convert(Before)


def test_fp32_list_ops_stay_float32(dtype):
    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((2, 8), "float32"), w: R.Tensor((8, 8), "float32")):
            with R.dataflow():
                lv = R.matmul(x, w)
                lv1 = R.exp(lv)
                lv2 = R.sum(lv1, axis=[1], keepdims=True)
                lv3 = R.arange(0, 8, 1, "float32")
                lv4 = R.add(lv2, lv3)
                gv = R.matmul(lv4, w)
                R.output(gv)
            return gv

    _, report = convert_checked(Before, dtype)
    for name in ("lv1", "lv2", "lv3", "lv4"):
        assert report.find(name).compute_dtype == "float32", name
    assert report.find("lv1").reason("builtin_category").values["category"] == "fp32"
    assert report.find("gv").compute_dtype == dtype


def test_softmax_accumulates_in_float32_and_hands_low_precision_on(dtype):
    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((2, 8), "float32"), w: R.Tensor((8, 8), "float32")):
            with R.dataflow():
                lv = R.nn.softmax(x)
                lv1 = R.matmul(lv, w)
                gv = R.add(lv1, lv)
                R.output(gv)
            return gv

    _, report = convert_checked(Before, dtype)
    row = report.find("lv")
    assert (row.compute_dtype, row.accumulation_dtype, row.output_dtype) == (
        "float32", "float32", f"float32+{dtype}")
    assert report.find("lv1").compute_dtype == dtype


def test_add_after_a_float32_op_stays_float32(dtype):
    """exp's result may not fit low precision: the add that reads it follows it in float32."""

    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((2, 8), "float32"), w: R.Tensor((8, 8), "float32")):
            with R.dataflow():
                lv = R.exp(x)
                lv1 = R.add(lv, x)
                gv = R.matmul(lv1, w)
                R.output(gv)
            return gv

    _, report = convert_checked(Before, dtype)
    assert report.find("lv").compute_dtype == "float32"
    assert report.find("lv1").compute_dtype == "float32"
    assert report.find("gv").compute_dtype == dtype


def test_where_after_matmul_runs_low_with_bool_condition_untouched(dtype):
    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((2, 8), "float32"), w: R.Tensor((8, 8), "float32"),
                 c: R.Tensor((2, 8), "bool")):
            with R.dataflow():
                lv = R.matmul(x, w)
                lv1 = R.where(c, lv, R.const(0.0, "float32"))
                gv = R.matmul(lv1, w)
                R.output(gv)
            return gv

    new, report = convert_checked(Before, dtype)
    row = report.find("lv1")
    assert row.compute_dtype == dtype and row.input_dtypes == ("bool", dtype, dtype)


def test_unknown_ops_and_call_tir_keep_their_dtypes(dtype):
    @I.ir_module
    class Before:
        @T.prim_func(private=True)
        def add_one(a: T.Buffer((T.int64(2), T.int64(8)), "float32"),
                    out: T.Buffer((T.int64(2), T.int64(8)), "float32")):
            for i, j in T.grid(T.int64(2), T.int64(8)):
                out[i, j] = a[i, j] + T.float32(1)

        @R.function
        def main(x: R.Tensor((2, 8), "float32"), w: R.Tensor((8, 8), "float32")):
            cls = Before
            with R.dataflow():
                lv = R.matmul(x, w)
                lv1 = R.call_tir(cls.add_one, (lv,), out_ty=R.Tensor((2, 8), "float32"))
                gv = R.matmul(lv1, w)
                R.output(gv)
            return gv

    new, report = convert_checked(Before, dtype)
    row = report.find("lv1")
    assert row.category == "unknown" and row.input_dtypes == ("float32",)
    assert report.unknown_ops == ["call_tir"]
    assert report.find("lv").output_dtype == "float32"  # no cast for the unknown consumer


def test_values_already_low_precision_are_not_recast(dtype):
    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((2, 8), dtype), w: R.Tensor((8, 8), "float32")):
            with R.dataflow():
                lv = R.matmul(x, R.astype(w, dtype), out_dtype=dtype)
                gv = R.matmul(R.astype(lv, "float32"), w)
                R.output(gv)
            return gv

    @I.ir_module
    class Expected:
        @R.function
        def main(x: R.Tensor((2, 8), dtype), w: R.Tensor((8, 8), "float32")):
            with R.dataflow():
                lv0 = R.astype(w, dtype)
                lv = R.matmul(x, lv0, out_dtype=dtype)
                lv1 = R.astype(lv, "float32")
                gv = R.matmul(lv, lv0, out_dtype="float32")
                R.output(gv)
            return gv

    report = check(Before, Expected, dtype)
    assert report.casts == 0


def test_float64_tensors_are_left_alone(dtype):
    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((2, 8), "float64"), w: R.Tensor((8, 8), "float64")):
            with R.dataflow():
                gv = R.matmul(x, w)
                R.output(gv)
            return gv

    new, report = convert_checked(Before, dtype)
    tvm.ir.assert_structural_equal(new, Before)
    assert "float64" in report.find("gv").reason("foreign_dtypes").values["dtypes"]


def test_low_precision_inputs_and_outputs(dtype):
    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((2, 8), "float32"), w: R.Tensor((8, 8), "float32")):
            with R.dataflow():
                lv = R.matmul(x, w)
                gv = R.nn.relu(lv)
                R.output(gv)
            return gv

    @I.ir_module
    class Expected:
        @R.function
        def main(x: R.Tensor((2, 8), dtype), w: R.Tensor((8, 8), dtype)) -> R.Tensor((2, 8), dtype):
            with R.dataflow():
                lv = R.matmul(x, w, out_dtype="float32")
                lv1 = R.astype(lv, dtype)
                gv = R.nn.relu(lv1)
                R.output(gv)
            return gv

    check(Before, Expected, dtype, keep_io_dtypes=False)

    @I.ir_module
    class ExpectedOneInput:
        @R.function
        def main(x: R.Tensor((2, 8), dtype), w: R.Tensor((8, 8), "float32")):
            with R.dataflow():
                w1 = R.astype(w, dtype)
                gv0 = R.matmul(x, w1, out_dtype="float32")
                gv = R.nn.relu(gv0)
                R.output(gv)
            return gv

    check(Before, ExpectedOneInput, dtype, low_precision_inputs=["x"])


def test_prim_func_only_module_is_returned_unchanged():
    @I.ir_module
    class Before:
        @T.prim_func
        def add_one(a: T.Buffer((4,), "float32"), out: T.Buffer((4,), "float32")):
            for i in range(4):
                out[i] = a[i] + T.float32(1)

    new, report = relay_amp.convert(Before, "float16")
    assert new.same_as(Before)
    assert report.rows == [] and "nothing was converted" in report.notes[0]
