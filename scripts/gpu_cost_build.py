"""The GPU cost of what relay_amp.cuda_pipeline builds, on every registry model: the sweep's GPU
columns (``relay_amp.eval.sweep.gpu_cost_rows``: float32, relay_amp float16 and bfloat16 with the
CUDA sm_90 defaults and float32 I/O, uncalibrated, TVM's built-in float16), each built with
relay_amp's pipeline and with TVM's own, without measuring accuracy.

    python scripts/gpu_cost_build.py --out results/gpu_cost_build.json [--models a,b]

Each model runs in its own process (a model that fails or exhausts memory costs its row only);
rows already in ``--out`` are kept. ``--markdown`` writes the table of docs/PERFORMANCE.md.
"""

from __future__ import annotations

import argparse
import sys

TARGET = {"kind": "cuda", "arch": "sm_90"}
DTYPES = ("float16", "bfloat16")


def measure(name: str) -> dict:
    import time

    from relay_amp.eval import models, sweep

    start = time.perf_counter()
    result = {"model": name}
    try:
        loaded = models.load(name)
    except Exception as err:  # the row says the model did not import
        result["gpu_cost"] = {"status": "load", "message": f"{type(err).__name__}: {err}"[:300]}
        return result
    sweep.gpu_cost_rows(result, loaded, None, TARGET, DTYPES)
    result["seconds"] = time.perf_counter() - start
    return result


def _failed(name: str, message: str) -> dict:
    return {"model": name, "gpu_cost": {"status": "error", "message": message[:300]}}


def main(argv=None) -> int:
    from relay_amp.eval.isolation import measure_each
    from relay_amp.eval.models import REGISTRY
    from relay_amp.eval.sweep import gpu_cost_markdown

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="results/gpu_cost_build.json")
    parser.add_argument("--models", default=None, help="comma-separated (default: the registry)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per model")
    parser.add_argument("--markdown", default=None, help="also write the table here")
    args = parser.parse_args(argv)
    names = args.models.split(",") if args.models else list(REGISTRY)
    rows = measure_each(names, measure, args.out, args.timeout, _failed, header={"target": TARGET})
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as handle:
            handle.write(gpu_cost_markdown({"models": rows}, names) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
