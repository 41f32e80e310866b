"""The ``relay-amp`` command.

``relay-amp convert MODEL -o OUT`` converts a model file and compiles it (:mod:`.convert`);
``relay-amp report OUT/report.json`` prints a saved report (:mod:`.report`). Other subcommands
(``sweep`` and ``bench``, which measure the pass on the model zoo) are plugins: the evaluation
harness registers them as entry points of the group ``relay_amp.commands`` (pyproject.toml),
and this command hands them their arguments unparsed. It never imports the harness itself.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys

from .arguments import CommandError, Interrupted, UsageError, error_exit, parse_input, split_list

#: The entry-point group of subcommands that other packages (the harness) provide.
PLUGIN_GROUP = "relay_amp.commands"


def plugin_commands() -> dict:
    """Subcommand name -> its entry point (``main(argv) -> exit code``), not yet loaded."""
    from importlib.metadata import entry_points

    return {point.name: point for point in entry_points(group=PLUGIN_GROUP)}


def _one_line_errors(parser: argparse.ArgumentParser, name: str) -> None:
    """Make ``parser`` report a usage error as one line (and exit 2), not usage + error."""

    def error(message):
        sys.exit(error_exit(name, UsageError(f"{message} (see relay-amp {name} --help)")))

    parser.error = error


def _convert(args) -> int:
    from . import convert, report

    try:
        inputs = [parse_input(text) for text in args.input or []]
        options = convert.Options(
            model=args.model, out=args.out, dtype=args.dtype, target=args.target,
            calibrate=args.calibrate, tolerance=args.tolerance, metric=args.metric,
            max_evaluations=args.max_evaluations, inputs=inputs, normalize=args.normalize,
            policy=args.policy, fp32_ops=args.fp32_ops, exclude=args.exclude,
            max_samples=args.max_samples, warn_above=args.warn_above,
            dump_errors=args.dump_errors, progress=not args.quiet,
            command="relay-amp convert " + " ".join(shlex.quote(a) for a in args.argv))
        saved = convert.convert_model(options)
    except CommandError as err:
        return error_exit("convert", err)
    except KeyboardInterrupt:
        return error_exit("convert", Interrupted("interrupted; nothing was written"))
    print(saved["conversion"]["summary"])
    print(report.time_line(saved["timings_s"]))
    for line in saved.get("advice", []):
        print(line)
    accuracy = saved.get("accuracy")
    if accuracy:
        print(f"accuracy on {accuracy['batches']} calibration batches (float32 vs converted): "
              f"relative L2 {accuracy['relative_l2']:.3g}, max abs {accuracy['max_abs']:.3g}")
    search = saved["conversion"].get("search")
    if search:
        print(f"tolerance {search['tolerance']:g} met with {len(search['fp32_bindings'])} "
              f"binding(s) kept in float32 ({search['evaluations']} evaluations)")
    if saved.get("accuracy_warning"):
        print(saved["accuracy_warning"], file=sys.stderr if accuracy else sys.stdout)
    if saved.get("error_dump"):
        print(f"{saved['error_dump']['summary']} (relay-amp report {args.out} --errors)")
    files = sorted(os.listdir(args.out))
    print(f"wrote {os.path.join(args.out, '')}: {', '.join(files)}")
    return 0


def _report(args) -> int:
    from . import report

    try:
        if args.errors:
            from .error_dump import format_errors

            print(format_errors(report.read_errors(args.report), rules=split_list(args.rule),
                                ops=split_list(args.op), compute=args.compute,
                                limit=args.limit))
            return 0
        saved = report.read_report(args.report)
        print(report.format_report(saved, rules=split_list(args.rule),
                                   ops=split_list(args.op), compute=args.compute,
                                   limit=args.limit))
    except CommandError as err:
        return error_exit("report", err)
    return 0


def _plugin(point, argv: list) -> int:
    return point.load()(argv)  # loaded only when asked for: convert and report stay light


def build_parser() -> argparse.ArgumentParser:
    """The ``relay-amp`` argument parser."""
    parser = argparse.ArgumentParser(
        prog="relay-amp", description="Convert a model to float16/bfloat16 with relay_amp and "
        "compile it (convert), print a saved report (report), measure the pass on the model zoo "
        "(sweep, bench).")
    commands = parser.add_subparsers(dest="command", required=True)
    for name, point in plugin_commands().items():  # main() hands these on
        provider = point.value.split(":")[0]
        commands.add_parser(name, help=f"provided by {provider} (relay-amp {name} --help)",
                            add_help=False)
    convert = commands.add_parser(
        "convert", help="convert your model file: a compiled library, its report and policy out",
        description="Convert an ONNX, TFLite or torch.export (.pt2) model to float16/bfloat16 "
                    "and compile it for a target. Writes OUT/model.so, report.md, report.json, "
                    "policy.json and, with --calibrate, accuracy.json (and errors.json with "
                    "--dump-errors).")
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
                         help="an input's shape, e.g. images:1,3,320,320; a name keeps a "
                              "dimension symbolic, with the sizes it may take: "
                              "images:batch,3,320,320 or ids:1,seq=1..512 (the model's own "
                              "symbolic dimensions stay symbolic without it); DTYPE uint8 feeds "
                              "a float32 image input as "
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
    convert.add_argument("--warn-above", type=float, default=0.01, metavar="ERROR",
                         help="with --calibrate: warn when the relative L2 error against "
                              "float32 is above this, naming the bindings that cause it "
                              "(default: %(default)s)")
    convert.add_argument("--max-samples", type=int, default=None,
                         help="use at most this many images or batches of --calibrate data")
    convert.add_argument("--policy", help="a policy.json (Policy.to_json, or an OUT/policy.json)")
    convert.add_argument("--fp32-ops", action="append", metavar="OP[,OP...]",
                         help="ops kept in float32, e.g. nn.softmax,exp")
    convert.add_argument("--exclude", action="append", metavar="NAME[,NAME...]",
                         help="bindings kept in float32 by name (the report's binding column); "
                              "re:PATTERN for a regex")
    convert.add_argument("--dump-errors", action="store_true",
                         help="with --calibrate: run float32 and the converted model side by "
                              "side and write OUT/errors.json: each binding's error against "
                              "float32, where it jumps, and an --exclude that keeps it (measured)")
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
    report.add_argument("--errors", action="store_true",
                        help="print the error dump (errors.json beside the report: convert "
                             "--dump-errors) instead of the report")
    report.set_defaults(run=_report)
    _one_line_errors(report, "report")
    return parser


def main(argv=None) -> int:
    """Run ``relay-amp`` with ``argv`` (default: the process's arguments); returns the exit code.

    Output cut short by its reader (``relay-amp report R.json | head``) ends quietly.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        plugins = plugin_commands()
        if argv and argv[0] in plugins:
            code = _plugin(plugins[argv[0]], argv)
        else:
            args = build_parser().parse_args(argv)
            args.argv = argv[1:]
            code = args.run(args)
        sys.stdout.flush()
    except BrokenPipeError:
        # Python flushes stdout again at exit and would report the closed pipe there
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return code
