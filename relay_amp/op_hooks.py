"""The per-op hooks: what a few ops do differently from the generic algorithm (stated in
:mod:`relay_amp.transform`), kept with the op's record in :mod:`relay_amp.op_registry` as TVM
keeps ``FInferMixedPrecision`` with its ops.

Every hook takes one :class:`OpSite`, the narrow view of one call binding that the stage
calling it builds, and returns a value; none sees the planner or the rewriter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import tvm_ffi
from tvm.ir import Call

from .kinds import Mode
from .reasons import Reason
from .relax_utils import op_name, tensor_dtype


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
    """

    call: Call
    low: str
    mode: Mode = Mode.ORIGINAL
    demand: frozenset = frozenset()
    can_low: bool = False
    f32_ready: bool = False
    producer: Callable = lambda expr: None
    integer_input: Callable = lambda expr: None


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
