"""A kernel the rewrite asks for and TVM will not build: the rewrite falls back to the plain
path, the module stays well-formed and right, and the report says what was emitted instead."""

import pytest
import tvm
from cases import PostNorm
from helpers import convert_checked, random_inputs, run_module

import relay_amp
from relay_amp import kernels

CUDA = {"kind": "cuda", "arch": "sm_90"}
TOLERANCE = {"float16": 3e-3, "bfloat16": 2e-2}


def _refuse(monkeypatch, absorbing: bool, mixed: bool):
    """Make TVM's legalization refuse the absorbing kernel (a prologue) and/or the mixed one."""
    emit = kernels.KernelEmitter._emit_legalized

    def refusing(self, op, legal_call, args, operand_dtype, name, output, out_dtype=None,
                 prologue=None):
        if (absorbing and prologue is not None) or (mixed and prologue is None):
            raise kernels._NotEmitted("forced by the test")
        return emit(self, op, legal_call, args, operand_dtype, name, output, out_dtype,
                    prologue)

    monkeypatch.setattr(kernels.KernelEmitter, "_emit_legalized", refusing)


def _check_numbers(converted, dtype):
    inputs = random_inputs(PostNorm, seed=5)
    want = run_module(PostNorm, inputs)
    got = run_module(converted, inputs)
    error = relay_amp.agreement(want, got)
    assert error.relative_l2 < TOLERANCE[dtype], error  # a NaN or Inf makes it inf


def _rows(report):
    return {name: report.find(name) for name in ("y", "s", "n")}


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_without_refusal_the_norm_absorbs_the_add(dtype):
    converted, report = convert_checked(PostNorm, dtype, target=CUDA)
    rows = _rows(report)
    assert "absorbed_add" in rows["s"].codes
    assert "absorbing_kernel" in rows["n"].codes
    _check_numbers(converted, dtype)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_refused_absorbing_kernel_leaves_the_add_its_own_kernel(monkeypatch, dtype):
    _refuse(monkeypatch, absorbing=True, mixed=False)
    converted, report = convert_checked(PostNorm, dtype, target=CUDA)
    rows = _rows(report)
    assert "absorbed_add" not in rows["s"].codes
    assert "add_not_absorbed" in rows["s"].codes and "forced by the test" in rows["s"].rule
    assert rows["s"].compute_dtype == "float32"
    codes = rows["n"].codes
    assert "absorbing_kernel" not in codes
    assert codes.index("absorbing_not_emitted") < codes.index("mixed_kernel")
    assert "no absorbing kernel" in rows["n"].rule
    ops = [b.value.op.name for b in converted["main"].body.blocks[0].bindings
           if isinstance(b.value, tvm.relax.Call) and isinstance(b.value.op, tvm.ir.Op)]
    assert "relax.add" in ops  # the sum is a kernel of its own again
    _check_numbers(converted, dtype)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_both_refused_the_norm_computes_as_tvm_legalizes_it(monkeypatch, dtype):
    _refuse(monkeypatch, absorbing=True, mixed=True)
    converted, report = convert_checked(PostNorm, dtype, target=CUDA)
    rows = _rows(report)
    assert "add_not_absorbed" in rows["s"].codes
    codes = rows["n"].codes
    assert "absorbing_kernel" not in codes and "mixed_kernel" not in codes
    assert codes.index("absorbing_not_emitted") < codes.index("kernel_not_emitted")
    assert rows["n"].reason("kernel_not_emitted").values["kernel"] == "mixed"
    _check_numbers(converted, dtype)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_refused_mixed_kernel_alone_falls_back_with_its_reason(monkeypatch, dtype):
    """With the absorbing kernel built, the mixed refusal is never reached: the row is the
    plain absorbing one; the report names no kernel that was not emitted."""
    _refuse(monkeypatch, absorbing=False, mixed=True)
    converted, report = convert_checked(PostNorm, dtype, target=CUDA)
    codes = _rows(report)["n"].codes
    assert "absorbing_kernel" in codes and "kernel_not_emitted" not in codes
    _check_numbers(converted, dtype)


def test_the_forced_refusal_reaches_the_emitter(monkeypatch):
    _refuse(monkeypatch, absorbing=True, mixed=True)
    emitter = kernels.KernelEmitter(tvm.relax.BlockBuilder(), None, "float16")
    call = PostNorm["main"].body.blocks[0].bindings[2].value
    assert emitter.emit_mixed("nn.layer_norm", call, list(call.args), "float32", "n",
                              False) is None
    assert emitter.not_emitted.values["why"] == "forced by the test"
