"""Calibrated ranges: one instrumented float32 run that records every binding's magnitude.

The instrumented copy of the function returns, besides its result, the largest and the smallest
non-zero finite ``|x|`` of every float32 tensor parameter and binding (the bindings inside If
branches excepted; the result of an If is measured). The pass reads the ranges: a value whose
observed maximum, times a safety margin, exceeds the low-precision dtype's largest finite value
is never stored in that dtype, and the low-precision ops that would read it compute in float32
instead; the report says ``fp32: observed max 7.4e+04 exceeds float16 max 65504``. That holds at
the function's boundary too: a parameter or result that the signature would make low precision
stays float32 (see :func:`relay_amp.convert`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np
import tvm
from tvm import relax

from .builds.pipeline import compile_module
from .execution import as_batches, check_batch, contiguous, with_function
from .instrument import instrument, returning_stats


@dataclass
class Calibration:
    """Observed magnitudes per parameter and binding, keyed by ``(function, name)``.

    Attributes
    ----------
    max_abs : dict
        The largest finite ``|x|`` seen over all calibration batches (0 where no value was
        finite and non-zero, or the tensor is empty): inf and NaN are stored as they are in
        every float dtype, so they never put a value out of range.
    min_abs : dict
        The smallest non-zero finite ``|x|`` seen (``inf`` if there was none).
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


def _is_float32_tensor(var) -> bool:
    ty = var.ty
    return isinstance(ty, relax.TensorType) and str(ty.dtype) == "float32"


def _instrument(func: relax.Function):
    """``func`` returning ``(result, (max_0, min_0, max_1, ...))`` and the names measured."""
    names = []

    def measure(value, bind):
        if not _is_float32_tensor(value):
            return []
        # inf and NaN are stored as they are in any float dtype: only finite values count
        finite = bind(relax.op.isfinite(value), "calib_finite")
        absolute = bind(relax.op.abs(value), "calib_abs")
        masked = bind(relax.op.where(finite, absolute, relax.const(0.0, "float32")),
                      "calib_mag")
        # one 0 more, so that an empty tensor has a maximum (TVM leaves it undefined)
        magnitude = bind(relax.op.concat([bind(relax.op.reshape(masked, (-1,)), "calib_flat"),
                                          relax.const(np.zeros(1, "float32"))]), "calib_pad")
        largest = bind(relax.op.max(magnitude), "calib_max", visible=True)
        positive = bind(relax.op.greater(magnitude, relax.const(0.0, "float32")), "calib_pos")
        nonzero = bind(relax.op.where(positive, magnitude, relax.const(np.inf, "float32")),
                       "calib_nz")
        smallest = bind(relax.op.min(nonzero), "calib_min", visible=True)
        names.append(value.name)
        return [largest, smallest]

    blocks, stats = instrument(func, lambda binding, bind: measure(binding.var, bind), measure)
    return returning_stats(func, blocks, stats), names


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
    batches = as_batches(inputs)
    if not batches:
        raise ValueError("calibration needs at least one batch of inputs")
    function = mod[func]
    ordered = [check_batch(function, batch, i) for i, batch in enumerate(batches)]
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
