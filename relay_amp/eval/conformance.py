"""The ONNX backend test suite (shipped in the onnx wheel) through relay_amp.

Each case: import with ``tvm.relax.frontend.onnx``; compile and run in float32 against the
case's reference outputs (a case TVM cannot import or run in float32 is a *skip*, with its
reason); then convert to float16 and bfloat16, compile, run and compare with the reference at the
dtype's tolerance. TVM's built-in pass is tried on the same graph, to name the graphs it crashes on.
"""

from __future__ import annotations

import glob
import json
import multiprocessing
import os
import re
import time
import traceback

import numpy as np

SUITES = ("node", "pytorch-converted", "pytorch-operator", "simple")
#: |out - ref| <= TOLERANCE * (1 + max |ref|) for float outputs (low precision), float32: 1e-3
TOLERANCE = {"float32": 1e-3, "float16": 2e-2, "bfloat16": 8e-2}


def case_dirs(suites=SUITES) -> list[str]:
    import onnx  # pylint: disable=import-outside-toplevel

    root = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data")
    dirs = []
    for suite in suites:
        dirs += sorted(d for d in glob.glob(os.path.join(root, suite, "*"))
                       if os.path.exists(os.path.join(d, "model.onnx")))
    return dirs


def case_name(path: str) -> str:
    return f"{os.path.basename(os.path.dirname(path))}/{os.path.basename(path)}"


def _load_tensors(folder: str, prefix: str):
    import onnx  # pylint: disable=import-outside-toplevel
    from onnx import numpy_helper  # pylint: disable=import-outside-toplevel

    arrays = []
    for path in sorted(glob.glob(os.path.join(folder, f"{prefix}_*.pb")),
                       key=lambda p: int(p.rsplit("_", 1)[1].split(".")[0])):
        tensor = onnx.TensorProto()
        with open(path, "rb") as handle:
            tensor.ParseFromString(handle.read())
        if not tensor.name and tensor.data_type == 0:
            raise ValueError("not a plain tensor (sequence or optional)")
        arrays.append(numpy_helper.to_array(tensor))
    return arrays


def _compare(reference, outputs, dtype: str) -> str | None:
    if len(reference) != len(outputs):
        return f"{len(outputs)} outputs, expected {len(reference)}"
    tolerance = TOLERANCE[dtype]
    for i, (ref, out) in enumerate(zip(reference, outputs)):
        ref = np.asarray(ref)
        out = np.asarray(out)
        if ref.shape != out.shape:
            return f"output {i} shape {out.shape}, expected {ref.shape}"
        if ref.dtype.kind in "fc":
            ref64, out64 = ref.astype(np.float64), out.astype(np.float64)
            both_nan = np.isnan(ref64) & np.isnan(out64)
            same_inf = np.isinf(ref64) & (ref64 == out64)
            ok = both_nan | same_inf
            finite = np.isfinite(ref64)
            scale = 1.0 + (np.max(np.abs(ref64[finite])) if finite.any() else 0.0)
            close = np.abs(out64 - ref64) <= tolerance * scale
            if not np.all(ok | close):
                worst = float(np.nanmax(np.where(ok, 0, np.abs(out64 - ref64))))
                return f"output {i} differs by {worst:.3g} (allowed {tolerance * scale:.3g})"
        elif not np.array_equal(ref, out.astype(ref.dtype)):
            return f"output {i} differs ({int(np.sum(ref != out))} of {ref.size} elements)"
    return None


def run_case(path: str) -> dict:
    """Run one case; never raises (a Python exception becomes the row's status)."""
    import onnx  # pylint: disable=import-outside-toplevel
    from tvm.relax.frontend.onnx import from_onnx  # pylint: disable=import-outside-toplevel

    import relay_amp  # pylint: disable=import-outside-toplevel
    from relay_amp.eval.stats import builtin_convert  # pylint: disable=import-outside-toplevel
    from relay_amp.execution import compile_module, run  # pylint: disable=import-outside-toplevel

    row = {"case": case_name(path)}

    def message(err):
        text = str(err).strip().splitlines()
        return f"{type(err).__name__}: {text[-1] if text else ''}"[:200]

    try:
        model = onnx.load(os.path.join(path, "model.onnx"))
        folder = os.path.join(path, "test_data_set_0")
        inputs = _load_tensors(folder, "input")
        reference = _load_tensors(folder, "output")
        initializers = {t.name for t in model.graph.initializer}
        names = [i.name for i in model.graph.input if i.name not in initializers]
        if len(names) != len(inputs):
            raise ValueError(f"{len(inputs)} input files for {len(names)} graph inputs")
        shapes = {n: list(a.shape) for n, a in zip(names, inputs)}
        mod = from_onnx(model, shape_dict=shapes)
    except Exception as err:  # many importer error types
        row.update(outcome="skip", reason=f"import: {message(err)}")
        return row
    try:  # the importer may bake constant inputs in: feed the parameters that remain, by name
        params = mod["main"].params
        feed = [inputs[names.index(p.name)] if p.name in names else None for p in params]
        if any(f is None for f in feed) and len(params) == len(inputs):
            feed = list(inputs)  # the importer renamed inputs ("0" -> "input_0"): by position
        if any(f is None for f in feed):
            raise ValueError("a function parameter is not a graph input")
        outputs = run(compile_module(mod), feed)
    except Exception as err:
        row.update(outcome="skip", reason=f"float32 compile/run: {message(err)}")
        return row
    mismatch = _compare(reference, outputs, "float32")
    if mismatch:
        row.update(outcome="skip", reason=f"float32 result: {mismatch}")
        return row
    try:
        builtin_convert(mod)
        row["builtin"] = "ok"
    except Exception as err:
        row["builtin"] = f"crash: {message(err)}"
    row["outcome"] = "pass"
    for dtype in ("float16", "bfloat16"):
        try:
            converted, report = relay_amp.convert(mod, dtype)
        except Exception as err:
            row.update(outcome="crash", reason=f"{dtype} convert: {message(err)}",
                       traceback=traceback.format_exc()[-1500:])
            return row
        row[f"{dtype}_low_ops"] = len(report.converted)
        try:
            low_outputs = run(compile_module(converted), feed)
        except Exception as err:
            row.update(outcome="fail", reason=f"{dtype} compile/run: {message(err)}")
            return row
        mismatch = _compare(reference, low_outputs, dtype)
        if mismatch:
            row.update(outcome="fail", reason=f"{dtype}: {mismatch}")
            return row
    return row


def _worker(paths, out_path):
    with open(out_path, "a", encoding="utf-8") as out:
        for path in paths:
            out.write(json.dumps({"start": case_name(path)}) + "\n")
            out.flush()
            out.write(json.dumps(run_case(path), default=str) + "\n")
            out.flush()


def run_suite(paths, out_path: str, progress=None, timeout_s: float = 120.0) -> list[dict]:
    """Run ``paths`` in a worker process, restarting it after a crash; rows go to ``out_path``
    (JSON lines) and are returned. A case that kills the process is a ``crash`` row."""
    done = {}
    if os.path.exists(out_path):
        done = {r["case"]: r for r in _read(out_path) if "outcome" in r}
    todo = [p for p in paths if case_name(p) not in done]
    context = multiprocessing.get_context("spawn")
    while todo:
        process = context.Process(target=_worker, args=(todo, out_path))
        process.start()
        last, started = None, time.time()
        while process.is_alive():
            process.join(1.0)
            rows = _read(out_path)
            current = rows[-1].get("start") if rows and "start" in rows[-1] else None
            if current != last:
                last, started = current, time.time()
            elif current and time.time() - started > timeout_s:
                process.kill()
                process.join()
                with open(out_path, "a", encoding="utf-8") as out:
                    out.write(json.dumps({"case": current, "outcome": "skip",
                                          "reason": f"timeout after {timeout_s:.0f} s"}) + "\n")
            if progress:
                progress(len([r for r in rows if "outcome" in r]))
        rows = _read(out_path)
        finished = {r["case"] for r in rows if "outcome" in r}
        if rows and "start" in rows[-1] and rows[-1]["start"] not in finished:
            with open(out_path, "a", encoding="utf-8") as out:
                out.write(json.dumps({"case": rows[-1]["start"], "outcome": "crash",
                                      "reason": f"process died (exit code {process.exitcode})"})
                          + "\n")
            finished.add(rows[-1]["start"])
        todo = [p for p in todo if case_name(p) not in finished]
    results = {r["case"]: r for r in _read(out_path) if "outcome" in r}
    return [results[case_name(p)] for p in paths if case_name(p) in results]


def _read(path):
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def summary_markdown(rows: list[dict], command: str, machine: str, date: str) -> str:
    from collections import Counter  # pylint: disable=import-outside-toplevel

    outcomes = Counter(r["outcome"] for r in rows)
    passed = [r for r in rows if r["outcome"] == "pass"]
    low = [r for r in passed if r.get("float16_low_ops", 0) or r.get("bfloat16_low_ops", 0)]
    builtin_crashes = sorted(r["case"] for r in rows if str(r.get("builtin", "")).startswith("crash"))
    skips = Counter(re.sub(r"\d+", "N", r["reason"])[:110] for r in rows
                    if r["outcome"] == "skip")
    lines = [
        "# ONNX backend conformance", "",
        f"Command: `{command}`  ", f"Date: {date}  ", f"Machine: {machine}", "",
        "Every case of the ONNX backend test suite shipped in the onnx wheel is imported with "
        "`tvm.relax.frontend.onnx`, run in float32 against its reference outputs, then converted "
        "by relay_amp to float16 and to bfloat16, compiled for the host CPU and compared with the "
        "reference (|out - ref| <= tol * (1 + max|ref|), tol = 2e-2 for float16 and 8e-2 for "
        "bfloat16; integer and boolean outputs exact).", "",
        "| outcome | cases |", "|---|---|",
        *[f"| {k} | {v} |" for k, v in sorted(outcomes.items())],
        f"| total | {len(rows)} |", "",
        f"Of the {len(passed)} cases that pass in float32 and after conversion, {len(low)} ran "
        "at least one op in low precision (the others have no float op the policy converts).", "",
        "## Skips by reason (TVM cannot import or run the case in float32)", "",
        "| reason (numbers shown as N) | cases |", "|---|---|",
        *[f"| {k.replace('|', '/')} | {v} |" for k, v in skips.most_common(25)],
        f"| other reasons | {sum(skips.values()) - sum(v for _, v in skips.most_common(25))} |",
        "",
        "## Failures and crashes", "",
    ]
    bad = [r for r in rows if r["outcome"] in ("fail", "crash")]
    lines += [f"- `{r['case']}` ({r['outcome']}): {r['reason']}" for r in bad] or ["None."]
    lines += ["", f"## Graphs on which TVM's built-in ToMixedPrecision crashes ({len(builtin_crashes)})",
              "", "relay_amp converts each of them (they are among the passing cases above):", ""]
    lines += [f"- `{c}`" for c in builtin_crashes]
    return "\n".join(lines) + "\n"
