"""The op registry against TVM itself: every op it has a record of exists in TVM's op registry,
and every TVM limitation it records still holds (so a TVM release that lifts one shows up here);
its views are derived from the records."""

import pytest
import tvm
from tvm import relax

import relay_amp
from relay_amp.op_registry import (
    EXACT_OPS,
    FUSION_KINDS,
    GROUP_OPS,
    RECORDS,
    REGISTRY,
    TVM_LIMITATIONS,
    builtin_table,
    op_info,
)

NAMED_OPS = sorted(REGISTRY)


def test_every_view_is_derived_from_the_records():
    assert len(RECORDS) == len(REGISTRY) >= 150
    assert {op for ops in GROUP_OPS.values() for op in ops} == set(builtin_table())
    assert EXACT_OPS == {op for op, group in builtin_table().items() if op_info(op).exact}
    assert all(REGISTRY[op].fusion == kind for op, kind in FUSION_KINDS.items())
    assert all(REGISTRY[op].limitations[dtype] == why
               for dtype, ops in TVM_LIMITATIONS.items() for op, why in ops.items())
    unknown = op_info("no_such_op")
    assert unknown.group is None and unknown.fusion is None and unknown.identity is None


@pytest.mark.parametrize("name", NAMED_OPS)
def test_every_op_the_tables_name_is_in_tvms_registry(name):
    assert tvm.ir.Op.get(f"relax.{name}").name == f"relax.{name}"


def test_the_registry_check_rejects_an_unknown_name():
    with pytest.raises(AttributeError, match="no_such_op_anywhere"):
        tvm.ir.Op.get("relax.no_such_op_anywhere")


def _call(op: str, dtype: str):
    """A module applying ``op`` to ``dtype`` tensors of small shapes."""
    x = relax.Var("x", relax.TensorType((2, 4, 3, 3), dtype))
    vector = relax.Var("v", relax.TensorType((4,), dtype))
    params = [x]
    nn = relax.op.nn
    if op in ("argmax", "argmin"):
        expr = getattr(relax.op, op)(x, axis=1)
    elif op == "nn.prelu":
        params.append(vector)
        expr = nn.prelu(x, vector, axis=1)
    elif op == "power":
        expr = relax.op.power(x, x)
    elif op in ("nn.layer_norm", "nn.group_norm", "nn.instance_norm"):
        gamma = relax.Var("g", relax.TensorType((4,) if op != "nn.layer_norm" else (3,), dtype))
        beta = relax.Var("b", relax.TensorType(gamma.ty.shape, dtype))
        params += [gamma, beta]
        expr = {"nn.layer_norm": lambda: nn.layer_norm(x, gamma, beta, axes=[-1]),
                "nn.group_norm": lambda: nn.group_norm(x, gamma, beta, 2, 1, [2, 3]),
                "nn.instance_norm": lambda: nn.instance_norm(x, gamma, beta, 1, [2, 3])}[op]()
    elif op == "quantize":
        expr = relax.op.quantize(x, relax.const(0.5, dtype), relax.const(0, "int8"), axis=1)
    elif op == "dequantize":
        q = relax.Var("q", relax.TensorType((2, 4, 3, 3), "int8"))
        params = [q]
        expr = relax.op.dequantize(q, relax.const(0.5, dtype), relax.const(0, "int8"), axis=1,
                                   out_dtype=dtype)
    else:
        raise AssertionError(f"no test module for {op}: add one when adding a limitation")
    builder = relax.BlockBuilder()
    with builder.function("main", params):
        with builder.dataflow():
            out = builder.emit_output(expr)
        builder.emit_func_output(out)
    return builder.get()


def _builds(op: str, dtype: str) -> bool:
    try:
        tvm.compile(_call(op, dtype), target=relay_amp.host_target())
    except Exception:  # TVM raises several types (TVMError, ValueError, AssertionError...)
        return False
    return True


LIMITS = [(dtype, op) for dtype, ops in TVM_LIMITATIONS.items() for op in sorted(ops)]


@pytest.mark.parametrize("dtype, op", LIMITS)
def test_every_recorded_tvm_limitation_still_holds(dtype, op):
    """The op fails to type-check or build in ``dtype`` but builds in float16 or float32: the
    day TVM accepts it, this fails and the entry (and its float32 fallback) should go."""
    control = "float16" if dtype == "bfloat16" else "float32"
    assert _builds(op, control), f"{op} does not build in {control} either: the probe is wrong"
    assert not _builds(op, dtype), f"TVM now builds {op} in {dtype}: drop the limitation"
