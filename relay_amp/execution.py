"""Compile, run and compare modules: what calibration and the accuracy-driven fallback need to
measure a module, and what the evaluation harness builds on."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import tvm
from tvm import relax


def host_target() -> tvm.target.Target:
    """An llvm target for this machine's CPU (a generic llvm target emulates fp16 ~40x slower)."""
    return tvm.target.Target({"kind": "llvm", "mcpu": tvm.target.codegen.llvm_get_system_cpu()})


def with_function(mod: tvm.IRModule, name: str, func) -> tvm.IRModule:
    """A copy of ``mod`` whose function ``name`` is ``func``; every other function, and every
    GlobalVar that calls refer to, stays as it is."""
    functions = dict(mod.functions_items())
    functions[mod.get_global_var(name)] = func
    return tvm.IRModule(functions, attrs=mod.attrs)


def contiguous(array) -> np.ndarray:
    """A C-contiguous copy-if-needed of ``array`` that keeps 0-d arrays 0-d."""
    array = np.asarray(array)
    return array if array.flags["C_CONTIGUOUS"] else np.ascontiguousarray(array)


def flatten_outputs(value) -> list[np.ndarray]:
    """A VM result as a flat list of numpy arrays (tuples flattened, bfloat16 as float32)."""
    if isinstance(value, (tuple, list)) or type(value).__name__ in ("Array", "Shape"):
        if type(value).__name__ == "Shape":
            return [np.array(list(value), dtype=np.int64)]
        return [array for item in value for array in flatten_outputs(item)]
    if isinstance(value, (bool, int, float)) or not hasattr(value, "numpy"):
        return [np.array(value)]
    array = value.numpy()
    if array.dtype.kind == "V" or str(array.dtype) == "bfloat16":
        array = array.astype(np.float32)
    return [array]


def run(vm, inputs: Sequence[np.ndarray] | Mapping[str, np.ndarray], func: str = "main"):
    """Run ``func`` on ``inputs`` and return its outputs as a flat list of numpy arrays."""
    if isinstance(inputs, Mapping):
        inputs = list(inputs.values())
    args = [tvm.runtime.tensor(contiguous(x)) for x in inputs]
    return flatten_outputs(vm[func](*args))


@dataclass(frozen=True)
class Agreement:
    """How closely a low-precision output follows the float32 one."""

    relative_l2: float
    max_abs: float
    cosine: float
    nonfinite: int

    def as_dict(self) -> dict:
        return {"relative_l2": self.relative_l2, "max_abs": self.max_abs, "cosine": self.cosine,
                "nonfinite": self.nonfinite}


def agreement(reference: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> Agreement:
    """Compare outputs with float32 references over all (float) outputs together.

    Non-finite values are counted, and excluded from the error figures only if the reference is
    non-finite at the same place; elsewhere they make the error infinite.
    """
    if len(reference) != len(outputs):
        raise ValueError(f"{len(reference)} reference outputs but {len(outputs)} outputs")
    num = den = dot = norm_out = 0.0
    max_abs, nonfinite = 0.0, 0
    for ref, out in zip(reference, outputs):
        if ref.shape != out.shape:
            raise ValueError(f"output shape {out.shape} differs from reference {ref.shape}")
        if ref.dtype.kind not in "fc":
            continue
        ref64, out64 = ref.astype(np.float64), out.astype(np.float64)
        bad = ~np.isfinite(out64)
        nonfinite += int(np.count_nonzero(bad & np.isfinite(ref64)))
        keep = np.isfinite(ref64) & np.isfinite(out64)
        diff = ref64[keep] - out64[keep]
        num += float(np.sum(diff * diff))
        den += float(np.sum(ref64[keep] ** 2))
        dot += float(np.sum(ref64[keep] * out64[keep]))
        norm_out += float(np.sum(out64[keep] ** 2))
        if diff.size:
            max_abs = max(max_abs, float(np.max(np.abs(diff))))
    if nonfinite:
        return Agreement(float("inf"), float("inf"), float("nan"), nonfinite)
    rel = float(np.sqrt(num / den)) if den > 0 else float(np.sqrt(num))
    cosine = dot / np.sqrt(den * norm_out) if den > 0 and norm_out > 0 else 1.0
    return Agreement(rel, max_abs, float(cosine), 0)


def as_batches(inputs) -> list:
    """``inputs`` as a list of batches: one batch (a list of arrays or a {name: array}
    mapping) or an iterable of them."""
    if isinstance(inputs, Mapping) or (
            isinstance(inputs, Sequence) and inputs and isinstance(inputs[0], np.ndarray)):
        return [inputs]
    return list(inputs)


def check_batch(function: relax.Function, batch, index: int) -> list:
    """Batch ``index`` as ``function``'s parameters in order; a clear error where an input is
    missing or its shape does not match."""
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
