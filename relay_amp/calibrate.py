"""Calibrated ranges: one instrumented float32 run that records every binding's magnitude.

The instrumented copy of the function returns, besides its result, ``max(|x|)`` and the smallest
non-zero ``|x|`` of every float32 tensor binding (If branches excepted). The pass reads the
ranges: a value whose observed maximum, times a safety margin, exceeds the low-precision dtype's
largest finite value is never stored in that dtype, and the low-precision ops that would read it
compute in float32 instead; the report says ``fp32: observed max 7.4e+04 exceeds float16 max
65504``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np
import tvm
from tvm import relax

from .execution import compile_module, contiguous, with_function


@dataclass
class Calibration:
    """Observed magnitudes per binding, keyed by ``(function, binding name)``.

    Attributes
    ----------
    max_abs : dict
        The largest ``|x|`` seen over all calibration batches.
    min_abs : dict
        The smallest non-zero ``|x|`` seen (``inf`` if the value was always zero).
    batches : int
        How many batches were run.
    margin : float
        Headroom: a value counts as out of range when ``max_abs * margin`` exceeds the dtype's
        largest finite value (calibration data rarely contains the worst case).
    """

    max_abs: dict = field(default_factory=dict)
    min_abs: dict = field(default_factory=dict)
    batches: int = 0
    margin: float = 2.0

    def observed_max(self, function: str, name: str) -> float | None:
        return self.max_abs.get((function, name))

    def to_dict(self) -> dict:
        return {"batches": self.batches, "margin": self.margin,
                "bindings": [{"function": f, "name": n, "max_abs": m,
                              "min_abs": self.min_abs.get((f, n))}
                             for (f, n), m in sorted(self.max_abs.items())]}

    @classmethod
    def from_dict(cls, data: dict) -> "Calibration":
        calibration = cls(batches=data["batches"], margin=data["margin"])
        for row in data["bindings"]:
            key = (row["function"], row["name"])
            calibration.max_abs[key] = row["max_abs"]
            calibration.min_abs[key] = row["min_abs"]
        return calibration

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    @classmethod
    def from_json(cls, text: str) -> "Calibration":
        return cls.from_dict(json.loads(text))


def _instrument(func: relax.Function):
    """``func`` returning ``(result, (max_0, min_0, max_1, ...))`` and the names measured."""
    builder = relax.BlockBuilder()
    names, stats, blocks = [], [], []
    for block in func.body.blocks:
        dataflow = isinstance(block, relax.DataflowBlock)
        bindings = list(block.bindings)
        for binding in block.bindings:
            ty = binding.var.ty
            if not (isinstance(ty, relax.TensorType) and str(ty.dtype) == "float32"):
                continue
            if isinstance(binding.value, relax.If):
                continue
            local = relax.DataflowVar if dataflow else relax.Var

            def bind(call, name, var_kind=local):
                value = builder.normalize(call)
                var = var_kind(name, value.ty)
                bindings.append(relax.VarBinding(var, value))
                return var

            magnitude = bind(relax.op.abs(binding.var), "calib_abs")
            largest = bind(relax.op.max(magnitude), "calib_max", relax.Var)
            positive = bind(relax.op.greater(magnitude, relax.const(0.0, "float32")), "calib_pos")
            nonzero = bind(relax.op.where(positive, magnitude, relax.const(np.inf, "float32")),
                           "calib_nz")
            smallest = bind(relax.op.min(nonzero), "calib_min", relax.Var)
            stats += [largest, smallest]
            names.append(binding.var.name)
        blocks.append((relax.DataflowBlock if dataflow else relax.BindingBlock)(bindings))
    body = relax.SeqExpr(blocks, relax.Tuple([func.body.body, relax.Tuple(stats)]))
    scalar = relax.TensorType((), "float32")
    ret_ty = tvm.ir.type.TupleType([func.ret_ty, tvm.ir.type.TupleType([scalar] * len(stats))])
    new = relax.Function(func.params, body, ret_ty, func.is_pure, func.attrs)
    return new, names


def _as_batches(inputs) -> list:
    if isinstance(inputs, Mapping) or (
            isinstance(inputs, Sequence) and inputs and isinstance(inputs[0], np.ndarray)):
        return [inputs]
    return list(inputs)


def calibrate(mod: tvm.IRModule, inputs, func: str = "main", target=None,
              margin: float = 2.0) -> Calibration:
    """Run ``func`` of ``mod`` in float32 over ``inputs`` and record each binding's range.

    Parameters
    ----------
    mod : tvm.IRModule
        The float32 module (the one you will convert).
    inputs : list of batches, or one batch
        A batch is a list of arrays in parameter order, or a dict by parameter name.
    func : str
        The function to calibrate.
    target : tvm.target.Target, optional
        Where to run it (default: this machine's CPU).
    margin : float
        See :class:`Calibration`.

    Raises
    ------
    ValueError
        No batches, or a batch whose arrays do not match the parameters.
    """
    if not isinstance(mod, tvm.IRModule):
        raise TypeError(f"calibrate() takes a tvm.IRModule; got {type(mod).__name__}")
    if func not in [gv.name_hint for gv in mod.get_global_vars()]:
        raise ValueError(f"the module has no function {func!r}")
    if not margin >= 1.0:
        raise ValueError(f"margin must be at least 1.0; got {margin}")
    batches = _as_batches(inputs)
    if not batches:
        raise ValueError("calibration needs at least one batch of inputs")
    function = mod[func]
    ordered = [_check_batch(function, batch, i) for i, batch in enumerate(batches)]
    instrumented, names = _instrument(function)
    probe = with_function(mod, func, instrumented)
    vm = compile_module(relax.transform.Normalize()(probe), target)
    calibration = Calibration(margin=margin)
    for batch in ordered:
        result = vm[func](*[tvm.runtime.tensor(contiguous(x)) for x in batch])
        stats = result[1]
        for i, name in enumerate(names):
            key = (func, name)
            largest = float(stats[2 * i].numpy())
            smallest = float(stats[2 * i + 1].numpy())
            calibration.max_abs[key] = max(largest, calibration.max_abs.get(key, 0.0))
            calibration.min_abs[key] = min(smallest, calibration.min_abs.get(key, np.inf))
        calibration.batches += 1
    return calibration


def _check_batch(function: relax.Function, batch, index: int) -> list:
    params = function.params
    if isinstance(batch, Mapping):
        missing = [p.name for p in params if p.name not in batch]
        if missing:
            raise ValueError(f"batch {index} has no input for parameter(s) {missing}")
        batch = [batch[p.name] for p in params]
    batch = list(batch)
    if len(batch) != len(params):
        raise ValueError(f"batch {index} has {len(batch)} arrays; the function takes "
                         f"{len(params)} ({', '.join(p.name for p in params)})")
    for param, array in zip(params, batch):
        ty = param.ty
        if isinstance(ty, relax.TensorType) and ty.shape is not None:
            expected = [int(d) if isinstance(d, tvm.tirx.IntImm) else None
                        for d in ty.shape.values]
            actual = list(np.shape(array))
            if len(expected) != len(actual) or any(
                    e is not None and e != a for e, a in zip(expected, actual)):
                raise ValueError(f"batch {index}: input {param.name!r} has shape "
                                 f"{tuple(actual)}, the function expects {tuple(ty.shape.values)}")
    return batch
