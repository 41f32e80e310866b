"""The sweep across machines: a deterministic split of the models (``relay-amp sweep --shard
I/N``) and the merge of the shards' results folders into one table (``--merge``).

Every machine computes the same split from the same inputs: the selected names, N, and the
per-model costs of an earlier sweep's ``results.json`` where one is given (``--balance-from``).
No scheduler lives here: a CI matrix, a batch system's array job or a cluster runs the same
command with its own index.
"""

from __future__ import annotations

import json
import os
import re
import statistics
from datetime import datetime, timezone

from .models import REGISTRY

#: What a merged row must share with every other: the settings a sweep measures under.
SETTINGS = ("relay_amp_target", "dtypes", "batches_requested", "calibrated_requested",
            "code_version", "policy")


def parse_shard(text: str) -> tuple[int, int]:
    """``"I/N"`` (1-based) → ``(I, N)``; ValueError naming what is wrong."""
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text or "")
    if not match:
        raise ValueError(f"--shard takes I/N (for example 1/4); got {text!r}")
    index, count = int(match[1]), int(match[2])
    if count < 1 or not 1 <= index <= count:
        raise ValueError(f"--shard I/N needs 1 <= I <= N; got {text!r}")
    return index, count


def model_costs(results: dict) -> dict[str, float]:
    """Seconds each model of an earlier sweep took: its process's wall time where recorded,
    else the sum of its rows' timed columns (conversion, compile, load, calibration)."""
    costs = {}
    for name, model in results.get("models", {}).items():
        cost = model.get("wall_s")
        if not isinstance(cost, (int, float)):
            rows = [model.get("fp32", {}), *model.get("variants", {}).values()]
            cost = sum(row.get(key) or 0.0 for row in rows for key in ("convert_s", "compile_s"))
            cost += sum(model.get(key) or 0.0 for key in ("load_s", "calibrate_s"))
        if cost > 0:
            costs[name] = float(cost)
    return costs


def shard_names(names, index: int, count: int, costs: dict | None = None) -> list[str]:
    """The names of shard ``index`` of ``count`` (1-based), in the order of ``names``.

    Longest first onto the least loaded shard (ties: the lower shard), with each model's cost
    from ``costs`` (seconds; a model without one costs the median of those known, 1 if none
    is): every machine given the same arguments picks the same models, every model is in
    exactly one shard, and the shards' summed costs differ by at most one model's."""
    if count < 1 or not 1 <= index <= count:
        raise ValueError(f"shard {index}/{count}: needs 1 <= index <= count")
    names = list(dict.fromkeys(names))
    costs = costs or {}
    known = [costs[n] for n in names if n in costs]
    fill = statistics.median(known) if known else 1.0
    loads = [0.0] * count
    chosen = set()
    for position, name in sorted(enumerate(names), key=lambda p: (-costs.get(p[1], fill), p[0])):
        shard = min(range(count), key=lambda s: (loads[s], s))
        loads[shard] += costs.get(name, fill)
        if shard == index - 1:
            chosen.add(position)
    return [name for position, name in enumerate(names) if position in chosen]


class MixedSettingsError(ValueError):
    """Rows to merge were measured under different settings (or the same model twice)."""


def _settings(row: dict) -> tuple:
    return tuple(json.dumps(row.get(key), sort_keys=True) for key in SETTINGS)


def merge_results(folders, allow_mixed: bool = False) -> dict:
    """One sweep's results from the ``results.json`` of each folder in ``folders``.

    Raises
    ------
    FileNotFoundError
        A folder has no ``results.json``.
    MixedSettingsError
        Without ``allow_mixed``: a model is in two folders, or two rows differ in a setting of
        :data:`SETTINGS` (target, dtypes, batches, calibration, code version, policy). With it, a
        later folder's row replaces an earlier one's and the differences are kept in the
        merged ``meta["mixed_settings"]``.
    """
    merged: dict = {"models": {}}
    origin: dict[str, str] = {}
    metas = []
    problems = []
    for folder in folders:
        path = os.path.join(folder, "results.json")
        if not os.path.exists(path):
            raise FileNotFoundError(f"{folder}: no results.json (not a sweep's output folder)")
        with open(path, encoding="utf-8") as handle:
            results = json.load(handle)
        metas.append(results.get("meta", {}))
        for name, row in results.get("models", {}).items():
            if name in origin:
                problems.append(f"{name} is in both {origin[name]} and {folder}")
            merged["models"][name] = row
            origin[name] = folder
    groups: dict[tuple, list[str]] = {}
    for name, row in merged["models"].items():
        groups.setdefault(_settings(row), []).append(name)
    if len(groups) > 1:
        for values, names in groups.items():
            described = ", ".join(f"{key}={value}" for key, value in zip(SETTINGS, values))
            problems.append(f"{len(names)} rows ({', '.join(names[:4])}"
                            f"{', ...' if len(names) > 4 else ''}) measured with {described}")
    if problems and not allow_mixed:
        raise MixedSettingsError("rows measured differently: " + "; ".join(problems)
                                 + " (--allow-mixed merges them anyway)")
    order = {name: i for i, name in enumerate(REGISTRY)}
    merged["models"] = dict(sorted(merged["models"].items(),
                                   key=lambda item: (order.get(item[0], len(order)), item[0])))
    first = metas[0] if metas else {}
    machines = list(dict.fromkeys(m.get("machine", "") for m in metas if m.get("machine")))
    merged["meta"] = {**first,
                      "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                      "machine": "; ".join(machines), "shard": None,
                      "merged_from": [os.path.abspath(f) for f in folders]}
    if problems:
        merged["meta"]["mixed_settings"] = problems
    return merged
