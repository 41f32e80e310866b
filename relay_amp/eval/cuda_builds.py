"""Does every model that converts also build for CUDA? The sweep of ``scripts/cuda_build_sweep.py``.

Each registry model (:data:`relay_amp.eval.models.REGISTRY`) and each ONNX backend-test case the
conformance suite converts (:mod:`relay_amp.eval.conformance`, mode ``cuda_build``) is built for
``cuda -arch=sm_90`` in float32 (the imported module as is) and converted to float16 and bfloat16
for that target and built, with :func:`relay_amp.builds.pipeline.build` (``cuda_pipeline``). A
build makes the CUDA source of the library, which needs no GPU and no CUDA compiler here (the
GPU host's loader compiles it). A build that fails is recorded with TVM's error and the schedule
rules that raised on its kernels (:class:`relay_amp.builds.schedule_rules.RuleLog`).

The cases run under the conformance suite's own supervisor (:func:`conformance.run_suite`: worker
processes restarted after a crash or a hang), the models each in their own process
(:func:`relay_amp.eval.isolation.measure_each`).
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections import Counter
from dataclasses import asdict

#: The target of the sweep.
TARGET = {"kind": "cuda", "arch": "sm_90"}
#: The dtypes each model and case is built in (float32: no conversion).
DTYPES = ("float32", "float16", "bfloat16")
#: The conformance mode that builds instead of running.
CASE_MODE = "cuda_build"


def _error_text(err) -> tuple[str, str]:
    """``(its type and the line that says what failed, its last 1,500 characters)``: TVM's
    first ``Check failed`` line (a TVMScript dump and its underlines may follow it), else
    the last line."""
    text = str(err).strip()
    lines = [line.strip() for line in text.splitlines() if line.strip(" ^~")]
    checks = [line for line in lines if line.startswith("Check failed")]
    line = checks[0] if checks else (lines[-1] if lines else "")
    return f"{type(err).__name__}: {line}"[:300], text[-1500:]


def device_source(executable, kind: str = "cuda") -> str | None:
    """The source of the first ``kind`` module an executable imports (None: it launches no
    kernel of that kind, e.g. a module of shape arithmetic alone)."""
    pending = list(executable.mod.imports)
    while pending:
        module = pending.pop(0)
        if module.kind == kind:
            return module.inspect_source(kind)
        pending.extend(module.imports)
    return None


def build_outcome(mod, target=None) -> dict:
    """Build ``mod`` for ``target`` (default :data:`TARGET`) with relay_amp's pipeline.

    Parameters
    ----------
    mod : tvm.IRModule
        The module to build, converted or not.
    target : dict or tvm.target.Target, optional
        A CUDA target.

    Returns
    -------
    dict
        ``outcome`` ``"pass"`` (with ``kernels``: the ``__global__`` functions its CUDA
        source defines) or ``"fail"`` (with ``cause`` ``"TVM"``, ``reason``: TVM's error's
        line, ``error``: its tail, and ``kernels_failing``: :func:`failing_kernels`);
        ``rule_errors``: the schedule rules that raised on a kernel
        (:class:`relay_amp.builds.schedule_rules.RuleError` as dicts), ``seconds``.
    """
    from ..builds.pipeline import build
    from ..builds.schedule_rules import RuleLog

    log = RuleLog()
    start = time.perf_counter()
    try:
        executable = build(mod, target or TARGET, rule_log=log)
        source = device_source(executable)
    except Exception as err:  # noqa: BLE001 - TVM raises many types; the row records which
        reason, error = _error_text(err)
        return {"outcome": "fail", "cause": "TVM", "reason": f"build: {reason}",
                "error": error, "rule_errors": [asdict(e) for e in log.errors],
                "kernels_failing": failing_kernels(mod, target or TARGET),
                "seconds": time.perf_counter() - start}
    kernels = 0 if source is None else len(re.findall(r"__global__[^;{]*\{", source))
    return {"outcome": "pass", "kernels": kernels,
            "rule_errors": [asdict(e) for e in log.errors],
            "seconds": time.perf_counter() - start}


def failing_kernels(mod, target=None) -> dict:
    """The kernels of ``mod``, scheduled as :func:`relay_amp.builds.pipeline.build` schedules
    them, that TVM cannot compile alone: ``{kernel: {"rule": the rule that scheduled it,
    "error": TVM's error's line}}`` (what a failed build names; TVM's error does not)."""
    import tvm

    from ..builds.pipeline import cuda_pipeline
    from ..builds.schedule_rules import RuleLog

    target = tvm.target.Target(target or TARGET)
    log = RuleLog()
    try:
        scheduled = cuda_pipeline(target, rule_log=log)(mod)
    except Exception as err:  # noqa: BLE001 - the failure is before the kernels
        return {"<pipeline>": {"rule": None, "error": _error_text(err)[0]}}
    failing = {}
    for gvar, func in scheduled.functions_items():
        if not isinstance(func, tvm.tirx.PrimFunc):
            continue
        try:
            tvm.compile(tvm.IRModule({gvar.name_hint: func.with_attr("global_symbol",
                                                                      gvar.name_hint)}),
                        target=target)
        except Exception as err:  # noqa: BLE001 - the row records it
            failing[gvar.name_hint] = {"rule": log.rules.get(gvar.name_hint),
                                       "error": _error_text(err)[0]}
    return failing


def build_model(mod, dtype: str, target=None) -> dict:
    """:func:`build_outcome` of ``mod`` converted to ``dtype`` for ``target`` (float32: as is);
    a conversion that raises is ``outcome`` ``"crash"``, cause ``"relay_amp"``."""
    import relay_amp

    target = target or TARGET
    if dtype != "float32":
        try:
            mod, _ = relay_amp.convert(mod, dtype, target=target)
        except Exception as err:  # noqa: BLE001 - the row records it
            reason, error = _error_text(err)
            return {"outcome": "crash", "cause": "relay_amp", "reason": f"convert: {reason}",
                    "error": error}
    return build_outcome(mod, target)


def measure_model(name: str, dtypes=DTYPES) -> dict:
    """The row of registry model ``name``: its build in each of ``dtypes`` (a model that does
    not load is ``status`` ``"load"``, with why)."""
    from . import models

    start = time.perf_counter()
    try:
        loaded = models.load(name)
    except Exception as err:  # noqa: BLE001 - the model's dependencies, not the build
        return {"model": name, "status": "load", "reason": _error_text(err)[0]}
    builds = {dtype: build_model(loaded.mod, dtype) for dtype in dtypes}
    return {"model": name, "status": "ok", "builds": builds,
            "seconds": time.perf_counter() - start}


def _model_died(name: str, message: str) -> dict:
    return {"model": name, "status": "error", "reason": message[:300]}


def run_models(names, dtypes=DTYPES, out: str = "results/cuda_builds_models.json",
               workers: int = 1, timeout: float = 1800.0) -> dict:
    """:func:`measure_model` of each name, each in its own process, ``workers`` at a time;
    rows already in ``out`` are kept. Returns the rows by name."""
    from .isolation import measure_each

    workers = max(1, min(int(workers), len(names) or 1))
    header = {"target": TARGET, "dtypes": list(dtypes)}
    if workers == 1:
        return measure_each(names, measure_model, out, timeout, _model_died, (tuple(dtypes),),
                            header)
    done = {}
    if os.path.exists(out):
        with open(out, encoding="utf-8") as handle:
            done = json.load(handle)["models"]
    shards = [f"{out}.{i}" for i in range(workers)]
    todo = [n for n in names if n not in done]
    threads = [threading.Thread(target=measure_each, args=(
        todo[i::workers], measure_model, shard, timeout, _model_died, (tuple(dtypes),), header))
        for i, shard in enumerate(shards)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for shard in shards:
        if os.path.exists(shard):
            with open(shard, encoding="utf-8") as handle:
                done.update(json.load(handle)["models"])
            os.remove(shard)
    with open(out, "w", encoding="utf-8") as handle:
        json.dump({**header, "models": done}, handle, indent=1)
    return done


def run_cases(paths, dtypes=DTYPES, out: str = "results/cuda_builds_cases.jsonl",
              workers: int = 1, timeout: float = 300.0, progress=None) -> list[dict]:
    """The conformance cases ``paths`` in mode ``cuda_build`` for ``dtypes``, under the
    suite's supervisor (:func:`relay_amp.eval.conformance.run_suite`; resumes from ``out``).
    Returns the case rows: a case the suite skips (TVM cannot import it, or its float32 module
    does not reproduce ONNX's outputs on this CPU) is ``outcome`` ``"skip"``."""
    from . import conformance

    return conformance.run_suite(paths, out, progress, timeout, workers, (CASE_MODE,),
                                 tuple(dtypes))


# ------------------------------------------------------------------------------ the tables
def case_builds(rows: list[dict], dtypes=DTYPES) -> dict:
    """Per dtype, the builds of the case rows (:func:`run_cases`) by outcome, and the failures
    as ``(case, result)``."""
    counts = {d: Counter() for d in dtypes}
    failures = {d: [] for d in dtypes}
    skipped = 0
    for row in rows:
        if row["outcome"] == "skip":
            skipped += 1
            continue
        for dtype in dtypes:
            result = row["units"].get(f"{CASE_MODE}/{dtype}")
            outcome = "missing" if result is None else result["outcome"]
            counts[dtype][outcome] += 1
            if outcome not in ("pass", "missing"):
                failures[dtype].append((row["case"], result))
    return {"counts": counts, "failures": failures, "skipped": skipped, "cases": len(rows)}


def model_builds(rows: dict, dtypes=DTYPES) -> dict:
    """The same over registry rows (:func:`run_models`), with the models that did not load."""
    counts = {d: Counter() for d in dtypes}
    failures = {d: [] for d in dtypes}
    not_loaded = []
    for name, row in rows.items():
        if row.get("status") != "ok":
            not_loaded.append((name, row.get("reason", "")))
            continue
        for dtype in dtypes:
            result = row["builds"].get(dtype)
            outcome = "missing" if result is None else result["outcome"]
            counts[dtype][outcome] += 1
            if outcome not in ("pass", "missing"):
                failures[dtype].append((name, result))
    return {"counts": counts, "failures": failures, "not_loaded": not_loaded,
            "models": len(rows)}


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _rule_text(result: dict) -> str:
    errors = result.get("rule_errors") or []
    return "; ".join(f"{e['kernel']}: {e['rule']} raised ({e['error']}), "
                     f"{e['scheduled_by'] or 'no later rule'} scheduled it"
                     for e in errors[:3]) or "none raised"


def _kernel_text(result: dict) -> str:
    failing = result.get("kernels_failing")
    if failing is None:  # a row from before the sweep located them
        return "not located"
    return "; ".join(f"{name} (scheduled by {f['rule'] or 'no rule'})"
                     for name, f in list(failing.items())[:3]) or "none fails alone"


def summary_markdown(cases: dict | None, models: dict | None, dtypes=DTYPES,
                     header: str = "") -> str:
    """The tables of :func:`case_builds` and :func:`model_builds` (either may be None): builds
    per dtype and outcome, then every failure with TVM's error and the rule log."""
    lines = [header] if header else []
    columns = "| | " + " | ".join(dtypes) + " |"
    rule = "|---|" + "---|" * len(dtypes)
    for title, summary, what in (("ONNX backend-test cases", cases, "case"),
                                 ("Registry models", models, "model")):
        if summary is None:
            continue
        total = summary["cases"] if what == "case" else summary["models"]
        left = (f"{summary['skipped']} skipped by the conformance suite (TVM cannot import "
                "them or their float32 module misses ONNX's outputs)" if what == "case" else
                f"{len(summary['not_loaded'])} did not load")
        lines += [f"**{title}**: {total} {what}s, {left}.", "", columns, rule]
        for outcome in ("pass", "fail", "crash", "missing"):
            if any(summary["counts"][d][outcome] for d in dtypes):
                lines.append(f"| {outcome} | " + " | ".join(
                    str(summary["counts"][d][outcome]) for d in dtypes) + " |")
        lines.append("")
        failed = [(d, name, r) for d in dtypes for name, r in summary["failures"][d]]
        if failed:
            lines += [f"| {what} | dtype | error | kernels that fail alone | "
                      "schedule rules that raised |", "|---|---|---|---|---|"]
            lines += [f"| {_cell(name)} | {d} | {_cell(r.get('reason', ''))} | "
                      f"{_cell(_kernel_text(r))} | {_cell(_rule_text(r))} |"
                      for d, name, r in failed]
            lines.append("")
        if what == "model" and summary["not_loaded"]:
            lines += ["Not loaded: " + "; ".join(f"{n} ({_cell(r)[:120]})"
                                                 for n, r in summary["not_loaded"]), ""]
    return "\n".join(lines)


__all__ = ["TARGET", "DTYPES", "CASE_MODE", "device_source", "build_outcome", "build_model",
           "failing_kernels", "measure_model", "run_models", "run_cases", "case_builds",
           "model_builds", "summary_markdown"]
