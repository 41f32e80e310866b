"""relay_amp.builds.constants: reshapes and transposes of constants computed in numpy at
build time, where TVM's FoldConstant compiles and runs a kernel for each."""

import numpy as np
import tvm
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R

from relay_amp.builds.constants import numpy_layout_constants

BIAS = np.arange(8, dtype="float32")


def _module():
    @I.ir_module
    class Bias:
        @R.function
        def main(x: R.Tensor((1, 4, 4, 8), "float32")):
            with R.dataflow():
                b = R.reshape(R.const(BIAS), (1, 8, 1, 1))
                t = R.permute_dims(b, [0, 2, 3, 1])
                gv = R.add(x, t)
                R.output(gv)
            return gv

    return Bias


def test_a_constants_reshape_and_transpose_are_computed_in_numpy():
    mod = _module()
    before = mod.script()
    folded = numpy_layout_constants()(mod)
    text = folded["main"].script()
    assert "R.reshape" not in text and "R.permute_dims" not in text
    constants = []
    relax.analysis.post_order_visit(folded["main"], lambda e: constants.append(e.value.numpy())
                                    if isinstance(e, tvm.ir.expr.Constant)
                                    and hasattr(e.value, "numpy") else None)
    (value,) = constants
    np.testing.assert_array_equal(value, BIAS.reshape(1, 8, 1, 1).transpose(0, 2, 3, 1))
    assert mod.script() == before  # the input is left alone
    x = np.random.default_rng(0).standard_normal((1, 4, 4, 8)).astype("float32")
    outputs = []
    for m in (mod, folded):
        vm = relax.VirtualMachine(tvm.compile(m, "llvm"), tvm.cpu())
        outputs.append(vm["main"](tvm.runtime.tensor(x)).numpy())
    np.testing.assert_array_equal(outputs[0], outputs[1])


def test_a_reshape_of_an_input_stays():
    @I.ir_module
    class Input:
        @R.function
        def main(x: R.Tensor((2, 8), "float32")):
            with R.dataflow():
                gv = R.reshape(x, (16,))
                R.output(gv)
            return gv

    assert "R.reshape" in numpy_layout_constants()(Input)["main"].script()


def test_a_weight_is_read_in_place_and_read_only():
    from relay_amp.builds.constants import array

    weight = relax.const(np.arange(12, dtype="float32").reshape(3, 4))
    value = array(weight)
    np.testing.assert_array_equal(value, np.arange(12).reshape(3, 4))
    assert np.shares_memory(value, array(weight))  # no copy per read
    assert not value.flags.writeable  # the input module's weight
    import ml_dtypes

    bfloat16 = relax.const(np.ones(3, ml_dtypes.bfloat16))  # no DLPack dtype in numpy: a copy
    assert array(bfloat16).dtype == ml_dtypes.bfloat16


@given(shape=st.lists(st.integers(1, 9), min_size=1, max_size=4), data=st.data())
@settings(max_examples=40, deadline=None)
def test_a_transposed_weight_becomes_an_aligned_constant_of_the_same_values(shape, data):
    from relay_amp.builds import constants

    axes = data.draw(st.permutations(range(len(shape))))
    value = np.random.default_rng(len(shape)).standard_normal(shape).astype("float32")
    view = np.transpose(value, axes)
    block = constants.COPY_BLOCK
    constants.COPY_BLOCK = 4  # blocks smaller than the array, and uneven ones
    try:
        made = constants.const(view)
    finally:
        constants.COPY_BLOCK = block
    held = np.from_dlpack(made.value)
    np.testing.assert_array_equal(held, view)
    assert held.ctypes.data % constants.ALIGNMENT == 0
    assert not np.shares_memory(held, value)  # the model's own array is not the constant
