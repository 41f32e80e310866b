"""The harness's subcommands of ``relay-amp``: ``sweep`` and ``bench`` (:mod:`relay_amp.cli` hands
them here)."""

from __future__ import annotations

import argparse
import json
import os
import sys

from ..cli.arguments import UsageError, parse_target
from . import sweep as sweep_module
from .models import DEFAULT_MODELS, REGISTRY


def _sweep(args) -> int:
    from . import sweep

    if args.list:
        print(sweep.list_models())
        return 0
    if args.merge:
        return _merge(args)
    names = list(REGISTRY) if args.all else [m for m in args.models.split(",") if m]
    jobs = sweep.default_jobs() if args.jobs is None else args.jobs
    if jobs < 1:
        print(f"relay-amp sweep: --jobs must be at least 1; got {jobs}", file=sys.stderr)
        return 2
    if args.shard:
        try:
            names = _shard(names, args)
        except (ValueError, OSError) as err:
            print(f"relay-amp sweep: {err}", file=sys.stderr)
            return 2
        print(f"relay-amp sweep: shard {args.shard}: {len(names)} models: {', '.join(names)}",
              file=sys.stderr)
    dtypes = [d for d in args.dtypes.split(",") if d]
    for dtype in dtypes:
        if dtype not in ("float16", "bfloat16"):
            print(f"relay-amp sweep: unknown dtype {dtype!r} (float16, bfloat16)", file=sys.stderr)
            return 2
    target = None
    if args.target != "none":
        try:
            target, notes = parse_target(args.target)
        except UsageError as err:
            print(f"relay-amp sweep: {err}", file=sys.stderr)
            return 2
        for note in notes:
            print(f"relay-amp sweep: {note}", file=sys.stderr)
    if args.batches is not None and args.batches < 1:
        print(f"relay-amp sweep: --batches must be at least 1; got {args.batches}",
              file=sys.stderr)
        return 2
    policy = None
    if args.policy:
        try:
            policy = _read_policy(args.policy)
        except (OSError, ValueError, TypeError) as err:
            print(f"relay-amp sweep: --policy {args.policy}: {err}", file=sys.stderr)
            return 2
    try:
        results = sweep.run_sweep(names, dtypes, args.out, args.timeout, args.force,
                                  progress=not args.quiet, calibrated=not args.no_calibration,
                                  target=target, batches=args.batches, jobs=jobs,
                                  shard=args.shard, gpu_cost=not args.no_gpu_cost,
                                  policy=policy)
    except KeyError as err:
        print(f"relay-amp sweep: {err.args[0]}", file=sys.stderr)
        return 2
    print("\n".join(sweep.summary_lines(results)))
    print()
    print(sweep.markdown_table(results, names))
    print(f"\nwrote {args.out}/results.json, results.csv, results.md and error.png")
    return 0


def _read_policy(path: str) -> dict:
    """The policy file as :meth:`relay_amp.Policy.to_dict` writes it (checked by reading it)."""
    from relay_amp import Policy

    with open(path, encoding="utf-8") as handle:
        return Policy.from_json(handle.read()).to_dict()


def _shard(names, args) -> list[str]:
    from . import shards

    index, count = shards.parse_shard(args.shard)
    costs = {}
    if args.balance_from:
        with open(args.balance_from, encoding="utf-8") as handle:
            costs = shards.model_costs(json.load(handle))
    return shards.shard_names(names, index, count, costs)


def _merge(args) -> int:
    from . import shards, sweep

    try:
        results = shards.merge_results(args.merge, allow_mixed=args.allow_mixed)
    except (OSError, ValueError) as err:
        print(f"relay-amp sweep --merge: {err}", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    sweep.write_outputs(results, args.out)
    for problem in results["meta"].get("mixed_settings", []):
        print(f"relay-amp sweep --merge: merged anyway: {problem}", file=sys.stderr)
    print("\n".join(sweep.summary_lines(results)))
    print()
    print(sweep.markdown_table(results))
    print(f"\nmerged {len(args.merge)} folders into {args.out}/results.json, results.csv, "
          "results.md and error.png")
    return 0


def _bench(args) -> int:
    from . import bench

    def names(text):
        return [item for item in text.split(",") if item]

    if args.gpu_cost_only:
        args.sizes = args.models = args.latency_models = ""
        args.profile_size = 0
    try:
        sizes = [int(size) for size in names(args.sizes)]
    except ValueError:
        print(f"relay-amp bench: --sizes takes comma-separated integers; got {args.sizes!r}",
              file=sys.stderr)
        return 2
    unknown = [m for m in names(args.models) + names(args.latency_models) if m not in REGISTRY]
    unknown += [m for m in names(args.gpu_cost_models)
                if m not in REGISTRY and m not in bench.GPU_COST_MODELS]
    unknown += [k for k in names(args.kinds) if k not in bench.KINDS]
    if unknown or args.repeats < 1:
        print(f"relay-amp bench: unknown model or graph kind: {', '.join(unknown)}" if unknown
              else "relay-amp bench: --repeats must be at least 1", file=sys.stderr)
        return 2
    results = bench.run_bench(sizes, names(args.kinds), names(args.models),
                              names(args.latency_models), args.repeats, args.sweep_results,
                              progress=not args.quiet, profile_size=args.profile_size,
                              gpu_cost_names=names(args.gpu_cost_models))
    paths = bench.write_outputs(results, args.out)
    print(bench.markdown(results))
    print("wrote " + ", ".join(paths))
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="relay-amp", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    sweep = commands.add_parser(
        "sweep", help="measure models: float32 vs relay_amp float16/bfloat16 vs TVM's pass")
    sweep.add_argument("--models", default=",".join(DEFAULT_MODELS),
                       help="comma-separated model names (default: %(default)s)")
    sweep.add_argument("--all", action="store_true", help="every model in the registry")
    sweep.add_argument("--dtypes", default="float16,bfloat16", help="default: %(default)s")
    sweep.add_argument("--out", default="results", help="output folder (default: %(default)s)")
    sweep.add_argument("--timeout", type=float, default=900.0,
                       help="seconds per model before it is stopped (default: %(default)s)")
    sweep.add_argument("--force", action="store_true", help="re-measure finished models")
    sweep.add_argument("--no-calibration", action="store_true",
                       help="convert without calibrated ranges (relay_amp calibrates by default)")
    sweep.add_argument("--no-gpu-cost", action="store_true",
                       help="leave out the GPU cost rows (what cuda_pipeline builds; up to 60 "
                            "%% of a model's time): for accuracy-only sweeps and CPU "
                            "targets")
    sweep.add_argument("--target", default=json.dumps(sweep_module.DEFAULT_TARGET),
                       help="the target whose defaults relay_amp converts for, as relay-amp "
                            "convert takes it ('cuda -arch=sm_90', a tag, a JSON dict) or 'none' "
                            "(default: %(default)s; the models run on this CPU)")
    sweep.add_argument("--policy", default=None, metavar="POLICY_JSON",
                       help="convert with this policy (Policy.to_json, or a relay-amp convert "
                            "OUT/policy.json; its dtype is replaced by each of --dtypes); "
                            "finished rows converted with another policy are measured again "
                            "(default: the defaults)")
    sweep.add_argument("--batches", type=int, default=None, metavar="N",
                       help="measure each model on at least N input batches where its loader "
                            "can give them (GluonCV: N batches of its batch size from more "
                            "photos; others: more samples of their own source, or their own "
                            "batches if already as many); each row records how many were "
                            "measured. Finished rows measured on another count are measured "
                            "again (default: each loader's own batches, one for GluonCV)")
    sweep.add_argument("--jobs", type=int, default=None, metavar="N",
                       help="measure N models at once, each in its own process (default: one "
                            "per core, fewer where memory is short: "
                            f"{sweep_module.default_jobs()} here); timings taken while other "
                            "models ran are marked *")
    sweep.add_argument("--shard", default=None, metavar="I/N",
                       help="measure part I of N of the selected models (a deterministic "
                            "split, the same on every machine); --merge joins the parts")
    sweep.add_argument("--balance-from", default=None, metavar="RESULTS_JSON",
                       help="with --shard: balance the parts by each model's time in this "
                            "earlier sweep's results.json (default: equal costs)")
    sweep.add_argument("--merge", nargs="+", default=None, metavar="DIR",
                       help="merge these sweeps' output folders into --out (no measuring); "
                            "rows measured with other settings are refused")
    sweep.add_argument("--allow-mixed", action="store_true",
                       help="with --merge: merge rows measured with different settings "
                            "(target, dtypes, batches, calibration, code version, policy)")
    sweep.add_argument("--list", action="store_true", help="list the models and exit")
    sweep.add_argument("--quiet", action="store_true", help="no progress bar")
    sweep.set_defaults(run=_sweep)
    from .bench import GPU_COST_MODELS, KINDS, LATENCY_MODELS, MODELS, SIZES

    bench = commands.add_parser(
        "bench", help="conversion speed and scaling, casts, bytes, CPU latency vs TVM's pass")
    bench.add_argument("--sizes", default=",".join(map(str, SIZES)),
                       help="synthetic graph sizes in bindings; empty skips (default: %(default)s)")
    bench.add_argument("--kinds", default=",".join(KINDS), help="default: %(default)s")
    bench.add_argument("--models", default=",".join(MODELS),
                       help="models for conversion time, casts and bytes (default: %(default)s)")
    bench.add_argument("--latency-models", default=",".join(LATENCY_MODELS),
                       help="models also compiled and timed on this CPU (default: %(default)s)")
    bench.add_argument("--repeats", type=int, default=5, help="default: %(default)s")
    bench.add_argument("--sweep-results", default=None,
                       help="a sweep's results.json: adds cast ratios over all its models")
    bench.add_argument("--profile-size", type=int, default=50000,
                       help="profile relay_amp on a transformer graph of this many bindings "
                            "(0: no profile; default: %(default)s)")
    bench.add_argument("--gpu-cost-models", default=",".join(GPU_COST_MODELS),
                       help="models of the GPU cost table (default: %(default)s)")
    bench.add_argument("--gpu-cost-only", action="store_true",
                       help="only the GPU cost table (about two minutes)")
    bench.add_argument("--out", default="results/bench", help="default: %(default)s")
    bench.add_argument("--quiet", action="store_true", help="no progress bars")
    bench.set_defaults(run=_bench)
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)[1:]
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
