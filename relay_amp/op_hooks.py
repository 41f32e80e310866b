"""The per-op hooks: what a few ops do differently from the generic algorithm (stated in
:mod:`relay_amp.transform`), kept with the op's record in :mod:`relay_amp.op_registry` as TVM
keeps ``FInferMixedPrecision`` with its ops.

Every hook takes one :class:`OpSite`, the narrow view of one call binding that the stage
calling it builds, and returns a value; none sees the planner or the rewriter.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import tvm
import tvm_ffi
from tvm import relax
from tvm.ir import Call

from .kinds import Mode
from .reasons import Reason
from .relax_utils import new_call, op_name, replace_attrs, tensor_dtype


@dataclass(frozen=True)
class OpSite:
    """What a hook may read of one call binding.

    Attributes
    ----------
    call : tvm.ir.Call
        The original call.
    low : str
        The low-precision dtype.
    mode : Mode
        The binding's mode so far (final in step 3).
    demand : frozenset of str
        The dtypes its consumers want (step 2 on; empty in step 1).
    can_low : bool
        Whether its value can exist in low precision without losing float32 protection.
    f32_ready : bool
        Whether its float32 value exists without a cast.
    producer : callable
        ``expr -> Call | None``: the call bound to a var of the function.
    integer_input : callable
        ``expr -> str | None``: the integer dtype a parameter is fed in (``input_dtypes``).
    block : int
        Step 3, for :attr:`~relay_amp.op_registry.OpInfo.blocked_sum`: the products per block
        asked (``Policy.set_accumulation_block``); ``call`` is then the call as the rewrite
        makes it, operands in the low dtype and typed.
    """

    call: Call
    low: str
    mode: Mode = Mode.ORIGINAL
    demand: frozenset = frozenset()
    can_low: bool = False
    f32_ready: bool = False
    producer: Callable = lambda expr: None
    integer_input: Callable = lambda expr: None
    block: int = 0


# ------------------------------------------------------------------ quantize, dequantize
def quantize_identity(site: OpSite):
    """quantize(x) of an input already fed as those integers (``input_dtypes``), or of
    dequantize(q) with the same parameters, returns the integers unchanged: ``(reason, the
    expression whose integers it returns)``, else None."""
    call = site.call
    data, out_dtype = call.args[0], str(call.attrs.out_dtype)
    declared = site.integer_input(data)
    if declared is not None:
        if declared != out_dtype:
            raise ValueError(
                f"input {data.name!r} is declared {declared} in input_dtypes, but the "
                f"quantize that reads it produces {out_dtype}: declare it {out_dtype}")
        return Reason.of("identity_input", input=data.name, dtype=out_dtype), data
    producer = site.producer(data)
    if (isinstance(producer, Call) and op_name(producer) == "dequantize"
            and tensor_dtype(producer.args[0]) == out_dtype
            and int(producer.attrs.axis) == int(call.attrs.axis)
            and all(tvm_ffi.structural_equal(a, b)
                    for a, b in zip(producer.args[1:3], call.args[1:3]))):
        return Reason.of("identity_requantize"), producer.args[0]
    return None


def quantize_mode(site: OpSite):
    """Reads low precision when its input can be low and is not already float32 (or comes
    from a dequantize, which then writes low precision)."""
    producer = site.producer(site.call.args[0])
    from_dequantize = isinstance(producer, Call) and op_name(producer) == "dequantize"
    if site.can_low and (not site.f32_ready or from_dequantize):
        return Mode.LOW, Reason.of("quantize_reads_low", dtype=site.low)
    return Mode.ORIGINAL, Reason.of("quantize_reads_float32")


def dequantize_mode(site: OpSite):
    """Writes low precision when every consumer wants it."""
    if site.low in site.demand and "float32" not in site.demand:
        return Mode.LOW, Reason.of("dequantize_low", dtype=site.low)
    if site.demand:
        return Mode.ORIGINAL, Reason.of("dequantize_float32")
    return Mode.ORIGINAL, Reason.of("unread")


# ------------------------------------------------------------------ attention
def attention_pin(site: OpSite):
    """TVM 0.27 legalizes attention with an explicit scale by multiplying the scores with a
    float32 constant, so its result becomes float32 whatever the inputs; a cast (a no-op at
    this level) brings the legalized result back to the declared dtype."""
    if site.mode != Mode.LOW or getattr(site.call.attrs, "scale", None) is None:
        return None
    return Reason.of("attention_pinned", dtype=site.low)


# ------------------------------------------------------------------ batch_norm
def inference_batch_norm(site: OpSite) -> bool:
    """Is this batch_norm an inference one (``decompose_batch_norm`` decomposes it)?"""
    return not bool(site.call.attrs.training)


# ------------------------------------------------------------------ accumulation in blocks
def matmul_blocks(site: OpSite):
    """matmul(a, b) summed in blocks (``site.block`` products in the low dtype, the blocks in
    float32): ``a`` (..., M, K) as (..., K/B, M, B), ``b`` (..., K, N) as (..., K/B, B, N), one
    batched matmul into the low dtype, its K/B partial products summed in float32. ``(expr,
    reason)``; ``expr`` None where the call does not split."""
    a, b = site.call.args
    a_shape, b_shape = _shape(a), _shape(b)
    if a_shape is None or b_shape is None or len(a_shape) < 2 or len(b_shape) < 2:
        return _refused(site, "an operand is not a matrix (or a stack of them) of known shape")
    extent = a_shape[-1]
    if not isinstance(extent, int):
        return _refused(site, "its reduction extent is symbolic")
    if extent <= site.block:
        return _one_block(site, extent)
    if extent % site.block:
        return _refused(site, f"its reduction of {extent} is no multiple of the block")
    blocks, rank = extent // site.block, len(a_shape)
    rows = relax.op.permute_dims(
        relax.op.reshape(a, [*a_shape[:-1], blocks, site.block]),
        [*range(rank - 2), rank - 1, rank - 2, rank])
    columns = relax.op.reshape(b, [*b_shape[:-2], blocks, site.block, b_shape[-1]])
    partial = relax.op.matmul(rows, columns, out_dtype=site.low)
    return (relax.op.sum(relax.op.astype(partial, "float32"), axis=[-3]),
            _made(site, site.block, blocks))


def conv_blocks(site: OpSite):
    """A convolution summed in blocks: each group's input channels split into runs of ``c``
    (the most that keep ``c`` times the window within ``site.block`` and divide the group's
    channels), one grouped convolution into the low dtype with a group per run, its runs'
    partial outputs summed in float32. Any layout without sub-blocked channels (``NCHW``/
    ``OIHW``, TFLite's ``NHWC``/``OHWI``, ...). ``(expr, reason)``."""
    call = site.call
    attrs, (data, weight) = call.attrs, call.args[:2]
    data_layout, kernel_layout = str(attrs.data_layout), str(attrs.kernel_layout)
    out_layout = str(attrs.out_layout) or data_layout
    if not all(layout.isupper() for layout in (data_layout, kernel_layout, out_layout)):
        return _refused(site, f"its layouts {data_layout}/{kernel_layout} split channels into "
                              "sub-blocks")
    kernel, out = _shape(weight), _shape(call)
    if kernel is None or out is None or not all(isinstance(d, int) for d in kernel):
        return _refused(site, "its weight shape is not known")
    order = [kernel_layout.index("O"), kernel_layout.index("I"),
             *(i for i, axis in enumerate(kernel_layout) if axis not in "OI")]
    kernel = [kernel[i] for i in order]  # as OI followed by the window
    channels, window, groups = kernel[1], math.prod(kernel[2:]), int(attrs.groups)
    if channels * window <= site.block:
        return _one_block(site, channels * window)
    if window > site.block:
        return _refused(site, f"its window of {window} products is larger than the block")
    run = max(c for c in range(1, site.block // window + 1) if channels % c == 0)
    runs, per_group, spatial = channels // run, kernel[0] // groups, len(kernel) - 2
    weight = _permuted(weight, order)
    weight = relax.op.reshape(weight, [groups, per_group, runs, run, *kernel[2:]])
    weight = relax.op.permute_dims(weight, [0, 2, 1, *range(3, 4 + spatial)])
    weight = relax.op.reshape(weight, [groups * runs * per_group, run, *kernel[2:]])
    weight = _permuted(weight, [order.index(i) for i in range(len(order))])
    partial = _conv_like(call, data, weight, groups * runs, site.low)
    channel = out_layout.index("C")
    partial = relax.op.reshape(partial, [*out[:channel], groups, runs, per_group,
                                         *out[channel + 1:]])
    total = relax.op.sum(relax.op.astype(partial, "float32"), axis=[channel + 1])
    return relax.op.reshape(total, out), _made(site, run * window, runs)


def _permuted(tensor, axes: list):
    return tensor if axes == sorted(axes) else relax.op.permute_dims(tensor, axes)


_CONVOLUTIONS = {"nn.conv1d": relax.op.nn.conv1d, "nn.conv2d": relax.op.nn.conv2d,
                 "nn.conv3d": relax.op.nn.conv3d}


def _conv_like(call, data, weight, groups: int, out_dtype: str):
    attrs = call.attrs
    return _CONVOLUTIONS[op_name(call)](
        data, weight, strides=list(attrs.strides), padding=list(attrs.padding),
        dilation=list(attrs.dilation), groups=groups, data_layout=str(attrs.data_layout),
        kernel_layout=str(attrs.kernel_layout), out_layout=str(attrs.out_layout) or None,
        out_dtype=out_dtype)


def _one_block(site: OpSite, products: int):
    """A reduction no longer than the block: the whole sum in the low dtype, widened."""
    call = site.call
    low = new_call(call.op, call.args, replace_attrs(call.attrs, out_dtype=site.low),
                   call.ty_args)
    return relax.op.astype(low, "float32"), _made(site, products, 1)


def _made(site: OpSite, products: int, blocks: int) -> Reason:
    return Reason.of("blocked_accumulation", dtype=site.low, block=products, blocks=blocks)


def _refused(site: OpSite, why: str):
    return None, Reason.of("blocked_accumulation_refused", block=site.block, why=why)


def _shape(expr) -> list | None:
    """The extents of a tensor expression (ints where known), or None."""
    shape = getattr(expr.ty, "shape", None)
    if not isinstance(shape, relax.ShapeExpr):
        return None
    return [int(d) if isinstance(d, tvm.tirx.IntImm) else d for d in shape.values]
