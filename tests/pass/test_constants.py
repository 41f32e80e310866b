"""relay_amp.builds.constants: reshapes and transposes of constants computed in numpy at
build time, where TVM's FoldConstant compiles and runs a kernel for each."""

import numpy as np
import tvm
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
