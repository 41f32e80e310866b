"""The function signature (the algorithm is stated in :mod:`relay_amp.transform`): which
float32 parameters the low dtype cannot hold (calibration), and the one cast of an integer
input at the top of the function."""

from __future__ import annotations

import numpy as np
from tvm import relax
from tvm.ir import Call
from tvm.relax import (
    Function,
    SeqExpr,
)

from .dtypes import OutOfRange, is_floating, max_finite, out_of_range_reason
from .dtypes import short_dtype as _short
from .op_registry import op_info
from .relax_utils import (
    leaves_of,
    op_name,
    tensor_dtype,
)

#: Reason code of a function parameter or result kept float32 although the signature asked for
#: the low-precision dtype (``keep_io_dtypes=False``, ``low_precision_inputs``): calibration, or a
#: constant, shows a value that dtype cannot hold. ``Policy(strict_io_dtypes=True)`` raises instead.
FP32_BOUNDARY = "fp32_boundary"


def parameter_problems(func: Function, params, observed, margin: float, low: str) -> dict:
    """Float32 parameters whose calibrated values the low dtype cannot hold: measured
    directly, or (a calibration without parameters) through a consumer whose result holds
    only their values. Keyed by the parameter's handle."""
    if observed is None:
        return {}
    problems = {}
    floats = {p.__chandle__(): p for p in params if tensor_dtype(p) == "float32"}
    for param in floats.values():
        largest = observed(param)
        problem = None if largest is None else out_of_range_reason(largest, low, margin)
        if problem is not None:
            problems[param.__chandle__()] = problem
    if not isinstance(func.body, SeqExpr) or len(problems) == len(floats):
        return problems
    for block in func.body.blocks:
        for binding in block.bindings:
            value = binding.value
            op = op_name(value) if type(value) is Call else None
            if op_info(op).values is None or tensor_dtype(binding.var) != "float32":
                continue
            leaves = [leaf for arg in value.args for leaf in leaves_of(arg)
                      if is_floating(tensor_dtype(leaf))]
            if len(leaves) != 1 or leaves[0].__chandle__() not in floats:
                continue
            param = floats[leaves[0].__chandle__()]
            largest = observed(binding.var)
            if param.__chandle__() in problems or largest is None or (
                    largest * margin <= max_finite(low)):
                continue
            problem = out_of_range_reason(largest, low, margin)
            problems[param.__chandle__()] = OutOfRange(
                f"its consumer {binding.var.name} ({op}, whose values are {param.name}'s) "
                f"has {problem}", problem.magnitude, problem.bound)
    return problems


def integer_input(builder, param, int_param, normalization, low: str, float32_readers: bool):
    """``(value, name, note)``: the cast of an integer input, once, straight to the low-precision
    dtype, folding in its normalization: one kernel reads the integers, applies
    ``x * scale + offset`` in float32 registers and writes the low-precision dtype, so the
    value is rounded once and no float32 tensor of the input exists. Where every reader
    computes float32 the kernel writes float32 instead, and FuseOps puts those readers in
    its kernel (it is emitted in the function's first dataflow block)."""
    from tvm import topi

    ndim = param.ty.ndim
    # Readers that all compute float32 (an inference batch_norm on the input, decomposed)
    # get float32 (``float32_readers``): a low-precision copy would round the input twice.
    target_low, low = low, "float32" if float32_readers else low
    note = f"{param.name}: fed as {int_param.ty.dtype}, cast once to {low}"
    name = f"{param.name}_{_short(low)}"
    if not normalization:
        if low == "float32":
            note += f"; float32, not {target_low}: every reader computes float32 (one rounding)"
        return relax.op.astype(int_param, low), name, note
    if "scale" in normalization:
        scale = np.float32(normalization["scale"])
        offset = np.float32(normalization["offset"])
        note += f" with x * {normalization['scale']:g} + {normalization['offset']:g} folded in"
    else:
        axis = normalization["axis"] % ndim
        channels = int(param.ty.shape.values[axis])
        if len(normalization["mean"]) != channels:
            raise ValueError(
                f"input_normalization[{param.name!r}] has {len(normalization['mean'])} "
                f"values, but axis {normalization['axis']} of {param.name} has {channels} "
                "channels")
        shape = [1] * ndim
        shape[axis] = channels
        mean = np.asarray(normalization["mean"], np.float64).reshape(shape)
        std = np.asarray(normalization["std"], np.float64).reshape(shape)
        scale, offset = (1.0 / std).astype(np.float32), (-mean / std).astype(np.float32)
        note += " with (x - mean) / std per channel folded in"
    if low == "float32":
        note += f"; float32, not {target_low}: every reader computes float32 (one rounding)"

    def normalize(data, scale_t, offset_t):
        widened = topi.cast(data, "float32")
        return topi.cast(topi.add(topi.multiply(widened, scale_t), offset_t), low)

    return builder.call_te(normalize, int_param, relax.const(scale, "float32"),
                           relax.const(offset, "float32"),
                           primfunc_name_hint=f"relay_amp_input_{param.name}"), name, note
