"""Constants computed at build time in numpy: a weight's casts, transposes and reshapes.

TVM's ``FoldConstant`` compiles a kernel with LLVM and runs it for every op whose inputs are
all constants: on yolov8n_320 for x86, 63 reshapes of biases to ``(1, C, 1, 1)`` in TVM's own
pipeline (4.2 s of its 5.1 s of Relax passes), and 63 transposes more once its convolutions are
NHWC. :func:`numpy_layout_constants` computes reshapes and transposes of constants in numpy
instead, before legalization; :func:`constant_value` reads a weight through them (and through
casts) for the passes that pack weights.
"""

from __future__ import annotations

import tvm


def _astype(value, call):
    import ml_dtypes
    import numpy as np

    dtype = str(call.attrs.dtype)
    return value.astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype))


def _permute(value, call):
    import numpy as np

    axes = call.attrs.axes
    return np.transpose(value, None if axes is None else [int(a) for a in axes])


def _reshape(value, call):
    return value.reshape([int(n) for n in call.ty.shape])


#: What a weight may pass through between its constant and the op, computed here with numpy:
#: the casts the pass inserts (a float16 TFLite weight is widened, then narrowed to bfloat16),
#: ``ConvertLayout``'s transpose and the frontends' reshapes (TFLite's depthwise weights).
FOLDED = {"relax.astype": _astype, "relax.permute_dims": _permute, "relax.reshape": _reshape}


def constant_value(mutator, expr, hops: int = 8):
    """The numpy value of ``expr`` where it is a constant or :data:`FOLDED` ops of one, through
    the variables ``mutator`` (a ``relax.PyExprMutator``) has bound them to; else None."""
    from tvm import relax

    while isinstance(expr, relax.Var) and hops:
        expr, hops = mutator.lookup_binding(expr), hops - 1
    if isinstance(expr, tvm.ir.expr.GenericConst):
        return expr.value.numpy()
    if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) \
            and expr.op.name in FOLDED and hops:
        value = constant_value(mutator, expr.args[0], hops - 1)
        return None if value is None else FOLDED[expr.op.name](value, expr)
    return None


def numpy_layout_constants() -> tvm.transform.Pass:
    """The Relax pass: every ``reshape`` and ``permute_dims`` of a constant (through the
    variables bound to it) replaced by the constant numpy computes, and the bindings left
    unread removed. Casts are left to TVM (a bfloat16 constant has no numpy dtype TVM reads).

    Returns
    -------
    tvm.transform.Pass
    """
    from tvm import relax

    from ..relax_utils import TVM_ERRORS, mutate_functions

    layouts = {tvm.ir.Op.get(name) for name in ("relax.reshape", "relax.permute_dims")}

    @relax.expr_functor.mutator
    class Folded(relax.PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            if isinstance(call.op, tvm.ir.Op) and call.op in layouts:
                try:
                    value = constant_value(self, call)
                except TVM_ERRORS:  # a symbolic shape: TVM's own folding, or none
                    value = None
                if value is not None and str(value.dtype) != "bfloat16":
                    return relax.const(value)
            return call

    @tvm.transform.module_pass(opt_level=0, name="relay_amp.numpy_layout_constants")
    def _fold(mod, context):
        return relax.transform.DeadCodeElimination()(mutate_functions(Folded(mod)))

    return _fold


__all__ = ["FOLDED", "constant_value", "numpy_layout_constants"]
