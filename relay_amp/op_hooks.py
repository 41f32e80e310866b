"""The per-op hook table: what an op does differently from the generic algorithm (stated in
:mod:`relay_amp.rewriter`), kept with the op as TVM keeps ``FInferMixedPrecision`` with its ops.

The op tables (:mod:`relay_amp.op_tables`) say *which* category an op is in and why; this table
says how the planner and the rewriter treat an op whose operands or result are not all float
values of one dtype (quantize, dequantize), whose legalization does not keep its declared dtype
(attention with a scale), that is itself a cast (astype), or whose float32 parameters the report
counts (batch_norm). An op not in :data:`OP_HOOKS` gets :data:`GENERIC`: every field's default
is the generic algorithm. Each hook takes the planner or rewriter as its first argument.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import tvm_ffi
from tvm import relax
from tvm.ir import Call

from .op_tables import Category
from .plan import Mode
from .reasons import Reason
from .relax_utils import GenericConst, op_name, tensor_dtype
from .report import short_dtype


@dataclass(frozen=True)
class OpHooks:
    """How one op departs from the generic algorithm; the defaults are the generic behaviour.

    Attributes
    ----------
    low_operands : tuple of int, optional
        The operands (by position) brought to the low dtype when the op runs in low precision;
        None: every float operand. The others (integers, scales, zero points) keep their dtypes.
    integer_side : bool
        One side of the op is integers (its input or its result): the kernel-boundary plan does
        not choose its mode, and an integer function input it reads is no float value to widen.
    keeps_out_dtype : bool
        Its ``out_dtype`` attribute is not the dtype it computes in (quantize's is its
        integers), so running in low precision leaves it as it is.
    writes_low : bool
        As a follow op it can write the low dtype whatever its inputs (through ``out_dtype``).
    is_cast : bool
        The op is a cast: a float32 <-> low-precision one joins the rewriter's cast cache.
    decision_operands : tuple of int
        Operands (by position) whose values decide a discrete result (a quantization's scale
        and zero point): they, and the small chain of arithmetic that computes them, compute in
        float32 (reason code ``decides_discrete``), since one rounding flips an integer.
    identity : callable, optional
        Step 1, ``(planner, call) -> Reason | None``: the reason when the call returns its
        input's values unchanged (the binding becomes that input).
    identity_source : callable, optional
        Step 3, ``(rewriter, call) -> expr``: what an identity binding is bound to.
    choose_mode : callable, optional
        Step 2, ``(planner, plan, var, demand) -> bool``: sets the op's mode and says so (True),
        or leaves it to its category's rule (False).
    before_rewrite : callable, optional
        Step 3, ``(rewriter, var)``: called before the binding is rewritten.
    after_emit : callable, optional
        Step 3, ``(rewriter, plan, call, var, name, output) -> var``: called with the emitted
        call (when it changed); returns what the binding's consumers read.
    """

    low_operands: tuple[int, ...] | None = None
    integer_side: bool = False
    keeps_out_dtype: bool = False
    writes_low: bool = False
    is_cast: bool = False
    decision_operands: tuple[int, ...] = ()
    identity: Callable | None = None
    identity_source: Callable | None = None
    choose_mode: Callable | None = None
    before_rewrite: Callable | None = None
    after_emit: Callable | None = None


# ------------------------------------------------------------------ quantize, dequantize
def _quantize_identity(planner, call) -> Reason | None:
    """quantize(x) of an input already fed as those integers (``input_dtypes``), or of
    dequantize(q) with the same parameters, returns the integers unchanged."""
    data, out_dtype = call.args[0], str(call.attrs.out_dtype)
    if data in planner.int_inputs:
        declared = planner.int_inputs[data]
        if declared != out_dtype:
            raise ValueError(
                f"input {data.name!r} is declared {declared} in input_dtypes, but the "
                f"quantize that reads it produces {out_dtype}: declare it {out_dtype}")
        return Reason.of("identity_input", input=data.name, dtype=out_dtype)
    producer = planner.bound.get(data)
    if (isinstance(producer, Call) and op_name(producer) == "dequantize"
            and tensor_dtype(producer.args[0]) == out_dtype
            and int(producer.attrs.axis) == int(call.attrs.axis)
            and all(tvm_ffi.structural_equal(a, b)
                    for a, b in zip(producer.args[1:3], call.args[1:3]))):
        return Reason.of("identity_requantize")
    return None


def _quantize_source(rewriter, call):
    data = call.args[0]
    if data in rewriter.int_params:
        return rewriter.int_params[data]
    return rewriter.visit_expr(rewriter.planner.bound[data].args[0])  # dequantize's integers


def _quantize_mode(planner, plan, var, demand):
    """Reads low precision when its input can be low and is not already float32 (or comes
    from a dequantize, which then writes low precision)."""
    if plan.category != Category.FOLLOW:
        return False
    producer = planner.bound.get(planner.bound[var].args[0])
    from_dequantize = isinstance(producer, Call) and op_name(producer) == "dequantize"
    if planner.can_low.get(var, False) and (
            not planner.f32_ready.get(var, False) or from_dequantize):
        plan.mode = Mode.LOW
        plan.reasons.append(Reason.of("quantize_reads_low", dtype=planner.low))
    else:
        plan.reasons.append(Reason.of("quantize_reads_float32"))
    return True


def _dequantize_mode(planner, plan, var, demand):
    """Writes low precision when every consumer wants it."""
    if plan.category != Category.FOLLOW:
        return False
    if planner.low in demand and "float32" not in demand:
        plan.mode = Mode.LOW
        plan.reasons.append(Reason.of("dequantize_low", dtype=planner.low))
    elif demand:
        plan.reasons.append(Reason.of("dequantize_float32"))
    else:
        plan.reasons.append(Reason.of("unread"))
    return True


# ------------------------------------------------------------------ attention
def _pin_attention(rewriter, plan, call, var, name: str, output: bool):
    """TVM 0.27 legalizes attention with an explicit scale by multiplying the scores with a
    float32 constant, so its result becomes float32 whatever the inputs; the cast (a no-op at
    this level) brings the legalized result back to the declared dtype."""
    if plan.mode != Mode.LOW or getattr(call.attrs, "scale", None) is None:
        return var
    low = rewriter.low
    plan.reasons.append(Reason.of("attention_pinned", dtype=low))
    return rewriter.count_cast(rewriter.emit_named(relax.op.astype(var, low),
                                              f"{name}_{short_dtype(low)}", output))


# ------------------------------------------------------------------ batch_norm
def _count_batch_norm(rewriter, var):
    """The report's count of batch norms and the bytes of their float32 parameters."""
    parameters = [arg for arg, _ in rewriter.planner.call_args[var][1:]
                  if type(arg) is GenericConst and rewriter.dtype_of(arg) == "float32"]
    if parameters:
        rewriter.batch_norm_float32[0] += 1
        for arg in parameters:
            if arg.__chandle__() not in rewriter.batch_norm_seen:  # dtype_of keeps arg alive
                rewriter.batch_norm_seen.add(arg.__chandle__())
                rewriter.batch_norm_float32[1] += 4 * int(np.prod(
                    [int(d) for d in arg.value.shape]))


GENERIC = OpHooks()
_ATTENTION = OpHooks(after_emit=_pin_attention)

#: op name (without ``relax.``) -> its hooks; every other op is :data:`GENERIC`.
OP_HOOKS: dict[str, OpHooks] = {
    "quantize": OpHooks(low_operands=(0,), integer_side=True, keeps_out_dtype=True,
                        decision_operands=(1, 2), identity=_quantize_identity,
                        identity_source=_quantize_source, choose_mode=_quantize_mode),
    "dequantize": OpHooks(low_operands=(), integer_side=True, writes_low=True,
                          decision_operands=(1, 2), choose_mode=_dequantize_mode),
    "nn.attention": _ATTENTION,
    "nn.attention_bias": _ATTENTION,
    "nn.batch_norm": OpHooks(before_rewrite=_count_batch_norm),
    "astype": OpHooks(is_cast=True),
}


def hooks_of(op: str | None) -> OpHooks:
    """The hooks of ``op``: its entry in :data:`OP_HOOKS`, else :data:`GENERIC`."""
    return OP_HOOKS.get(op, GENERIC)
