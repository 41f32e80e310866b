"""relay_amp.builds.constants.numpy_elementwise_constants: elementwise ops whose arguments are all
constants computed in numpy before legalization, where TVM's FoldConstant compiles a kernel
for each (ONNX's Clip: ``isnan`` and ``where`` of its bounds), with TVM's values."""

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R

import relay_amp
from relay_amp.builds.constants import ELEMENTWISE, numpy_elementwise_constants


def _onnx_clip():
    """What TVM's ONNX importer makes of ``Clip(x, 0, 6)`` (mobilenetv2_1.0's ReLU6)."""

    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((1, 8, 4, 4), "float32")):
            with R.dataflow():
                low_nan = R.isnan(R.const(0.0, "float32"))
                low = R.where(low_nan, R.const(float("-inf"), "float32"),
                              R.const(0.0, "float32"))
                high_nan = R.isnan(R.const(6.0, "float32"))
                high = R.where(high_nan, R.const(float("inf"), "float32"),
                               R.const(6.0, "float32"))
                gv = R.minimum(R.maximum(x, low), high)
                R.output(gv)
            return gv

    return Before


def test_an_onnx_clips_bounds_are_computed_in_numpy():
    @I.ir_module
    class Expected:
        @R.function
        def main(x: R.Tensor((1, 8, 4, 4), "float32")):
            with R.dataflow():
                lv = R.maximum(x, R.const(0.0, "float32"))
                gv = R.minimum(lv, R.const(6.0, "float32"))
                R.output(gv)
            return gv

    before = _onnx_clip()
    text = before.script()
    after = numpy_elementwise_constants()(before)
    tvm.ir.assert_structural_equal(after, Expected)
    assert before.script() == text  # the input module is not changed


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_cast_of_a_constant_is_computed_unless_bfloat16_rounds_it(dtype):
    """A float16 TFLite weight widened to float32 (face_landmark: 29 such kernels) and a
    float32 one narrowed to float16 are numpy's exact casts; bfloat16's rounding stays TVM's."""
    weight = np.random.default_rng(0).standard_normal((8, 4)).astype("float32")

    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((2, 8), dtype)):
            with R.dataflow():
                gv = R.matmul(x, R.astype(R.const(weight), dtype))
                R.output(gv)
            return gv

    after = numpy_elementwise_constants()(Before)
    casts = "R.astype" in after["main"].script()
    assert casts == (dtype == "bfloat16")
    if dtype == "float16":
        constants = []
        relax.analysis.post_order_visit(after["main"], lambda e: constants.append(
            e.value.numpy()) if isinstance(e, tvm.ir.expr.GenericConst) else None)
        (value,) = constants
        assert value.dtype == np.float16 and np.array_equal(value, weight.astype("float16"))


def _result(mod):
    """The numpy value of ``mod``'s output, which must be a constant (through its bindings)."""
    body = mod["main"].body
    value = body.body
    while isinstance(value, relax.Var):
        value = next(b.value for block in body.blocks for b in block.bindings
                     if b.var.same_as(value))
    assert isinstance(value, tvm.ir.expr.GenericConst), f"not computed: {value}"
    return value.value.numpy()


def _inputs(name, dtype, rng):
    """Constants for ``name``: signed values with zeros, infinities and a NaN among them."""
    if dtype == "bool":
        return [rng.random((3, 5)) < 0.5 for _ in range(2)]
    values = [rng.standard_normal((3, 5)).astype(dtype) * 4 for _ in range(2)]
    values[0][0, :4] = [0.0, np.inf, -np.inf, np.nan]
    values[0][1, :3] = [0.0, -0.0, 1.0]
    values[1][1, :3] = [-0.0, 0.0, 0.0]  # 1 / -0 is -inf
    return values


def _bits_equal(got, want) -> bool:
    """Equal bit for bit, a NaN's payload aside."""
    nan = np.isnan(got) if got.dtype.kind == "f" else np.zeros(got.shape, bool)
    return (np.array_equal(nan, np.isnan(want) if want.dtype.kind == "f" else nan)
            and np.array_equal(got.view(np.uint8).reshape(*got.shape, -1)[~nan],
                               want.view(np.uint8).reshape(*want.shape, -1)[~nan]))


def _module(op, values):
    builder = relax.BlockBuilder()
    with builder.function("main", []):
        with builder.dataflow():
            out = builder.emit_output(builder.emit(op(*(relax.const(v) for v in values))))
        builder.emit_func_output(out)
    return builder.get()


def _tvms(mod):
    return _result(tvm.transform.Sequential([relax.transform.LegalizeOps(),
                                             relax.transform.FoldConstant()])(mod))


OPS = {  # (op, argument count, argument dtypes)
    "relax.isnan": (R.isnan, 1), "relax.isinf": (R.isinf, 1), "relax.isfinite": (R.isfinite, 1),
    "relax.logical_not": (R.logical_not, 1), "relax.logical_and": (R.logical_and, 2),
    "relax.logical_or": (R.logical_or, 2), "relax.equal": (R.equal, 2), "relax.less": (R.less, 2),
    "relax.less_equal": (R.less_equal, 2), "relax.greater": (R.greater, 2),
    "relax.greater_equal": (R.greater_equal, 2), "relax.add": (R.add, 2),
    "relax.subtract": (R.subtract, 2), "relax.multiply": (R.multiply, 2),
    "relax.divide": (R.divide, 2), "relax.negative": (R.negative, 1), "relax.abs": (R.abs, 1),
}
#: What numpy computes otherwise than TVM's kernel, on a NaN: why they are not in ELEMENTWISE.
DIFFERENT = {"relax.not_equal": (R.not_equal, 2), "relax.maximum": (R.maximum, 2),
             "relax.minimum": (R.minimum, 2)}


def test_every_op_of_the_table_is_tested():
    assert set(OPS) | {"relax.astype", "relax.where"} == set(ELEMENTWISE)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("name", sorted(OPS))
def test_numpys_value_is_tvms_folded_constant_bit_for_bit(name, dtype):
    op, count = OPS[name]
    logical = name.startswith("relax.logical")
    rng = np.random.default_rng(sorted(OPS).index(name))
    values = _inputs(name, "bool" if logical else dtype, rng)[:count]
    mod = _module(op, values)
    want, got = _tvms(mod), _result(numpy_elementwise_constants()(mod))
    assert got.dtype == want.dtype and _bits_equal(got, want)


@pytest.mark.parametrize("name", sorted(DIFFERENT))
def test_the_ops_left_out_would_differ_from_tvms_kernel(name):
    """If a TVM release makes these numpy's values, this fails, and they can join the table."""
    op, count = DIFFERENT[name]
    values = _inputs(name, "float32", np.random.default_rng(0))[:count]
    with np.errstate(invalid="ignore"):
        computed = getattr(np, name.split(".")[1])(*values)
    assert not _bits_equal(np.asarray(computed), _tvms(_module(op, values)))
    assert name.split(".")[1] not in {n.split(".")[1] for n in ELEMENTWISE}


def test_integer_arithmetic_is_left_to_tvm():
    """numpy's integer division floors where TIR's truncates, and its overflow is its own."""
    builder = relax.BlockBuilder()
    with builder.function("main", []):
        with builder.dataflow():
            out = builder.emit_output(builder.emit(relax.op.divide(
                relax.const(np.array([-7, 7], "int32")), relax.const(np.array([2, 2], "int32")))))
        builder.emit_func_output(out)
    assert "R.divide" in numpy_elementwise_constants()(builder.get())["main"].script()


def test_cpu_pipeline_leaves_foldconstant_no_kernel_to_compile_for_a_clip():
    """In relay_amp's CPU pipeline the Clip's bounds are numbers before legalization:
    FoldConstant finds no kernel whose arguments are all constants; TVM's pipeline compiles
    one for each bound. The built library's outputs are TVM's, bit for bit."""
    target = tvm.target.Target(relay_amp.host_target())

    @tvm.instrument.pass_instrument
    class ConstantKernels:
        def __init__(self):
            self.found = None

        def run_before_pass(self, mod, info):
            if info.name != "FoldConstant":
                return
            calls = []
            relax.analysis.post_order_visit(mod["main"], lambda e: calls.append(e) if (
                isinstance(e, relax.Call) and e.op.same_as(tvm.ir.Op.get("relax.call_tir"))
                and all(isinstance(a, tvm.ir.expr.GenericConst) for a in e.args[1].fields))
                else None)
            self.found = len(calls)

    counts, outputs = {}, {}
    x = np.random.default_rng(1).standard_normal((1, 8, 4, 4)).astype("float32") * 8
    for ours in (False, True):
        counter = ConstantKernels()
        with tvm.transform.PassContext(instruments=[counter]):
            executable = tvm.compile(_onnx_clip(), target=target,
                                     relax_pipeline=relay_amp.cpu_pipeline(target, ours))
        counts[ours] = counter.found
        vm = relax.VirtualMachine(executable, tvm.cpu())
        outputs[ours] = vm["main"](tvm.runtime.tensor(x)).numpy()
    assert counts == {False: 2, True: 0}
    np.testing.assert_array_equal(outputs[True], outputs[False])
    np.testing.assert_array_equal(outputs[True], np.clip(x, 0, 6))
