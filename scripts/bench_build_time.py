"""Build time of relay_amp's CPU pipeline beside TVM's, on every registry model (issue 44 item 5).

Each model is imported once (batch 1, float32) and built for this host by TVM's CPU pipeline
and by ``relay_amp.cpu_pipeline``, one after the other in one process, the order alternating
from model to model; a build is ``tvm.compile`` + ``export_library``, as a user's is. Both
pipelines are warmed up on a small model first, so neither pays the process's first compile.

    python scripts/bench_build_time.py --json build_times.json --markdown build_times.md
    python scripts/bench_build_time.py --models yolov8n_320,resnet50_v1

Rows already in ``--json`` are kept and not built again, so an interrupted sweep resumes.
Times on a shared machine move with its load; the ratio of two builds made side by side is the
figure to read.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def build_seconds(mod, target, relay_amp_schedules: bool, workdir: str) -> float:
    """Seconds of ``tvm.compile`` + ``export_library`` of ``mod`` by TVM's CPU pipeline
    (``relay_amp_schedules`` False) or by relay_amp's: ``bench_peers``' own build."""
    from bench_peers import _build

    return _build(mod, target, relay_amp_schedules, workdir)[1]


def _row(name: str, index: int, target) -> dict:
    from relay_amp.eval import models, transformers_zoo

    spec = models.get_spec(name)
    order = (False, True) if index % 2 == 0 else (True, False)
    with tempfile.TemporaryDirectory(prefix="bench_build_") as workdir:  # hundreds of MB
        if spec.family == "transformers":
            mod = transformers_zoo.to_relax(transformers_zoo.build(name))
        else:
            mod = models.load(name, workdir, batch_size=1).mod
        seconds = {ours: build_seconds(mod, target, ours, workdir) for ours in order}
    return {"model": name, "status": "ok", "tvm_build_s": round(seconds[False], 2),
            "relay_amp_build_s": round(seconds[True], 2),
            "ratio": round(seconds[True] / seconds[False], 3), "first": "relay_amp" if order[0]
            else "tvm"}


def table(rows: list[dict]) -> str:
    """The markdown table of ``rows``, slowest ratio first."""
    lines = ["| model | TVM's build (s) | relay_amp's build (s) | relay_amp ÷ TVM's |",
             "|---|---:|---:|---:|"]
    for row in sorted(rows, key=lambda r: -r.get("ratio", float("inf"))):
        if row["status"] != "ok":
            lines.append(f"| {row['model']} | {row['status']} | | |")
            continue
        lines.append(f"| {row['model']} | {row['tvm_build_s']:.1f} | "
                     f"{row['relay_amp_build_s']:.1f} | {row['ratio']:.2f} × |")
    return "\n".join(lines)


def main(argv=None) -> int:
    import tvm
    from bench_peers import elementwise_chain
    from tqdm import tqdm

    import relay_amp
    from relay_amp.eval import models

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="", help="comma-separated (default: the registry)")
    parser.add_argument("--json", default="", help="rows, kept across runs (resume)")
    parser.add_argument("--markdown", default="", help="also write the table here")
    args = parser.parse_args(argv)
    names = [n for n in args.models.split(",") if n] or sorted(models.REGISTRY)
    for name in names:
        models.get_spec(name)  # an unknown name fails before any build
    rows = []
    if args.json and os.path.exists(args.json):
        with open(args.json) as handle:
            rows = json.load(handle)["rows"]
    done = {row["model"] for row in rows}
    target = tvm.target.Target(relay_amp.host_target())
    with tempfile.TemporaryDirectory(prefix="bench_build_warm_") as warm:
        for ours in (False, True):
            build_seconds(elementwise_chain(2), target, ours, warm)
    for index, name in enumerate(bar := tqdm([n for n in names if n not in done],
                                             unit="model")):
        bar.set_description(name)
        try:
            rows.append(_row(name, index, target))
        except Exception as error:  # noqa: BLE001 - one model's failure is a row, not the end
            traceback.print_exc()
            rows.append({"model": name, "status": f"fails: {type(error).__name__}: "
                                                  f"{str(error).splitlines()[0][:120]}"})
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
        if args.json:
            with open(args.json, "w") as handle:
                json.dump({"target": str(target), "rows": rows}, handle, indent=1)
    text = table(rows)
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as handle:
            handle.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
