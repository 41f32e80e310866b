"""The one place relay_amp reaches into a closure of TVM's (kernels._rebind_builder): pinned to
what TVM's legalization does today, so a TVM release that changes it shows up here."""

import tvm
from tvm import relax
from tvm.script import relax as R

from relay_amp.kernels import _rebind_builder, _TeRecorder


@tvm.script.ir_module
class Matmul:
    @R.function
    def main(x: R.Tensor((4, 8), "float16"), w: R.Tensor((8, 16), "float16")):
        with R.dataflow():
            y = R.matmul(x, w, out_dtype="float32")
            R.output(y)
        return y


def _legalized_te_function():
    call = Matmul["main"].body.blocks[0].bindings[0].value
    recorder = _TeRecorder()
    tvm.ir.Op.get("relax.matmul").get_attr("FLegalize")(recorder, call)
    assert len(recorder.calls) == 1, "matmul no longer legalizes into one call_te"
    return recorder, recorder.calls[0][0]


def test_matmuls_legalization_closes_over_its_builder_and_the_rebind_reaches_it():
    recorder, te_func = _legalized_te_function()
    builder = relax.BlockBuilder()
    assert _rebind_builder(te_func, recorder, builder) >= 1
    assert all(cell.cell_contents is not recorder for cell in te_func.__closure__)
    assert any(cell.cell_contents is builder for cell in te_func.__closure__)


def test_the_rebind_leaves_other_closures_alone():
    recorder, te_func = _legalized_te_function()
    assert _rebind_builder(te_func, _TeRecorder(), relax.BlockBuilder()) == 0
    assert any(cell.cell_contents is recorder for cell in te_func.__closure__)
