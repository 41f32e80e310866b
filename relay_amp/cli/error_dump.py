"""``relay-amp convert --dump-errors``: where, binding by binding, the converted model departs
from float32 on the calibration data.

Per binding of ``main``, in execution order: its relative error against float32 with everything
before it converted as the converted module converts it
(:func:`relay_amp.binding_errors.binding_errors`), the output error with it alone converted
(:func:`relay_amp.fallback.output_effects`, as the accuracy warning measures it), and the
report's decisions for it. The first bindings whose error jumps (more than
:data:`JUMP_FACTOR` times the largest before it, and the dtype's unit roundoff) are kept float32
first in the suggested ``--exclude``, then the bindings whose rounding alone moves the outputs
most until the error is estimated within the goal (:func:`.convert.choose_exclusions`); the
conversion with that ``--exclude`` is measured. ``OUT/errors.json`` holds it all, report.md the
jumps and the ``--exclude``, ``relay-amp report OUT --errors`` the table.
"""

from __future__ import annotations

import math
import time

from .progress import progress_bar

#: The file the dump writes into OUT.
ERRORS_FILE = "errors.json"
ERRORS_FORMAT = 1
#: A binding's error jumps where it exceeds this times the largest error before it.
JUMP_FACTOR = 10.0
#: The jumps report.md shows and the suggested ``--exclude`` keeps float32.
MAX_JUMPS = 5


def unit_roundoff(dtype: str) -> float:
    """Half the spacing of ``dtype`` at 1: the relative error of one rounding."""
    from ..dtypes import finfo

    return float(finfo(dtype).eps) / 2


def find_jumps(rows: list, dtype: str, factor: float = JUMP_FACTOR) -> list:
    """The rows (dump rows, in execution order) whose error exceeds ``factor`` times both the
    largest error before them and one rounding of ``dtype``: where the error jumps rather than
    builds up. An infinite error (NaN/Inf) jumps once, at its first binding."""
    jumps, largest = [], unit_roundoff(dtype)
    for row in rows:
        error = row.get("error")
        if error is None:
            continue
        if error > factor * largest:
            jumps.append(row)
        largest = max(largest, error)
        if math.isinf(largest):
            break
    return jumps


def _row(index: int, name: str, op: str, record, error, effect, note) -> dict:
    return {"index": index, "binding": name, "op": op,
            "compute": record.compute_dtype if record else None,
            "accumulation": record.accumulation_dtype if record else None,
            "output": record.output_dtype if record else None,
            "rule": record.rule if record else None,
            "error": error.relative_l2 if error else None,
            "max_abs": error.max_abs if error else None,
            "nonfinite": error.nonfinite if error else None,
            "effect": effect, "jump": False, "note": note}


def _ops(mod) -> list:
    """``(name, op)`` of every top-level binding of ``main``, in execution order."""
    import tvm

    from ..relax_utils import op_name

    ops = []
    for block in mod["main"].body.blocks:
        for binding in block.bindings:
            value = binding.value
            op = (op_name(value) if isinstance(value, tvm.ir.Call)
                  and isinstance(value.op, tvm.ir.Op) else type(value).__name__)
            ops.append((binding.var.name, op))
    return ops


def dump_errors(mod, converted, report, data, effects: dict, goal: float, goal_from: str,
                output_error: float, measure, advice: dict | None, progress: bool) -> dict:
    """The dump's data (what ``errors.json`` holds).

    Parameters
    ----------
    mod, converted : tvm.IRModule
        The float32 module and the converted one.
    report : relay_amp.Report
        The conversion's report (the decisions of each binding).
    data : CalibrationBatches
        The calibration data (``reference`` and ``converted`` batches).
    effects : dict
        Binding name -> output error with it alone converted
        (:func:`.convert.output_effects_of` with ``complete=True``).
    goal, goal_from : float, str
        The error to reach and the flag that set it (``--tolerance``, ``--warn-above``).
    output_error : float
        The converted model's relative L2 on the data (accuracy.json's).
    measure : callable
        ``measure(names) -> {"relative_l2", "nonfinite"}``: the conversion with ``names``
        kept float32, measured on the data (:func:`.convert.measure_exclusions`).
    advice : dict, optional
        The accuracy warning's measured advice: not measured again where the set is the same.
    progress : bool
        Progress bars on stderr.
    """
    from ..binding_errors import binding_errors
    from ..fallback import RANKING_BATCHES
    from .convert import choose_exclusions

    start = time.perf_counter()
    bar = progress_bar(total=len(data.reference),
                       desc="error dump: every binding, float32 vs converted", unit="batch",
                       disable=not progress)
    try:
        errors, unmatched = binding_errors(
            mod, converted, data.reference, data.converted,
            on_batch=lambda done, total: bar.update(done - bar.n))
    finally:
        bar.close()
    records = {r.name: r for r in report.rows if r.function == "main"}
    rows = [_row(i, name, op, records.get(name), errors.get(name), effects.get(name),
                 unmatched.get(name)) for i, (name, op) in enumerate(_ops(mod))]
    dtype = report.dtype
    jumps = find_jumps(rows, dtype)
    for row in jumps:
        row["jump"] = True
    shown = jumps[:MAX_JUMPS]
    # excluding a binding that neither computes nor stores low precision changes nothing
    first = tuple(row["binding"] for row in shown if row["binding"] in effects)
    overflowing = [name for name, effect in effects.items() if not math.isfinite(effect)]
    if overflowing or not math.isfinite(output_error):  # no estimate: keep what overflows
        choice = ([*first, *(n for n in overflowing if n not in first)], None)
        choice = choice if choice[0] else None
    else:
        choice = choose_exclusions(effects, output_error, goal, first)
    if choice is None and first:
        choice = (list(first), None)
    suggestion = None
    if choice is not None:
        names, estimate = choice
        if advice is not None and advice["exclude"] == names:
            measured = {"relative_l2": advice["measured_relative_l2"],
                        "nonfinite": advice["measured_nonfinite"]}
        else:
            measured = measure(names)
        suggestion = {"exclude": names, "estimated_relative_l2": estimate,
                      "measured_relative_l2": measured["relative_l2"],
                      "measured_nonfinite": measured["nonfinite"]}
    return {"errors_format": ERRORS_FORMAT, "dtype": dtype, "batches": len(data.reference),
            "effect_batches": min(RANKING_BATCHES, len(data.reference)),
            "relative_l2": output_error, "goal": goal, "goal_from": goal_from,
            "jump_factor": JUMP_FACTOR, "unit_roundoff": unit_roundoff(dtype),
            "jumps": [row["binding"] for row in jumps], "suggestion": suggestion,
            "seconds": time.perf_counter() - start, "rows": rows}


def _fmt(value) -> str:
    if value is None:
        return "-"
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def summary_line(dump: dict) -> str:
    """One line: where the error jumps first (or that it builds up) and the suggested
    ``--exclude`` with the error measured with it."""
    measured = [r for r in dump["rows"] if r["error"] is not None]
    if dump["jumps"]:
        jump = next(r for r in dump["rows"] if r["binding"] == dump["jumps"][0])
        text = (f"error dump: the error jumps first at {jump['binding']} ({jump['op']}, "
                f"relative L2 {_fmt(jump['error'])}; {len(dump['jumps'])} jump(s))")
    elif measured:
        worst = max(measured, key=lambda r: float(r["error"]))  # errors.json writes Inf "inf"
        text = (f"error dump: no binding's error jumps {dump['jump_factor']:g}x over the "
                f"largest before it; it builds up (largest {worst['binding']} "
                f"{_fmt(worst['error'])})")
    else:
        text = "error dump: no binding could be compared"
    suggestion = dump["suggestion"]
    if suggestion:
        text += (f"; with --exclude {','.join(suggestion['exclude'])} it measured relative L2 "
                 f"{_fmt(suggestion['measured_relative_l2'])} (from {_fmt(dump['relative_l2'])},"
                 f" goal {dump['goal']:g})")
    elif float(dump["relative_l2"] if dump["relative_l2"] is not None else "nan") > dump["goal"]:
        text += (f"; no few bindings are estimated to bring it within {dump['goal']:g}: "
                 "--tolerance finds the fewest that do")
    return text


def markdown_section(dump: dict) -> list:
    """report.md's lines for the dump: the first jumps and the ``--exclude`` that keeps them."""
    lines = [f"## Where {dump['dtype']} departs from float32", "",
             f"Each binding's relative L2 against float32 with everything before it converted, "
             f"over {dump['batches']} batches, and the output error with it alone converted "
             f"({dump['effect_batches']} batches); every binding is in `errors.json` "
             "(`relay-amp report OUT --errors` prints it). The dump added "
             f"{dump['seconds']:.1f} s to the convert.", ""]
    jumps = [r for r in dump["rows"] if r["jump"]][:MAX_JUMPS]
    if jumps:
        lines += [f"The first bindings whose error jumps (over {dump['jump_factor']:g} x the "
                  "largest before it):", "",
                  "| # | binding | op | error | largest before | alone | compute | output |",
                  "|---|---|---|---|---|---|---|---|"]
        for row in jumps:
            before = [r["error"] for r in dump["rows"][:row["index"]] if r["error"] is not None]
            lines.append(f"| {row['index']} | {row['binding']} | {row['op']} | "
                         f"{_fmt(row['error'])} | {_fmt(max(before, default=0.0))} | "
                         f"{_fmt(row['effect'])} | {row['compute'] or '-'} | "
                         f"{row['output'] or '-'} |")
        lines.append("")
    summary = summary_line(dump).removeprefix("error dump: ")
    lines += [summary[:1].upper() + summary[1:] + ".", ""]
    suggestion = dump["suggestion"]
    if suggestion:
        lines += ["```", f"--exclude {','.join(suggestion['exclude'])}", "```", ""]
    unmatched = [r for r in dump["rows"] if r["note"]]
    if unmatched:
        lines += [f"Not compared: {len(unmatched)} binding(s) ("
                  + "; ".join(f"{r['binding']}: {r['note']}" for r in unmatched[:5])
                  + ("; ..." if len(unmatched) > 5 else "") + ").", ""]
    return lines


def format_errors(dump: dict, rules=(), ops=(), compute=None, limit: int | None = None) -> str:
    """The table ``relay-amp report OUT --errors`` prints: one row per binding, in execution
    order, those whose rule contains one of ``rules``, whose op is in ``ops`` and that compute
    in ``compute`` where given, at most ``limit``."""
    picked = [row for row in dump["rows"]
              if (not ops or row["op"] in ops)
              and (not rules or any(r.lower() in (row["rule"] or "").lower() for r in rules))
              and (compute is None or row["compute"] == compute)]
    header = ["#", "binding", "op", "compute", "acc", "output", "error", "alone", "jump",
              "rule"]
    table = [header]
    for row in picked[:limit]:
        table.append([str(row["index"]), row["binding"], row["op"], row["compute"] or "-",
                      row["accumulation"] or "-", row["output"] or "-", _fmt(row["error"]),
                      _fmt(row["effect"]), "JUMP" if row["jump"] else "",
                      row["rule"] or row["note"] or "-"])
    widths = [max(len(line[k]) for line in table) for k in range(len(header) - 1)]
    text = [f"{dump['dtype']} vs float32 on {dump['batches']} batches: output relative L2 "
            f"{_fmt(dump['relative_l2'])}; error: this binding with everything before it "
            f"converted; alone: the output error with it alone converted "
            f"({dump['effect_batches']} batches)", summary_line(dump), ""]
    text += ["  ".join(cell.ljust(width) for cell, width in zip(line, widths)) + "  " + line[-1]
             for line in table]
    if limit is not None and len(picked) > limit:
        text.append(f"... {len(picked) - limit} more rows (--limit)")
    if len(picked) < len(dump["rows"]):
        text.append(f"{len(picked)} of {len(dump['rows'])} bindings")
    return "\n".join(text)
