"""PReLU as the elementwise op it is, where an importer flattened it.

TVM's TFLite frontend writes a PReLU of a ``(1, H, W, C)`` tensor as a PReLU of its flattening,
with the slope broadcast to the whole tensor and flattened too, and the result reshaped back:
``reshape(prelu(reshape(x, [n]), reshape(broadcast_to(slope, shape), [n]), axis=0), shape)``
(in a converted model, cast before the last reshape).
The reshapes keep it out of the convolution's kernel before it (a convolution fuses the
elementwise ops after it, not a reshape), and TVM's own PReLU kernel runs a scalar loop with a
branch an element and a slope loaded per element: on MediaPipe's landmark models about a
fifth of relay_amp's aarch64 instructions. :func:`elementwise_prelu` writes it as the PReLU
of ``x`` itself over its last axis, the slope one value a channel: the convolution fuses it,
and its write-back computes it on the tile in registers (``relay_amp.builds.cpu_pipeline``).
The same values: the same select and product.
"""

from __future__ import annotations

import tvm


def _pattern():
    from tvm.relax.dpl import is_const, is_op, wildcard

    x, slope = wildcard(), is_const()
    flat_x = is_op("relax.reshape")(x, wildcard())
    stored = slope | is_op("relax.astype")(slope)  # a model that stores its weights in float16
    flat_slope = is_op("relax.reshape")(is_op("relax.broadcast_to")(stored, wildcard()),
                                        wildcard())
    prelu = is_op("relax.nn.prelu")(flat_x, flat_slope)
    cast = is_op("relax.astype")(prelu)  # a converted model casts it before the reshape
    return is_op("relax.reshape")(prelu | cast, wildcard()), x, slope


def elementwise_prelu() -> tvm.transform.Pass:
    """The pass: each flattened PReLU of a module (above) written on the unflattened tensor,
    where the result's shape is the input's and the slope is one value per channel (the last
    axis)."""
    from tvm import relax
    from tvm.relax.dpl import rewrite_call

    pattern, x, slope = _pattern()

    def rewrite(call, matches):
        value, weight = matches[x], matches[slope].value.numpy()
        weight = weight.astype(str(value.ty.dtype))  # exact: a float16 slope read as float32
        shape = [int(d) for d in call.ty.shape]
        if [int(d) for d in value.ty.shape] != shape or not shape \
                or weight.size != shape[-1]:
            return call  # a slope per element, not per channel: TVM's own kernel
        prelu = relax.op.nn.prelu(value, relax.const(weight.reshape(shape[-1])),
                                  axis=len(shape) - 1)
        dtype = str(call.ty.dtype)
        return prelu if dtype == str(value.ty.dtype) else relax.op.astype(prelu, dtype)

    @tvm.transform.module_pass(opt_level=0, name="relay_amp.elementwise_prelu")
    def _rewrite(mod, context):
        functions = {gvar: rewrite_call(pattern, rewrite, func)
                     if isinstance(func, relax.Function) else func
                     for gvar, func in mod.functions_items()}
        return tvm.IRModule(functions, attrs=mod.attrs)

    return _rewrite


__all__ = ["elementwise_prelu"]
