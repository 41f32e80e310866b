"""Compile, run and compare modules: the numeric side of tests, the sweep and benchmarks."""

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


def compile_module(mod: tvm.IRModule, target=None):
    """Compile ``mod`` with TVM's default pipeline and return a Relax VirtualMachine."""
    target = target or host_target()
    executable = tvm.compile(mod, target=target)
    return relax.VirtualMachine(executable, tvm.cpu())


def contiguous(array) -> np.ndarray:
    """A C-contiguous copy-if-needed of ``array`` that keeps 0-d arrays 0-d."""
    array = np.asarray(array)
    return array if array.flags["C_CONTIGUOUS"] else np.ascontiguousarray(array)


def _flatten(value) -> list[np.ndarray]:
    if isinstance(value, (tuple, list)) or type(value).__name__ in ("Array", "Shape"):
        if type(value).__name__ == "Shape":
            return [np.array(list(value), dtype=np.int64)]
        return [array for item in value for array in _flatten(item)]
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
    return _flatten(vm[func](*args))


def builtin_convert(mod: tvm.IRModule) -> tvm.IRModule:
    """TVM's own ``relax.transform.ToMixedPrecision`` (float16, float32 outputs): the baseline."""
    return relax.transform.ToMixedPrecision(out_dtype="float32")(mod)


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


_CONSTANT = type(relax.const(0.0))


def _astype_source(value):
    if isinstance(value, tvm.ir.Call) and getattr(value.op, "name", "") == "relax.astype":
        return value.args[0]
    return None


def module_stats(mod: tvm.IRModule, low: str = "float16") -> dict:
    """Counts that compare conversions: casts, round trips, parameter bytes, low-precision share.

    A round trip is ``astype(astype(x, low), float32)`` with ``x`` float32: the value comes back
    with its low-precision rounding and nothing gained.
    """
    from .report import estimate_macs  # pylint: disable=import-outside-toplevel

    casts = round_trips = ops = low_ops = 0
    macs = low_macs = 0
    param_bytes = float32_bytes = 0
    seen_constants = set()
    for _, func in mod.functions_items():
        if not isinstance(func, relax.Function):
            continue
        bindings = {}

        def visit(expr):
            nonlocal param_bytes, float32_bytes
            if isinstance(expr, _CONSTANT) and expr not in seen_constants:
                seen_constants.add(expr)
                value = expr.value
                nbytes = int(np.prod(value.shape)) * tvm.runtime.DataType(str(value.dtype)).bits // 8
                param_bytes += nbytes
                float32_bytes += nbytes if str(value.dtype) == "float32" else 0

        relax.analysis.post_order_visit(func, visit)
        for binding in all_bindings(func.body):
            bindings[binding.var] = binding.value
            value = binding.value
            if not isinstance(value, tvm.ir.Call) or not isinstance(value.op, tvm.ir.Op):
                continue
            source = _astype_source(value)
            if source is not None:
                casts += 1
                inner = _astype_source(bindings.get(source)) if isinstance(source, relax.Var) else None
                if (inner is not None and str(source.ty.dtype) == low
                        and str(value.ty.dtype) == str(inner.ty.dtype) == "float32"):
                    round_trips += 1
                continue
            ops += 1
            dtypes = [str(a.ty.dtype) for a in value.args if isinstance(a.ty, relax.TensorType)]
            is_low = low in dtypes
            low_ops += is_low
            op_macs = estimate_macs(value.op.name[len("relax."):], value)
            macs += op_macs
            low_macs += op_macs if is_low else 0
    return {"casts": casts, "round_trips": round_trips, "param_bytes": param_bytes,
            "float32_param_bytes": float32_bytes,
            "ops": ops, "low_ops": low_ops, "low_op_fraction": low_ops / ops if ops else 0.0,
            "low_mac_fraction": low_macs / macs if macs else None}


def all_bindings(expr):
    """Every binding of a SeqExpr, If branches included, in program order."""
    if isinstance(expr, relax.SeqExpr):
        for block in expr.blocks:
            for binding in block.bindings:
                yield binding
                if isinstance(binding.value, relax.If):
                    yield from all_bindings(binding.value.true_branch)
                    yield from all_bindings(binding.value.false_branch)


def latency_ms(vm, inputs, func: str = "main", budget_s: float = 2.0, max_runs: int = 20,
               previous_run_s: float | None = None) -> float:
    """Median wall time of ``func`` on ``inputs``: one warm-up, then as many runs as fit in
    ``budget_s`` (at least one, at most ``max_runs``). A model whose earlier run
    (``previous_run_s``) already took more than half the budget is timed by that run alone."""
    import time  # pylint: disable=import-outside-toplevel

    if previous_run_s is not None and previous_run_s > budget_s / 2:
        return float(previous_run_s * 1e3)
    args = [tvm.runtime.tensor(contiguous(x)) for x in inputs]
    begin = time.perf_counter()
    vm[func](*args)
    warmup = time.perf_counter() - begin
    runs = int(min(max_runs, max(1, budget_s // max(warmup, 1e-6))))
    times = []
    for _ in range(runs):
        begin = time.perf_counter()
        vm[func](*args)
        times.append(time.perf_counter() - begin)
    return float(np.median(times) * 1e3)
