"""Convolutions in NHWC on aarch64: the layout :mod:`relay_amp.builds.neon_tiles`' register
tile reads.

A convolution in NCHW (GluonCV's, PyTorch's exports) reduces over input channels that lie a
whole feature map apart, and its lanes are output pixels: its weight is the scalar operand, and
its innermost axis is a 3-wide kernel row. In NHWC with HWIO weights the lanes are output
channels (contiguous in the weight) and each output pixel's input channels are contiguous: the
register tile of XNNPACK's and ONNX Runtime's kernels. TVM's ``ConvertLayout`` rewrites the
convolutions and the elementwise ops around them, transposing only where a layout meets an op
that keeps its own; the weights are then transposed once, at build time.
"""

from __future__ import annotations

import tvm

from ..relax_utils import TVM_ERRORS, last_line, mutate_functions

#: What ``relax.transform.ConvertLayout`` asks for: NHWC data, HWIO weights.
LAYOUTS = {"relax.nn.conv2d": ["NHWC", "HWIO"]}


def nhwc_convolutions(rule_log=None) -> tvm.transform.Pass:
    """The pass: convolutions in :data:`LAYOUTS`, weights transposed at build time.

    Parameters
    ----------
    rule_log : relay_amp.builds.schedule_rules.RuleLog, optional
        Where TVM's ``ConvertLayout`` raises, the module keeps its layouts and the log says so.

    Returns
    -------
    tvm.transform.Pass
    """
    from tvm import relax

    @tvm.transform.module_pass(opt_level=0, name="relay_amp.nhwc_convolutions")
    def _convert(mod, context):
        before = _followers(mod)
        try:  # on a copy: inside a pass TVM rewrites the module it is given in place
            converted = relax.transform.ConvertLayout(LAYOUTS)(
                tvm.IRModule(dict(mod.functions_items()), attrs=mod.attrs))
        except TVM_ERRORS as err:  # TVM's own errors: the convolutions keep their layout
            if rule_log is not None:
                rule_log.raised("<module>", "ConvertLayout", last_line(err))
            return mod
        unlowered = sorted(op for op, seen in _followers(converted).items()
                           if seen != before.get(op))
        if unlowered:  # an op that follows its input's layout, with no NHWC kernel in TVM
            if rule_log is not None:
                rule_log.raised("<module>", "ConvertLayout", f"{', '.join(unlowered)} would "
                                "become NHWC, which TVM does not lower: NCHW kept")
            return mod
        return _transpose_constants(converted)

    return _convert


def _followers(mod) -> dict:
    """The ``data_layout`` values of each op other than the convolutions of :data:`LAYOUTS`.
    One whose layout the conversion changes follows its input (a transposed convolution), and
    TVM 0.27 has no NHWC kernel for it: "CodeGenVM cannot emit this Relax operator"
    (ppocrv4_det on aarch64)."""
    from tvm import relax

    found = {}

    def visit(expr):
        if (isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op)
                and expr.op.name not in LAYOUTS and hasattr(expr.attrs, "data_layout")):
            found.setdefault(expr.op.name, set()).add(str(expr.attrs.data_layout))

    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return found


def _transpose_constants(mod):
    """``mod`` with each ``permute_dims`` of a constant (a weight ``ConvertLayout`` transposed)
    replaced by the transposed constant: numpy's transpose at build time, where TVM's
    ``FoldConstant`` would compile and run a kernel on the host per weight (8.6 of 14.6 s
    building mobilenetv2_1.0)."""
    import numpy as np
    from tvm import relax

    permute = tvm.ir.Op.get("relax.permute_dims")

    @relax.expr_functor.mutator
    class Transposed(relax.PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            if call.op.same_as(permute) and isinstance(call.args[0], tvm.ir.expr.Constant):
                axes = None if call.attrs.axes is None else [int(a) for a in call.attrs.axes]
                return relax.const(np.ascontiguousarray(
                    np.transpose(call.args[0].value.numpy(), axes)))
            return call

    return mutate_functions(Transposed(mod))


__all__ = ["LAYOUTS", "nhwc_convolutions"]
