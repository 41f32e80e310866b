"""The function signature in step 3 (the algorithm is stated in :mod:`relay_amp.rewriter`):
parameters and results kept float32 where the low dtype cannot hold them, and integer inputs
cast once at the top of the function."""

from __future__ import annotations

import numpy as np
from tvm import relax
from tvm.ir import Call
from tvm.relax import (
    Function,
    SeqExpr,
)

from .calibrate import OutOfRange, out_of_range_reason
from .dtypes import (
    max_finite,
)
from .op_registry import op_info
from .relax_utils import (
    leaves_of,
    op_name,
    tensor_dtype,
)
from .report import BoundaryRecord
from .report import short_dtype as _short


class SignatureRewriter:
    """Signature handling of :class:`relay_amp.rewriter.MixedPrecisionRewriter`."""

    def _parameter_problems(self, func: Function, params, observed, margin: float) -> dict:
        """Float32 parameters whose calibrated values the low dtype cannot hold: measured
        directly, or (a calibration without parameters) through a consumer whose result holds
        only their values. Keyed by the parameter's handle."""
        if observed is None:
            return {}
        problems = {}
        floats = {p.__chandle__(): p for p in params if tensor_dtype(p) == "float32"}
        for param in floats.values():
            largest = observed(param)
            problem = None if largest is None else out_of_range_reason(largest, self.low, margin)
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
                          if (tensor_dtype(leaf) or "").startswith(("float", "bfloat"))]
                if len(leaves) != 1 or leaves[0].__chandle__() not in floats:
                    continue
                param = floats[leaves[0].__chandle__()]
                largest = observed(binding.var)
                if param.__chandle__() in problems or largest is None or (
                        largest * margin <= max_finite(self.low)):
                    continue
                problem = out_of_range_reason(largest, self.low, margin)
                problems[param.__chandle__()] = OutOfRange(
                    f"its consumer {binding.var.name} ({op}, whose values are {param.name}'s) "
                    f"has {problem}", problem.magnitude, problem.bound)
        return problems

    def _keep_at_boundary(self, function: str, kind: str, where: str, value: str,
                          problem: OutOfRange, named: bool):
        """Record a parameter or result kept float32 at the signature, or raise if the policy
        asks for strict I/O dtypes."""
        if self.policy.strict_io_dtypes:
            undo = f"leave it off to keep this {kind} float32" + (
                f", or take {where} out of low_precision_inputs" if named else "")
            subject = where if where == value else f"{where} ({value})"
            raise ValueError(f"{function}: {kind} {subject} cannot be {self.low}: {problem}; "
                             f"strict_io_dtypes is set ({undo})")
        record = BoundaryRecord(function, kind, where, value, problem.magnitude, problem.bound,
                                str(problem))
        self.boundary.append(record)
        self.notes.append(record.note(self.low))

    def _integer_input(self, param, int_param, normalization):
        """``(value, name)``: the cast of an integer input, once, straight to the low-precision
        dtype, folding in its normalization: one kernel reads the integers, applies
        ``x * scale + offset`` in float32 registers and writes the low-precision dtype, so the
        value is rounded once and no float32 tensor of the input exists. Where every reader
        computes float32 the kernel writes float32 instead, and FuseOps puts those readers in
        its kernel (it is emitted in the function's first dataflow block)."""
        from tvm import topi

        ndim = param.ty.ndim
        # Readers that all compute float32 (an inference batch_norm on the input, decomposed)
        # get float32: a low-precision copy would round the input twice.
        low = "float32" if self.plan.read_in_float32(param) else self.low
        note = f"{param.name}: fed as {int_param.ty.dtype}, cast once to {low}"
        self.total_casts += 1
        name = f"{param.name}_{_short(low)}"
        if not normalization:
            if low == "float32":
                note += f"; float32, not {self.low}: every reader computes float32 (one rounding)"
            self.notes.append(note)
            return relax.op.astype(int_param, low), name
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
            note += f"; float32, not {self.low}: every reader computes float32 (one rounding)"
        self.notes.append(note)

        def normalize(data, scale_t, offset_t):
            widened = topi.cast(data, "float32")
            return topi.cast(topi.add(topi.multiply(widened, scale_t), offset_t), low)

        return self.builder_.call_te(normalize, int_param, relax.const(scale, "float32"),
                                     relax.const(offset, "float32"),
                                     primfunc_name_hint=f"relay_amp_input_{param.name}"), name
