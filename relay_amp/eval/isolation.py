"""Measure models one process each, the rows kept in a JSON file as they come.

The per-model scripts (``scripts/gpu_cost_build.py``, ``scripts/arm_insn_count.py``) measure
models that can fail, hang or exhaust memory: each model runs in a fresh ``spawn`` process, so
that it costs its own row only, and the file is rewritten after each model, so that a run that
stops keeps what it measured and a rerun measures only what is missing.
"""

from __future__ import annotations

import json
import multiprocessing
import os
from collections.abc import Callable, Sequence

from tqdm import tqdm


def measure_each(names: Sequence[str], measure: Callable, out: str, timeout: float,
                 failed: Callable[[str, str], dict], extra_args: tuple = (),
                 header: dict | None = None) -> dict:
    """``measure(name, *extra_args)`` for each name not already in ``out``, each in its own
    process; returns every row by name (those read from ``out`` included).

    Parameters
    ----------
    names : sequence of str
        The models, in order.
    measure : callable
        A module-level function (it is pickled into the child): ``measure(name, *extra_args)``
        returns the model's row (a dict that ``json`` writes).
    out : str
        The JSON file: ``{**header, "models": {name: row}}``; rows in it are kept.
    timeout : float
        Seconds one model may take.
    failed : callable
        ``failed(name, message)``: the row of a model whose process raised, died or timed out.
    extra_args : tuple, optional
        More arguments for ``measure``.
    header : dict, optional
        Written beside ``"models"``.
    """
    rows = {}
    if os.path.exists(out):
        with open(out, encoding="utf-8") as handle:
            rows = json.load(handle)["models"]
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    context = multiprocessing.get_context("spawn")
    for name in tqdm(names, unit="model"):
        if name in rows:
            continue
        with context.Pool(1) as pool:
            try:
                rows[name] = pool.apply_async(measure, (name, *extra_args)).get(timeout)
            except Exception as err:  # a timeout or a dead child: the row says which
                rows[name] = failed(name, f"{type(err).__name__}: {err}"[:400])
        with open(out, "w", encoding="utf-8") as handle:
            json.dump({**(header or {}), "models": rows}, handle, indent=1)
    return rows
