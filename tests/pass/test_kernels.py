"""The one place relay_amp reaches into a closure of TVM's (kernels._rebind_builder): pinned to
what TVM's legalization does today, so a TVM release that changes it shows up here."""

import pytest
import tvm
from helpers import convert_checked, random_inputs, run_module
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R

import relay_amp
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


@I.ir_module
class SubtractThenNorm:
    @R.function
    def main(x: R.Tensor((2, 8, 16), "float32"), w: R.Tensor((16, 16), "float32"),
             g: R.Tensor((16,), "float32"), b: R.Tensor((16,), "float32")):
        with R.dataflow():
            y = R.matmul(x, w)
            s = R.subtract(x, y)
            n = R.nn.layer_norm(s, g, b, axes=[-1])
            R.output(n)
        return n


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_the_absorbed_residual_is_the_op_the_registry_names(monkeypatch, dtype):
    """The kernel that absorbs a residual forms it with the registry's ``residual_add`` op,
    whatever that op is (here subtract, made one for the test), not with an add."""
    import dataclasses

    from relay_amp import op_registry

    monkeypatch.setitem(op_registry.REGISTRY, "subtract", dataclasses.replace(
        op_registry.REGISTRY["subtract"], residual_add=True))
    converted, report = convert_checked(SubtractThenNorm, dtype,
                                        target={"kind": "cuda", "arch": "sm_90"})
    assert "absorbed_add" in report.find("s").codes
    assert "absorbing_kernel" in report.find("n").codes
    inputs = random_inputs(SubtractThenNorm, seed=3)
    want = run_module(SubtractThenNorm, inputs)
    got = run_module(converted, inputs)
    error = relay_amp.agreement(want, got).relative_l2
    assert error < {"float16": 2e-3, "bfloat16": 2e-2}[dtype], error
