"""Saved convert reports: ``report.md`` for people, ``relay-amp report`` to filter
``report.json``."""

from __future__ import annotations

import difflib
import json
import os

from .arguments import UsageError, one_line


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


#: The stages of a convert run, in order: key in ``timings_s`` -> the name printed.
STAGES = {"import_s": "import", "calibrate_s": "calibrate", "search_s": "search",
          "convert_s": "convert", "build_s": "build", "accuracy_s": "accuracy",
          "dump_errors_s": "error dump"}
#: The parts of the build stage.
BUILD_STAGES = {"build_relax_passes_s": "Relax passes", "build_tir_passes_s": "TIR passes",
                "build_codegen_s": "code generation", "build_export_s": "export"}


def _seconds(value: float) -> str:
    return f"{value:.2f} s" if value < 10 else f"{value:.0f} s"


def time_line(timings: dict) -> str:
    """The seconds of each stage of a convert run, as its summary prints them: ``time: import
    0.41 s, convert 0.25 s, build 3.10 s (Relax passes 1.20 s, TIR passes 0.40 s, code
    generation 1.00 s, export 0.50 s), total 3.90 s``."""
    parts = []
    for key, name in STAGES.items():
        if key not in timings:
            continue
        part = f"{name} {_seconds(timings[key])}"
        if key == "build_s":
            inner = [f"{label} {_seconds(timings[k])}" for k, label in BUILD_STAGES.items()
                     if k in timings]
            part += f" ({', '.join(inner)})" if inner else ""
        parts.append(part)
    if "total_s" in timings:
        parts.append(f"total {_seconds(timings['total_s'])}")
    return "time: " + ", ".join(parts)


def _md_cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def loading_snippet(saved: dict) -> list:
    library = saved["library"]
    if saved["target"].get("kind") == "cuda":
        return [
            "```python",
            "import tvm",
            "from relay_amp.cuda_loader import enable_cuda  # NVRTC compiles the CUDA "
            "source at load",
            "enable_cuda(tvm, 'nvrtc')",
            f"vm = tvm.runtime.vm.VirtualMachine(tvm.runtime.load_module('{library}'), "
            "tvm.cuda())",
            "outputs = vm['main'](*[tvm.runtime.tensor(x, tvm.cuda()) for x in inputs])",
            "```",
        ]
    return [
        "```python",
        "import tvm",
        f"vm = tvm.runtime.vm.VirtualMachine(tvm.runtime.load_module('{library}'), tvm.cpu())",
        "outputs = vm['main'](*[tvm.runtime.tensor(x) for x in inputs])",
        "```",
    ]


def symbolic_text(rows: list) -> str:
    """The symbolic dimensions of a report's inputs, in a line: name, sizes, where."""
    return "; ".join(
        f"`{row['name']}` "
        + (f"{row['lower']}..{row['upper']} (memory planned for {row['upper']})"
           if row["upper"] is not None else "any size (memory allocated per call)")
        + f" in {', '.join(row['inputs'])}" for row in rows)


def markdown_report(saved: dict, dump: dict | None = None) -> str:
    """report.md: what was converted, how, how well, where it departs from float32 (``dump``,
    the ``--dump-errors`` data), and how to load it."""
    conversion = saved["conversion"]
    target = saved["target"]
    target_text = ", ".join(f"{k}={v}" for k, v in target.items()
                            if k in ("kind", "arch", "mcpu", "mtriple", "mattr"))
    lines = [f"# relay-amp convert: {os.path.basename(saved['model']['path'])}", "",
             f"`{saved['command']}`" if saved.get("command") else "", "",
             "| | |", "|---|---|",
             f"| model | `{saved['model']['path']}` ({saved['model']['format']}) |",
             "| inputs | " + "; ".join(
                 f"`{i['name']}` {'x'.join(map(str, i['shape']))} {i['dtype']}"
                 + (f" (fed as {i['fed_as']})" if i["fed_as"] != i["dtype"] else "")
                 for i in saved["model"]["inputs"]) + " |",
             *([f"| symbolic | {_md_cell(symbolic_text(saved['model']['symbolic']))} |"]
               if saved["model"].get("symbolic") else []),
             f"| dtype | {saved['dtype']} |",
             f"| target | {target_text} |",
             f"| library | `{saved['library']}` |",
             f"| policy | `{saved['policy']}` (re-use with `--policy`) |"]
    if saved.get("timings_s"):
        lines.append(f"| time | {time_line(saved['timings_s']).removeprefix('time: ')} |")
    lines += ["", "## Summary", "", conversion["summary"], ""]
    if saved.get("accuracy"):
        acc = saved["accuracy"]
        lines += ["## Accuracy on the calibration data", "",
                  f"float32 vs converted over {acc['batches']} batches, run on {acc['ran_on']}:",
                  "", "| relative L2 | max abs | cosine | NaN/Inf | worst batch rel. L2 |",
                  "|---|---|---|---|---|",
                  f"| {_fmt(acc['relative_l2'])} | {_fmt(acc['max_abs'])} | "
                  f"{_fmt(acc['cosine'])} | {acc['nonfinite']} | "
                  f"{_fmt(acc['worst_batch_relative_l2'])} |", ""]
    if saved.get("accuracy_warning"):
        lines += [f"**{_md_cell(saved['accuracy_warning'])}**", ""]
    search = conversion.get("search")
    if search:
        lines += ["## Accuracy-driven fallback", "",
                  f"Tolerance {search['tolerance']:g} ({'met' if search['met'] else 'not met'}: "
                  f"{search['metric_value']:.3g}) with {len(search['fp32_bindings'])} binding(s) "
                  f"kept in float32 ({', '.join(search['fp32_bindings']) or 'none'}), "
                  f"{search['evaluations']} evaluations, {search['seconds']:.1f} s."]
        if search.get("total_macs"):
            share = search["fp32_macs"] / search["total_macs"]
            lines.append(f"They hold {100 * share:.1f}% of the MACs.")
        if search.get("contributors"):
            lines.append("Output error with one binding alone in low precision, largest first: "
                         + ", ".join(f"{n} {_fmt(e)}" for n, e in search["contributors"]) + ".")
        lines.append("")
    if dump is not None:
        from .error_dump import markdown_section

        lines += markdown_section(dump)
    if conversion.get("notes") or saved.get("notes"):
        lines += ["## Notes", ""]
        lines += [f"- {_md_cell(n)}" for n in saved.get("notes", []) + conversion["notes"]]
        lines.append("")
    lines += ["## Load it", ""] + loading_snippet(saved) + [""]
    if saved.get("kernel_schedules"):
        lines += ["## Every kernel's schedule", "",
                  "How the build's schedule rules ran each kernel: the rule that scheduled it "
                  "(none: as TVM legalized it), what it decided, and why rules before it "
                  "passed it on.", "",
                  "| kernel | rule | decisions | passed on |", "|---|---|---|---|"]
        for row in saved["kernel_schedules"]:
            lines.append("| " + " | ".join(_md_cell(v) for v in (
                row["kernel"], row["rule"] or "none", "; ".join(row["decisions"]),
                "; ".join(row["passed_on"]))) + " |")
        lines.append("")
    lines += ["## Every binding", "",
              "| function | binding | op | inputs | compute | acc | output | casts | rule |",
              "|---|---|---|---|---|---|---|---|---|"]
    for row in conversion["rows"]:
        lines.append("| " + " | ".join(_md_cell(v) for v in (
            row["function"], row["name"], row["op"], ",".join(row["input_dtypes"]),
            row["compute_dtype"], row["accumulation_dtype"], row["output_dtype"],
            row["casts_added"], row["rule"])) + " |")
    return "\n".join(lines) + "\n"


def read_report(path: str) -> dict:
    if os.path.isdir(path):
        path = os.path.join(path, "report.json")
    if not os.path.isfile(path):
        raise UsageError(f"{path!r} does not exist; give the report.json a convert run wrote")
    try:
        with open(path, encoding="utf-8") as handle:
            saved = json.load(handle)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise UsageError(f"{path!r} is not JSON ({one_line(err)})") from None
    if not isinstance(saved, dict) or "conversion" not in saved or "rows" not in saved.get(
            "conversion", {}):
        raise UsageError(f"{path!r} is not a report.json from relay-amp convert")
    return saved


def read_errors(path: str) -> dict:
    """The ``errors.json`` of a convert output, given its folder or its report.json."""
    from .error_dump import ERRORS_FILE

    folder = path if os.path.isdir(path) else os.path.dirname(path)
    errors = os.path.join(folder, ERRORS_FILE)
    if not os.path.isfile(errors):
        if not os.path.exists(path):
            raise UsageError(f"{path!r} does not exist; give the folder a convert run wrote")
        raise UsageError(f"no {ERRORS_FILE} in {folder or '.'!r}: convert with --calibrate DATA "
                         "--dump-errors to write it")
    try:
        with open(errors, encoding="utf-8") as handle:
            dump = json.load(handle)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise UsageError(f"{errors!r} is not JSON ({one_line(err)})") from None
    if not isinstance(dump, dict) or "rows" not in dump:
        raise UsageError(f"{errors!r} is not an {ERRORS_FILE} from relay-amp convert "
                         "--dump-errors")
    return dump


def format_report(saved: dict, rules=(), ops=(), compute=None, limit=None) -> str:
    """The text ``relay-amp report`` prints: summary, notes, accuracy, then the (filtered) rows."""
    from ..report import BindingRecord, Report

    conversion = saved["conversion"]
    rows = conversion["rows"]
    known_ops = sorted({row["op"] for row in rows})
    for op in ops:
        if op not in known_ops:
            close = difflib.get_close_matches(op, known_ops, n=3)
            hint = f"did you mean {', '.join(close)}? " if close else ""
            raise UsageError(f"--op {op!r}: no row of this report has that op; {hint}its ops "
                             f"are {', '.join(known_ops)}")
    picked = [row for row in rows
              if (not ops or row["op"] in ops)
              and (not rules or any(r.lower() in row["rule"].lower() for r in rules))
              and (compute is None or row["compute_dtype"] == compute)]
    report = Report(conversion["dtype"],
                    rows=[BindingRecord.from_dict(row)
                          for row in picked])
    target = saved.get("target", {})
    lines = [f"model   {saved['model']['path']} ({saved['model']['format']})",
             "target  " + ", ".join(f"{k}={v}" for k, v in target.items()
                                     if k in ("kind", "arch", "mcpu", "mtriple", "mattr")),
             f"library {saved.get('library')}",
             conversion["summary"]]
    if saved.get("timings_s"):
        lines.append(time_line(saved["timings_s"]))
    lines += list(saved.get("notes", [])) + list(conversion.get("notes", []))
    search = conversion.get("search")
    if search:
        lines.append(f"search: tolerance {search['tolerance']:g} "
                     f"{'met' if search['met'] else 'NOT met'} ({search['metric_value']:.3g}) "
                     f"with {len(search['fp32_bindings'])} float32 binding(s) in "
                     f"{search['evaluations']} evaluations")
    accuracy = saved.get("accuracy")
    if accuracy:
        lines.append(f"accuracy on {accuracy['batches']} calibration batches: relative L2 "
                     f"{_fmt(accuracy['relative_l2'])}, max abs {_fmt(accuracy['max_abs'])}, "
                     f"cosine {_fmt(accuracy['cosine'])}, NaN/Inf {accuracy['nonfinite']}")
    if saved.get("accuracy_warning"):
        lines.append(saved["accuracy_warning"])
    filters = [f"rule contains {' or '.join(map(repr, rules))}" if rules else "",
               f"op in {', '.join(ops)}" if ops else "",
               f"compute {compute}" if compute else ""]
    filters = [f for f in filters if f]
    lines.append("")
    lines.append(f"{len(picked)} of {len(rows)} rows" + (f" ({'; '.join(filters)})"
                                                        if filters else ""))
    if picked:
        lines.append(report.table(max_rows=limit))
    return "\n".join(lines)

