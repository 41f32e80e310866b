"""Random Relax functions for property-based testing (hypothesis) and the invariants they keep."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tvm
import tvm_ffi
from hypothesis import strategies as st
from tvm import relax

OPS = ("matmul", "conv1x1", "attention", "add", "multiply", "subtract", "relu", "gelu",
       "sigmoid", "tanh", "exp_bounded", "softmax", "log_softmax", "sum_back", "mean_back",
       "layer_norm", "rms_norm", "concat_split", "reshape_back", "tuple_item", "where",
       "take", "float16_side", "if")


@dataclass
class Case:
    """A generated module and what is needed to run it."""

    mod: tvm.IRModule
    batch: int  # the concrete batch size used for running (also when the shape is symbolic)
    ops: list
    inputs: list  # numpy arrays in parameter order


@st.composite
def cases(draw, max_ops: int = 8, allow_if: bool = True) -> Case:  # noqa: C901 - one op table
    """A random function over (batch, channels) float32 tensors, with int and float16 extras.

    ``allow_if=False`` leaves out ``If``: TVM 0.27's VM crashes (in
    ``StorageObj::AllocTensor``) when some float32 functions with ``If`` run a second time,
    so numeric checks use functions without it.
    """
    op = relax.op
    channels = draw(st.sampled_from([4, 8]))
    batch = draw(st.integers(1, 3))
    symbolic = draw(st.booleans())
    dim = tvm.tirx.Var("n", "int64") if symbolic else batch
    choices = OPS if allow_if else tuple(o for o in OPS if o != "if")
    names = draw(st.lists(st.sampled_from(choices), min_size=1, max_size=max_ops))
    use_if = "if" in names
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    x = relax.Var("x", relax.TensorType((dim, channels), "float32"))
    w = relax.Var("w", relax.TensorType((channels, channels), "float32"))
    half = relax.Var("h", relax.TensorType((dim, channels), "float16"))
    index = relax.Var("idx", relax.TensorType((channels,), "int64"))
    cond = relax.Var("cond", relax.TensorType((), "bool"))
    params = [x, w, half, index, cond]
    builder = relax.BlockBuilder()
    gamma = relax.const(rng.uniform(0.5, 1.5, channels).astype("float32"))
    beta = relax.const(rng.normal(0, 0.1, channels).astype("float32"))
    weight = relax.const(rng.normal(0, 0.5, (channels, channels, 1, 1)).astype("float32"))
    with builder.function("main", params):
        scope = builder.dataflow() if not use_if else _NoScope()
        with scope:
            emit = builder.emit_output if not use_if else builder.emit
            local = builder.emit
            pool = [x]

            def pick():
                return pool[draw(st.integers(0, len(pool) - 1))]

            for name in names:
                a, b = pick(), pick()
                if name == "matmul":
                    value = local(op.matmul(a, w))
                elif name == "conv1x1":
                    four = local(op.reshape(a, (dim, channels, 1, 1)))
                    value = local(op.reshape(local(op.nn.conv2d(four, weight)), (dim, channels)))
                elif name == "attention":
                    four = local(op.reshape(a, (1, dim, 1, channels)))
                    value = local(op.reshape(local(op.nn.attention(four, four, four, scale=0.5)),
                                             (dim, channels)))
                elif name in ("add", "multiply", "subtract"):
                    value = local(getattr(op, name)(a, b))
                elif name in ("relu", "gelu"):
                    value = local(getattr(op.nn, name)(a))
                elif name in ("sigmoid", "tanh"):
                    value = local(getattr(op, name)(a))
                elif name == "exp_bounded":
                    value = local(op.exp(local(op.tanh(a))))
                elif name == "softmax":
                    value = local(op.nn.softmax(a, axis=-1))
                elif name == "log_softmax":
                    value = local(op.nn.log_softmax(a, axis=-1))
                elif name in ("sum_back", "mean_back"):
                    reduce = op.sum if name == "sum_back" else op.mean
                    value = local(op.add(a, local(reduce(a, axis=[1], keepdims=True))))
                elif name == "layer_norm":
                    value = local(op.nn.layer_norm(a, gamma, beta, axes=[-1]))
                elif name == "rms_norm":
                    value = local(op.nn.rms_norm(a, gamma, axes=[-1]))
                elif name == "concat_split":
                    both = local(op.concat([a, b], axis=1))
                    parts = local(op.split(both, 2, axis=1))
                    value = local(relax.TupleGetItem(parts, draw(st.integers(0, 1))))
                elif name == "reshape_back":
                    three = local(op.reshape(a, (dim, channels // 2, 2)))
                    value = local(op.reshape(three, (dim, channels)))
                elif name == "tuple_item":
                    pair = local(relax.Tuple([a, b]))
                    value = local(relax.TupleGetItem(pair, 1))
                elif name == "where":
                    positive = local(op.greater(a, relax.const(0.0, "float32")))
                    value = local(op.where(positive, a, b))
                elif name == "take":
                    value = local(op.take(a, index, axis=1))
                elif name == "float16_side":
                    low = local(op.add(half, local(op.astype(a, "float16"))))
                    value = local(op.astype(low, "float32"))
                else:  # if
                    value = builder.emit(relax.If(cond, _branch(builder, op.matmul(a, w)),
                                                  _branch(builder, op.nn.relu(b))))
                pool.append(value)
            outputs = [pool[-1]] + ([pick()] if draw(st.booleans()) else [])
            result = emit(relax.Tuple(outputs) if len(outputs) > 1 else outputs[0])
        builder.emit_func_output(result)
    mod = builder.get()
    inputs = [rng.uniform(-1, 1, (batch, channels)).astype("float32"),
              rng.normal(0, 0.5, (channels, channels)).astype("float32"),
              rng.uniform(-1, 1, (batch, channels)).astype("float16"),
              rng.integers(0, channels, channels).astype("int64"),
              np.array(draw(st.booleans()))]
    return Case(mod, batch, names, inputs)


class _NoScope:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _branch(builder, call):
    value = builder.normalize(call)
    var = relax.Var("branch", value.ty)
    return relax.SeqExpr([relax.BindingBlock([relax.VarBinding(var, value)])], var)


# ------------------------------------------------------------------------------ invariants
def _dtypes(ty):
    if isinstance(ty, relax.TensorType):
        return str(ty.dtype)
    if isinstance(ty, tvm.ir.type.TupleType):
        return tuple(_dtypes(f) for f in ty.fields)
    return None


def check_invariants(case: Case, dtype: str, target=None) -> tuple:
    """Convert ``case`` (with ``target``'s defaults) and assert what every conversion must
    keep. Returns (module, report)."""
    import relay_amp

    mod = case.mod
    before = tvm_ffi.structural_hash(mod)
    new, report = relay_amp.convert(mod, dtype, target=target)
    assert tvm_ffi.structural_hash(mod) == before, "input module changed"
    relax.analysis.well_formed(new)
    old_func, new_func = mod["main"], new["main"]
    assert [_dtypes(p.ty) for p in old_func.params] == [_dtypes(p.ty) for p in new_func.params]
    assert _dtypes(old_func.ret_ty) == _dtypes(new_func.ret_ty), "return dtypes changed"
    again, _ = relay_amp.convert(new, dtype, target=target)
    tvm.ir.assert_structural_equal(again, new)
    reported = {r.name for r in report.rows}
    original = set()
    relax.analysis.post_order_visit(old_func, lambda e: original.add(e.name)
                                    if isinstance(e, relax.Var) else None)
    from .stats import all_bindings

    for binding in all_bindings(new_func.body):
        value = binding.value
        if not isinstance(value, tvm.ir.Call) or not isinstance(value.op, tvm.ir.Op):
            continue
        if value.op.name == "relax.astype" or binding.var.name not in original:
            continue
        args = [a for a in value.args if isinstance(a.ty, relax.TensorType)]
        if any(str(a.ty.dtype) == dtype for a in args):
            assert binding.var.name in reported, \
                f"{binding.var.name} is low precision but unreported"
    return new, report


def check_numerics(case: Case, converted: tvm.IRModule, dtype: str) -> float:
    """Relative L2 error of ``converted`` against the float32 module on bounded inputs."""
    from ..builds.pipeline import compile_module
    from ..execution import agreement, run

    reference = run(compile_module(case.mod), case.inputs)
    outputs = run(compile_module(converted), case.inputs)
    result = agreement(reference, outputs)
    bound = {"float16": 2e-2, "bfloat16": 1e-1}[dtype]
    assert result.nonfinite == 0, f"NaN/Inf in {case.ops}"
    assert result.relative_l2 <= bound, f"error {result.relative_l2:.3g} > {bound} for {case.ops}"
    return result.relative_l2
