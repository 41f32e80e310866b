"""Inference batch_norm as elementwise ops, before legalization, so that FuseOps computes it in
the kernel of the convolution it follows.

TVM's CPU pipeline legalizes ``relax.nn.batch_norm`` into a kernel of its own, which FuseOps
does not fuse with the convolution before it: one more pass over the activations, in memory.
With constant parameters (an imported model's), it becomes ``x * scale + shift``, the two
per-channel constants computed here with numpy (``gamma / sqrt(var + eps)`` and ``beta - mean *
scale``, in float64, rounded once), as ONNX Runtime folds it; with parameters that are inputs,
the elementwise ops of TVM's ``DecomposeOpsForInference``. ``CanonicalizeBindings`` then makes
the tuple item the model reads the result itself, so that it joins the convolution's kernel with
what follows (a relu, a clip). Folding the constants here instead of with TVM's ``FoldConstant``
keeps the build from compiling a kernel per folded constant.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from ..execution import with_function
from ..relax_utils import GenericConst

BATCH_NORM = "relax.nn.batch_norm"


def _is_batch_norm(expr) -> bool:
    return (isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op)
            and expr.op.name == BATCH_NORM)


def _batch_norms(func) -> list:
    found = []
    relax.analysis.post_order_visit(
        func, lambda expr: found.append(expr) if _is_batch_norm(expr) else None)
    return found


@relax.expr_functor.mutator
class _ConstantBatchNorms(relax.PyExprMutator):
    """Each inference batch_norm whose four parameters are constants as ``x * scale + shift``
    (the tuple it returns keeps its moving mean and variance)."""

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if not _is_batch_norm(call) or bool(call.attrs.training):
            return call
        data, *parameters = call.args
        if not all(type(p) is GenericConst for p in parameters):
            return call
        gamma, beta, mean, var = (p.value.numpy().astype("float64") for p in parameters)
        attrs = call.attrs
        gamma = gamma if attrs.scale else np.ones_like(gamma)
        beta = beta if attrs.center else np.zeros_like(beta)
        scale = gamma / np.sqrt(var + float(attrs.epsilon))
        shift = beta - mean * scale
        ndim = data.ty.ndim
        shape = [1] * ndim
        shape[int(attrs.axis) % ndim] = -1
        dtype = str(data.ty.dtype)
        scaled = self.builder_.emit(relax.op.multiply(
            data, relax.const(scale.reshape(shape).astype(dtype), dtype)), "bn_scaled")
        shifted = self.builder_.emit(relax.op.add(
            scaled, relax.const(shift.reshape(shape).astype(dtype), dtype)), "bn")
        return relax.Tuple([shifted, call.args[3], call.args[4]])


def inference_batch_norms() -> tvm.transform.Pass:
    """A pass: in each Relax function whose batch_norms are all inference ones
    (``training=False``), every batch_norm as elementwise ops. A training batch_norm computes
    its batch's statistics, which ``DecomposeOpsForInference`` would replace by the moving
    ones, so a function with one is left as it is.

    Returns
    -------
    tvm.transform.Pass
    """

    @tvm.transform.module_pass(opt_level=0, name="relay_amp.InferenceBatchNorms")
    def _decompose(mod, _context):
        decomposed = mod
        for gvar, func in list(mod.functions_items()):
            if not isinstance(func, relax.Function):
                continue
            norms = _batch_norms(func)
            if not norms or any(bool(call.attrs.training) for call in norms):
                continue
            func = _ConstantBatchNorms().visit_expr(func)
            decomposed = with_function(decomposed, gvar.name_hint, func)
            if _batch_norms(func):
                decomposed = relax.transform.DecomposeOpsForInference(gvar.name_hint)(decomposed)
        if decomposed.same_as(mod):
            return mod
        return relax.transform.CanonicalizeBindings()(decomposed)

    return _decompose
