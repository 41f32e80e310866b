"""Structural figures of converted modules (casts, round trips, parameter bytes), TVM's
built-in pass as the baseline, and CPU latency: what the sweep and benchmarks report."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from ..execution import contiguous


def builtin_convert(mod: tvm.IRModule) -> tvm.IRModule:
    """TVM's own ``relax.transform.ToMixedPrecision`` (float16, float32 outputs): the baseline."""
    return relax.transform.ToMixedPrecision(out_dtype="float32")(mod)


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
    from ..report import estimate_macs

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
                bits = tvm.runtime.DataType(str(value.dtype)).bits
                nbytes = int(np.prod(value.shape)) * bits // 8
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
                inner = (_astype_source(bindings.get(source))
                         if isinstance(source, relax.Var) else None)
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
    import time

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
