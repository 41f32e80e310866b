"""relay_amp catches TVM_ERRORS where it asks TVM whether it accepts something and falls back:
each test triggers one rejection relay_amp relies on and pins the type TVM 0.27 raises for it."""

import pytest
import tvm
from tvm import relax
from tvm.script import tirx as T

from relay_amp.kernels import _TeRecorder
from relay_amp.relax_utils import TVM_ERRORS


def _raised(action) -> type:
    with pytest.raises(TVM_ERRORS) as caught:
        action()
    return caught.type


def test_an_op_rejecting_a_dtype_raises_type_error():
    x = relax.Var("x", relax.TensorType((2, 3), "bfloat16"))
    alpha = relax.Var("a", relax.TensorType((3,), "bfloat16"))
    assert _raised(lambda: relax.BlockBuilder().normalize(relax.op.nn.prelu(x, alpha))) \
        is TypeError


def test_a_bad_target_and_an_ill_formed_module_raise_value_error():
    assert _raised(lambda: tvm.target.Target({"kind": "no_such_kind"})) is ValueError
    x = relax.Var("x", relax.TensorType((2,), "float32"))
    free = relax.Var("y", relax.TensorType((2,), "float32"))
    func = relax.Function([x], relax.SeqExpr([], free), relax.TensorType((2,), "float32"))
    assert _raised(lambda: relax.analysis.well_formed(tvm.IRModule({"main": func}))) \
        is ValueError


def test_a_primfunc_without_blocks_raises_tvms_schedule_error():
    from tvm import s_tir

    @T.prim_func
    def no_blocks(a: T.handle):
        A = T.match_buffer(a, (4,), "float32")
        for i in range(4):
            A[i] = 1.0

    raised = _raised(lambda: s_tir.Schedule(no_blocks).get_sblock("root"))
    assert issubclass(raised, RuntimeError) and raised.__module__.startswith("tvm.")


def test_a_python_error_in_a_legalization_comes_back_through_the_ffi_as_runtime_error():
    """What the kernel emitter's recorder relies on: its refusal reaches it as RuntimeError."""
    x = relax.Var("x", relax.TensorType((2, 3), "float32"))
    pair = relax.Var("t", relax.TupleType([x.ty, x.ty]))
    call = relax.BlockBuilder().normalize(relax.op.einsum(pair, "ij,ij->ij"))
    legalize = tvm.ir.Op.get("relax.einsum").get_attr("FLegalize")
    assert _raised(lambda: legalize(_TeRecorder(), call)) is RuntimeError


def test_key_and_index_errors_are_relay_amps_own_bugs_not_rejections():
    assert not issubclass(KeyError, TVM_ERRORS) and not issubclass(IndexError, TVM_ERRORS)
