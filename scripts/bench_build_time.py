"""Build time of relay_amp's CPU pipeline beside TVM's, on every registry model (issue 44 item 5),
and whether the two builds' outputs agree within float32 rounding of reordered sums (item 2).

Each model is imported once (batch 1, float32) and built for this host by TVM's CPU pipeline
and by ``relay_amp.cpu_pipeline``, one after the other in one process, the order alternating
from model to model; a build is ``tvm.compile`` + ``export_library``, as a user's is. Both
pipelines are warmed up first on a small convolution and matmul (:func:`warm_up_model`), so
neither pays the process's first compile of those kernels (a 2-op chain did not warm the
convolution path: the first model built in a process paid it). ``--repeat N`` builds each model
N times a pipeline, interleaved, and takes each pipeline's median (this host's TVM build of one
model moved by 30 % between runs).
Both builds then run the registry's first batch, and each output's largest difference is
checked against :func:`relay_amp.eval.rounding.reordering_bound` (``--no-outputs``: times only).

    python scripts/bench_build_time.py --json build_times.json --markdown build_times.md
    python scripts/bench_build_time.py --models yolov8n_320,resnet50_v1 --repeat 3

Rows already in ``--json`` are kept and not built again, so an interrupted sweep resumes.
Times on a shared machine move with its load; the ratio of two builds made side by side is the
figure to read.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def build_seconds(mod, target, relay_amp_schedules: bool, workdir: str) -> float:
    """Seconds of ``tvm.compile`` + ``export_library`` of ``mod`` by TVM's CPU pipeline
    (``relay_amp_schedules`` False) or by relay_amp's: ``bench_peers``' own build."""
    from bench_peers import _build

    return _build(mod, target, relay_amp_schedules, workdir)[1]


def warm_up_model():
    """A small NCHW convolution (3 x 3, then a ReLU) followed by a matmul, float32: the
    kernels whose first build in a process registers the tile intrinsics and compiles the
    layout and packing passes."""
    import numpy as np
    from tvm import relax

    rng = np.random.default_rng(0)
    x = relax.Var("x", relax.TensorType((1, 8, 14, 14), "float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            conv = builder.emit(relax.op.nn.relu(relax.op.nn.conv2d(
                x, relax.const(rng.standard_normal((32, 8, 3, 3)).astype("float32")),
                padding=1)))
            flat = builder.emit(relax.op.reshape(conv, (14, 14 * 32)))
            out = builder.emit_output(relax.op.matmul(
                flat, relax.const(rng.standard_normal((14 * 32, 64)).astype("float32"))))
        builder.emit_func_output(out)
    return builder.get()


def _outputs(function, inputs) -> list:
    import tvm

    from relay_amp.execution import flatten_outputs

    return flatten_outputs(function(*(tvm.runtime.tensor(x) for x in inputs)))


def _row(name: str, index: int, target, outputs: bool = True, repeat: int = 1) -> dict:
    from bench_peers import _build

    from relay_amp.eval import models, rounding, transformers_zoo

    spec = models.get_spec(name)
    order = (False, True) if index % 2 == 0 else (True, False)
    with tempfile.TemporaryDirectory(prefix="bench_build_") as workdir:  # hundreds of MB
        if spec.family == "transformers":
            built = transformers_zoo.build(name)
            mod, inputs = transformers_zoo.to_relax(built), built.batches[0]
        else:
            loaded = models.load(name, workdir, batch_size=1)
            mod, inputs = loaded.mod, loaded.batches[0]
        times, results = {False: [], True: []}, {}
        for ours in order * repeat:
            function, elapsed = _build(mod, target, ours, workdir)
            times[ours].append(elapsed)
            if outputs and ours not in results:
                results[ours] = _outputs(function, inputs)
            del function
    seconds = {ours: statistics.median(times[ours]) for ours in times}
    row = {"model": name, "status": "ok", "tvm_build_s": round(seconds[False], 2),
           "relay_amp_build_s": round(seconds[True], 2),
           "ratio": round(seconds[True] / seconds[False], 3), "first": "relay_amp" if order[0]
           else "tvm"}
    if repeat > 1:
        row.update(builds=repeat, tvm_builds_s=[round(t, 2) for t in times[False]],
                   relay_amp_builds_s=[round(t, 2) for t in times[True]])
    if outputs:
        terms = rounding.reduction_terms(mod)
        compared = rounding.compare(results[True], results[False], terms)
        row.update(terms=terms, outputs=compared,
                   within=all(c["within"] for c in compared),
                   relative=max((c["relative"] for c in compared), default=0.0))
    return row


def _within(row: dict) -> str:
    moved = max((output.get("rows_moved", 0) for output in row.get("outputs", ())), default=0)
    return "**no**" if not row["within"] else \
        f"yes ({moved} ranked rows swapped on a tie)" if moved else "yes"


def table(rows: list[dict]) -> str:
    """The markdown table of ``rows``, slowest ratio first."""
    from relay_amp.eval import rounding

    lines = ["| model | TVM's build (s) | relay_amp's build (s) | relay_amp ÷ TVM's | "
             "max \\|Δ\\| ÷ max \\|y\\| | bound ÷ max \\|y\\| | outputs within |",
             "|---|---:|---:|---:|---:|---:|---|"]
    for row in sorted(rows, key=lambda r: -r.get("ratio", float("inf"))):
        if row["status"] != "ok":
            lines.append(f"| {row['model']} | {row['status']} | | | | | |")
            continue
        checked = "| | | not run |"
        if "within" in row:
            checked = (f"| {row['relative']:.1e} | {rounding.EPSILON * row['terms']:.1e} | "
                       f"{_within(row)} |")
        lines.append(f"| {row['model']} | {row['tvm_build_s']:.1f} | "
                     f"{row['relay_amp_build_s']:.1f} | {row['ratio']:.2f} × {checked}")
    return "\n".join(lines)


def main(argv=None) -> int:
    import tvm
    from tqdm import tqdm

    import relay_amp
    from relay_amp.eval import models

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="", help="comma-separated (default: the registry)")
    parser.add_argument("--json", default="", help="rows, kept across runs (resume)")
    parser.add_argument("--markdown", default="", help="also write the table here")
    parser.add_argument("--no-outputs", action="store_true",
                        help="time the builds only; do not run and compare their outputs")
    parser.add_argument("--repeat", type=int, default=1,
                        help="builds of each model a pipeline, interleaved; the median is kept")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error(f"--repeat must be at least 1, not {args.repeat}")
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
            build_seconds(warm_up_model(), target, ours, warm)
    for index, name in enumerate(bar := tqdm([n for n in names if n not in done],
                                             unit="model")):
        bar.set_description(name)
        try:
            rows.append(_row(name, index, target, not args.no_outputs, args.repeat))
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
