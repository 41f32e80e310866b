"""relay_amp catches TVM_ERRORS where it asks TVM whether it accepts something: these tests pin
that TVM reports each kind of rejection relay_amp relies on as one of them."""

import pytest
import tvm
from tvm import relax

from relay_amp.relax_utils import TVM_ERRORS
from relay_amp.targets import as_target


def test_an_op_rejecting_a_dtype_raises_one_of_them():
    x = relax.Var("x", relax.TensorType((2, 3), "bfloat16"))
    alpha = relax.Var("a", relax.TensorType((3,), "bfloat16"))
    with pytest.raises(TVM_ERRORS):
        relax.BlockBuilder().normalize(relax.op.nn.prelu(x, alpha))


def test_an_unknown_target_raises_one_of_them_and_relay_amp_says_invalid_target():
    with pytest.raises(TVM_ERRORS):
        tvm.target.Target({"kind": "no_such_kind"})
    with pytest.raises(ValueError, match="invalid target"):
        as_target({"kind": "no_such_kind"})


def test_an_ill_formed_module_raises_one_of_them():
    x = relax.Var("x", relax.TensorType((2,), "float32"))
    y = relax.Var("y", relax.TensorType((2,), "float32"))  # free: bound nowhere
    func = relax.Function([x], relax.SeqExpr([], relax.op.add(x, y)),
                          relax.TensorType((2,), "float32"))
    with pytest.raises(TVM_ERRORS):
        relax.analysis.well_formed(tvm.IRModule({"main": func}))
