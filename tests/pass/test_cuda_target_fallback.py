"""Kernels with a CUDA target: the mixed kernel of a mean over every axis (TVM's legalization
passes ``axis=None`` to its TE function, which once ran the kernel out of operands and crashed
the conversion, issue 36), and a kernel TVM will not build falling back with its reason code."""

import numpy as np
import pytest
from helpers import convert_checked, random_inputs, run_module
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R

from relay_amp import kernels
from relay_amp.dtypes import numpy_dtype

CUDA = {"kind": "cuda", "arch": "sm_90"}
TOLERANCE = {"float16": 2e-3, "bfloat16": 2e-2}


@I.ir_module
class MeanOfAll:
    """The tail of ONNX's ``nllloss_*_expanded`` cases: a mean over every axis."""

    @R.function
    def main(x: R.Tensor((3, 5), "float32")):
        with R.dataflow():
            lv = R.negative(x)
            gv = R.mean(lv, axis=None, keepdims=False)
            R.output(gv)
        return gv


def _row(report, op):
    return next(r for r in report.rows if r.op == op)


def _feed(converted, inputs):
    params = converted["main"].params
    return [a.astype(numpy_dtype(str(p.ty.dtype))) for a, p in zip(inputs, params)]


@pytest.mark.parametrize("keep_io_dtypes", [True, False])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_mean_over_every_axis_gets_its_mixed_kernel(dtype, keep_io_dtypes):
    converted, report = convert_checked(MeanOfAll, dtype, target=CUDA,
                                        keep_io_dtypes=keep_io_dtypes)
    assert "mixed_kernel" in [r.code for r in _row(report, "mean").reasons]
    inputs = random_inputs(MeanOfAll)
    expected = run_module(MeanOfAll, inputs)[0]
    got = run_module(converted, _feed(converted, inputs))[0].astype(np.float32)
    scale = np.abs(inputs[0]).mean()
    assert abs(float(got) - float(expected)) <= TOLERANCE[dtype] * scale


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_kernel_tvm_will_not_build_falls_back_with_its_reason(monkeypatch, dtype):
    """A legalization that uses its builder for more than one ``call_te`` (as einsum's does)
    gets no mixed kernel: the op computes as TVM legalizes it, and the row says why."""

    def more_than_call_te(recorder, func, *args, **kwargs):
        return recorder.emit(None)

    monkeypatch.setattr(kernels._TeRecorder, "call_te", more_than_call_te)
    converted, report = convert_checked(MeanOfAll, dtype, target=CUDA, keep_io_dtypes=False)
    reasons = _row(report, "mean").reasons
    codes = [r.code for r in reasons]
    assert "kernel_not_emitted" in codes and "mixed_kernel" not in codes
    why = next(r for r in reasons if r.code == "kernel_not_emitted")
    assert why.values["kernel"] == "mixed" and "emit" in why.values["why"]
    assert "no mixed kernel" in _row(report, "mean").rule
    inputs = random_inputs(MeanOfAll)
    expected = run_module(MeanOfAll, inputs)[0]
    got = run_module(converted, _feed(converted, inputs))[0].astype(np.float32)
    assert abs(float(got) - float(expected)) <= TOLERANCE[dtype] * np.abs(inputs[0]).mean()


def test_the_recorder_refuses_a_legalization_beyond_call_te():
    """einsum's legalization looks up its operand's binding: no kernel, a reason instead of
    an exception."""
    x = relax.Var("x", relax.TensorType((2, 3), "float32"))
    pair = relax.Var("t", relax.TupleType([x.ty, x.ty]))
    call = relax.BlockBuilder().normalize(relax.op.einsum(pair, "ij,ij->ij"))
    emitter = kernels.KernelEmitter(relax.BlockBuilder(), None, "float16")
    assert emitter.emit_mixed("einsum", call, [pair], "float32", "y", False) is None
    assert emitter.not_emitted.code == "kernel_not_emitted"
    assert "lookup_binding" in emitter.not_emitted.values["why"]
