"""relay_amp catches TVM_ERRORS where it asks TVM whether it accepts something: these tests pin
that TVM reports each kind of rejection relay_amp relies on as one of them, and that the fast Call
constructor makes the node TVM's own makes."""

import pytest
import tvm
from tvm import relax

from relay_amp.relax_utils import TVM_ERRORS, mutate_functions, new_call
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


def test_new_call_makes_the_node_tvm_ir_call_makes():
    x = relax.Var("x", relax.TensorType((2, 3), "float32"))
    w = relax.Var("w", relax.TensorType((3, 4), "float32"))
    model = relax.op.matmul(x, w, out_dtype="float16")
    made = new_call(model.op, [x, w], model.attrs, model.ty_args, model.span)
    assert type(made) is tvm.ir.Call
    tvm.ir.assert_structural_equal(made, tvm.ir.Call(model.op, [x, w], model.attrs))
    normalized = relax.BlockBuilder().normalize(made)
    assert normalized.ty.dtype == "float16" and list(normalized.ty.shape) == [2, 4]


def test_mutate_functions_visits_every_relax_function_and_leaves_the_input():
    @relax.expr_functor.mutator
    class ReluToSigmoid(relax.PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            return relax.op.sigmoid(call.args[0]) if call.op.name == "relax.nn.relu" else call

    builder = relax.BlockBuilder()
    for name in ("main", "other"):
        x = relax.Var("x", relax.TensorType((2,), "float32"))
        with builder.function(name, [x]):
            builder.emit_func_output(builder.emit(relax.op.nn.relu(x)))
    mod = builder.get()
    before = mod.script()
    after = mutate_functions(ReluToSigmoid(mod))
    assert after.script().count("R.sigmoid") == 2 and "R.nn.relu" not in after.script()
    assert mod.script() == before
