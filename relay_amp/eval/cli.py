"""The ``relay-amp`` command line."""

from __future__ import annotations

import argparse
import json
import os
import sys

from . import sweep as sweep_module
from .models import DEFAULT_MODELS, REGISTRY


def _sweep(args) -> int:
    from . import sweep  # pylint: disable=import-outside-toplevel

    if args.list:
        print(sweep.list_models())
        return 0
    names = list(REGISTRY) if args.all else [m for m in args.models.split(",") if m]
    dtypes = [d for d in args.dtypes.split(",") if d]
    for dtype in dtypes:
        if dtype not in ("float16", "bfloat16"):
            print(f"relay-amp sweep: unknown dtype {dtype!r} (float16, bfloat16)", file=sys.stderr)
            return 2
    try:
        target = None if args.target == "none" else json.loads(args.target)
        if target is not None:
            import tvm  # pylint: disable=import-outside-toplevel

            tvm.target.Target(target)
    except Exception as err:  # not JSON, or not a target TVM knows
        message = str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__
        print(f"relay-amp sweep: --target takes a JSON target dict or 'none': {message}",
              file=sys.stderr)
        return 2
    try:
        results = sweep.run_sweep(names, dtypes, args.out, args.timeout, args.force,
                                  progress=not args.quiet, calibrated=not args.no_calibration,
                                  target=target)
    except KeyError as err:
        print(f"relay-amp sweep: {err.args[0]}", file=sys.stderr)
        return 2
    print("\n".join(sweep.summary_lines(results)))
    print()
    print(sweep.markdown_table(results, names))
    print(f"\nwrote {args.out}/results.json, results.csv, results.md and error.png")
    return 0


def _bench(args) -> int:
    from . import bench  # pylint: disable=import-outside-toplevel

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


def _one_line_errors(parser: argparse.ArgumentParser, name: str) -> None:
    """Make ``parser`` report a usage error as one line (and exit 2), not usage + error."""

    def error(message):
        print(f"relay-amp {name}: {message} (see relay-amp {name} --help)", file=sys.stderr)
        sys.exit(2)

    parser.error = error


def _convert(args) -> int:
    from . import convert  # pylint: disable=import-outside-toplevel

    try:
        inputs = [convert.parse_input(text) for text in args.input or []]
        options = convert.Options(
            model=args.model, out=args.out, dtype=args.dtype, target=args.target,
            calibrate=args.calibrate, tolerance=args.tolerance, metric=args.metric,
            max_evaluations=args.max_evaluations, inputs=inputs, normalize=args.normalize,
            policy=args.policy, fp32_ops=args.fp32_ops, exclude=args.exclude,
            max_samples=args.max_samples, progress=not args.quiet,
            command="relay-amp convert " + " ".join(_quote(a) for a in args.argv))
        saved = convert.convert_model(options)
    except convert.UsageError as err:
        print(f"relay-amp convert: {err}", file=sys.stderr)
        return 2
    except convert.ConvertFailure as err:
        print(f"relay-amp convert: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("relay-amp convert: interrupted; nothing was written", file=sys.stderr)
        return 130
    print(saved["conversion"]["summary"])
    accuracy = saved.get("accuracy")
    if accuracy:
        print(f"accuracy on {accuracy['batches']} calibration batches (float32 vs converted): "
              f"relative L2 {accuracy['relative_l2']:.3g}, max abs {accuracy['max_abs']:.3g}")
    search = saved["conversion"].get("search")
    if search:
        print(f"tolerance {search['tolerance']:g} met with {len(search['fp32_bindings'])} "
              f"binding(s) kept in float32 ({search['evaluations']} evaluations)")
    files = sorted(os.listdir(args.out))
    print(f"wrote {os.path.join(args.out, '')}: {', '.join(files)}")
    return 0


def _quote(text: str) -> str:
    import shlex  # pylint: disable=import-outside-toplevel

    return shlex.quote(text)


def _report(args) -> int:
    from . import convert  # pylint: disable=import-outside-toplevel

    try:
        saved = convert.read_report(args.report)
        print(convert.format_report(saved, rules=convert.split_list(args.rule),
                                    ops=convert.split_list(args.op), compute=args.compute,
                                    limit=args.limit))
    except convert.UsageError as err:
        print(f"relay-amp report: {err}", file=sys.stderr)
        return 2
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
    sweep.add_argument("--target", default=json.dumps(sweep_module.DEFAULT_TARGET),
                       help="the target whose defaults relay_amp converts for, as a JSON dict, "
                            "or 'none' (default: %(default)s; the models run on this CPU)")
    sweep.add_argument("--list", action="store_true", help="list the models and exit")
    sweep.add_argument("--quiet", action="store_true", help="no progress bar")
    sweep.set_defaults(run=_sweep)
    from .bench import GPU_COST_MODELS, KINDS, LATENCY_MODELS, MODELS, SIZES  # pylint: disable=import-outside-toplevel

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
    convert = commands.add_parser(
        "convert", help="convert your model file: a compiled library, its report and policy out",
        description="Convert an ONNX, TFLite or torch.export (.pt2) model to float16/bfloat16 "
                    "and compile it for a target. Writes OUT/model.so, report.md, report.json, "
                    "policy.json and, with --calibrate, accuracy.json.")
    convert.add_argument("model", help="an .onnx, .tflite or .pt2 (torch.export.save) file")
    convert.add_argument("-o", "--out", required=True,
                         help="output folder (new, empty, or an earlier convert output)")
    convert.add_argument("--dtype", default=None,
                         help="float16 or bfloat16 (default: the --policy file's)")
    convert.add_argument("--target", default="host",
                         help="'cuda', 'cuda -arch=sm_90', 'llvm', 'llvm -mtriple=aarch64-linux-gnu"
                              " -mattr=+fullfp16', 'host' (this CPU) or TVM's JSON dict form "
                              "(default: %(default)s)")
    convert.add_argument("--input", action="append", metavar="NAME:SHAPE[:DTYPE]",
                         help="an input's shape (needed where the model's is symbolic), e.g. "
                              "images:1,3,320,320; DTYPE uint8 feeds a float32 image input as "
                              "uint8 pixels (normalization folded in), float16/bfloat16 in the "
                              "low-precision dtype; repeat per input")
    convert.add_argument("--calibrate", metavar="DIR|NPZ",
                         help="calibration data: a folder of images, or an .npz with an array "
                              "per input name")
    convert.add_argument("--normalize", metavar="imagenet|none|MEAN,STD",
                         help="how image pixels become inputs: scaled to [0, 1], then "
                              "(x - MEAN) / STD per channel; 'none' stops at [0, 1]")
    convert.add_argument("--tolerance", type=float,
                         help="with --calibrate: keep the fewest ops in float32 that meet this "
                              "error against float32 (auto_mixed_precision)")
    convert.add_argument("--metric", choices=("relative_l2", "max_abs"), default="relative_l2",
                         help="the error --tolerance bounds (default: %(default)s)")
    convert.add_argument("--max-evaluations", type=int, default=16,
                         help="full evaluations the --tolerance search may use "
                              "(default: %(default)s)")
    convert.add_argument("--max-samples", type=int, default=None,
                         help="use at most this many images or batches of --calibrate data")
    convert.add_argument("--policy", help="a policy.json (Policy.to_json, or an OUT/policy.json)")
    convert.add_argument("--fp32-ops", action="append", metavar="OP[,OP...]",
                         help="ops kept in float32, e.g. nn.softmax,exp")
    convert.add_argument("--exclude", action="append", metavar="NAME[,NAME...]",
                         help="bindings kept in float32 by name (the report's binding column); "
                              "re:PATTERN for a regex")
    convert.add_argument("--quiet", action="store_true", help="no progress bars")
    convert.set_defaults(run=_convert)
    _one_line_errors(convert, "convert")
    report = commands.add_parser(
        "report", help="print a saved convert report (summary, rows, filters)")
    report.add_argument("report", help="OUT/report.json (or the OUT folder)")
    report.add_argument("--rule", action="append",
                        help="rows whose rule contains this text (e.g. fp32, excluded, storage)")
    report.add_argument("--op", action="append", metavar="OP[,OP...]", help="rows of these ops")
    report.add_argument("--compute", help="rows computed in this dtype (float16, float32, ...)")
    report.add_argument("--limit", type=int, default=None, help="print at most this many rows")
    report.set_defaults(run=_report)
    _one_line_errors(report, "report")
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)[1:]
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
