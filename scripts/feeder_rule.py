"""What the result-feeder rule (``Policy(result_budget=...)``, reason ``feeds_result``:
values that feed a function result through elementwise and data-movement ops keep float32
between kernels) changes on registry models: each model converted for CUDA sm_90 (float16,
float32 I/O, uncalibrated, as the GPU cost table of docs/PERFORMANCE.md) with the rule and with
its budget at 0 (the rule off, the earlier behaviour), the GPU cost of both, and which
bindings the rule kept float32.

    python scripts/feeder_rule.py --out results/feeder_rule.json [--models a,b]

Each model runs in its own process (a model that fails or exhausts memory costs its row only).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys

from tqdm import tqdm

TARGET = {"kind": "cuda", "arch": "sm_90"}


def measure(name: str) -> dict:
    import tvm_ffi

    import relay_amp
    from relay_amp.builds.gpu_cost import gpu_cost, symbolic_sizes
    from relay_amp.eval import models

    loaded = models.load(name)
    mod = loaded.mod
    sizes = symbolic_sizes(mod, loaded.batches[0]) if loaded.batches else {}
    fp32 = gpu_cost(mod, TARGET, sizes)
    ret = mod["main"].body.ty
    outputs = len(ret.fields) if hasattr(ret, "fields") else 1
    row = {"model": name, "outputs": outputs, "float32": fp32.as_dict()}
    converted = {}
    for label, value in (("rule", None), ("rule off", 0.0)):
        converted[label], report = relay_amp.convert(mod, "float16", target=TARGET,
                                                     result_budget=value)
        cost = gpu_cost(converted[label], TARGET, sizes)
        kept = [r.name for r in report.rows if "feeds_result" in r.codes]
        row[label] = {**cost.as_dict(), "bytes_ratio": cost.bytes / fp32.bytes, "kept": kept}
    row["changed"] = not tvm_ffi.structural_equal(converted["rule"], converted["rule off"])
    row["moved"] = row["rule"]["bytes_ratio"] - row["rule off"]["bytes_ratio"]
    return row


def _child(name, queue):
    try:
        queue.put(measure(name))
    except Exception as err:  # the model's row says what failed
        queue.put({"model": name, "error": f"{type(err).__name__}: {err}"[:300]})


def run(name: str, timeout: float) -> dict:
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=_child, args=(name, queue))
    process.start()
    try:
        return queue.get(timeout=timeout)
    except Exception:  # no row in time: the model's row says so
        return {"model": name, "error": f"no result in {timeout:.0f} s "
                                        f"(exit code {process.exitcode})"}
    finally:
        process.join(5)
        if process.is_alive():
            process.kill()


def main(argv=None) -> int:
    from relay_amp.eval.models import REGISTRY

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="results/feeder_rule.json")
    parser.add_argument("--models", default=None, help="comma-separated (default: the registry)")
    parser.add_argument("--timeout", type=float, default=900.0)
    args = parser.parse_args(argv)
    names = args.models.split(",") if args.models else list(REGISTRY)
    rows = {}
    if os.path.exists(args.out):
        rows = {r["model"]: r for r in json.load(open(args.out)) if "error" not in r}
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    for name in tqdm(names, unit="model"):
        if name in rows:
            continue
        rows[name] = run(name, args.timeout)
        with open(args.out, "w") as f:
            json.dump(list(rows.values()), f, indent=1)
        row = rows[name]
        tqdm.write(f"{name}: " + (row["error"] if "error" in row else
                                  f"moved {row['moved']:+.4f}, kept {len(row['rule']['kept'])}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
