"""Constants computed at build time in numpy: a weight's casts, transposes and reshapes.

TVM's ``FoldConstant`` compiles a kernel with LLVM and runs it for every op whose inputs are
all constants: on yolov8n_320 for x86, 63 reshapes of biases to ``(1, C, 1, 1)`` in TVM's own
pipeline (4.2 s of its 5.1 s of Relax passes), and 63 transposes more once its convolutions are
NHWC. :func:`numpy_layout_constants` computes reshapes and transposes of constants in numpy
instead, before legalization; :func:`constant_value` reads a weight through them (and through
casts) for the passes that pack weights. :func:`numpy_elementwise_constants` does the same for
the elementwise ops of :data:`ELEMENTWISE` whose arguments are all constants: ONNX's ``Clip``
comes out of TVM's importer as ``isnan`` and ``where`` of its bounds, 70 kernels that
``FoldConstant`` compiled for mobilenetv2_1.0, 9 of its 11 s of Relax passes; a float16 TFLite
model's weights are widened by casts.

A weight is read without a copy (:func:`array`) and a computed one is copied once
(:func:`const`): ``Tensor.numpy()`` copies, and so does ``relax.const`` of a numpy array, which
for vgg16's 411 MB first dense weight took 1.4 and 0.5 s of a 17.6 s build.
"""

from __future__ import annotations

import tvm

#: Where TVM's tensors start (``kAllocAlignment``); its DLPack import refuses other addresses.
ALIGNMENT = 64


def array(constant):
    """The numpy value of a Relax constant (or a ``tvm.runtime.Tensor``), read-only, sharing
    its memory where DLPack can say its dtype (not bfloat16, which is copied)."""
    import numpy as np

    tensor = getattr(constant, "value", constant)
    try:
        value = np.from_dlpack(tensor)
    except (BufferError, RuntimeError, TypeError):  # a dtype DLPack's numpy side lacks
        return tensor.numpy()
    value.flags.writeable = False  # the input module's weight: a build never writes it
    return value


def _aligned(shape, dtype):
    """An empty numpy array of ``shape`` starting at an address TVM would give it; None for a
    dtype DLPack's numpy side lacks (bfloat16)."""
    import numpy as np

    try:
        np.empty(0, dtype).__dlpack__()
    except (BufferError, TypeError):
        return None
    nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    buffer = np.empty(nbytes + ALIGNMENT, np.uint8)
    start = -buffer.ctypes.data % ALIGNMENT
    return buffer[start:start + nbytes].view(dtype).reshape(shape)


def const(value):
    """A Relax constant of the numpy ``value`` (a strided view too), copied once: into memory
    aligned as TVM's own, which the constant then holds without a second copy."""
    import numpy as np
    from tvm import relax

    value = np.asarray(value)
    aligned = _aligned(value.shape, value.dtype)
    if aligned is None:  # bfloat16: TVM's own copy
        return relax.const(value)
    _copy(aligned, value)
    return relax.const(tvm.runtime.from_dlpack(aligned))


def concatenated(values, offsets, size: int):
    """A 1-d Relax constant of ``size`` elements holding each of ``values`` (numpy arrays of one
    dtype) flattened from its offset in ``offsets``, zeros between them; each copied once."""
    import numpy as np
    from tvm import relax

    dtype = values[0].dtype
    aligned = _aligned((size,), dtype)
    flat = np.empty(size, dtype) if aligned is None else aligned  # bfloat16: TVM copies it
    ends = [offset + value.size for value, offset in zip(values, offsets)]
    for start, end in zip(ends, [*offsets[1:], size]):
        flat[start:end] = 0
    for value, offset in zip(values, offsets):
        flat[offset:offset + value.size] = value.reshape(-1)
    return relax.const(flat if aligned is None else tvm.runtime.from_dlpack(flat))


#: Elements a block of :func:`_copy` reads (1 MB of float32), and its run along the last axis.
COPY_BLOCK, COPY_RUN = 1 << 18, 64


def _copy(out, value):
    """``out[...] = value`` for a transposed ``value``, in blocks over the axis ``value`` is
    contiguous along and ``out``'s last: numpy's own copy of vgg16's 411 MB transposed dense
    weight took 1.3-2.1 s, these blocks 0.3 s (each block's rows stay in cache)."""
    import itertools

    import numpy as np

    last = value.ndim - 1
    strides = [abs(s) if n > 1 else np.inf for s, n in zip(value.strides, value.shape)]
    along = int(np.argmin(strides)) if value.ndim else last
    if along == last or value.size <= COPY_BLOCK:
        np.copyto(out, value)
        return
    steps = list(value.shape)
    steps[last] = min(value.shape[last], COPY_RUN)
    steps[along] = max(1, COPY_BLOCK // steps[last])
    for corner in itertools.product(*(range(0, n, s) for n, s in zip(value.shape, steps))):
        index = tuple(slice(c, c + s) for c, s in zip(corner, steps))
        out[index] = value[index]


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


#: The layout ops of :data:`FOLDED`: what a value keeps bit for bit.
LAYOUT_OPS = {"relax.permute_dims": _permute, "relax.reshape": _reshape}

#: What a weight may pass through between its constant and the op, computed here with numpy:
#: the casts the pass inserts (a float16 TFLite weight is widened, then narrowed to bfloat16),
#: ``ConvertLayout``'s transpose and the frontends' reshapes (TFLite's depthwise weights).
FOLDED = {"relax.astype": _astype, **LAYOUT_OPS}


def constant_value(mutator, expr, hops: int = 8, folded=None):
    """The numpy value of ``expr`` where it is a constant or ``folded`` ops (by default
    :data:`FOLDED`) of one, through the variables ``mutator`` (a ``relax.PyExprMutator``) has
    bound them to; else None."""
    from tvm import relax

    while isinstance(expr, relax.Var) and hops:
        expr, hops = mutator.lookup_binding(expr), hops - 1
    if isinstance(expr, tvm.ir.expr.GenericConst):
        return array(expr)
    folded = FOLDED if folded is None else folded
    if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) \
            and expr.op.name in folded and hops:
        value = constant_value(mutator, expr.args[0], hops - 1, folded)
        return None if value is None else folded[expr.op.name](value, expr)
    return None


def _elementwise(function, floats_only: bool = False):
    """``function`` of the arguments' values as :data:`ELEMENTWISE` calls it; with
    ``floats_only``, None for integer arguments (numpy's integer division, shifts and overflow
    are not TIR's)."""
    import numpy as np

    def computed(values, _call):
        if floats_only and not all(np.issubdtype(v.dtype, np.floating) for v in values):
            return None
        return function(*values)

    return computed


def _cast(values, call):
    # bfloat16's rounding is TVM's, as the layout pass leaves it
    if "bfloat16" in (str(call.attrs.dtype), str(values[0].dtype)):
        return None
    return _astype(values[0], call)


def _elementwise_ops() -> dict:
    import numpy as np

    exact = {"relax.isnan": np.isnan, "relax.isinf": np.isinf, "relax.isfinite": np.isfinite,
             "relax.logical_not": np.logical_not, "relax.logical_and": np.logical_and,
             "relax.logical_or": np.logical_or, "relax.equal": np.equal, "relax.less": np.less,
             "relax.less_equal": np.less_equal, "relax.greater": np.greater,
             "relax.greater_equal": np.greater_equal}
    rounded = {"relax.add": np.add, "relax.subtract": np.subtract,
               "relax.multiply": np.multiply, "relax.divide": np.divide,
               "relax.negative": np.negative, "relax.abs": np.abs}
    return {"relax.astype": _cast, "relax.where": _elementwise(np.where),
            **{name: _elementwise(f) for name, f in exact.items()},
            **{name: _elementwise(f, floats_only=True) for name, f in rounded.items()}}


#: Elementwise ops computed in numpy where every argument is a constant: ordered comparisons,
#: tests and selections, which are exact, and float arithmetic that IEEE rounds once, as the
#: kernel TVM would compile does (no transcendental function: numpy's ``exp`` is not LLVM's).
#: Not here, because numpy's value differs from TVM's kernel's: ``not_equal`` (TVM's is false
#: on a NaN), ``maximum`` and ``minimum`` (numpy's keep a NaN). A cast to or from bfloat16 is
#: left to TVM, whose rounding it is.
ELEMENTWISE = _elementwise_ops()


def numpy_elementwise_constants() -> tvm.transform.Pass:
    """The Relax pass: every call of an op of :data:`ELEMENTWISE` whose arguments are all
    constants (through the variables bound to them) replaced by the constant numpy computes,
    where its shape and dtype are the call's; the bindings left unread removed.

    Returns
    -------
    tvm.transform.Pass
    """
    import numpy as np
    from tvm import relax

    from ..relax_utils import mutate_functions

    ops = {tvm.ir.Op.get(name): compute for name, compute in ELEMENTWISE.items()}

    @relax.expr_functor.mutator
    class Computed(relax.PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            compute = ops.get(call.op) if isinstance(call.op, tvm.ir.Op) else None
            if compute is None or not isinstance(call.ty, relax.TensorType):
                return call
            # through the variables bound to constants only: no op computed on the way
            values = [constant_value(self, arg, folded={}) for arg in call.args]
            if any(value is None for value in values):
                return call
            with np.errstate(all="ignore"):  # a division by zero is inf, as in the kernel
                value = compute(values, call)
            if value is None:
                return call
            value = np.asarray(value)
            shape = call.ty.shape
            if shape is None or any(not isinstance(n, tvm.tirx.IntImm) for n in shape) \
                    or value.shape != tuple(int(n) for n in shape) \
                    or str(value.dtype) != str(call.ty.dtype):
                return call
            return const(value)

    @tvm.transform.module_pass(opt_level=0, name="relay_amp.numpy_elementwise_constants")
    def _compute(mod, context):
        # each computed constant in place of the variable bound to it, where the op reads it
        return tvm.transform.Sequential([relax.transform.CanonicalizeBindings(),
                                         relax.transform.DeadCodeElimination()])(
            mutate_functions(Computed(mod)))

    return _compute


def numpy_layout_constants() -> tvm.transform.Pass:
    """The Relax pass: every ``reshape`` and ``permute_dims`` of a constant (through the
    variables bound to it) replaced by the constant numpy computes, and the bindings left
    unread removed. A cast to bfloat16 on the way is left to TVM, whose rounding it is; a
    bfloat16 weight's own transpose is folded (the layout pass leaves the weights' transposes
    here).

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
                if value is not None and str(value.dtype) == "bfloat16":
                    value = constant_value(self, call, folded=LAYOUT_OPS)  # None through a cast
                if value is not None:
                    return const(value)
            return call

    @tvm.transform.module_pass(opt_level=0, name="relay_amp.numpy_layout_constants")
    def _fold(mod, context):
        return relax.transform.DeadCodeElimination()(mutate_functions(Folded(mod)))

    return _fold


__all__ = ["ALIGNMENT", "ELEMENTWISE", "FOLDED", "LAYOUT_OPS", "array", "concatenated", "const",
           "constant_value", "numpy_elementwise_constants", "numpy_layout_constants"]
