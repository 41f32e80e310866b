"""``relay-amp convert``: a model file in, a compiled library and its report out.

One call does what a user would otherwise script from the README: import an ONNX, TFLite or
``torch.export`` (``.pt2``) file, convert it with :func:`relay_amp.convert` (optionally with
calibrated ranges and :func:`relay_amp.auto_mixed_precision`), compile it for the target and write::

    OUT/
      model.so        the library (``export_library``); for CUDA it holds the CUDA source that
                      TVM's CUDA loader compiles on the GPU host (this TVM has no CUDA compiler)
      report.md       the conversion explained, for people
      report.json     the same for tools (``relay-amp report OUT/report.json`` prints it)
      policy.json     the effective policy: ``--policy OUT/policy.json`` converts the same way
      accuracy.json   with calibration data: float32 vs the converted model on that data
      errors.json     with ``--dump-errors``: each binding's error against float32

Every bad argument is a :class:`UsageError`: one line that says what to do (exit code 2). All files
are written into a temporary folder next to OUT and renamed into place at the end, so a failed run
leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import difflib
import json
import math
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field

from .arguments import (
    NORMALIZE_HELP,
    ConvertFailure,
    UsageError,
    _plain,
    detect_format,
    one_line,
    parse_normalize,
    parse_target,
    split_list,
    symbolic_ranges,
)
from .calibration_data import (
    IMAGE_EXTENSIONS,
    CalibrationBatches,
    io_normalization,
    list_images,
    load_calibration,
)
from .error_dump import ERRORS_FILE, dump_errors, summary_line
from .frontends import Imported, import_model
from .progress import progress_bar
from .report import markdown_report
from .symbolic import build_notes, describe, symbolic_line, symbols_of, with_bounds

#: The files a convert run writes; a folder holding only these (and report.json) is replaced.
OUTPUT_FILES = ("model.so", "model.tar", "report.md", "report.json", "policy.json",
                "accuracy.json", "errors.json")


REPORT_FORMAT = 1


@dataclass
class Options:
    """What ``relay-amp convert`` was asked to do (validated by :func:`check_options`)."""

    model: str
    out: str
    dtype: str | None = None
    target: str = "host"
    calibrate: str | None = None
    tolerance: float | None = None
    metric: str = "relative_l2"
    max_evaluations: int = 16
    inputs: list = field(default_factory=list)  # InputSpec
    normalize: str | None = None
    policy: str | None = None
    fp32_ops: list = field(default_factory=list)
    exclude: list = field(default_factory=list)
    max_samples: int | None = None
    warn_above: float = 0.01
    dump_errors: bool = False
    progress: bool = True
    command: str = ""


@dataclass
class Checked:
    """Options after validation, everything that needs no model import."""

    fmt: str
    specs: dict
    target: dict
    target_notes: list
    policy: object  # relay_amp.Policy (dtype, fp32 ops, exclusions)
    normalize: object
    calibration_kind: str | None


def check_out(out: str) -> None:
    if not out:
        raise UsageError("-o OUT is empty: name the folder to write")
    if os.path.exists(out) and not os.path.isdir(out):
        raise UsageError(f"-o {out!r} is a file; name a folder (it will hold model.so and the "
                         "reports)")
    if os.path.isdir(out):
        present = set(os.listdir(out))
        foreign = sorted(present - set(OUTPUT_FILES))
        if foreign or (present and "report.json" not in present):
            raise UsageError(f"-o {out!r} already holds files that relay-amp convert did not "
                             f"write ({', '.join(foreign or sorted(present))}); name a new or "
                             "empty folder")


def _exclusion_names(values: list) -> tuple[list, list]:
    names, patterns = [], []
    for value in values:
        if value.startswith("re:"):
            patterns.append(value[3:])
        else:
            names.append(value)
    return names, patterns


def _check_numbers(options: Options) -> None:
    for flag, value in (("--tolerance", options.tolerance), ("--warn-above", options.warn_above)):
        if value is not None and not (math.isfinite(value) and value > 0):
            raise UsageError(f"{flag} {value:g}: give a positive number, e.g. {flag} 0.01 "
                             "(relative L2 error against float32)")
    if options.tolerance is not None and options.calibrate is None:
        raise UsageError("--tolerance needs data to measure on: add --calibrate DIR (images) "
                         "or --calibrate FILE.npz")
    if options.dump_errors and options.calibrate is None:
        raise UsageError("--dump-errors runs float32 and the converted model side by side on "
                         "data: add --calibrate DIR (images) or --calibrate FILE.npz")
    if options.max_evaluations < 1:
        raise UsageError("--max-evaluations must be at least 1")
    if options.max_samples is not None and options.max_samples < 1:
        raise UsageError("--max-samples must be at least 1")


def check_options(options: Options) -> Checked:
    """Every check that needs no model import; raises :class:`UsageError`."""
    from ..policy import Policy

    fmt = detect_format(options.model)
    check_out(options.out)
    specs = {}
    for spec in options.inputs:
        if spec.name in specs:
            raise UsageError(f"--input {spec.name} is given twice; give each input once")
        specs[spec.name] = spec
    symbolic_ranges(specs.values())  # a name given two ranges
    if options.dtype is not None and options.dtype not in ("float16", "bfloat16"):
        close = difflib.get_close_matches(options.dtype, ["float16", "bfloat16"], n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        raise UsageError(f"--dtype {options.dtype!r}: {hint}use float16 or bfloat16")
    if options.dtype is None and options.policy is None:
        raise UsageError("give --dtype float16 or --dtype bfloat16 (or a --policy file that "
                         "names one)")
    _check_numbers(options)
    calibration_kind = None
    if options.calibrate is not None:
        if not os.path.exists(options.calibrate):
            raise UsageError(f"--calibrate {options.calibrate!r} does not exist; give a folder of "
                             "images or an .npz of arrays per input name")
        if os.path.isdir(options.calibrate):
            calibration_kind = "images"
            if not list_images(options.calibrate):
                raise UsageError(f"no images in {options.calibrate!r} (looked for "
                                 f"{', '.join(IMAGE_EXTENSIONS)}); give a folder of images or "
                                 "an .npz of arrays per input name")
        elif options.calibrate.lower().endswith(".npz"):
            calibration_kind = "npz"
        else:
            raise UsageError(f"--calibrate {options.calibrate!r} is neither a folder of images nor "
                             "an .npz file")
    normalize = parse_normalize(options.normalize)
    if options.policy is not None:
        policy = _read_policy(options.policy)
    else:
        policy = Policy(options.dtype)
    if options.dtype is not None and options.dtype != policy.dtype:
        policy = policy.with_dtype(options.dtype)
    fp32_ops = split_list(options.fp32_ops)
    try:
        if fp32_ops:
            policy.fp32(*fp32_ops)
    except (ValueError, TypeError) as err:
        raise UsageError(f"--fp32-ops: {one_line(err)}".replace(" in set_category(fp32)", "")) \
            from None
    names, patterns = _exclusion_names(split_list(options.exclude))
    try:
        policy.exclude(*names)
        policy.exclude(*patterns, regex=True)
    except (ValueError, TypeError) as err:
        raise UsageError(f"--exclude: {one_line(err)}") from None
    target, target_notes = parse_target(options.target)
    return Checked(fmt, specs, target, target_notes, policy, normalize, calibration_kind)


def _read_policy(path: str):
    from ..policy import Policy

    if not os.path.isfile(path):
        raise UsageError(f"--policy {path!r} does not exist; give a policy.json (a convert run "
                         "writes one to its OUT folder)")
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise UsageError(f"--policy {path!r} is not JSON ({one_line(err)})") from None
    try:
        return Policy.from_dict(data)
    except (ValueError, TypeError, KeyError) as err:
        raise UsageError(f"--policy {path}: {one_line(err)}") from None


def _binding_names(mod) -> set:
    from tvm import relax

    names = set()
    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            params = {param.name for param in func.params}
            names |= {var.name for var in relax.analysis.all_vars(func)} - params
    return names


def _check_exclusions(mod, given: list) -> None:
    """Names in ``--exclude`` must be bindings of the model (regexes are not checked)."""
    names, _ = _exclusion_names(given)
    known = _binding_names(mod)
    for name in names:
        if name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=3)
            hint = f"did you mean {', '.join(close)}? " if close else ""
            raise UsageError(f"--exclude {name!r} is not a binding of the model; {hint}the "
                             "binding names are the report's 'binding' column (run once without "
                             "--exclude and see report.md)")


def _io_settings(policy, checked: Checked, imported: Imported, dtype: str):
    """The converted model's input dtypes: ``--input NAME:SHAPE:DTYPE`` and the policy's own."""
    from ..policy import INTEGER_INPUT_DTYPES

    data = policy.to_dict()
    by_source = {i.source: i for i in imported.inputs}
    for source, spec in checked.specs.items():
        model_input = by_source[source]
        if spec.dtype is None or spec.dtype == model_input.dtype:
            continue
        if spec.dtype in ("float16", "bfloat16"):
            if spec.dtype != dtype:
                raise UsageError(f"--input {source}: {spec.dtype} input with --dtype {dtype}; "
                                 f"feed it as {dtype} or float32")
            if model_input.name not in data["low_precision_inputs"]:
                data["low_precision_inputs"].append(model_input.name)
        elif spec.dtype in INTEGER_INPUT_DTYPES:
            if checked.normalize is None:
                raise UsageError(f"--input {source}: fed as {spec.dtype}, the model needs to know "
                                 f"how to scale it: add --normalize {NORMALIZE_HELP}")
            data["input_dtypes"][model_input.name] = spec.dtype
            data["input_normalization"][model_input.name] = io_normalization(
                model_input, checked.normalize)
    io = dict(data["input_dtypes"])
    io.update({name: dtype for name in data["low_precision_inputs"]})
    params = {i.name for i in imported.inputs}
    stray = sorted(set(io) - params)
    if stray:
        raise UsageError(f"the policy feeds {', '.join(stray)} in another dtype, but the model "
                         f"has no such input (its inputs: {', '.join(sorted(params))})")
    return data, io


def _without_io(data: dict) -> dict:
    return {**data, "input_dtypes": {}, "input_normalization": {}, "low_precision_inputs": []}


@contextlib.contextmanager
def _stage(desc: str, progress: bool):
    """A one-step progress bar for a step whose progress TVM does not report."""
    bar = progress_bar(total=1, desc=desc, disable=not progress,
                       bar_format="{desc}: {bar} {elapsed}")
    try:
        yield bar
        bar.update(1)
    finally:
        bar.close()


def _cross_compiler(target: dict):
    """``(fcompile or None, library file name, note)`` for exporting an llvm target: the
    compiler :func:`relay_amp.builds.remote.cross_compiler_for` finds, else the object files."""
    from tvm.support import cc

    from ..builds.remote import cross_compiler_name, target_triple

    if target.get("kind") != "llvm" or not target.get("mtriple"):
        return None, "model.so", None
    try:
        compiler = cross_compiler_name(target)
    except RuntimeError:
        triple = target_triple(target)
        arch = triple.split("-")[0]
        return None, "model.tar", (
            f"no {triple}-g++ here to link the library: model.tar holds the object files, and "
            f"tvm.runtime.load_module('model.tar') links them on the {arch} machine (or install "
            f"{triple}-g++ here and convert again for a model.so)")
    if compiler is None:
        return None, "model.so", None
    return cc.cross_compiler(compiler), "model.so", f"linked with {compiler}"


def _build(mod, target: dict, folder: str, timings: dict):
    """Compile for ``target`` and export; returns ``(executable, library file name, note,
    rule log)`` (:class:`relay_amp.builds.schedule_rules.RuleLog`: which rule scheduled each
    kernel and what it decided, a rule that raised on a kernel and the rule that scheduled it
    instead).
    ``timings`` gets the seconds of the build's stages (``build_relax_passes_s``,
    ``build_tir_passes_s``, ``build_codegen_s``: :func:`relay_amp.builds.pipeline.build`) and of the
    export (``build_export_s``)."""

    from ..builds.packing import can_pack, pack_imports
    from ..builds.pipeline import build
    from ..builds.schedule_rules import RuleLog

    stages: dict = {}
    rule_log = RuleLog()
    executable = build(mod, target, timings=stages, rule_log=rule_log)
    timings.update({f"build_{name}": seconds for name, seconds in stages.items()})
    start = time.perf_counter()
    fcompile, library, note = _cross_compiler(target)
    path = os.path.join(folder, library)
    if fcompile is not None:
        executable.export_library(path, fcompile=fcompile)
    elif can_pack(target):  # the weights packed from one copy (relay_amp.builds.packing)
        executable.export_library(path, fpack_imports=pack_imports)
    else:
        executable.export_library(path)
    timings["build_export_s"] = time.perf_counter() - start
    return executable, library, note, rule_log


def _runs_here(target: dict) -> bool:
    import tvm

    if target.get("kind") != "llvm":
        return False
    triple = target.get("mtriple")
    here = tvm.target.codegen.llvm_get_system_triple().split("-")[0]
    if triple and triple.split("-")[0] != here:
        return False
    features = target.get("mattr") or []
    cpu = target.get("mcpu")
    return not features and (cpu is None or cpu == tvm.target.codegen.llvm_get_system_cpu())


def measure_accuracy(mod, converted, executable, target: dict, data: CalibrationBatches,
                     progress: bool) -> dict:
    """float32 vs the converted model on the calibration data, both run on this CPU."""
    from tvm import relax

    from ..builds.pipeline import compile_module
    from ..execution import agreement, run

    with _stage("accuracy: compile float32 for this CPU", progress):
        reference_vm = compile_module(mod)
    if executable is not None and _runs_here(target):
        import tvm

        converted_vm = relax.VirtualMachine(executable, tvm.cpu())
        where = "the built library, on this CPU"
    else:
        with _stage("accuracy: compile the converted model for this CPU", progress):
            converted_vm = compile_module(converted)
        where = "this CPU (the converted module compiled for it; the library's target differs)"
    references, outputs, per_batch = [], [], []
    for ref_batch, conv_batch in progress_bar(list(zip(data.reference, data.converted)),
                                      desc="accuracy", unit="batch", disable=not progress):
        ref = run(reference_vm, ref_batch)
        out = run(converted_vm, conv_batch)
        references.extend(ref)
        outputs.extend(out)
        per_batch.append(agreement(ref, out).as_dict())
    overall = agreement(references, outputs).as_dict()
    count = len(data.reference)
    outputs_per_batch = len(references) // max(count, 1)
    per_output = []
    for k in range(outputs_per_batch):
        pick = slice(k, None, outputs_per_batch)
        per_output.append({"output": k, "shape": list(references[k].shape),
                           **agreement(references[pick], outputs[pick]).as_dict()})
    return {"ran_on": where, "batches": count, "source": data.source, **overall,
            "worst_batch_relative_l2": max(b["relative_l2"] for b in per_batch),
            "outputs": per_output, "per_batch": per_batch}


#: The most bindings the warning's advice keeps float32 (more is --tolerance's job).
MAX_ADVISED = 12


def output_effects_of(mod, report, data: CalibrationBatches, dtype: str, progress: bool,
                      complete: bool = False) -> dict:
    """Binding name -> the output error with it alone in ``dtype``, for every binding that
    computes or stores low precision: the search's ranking where it ran (its largest only)
    unless ``complete``, else measured on the calibration data
    (:func:`relay_amp.fallback.output_effects`)."""
    from ..fallback import RANKING_BATCHES, output_effects

    if not complete and report.search is not None and report.search.contributors:
        return dict(report.search.contributors)
    # a target that only stores low precision rounds the outputs it stores: those count too
    low = [r.name for r in report.ops if r.function == "main"
           and (r.compute_dtype == dtype or dtype in r.output_dtype.split("+"))]
    bar = progress_bar(total=None, desc=f"accuracy: what moves the outputs ({len(low)} bindings)",
                       unit="run", disable=not progress)

    def ran(done, total):
        bar.total = total
        bar.update(done - bar.n)

    try:
        return output_effects(mod, data.reference[:RANKING_BATCHES], low, dtype, on_run=ran)
    finally:
        bar.close()


def contributors(effects: dict, count: int = 5) -> list:
    """``[name, effect]`` of the ``count`` bindings whose rounding moves the outputs most."""
    ranked = sorted(effects, key=lambda name: -effects[name])[:count]
    return [[name, effects[name]] for name in ranked]


def choose_exclusions(effects: dict, error: float, goal: float,
                      first: tuple = ()) -> tuple[list, float] | None:
    """``(names, estimated error)``: ``first``, then the fewest bindings, largest effect first,
    whose float32 is estimated to bring ``error`` within ``goal``; None where no such set of
    ``first`` and at most :data:`MAX_ADVISED` more does.

    Roundings add in quadrature, so keeping a set float32 removes about its share of the
    effects' sum of squares: the error left is ``error * sqrt(1 - Σ_set e² / Σ_all e²)``, and an
    error spread over many bindings needs many."""
    total = sum(effect ** 2 for effect in effects.values())
    if total <= 0.0:
        return None
    chosen = list(first)
    left = 1.0 - sum(effects.get(name, 0.0) ** 2 for name in chosen) / total
    rest = [name for name in sorted(effects, key=lambda item: -effects[item])
            if name not in chosen]
    for name in rest[:MAX_ADVISED]:
        if error * math.sqrt(max(left, 0.0)) <= goal:
            break
        chosen.append(name)
        left -= effects[name] ** 2 / total
    estimate = error * math.sqrt(max(left, 0.0))
    if not chosen or estimate > goal:
        return None
    return chosen, estimate


def measure_exclusions(mod, policy, target: dict, calibration, data: CalibrationBatches,
                       names: list, what: str, progress: bool) -> dict:
    """The conversion with ``names`` kept float32 on top of ``policy``, measured on the
    calibration data (:func:`measure_accuracy`): ``relative_l2`` and ``nonfinite``."""
    import relay_amp

    from ..policy import Policy

    excluded = Policy.from_dict(policy.to_dict()).exclude(*names)  # exclude() changes its policy
    with _stage(f"{what} ({len(names)} bindings float32)", progress):
        converted, _ = relay_amp.convert(mod, policy=excluded, target=target,
                                         calibration=calibration)
    measured = measure_accuracy(mod, converted, None, target, data, False)
    return {"relative_l2": measured["relative_l2"], "nonfinite": measured["nonfinite"]}


def measured_advice(mod, policy, target: dict, calibration, data: CalibrationBatches,
                    effects: dict, error: float, goal: float, progress: bool) -> dict | None:
    """The fewest bindings, largest effect first, whose float32 is estimated to bring the
    error within ``goal`` (:func:`choose_exclusions`), then converted that way and measured on
    the calibration data: the estimate only chooses the set, the advice states the error
    measured with it. None where no set of at most :data:`MAX_ADVISED` bindings reaches
    ``goal`` by the estimate."""
    choice = choose_exclusions(effects, error, goal)
    if choice is None:
        return None
    chosen, estimate = choice
    measured = measure_exclusions(mod, policy, target, calibration, data, chosen,
                                  "accuracy: check the advice", progress)
    return {"exclude": chosen, "estimated_relative_l2": estimate,
            "measured_relative_l2": measured["relative_l2"],
            "measured_nonfinite": measured["nonfinite"]}


def accuracy_warning(accuracy: dict | None, warn_above: float) -> str | None:
    """The line that says the conversion lost accuracy, naming what lost it and, where a few
    bindings kept float32 fix it, the ``--exclude`` with the error measured with it; or,
    without calibration data, that nothing was measured and how to measure it. None:
    measured, within ``warn_above``."""
    if accuracy is None:
        return ("accuracy not measured: add --calibrate DIR (images) or FILE.npz (an array per "
                "input) to measure the error against float32, and --tolerance to bound it")
    if accuracy["relative_l2"] <= warn_above and not accuracy["nonfinite"]:
        return None
    worst = accuracy.get("contributors") or []
    names = ", ".join(f"{name} ({effect:.2g})" for name, effect in worst[:3])
    error = (f"{accuracy['nonfinite']} NaN/Inf values" if accuracy["nonfinite"] else
             f"relative L2 {accuracy['relative_l2']:.3g} against float32, above {warn_above:g}")
    text = f"warning: accuracy lost: {error}"
    if not names:
        return text + ("; no binding computes or stores low precision to attribute it to "
                       "(constants stored low and rounded inputs are not bindings)")
    text += f"; the bindings whose rounding alone moves the outputs most: {names}"
    advice = accuracy.get("advice")
    if advice is None:
        return text + (f"; no {MAX_ADVISED} bindings kept float32 are estimated to bring it "
                       f"within {warn_above:g}: --tolerance finds the fewest that do")
    measured = advice["measured_relative_l2"]
    text += (f"; with --exclude {','.join(advice['exclude'])} it measured relative L2 "
             f"{measured:.3g} on this data")
    if measured > warn_above or advice["measured_nonfinite"]:
        text += f", still above {warn_above:g}: --tolerance finds the fewest that do"
    return text


def _json_safe(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def convert_model(options: Options) -> dict:
    """Do everything ``relay-amp convert`` does; returns the saved report's data.

    Raises :class:`UsageError` for a bad argument (nothing is written) and
    :class:`ConvertFailure` when a step fails; OUT is complete or untouched either way.
    """
    checked = check_options(options)
    out = os.path.abspath(options.out)
    parent = os.path.dirname(out)
    created = None
    probe = parent
    while not os.path.exists(probe):
        created, probe = probe, os.path.dirname(probe)
    os.makedirs(parent, exist_ok=True)
    work = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.partial-", dir=parent)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(work, 0o777 & ~umask)  # mkdtemp's 0700 would become OUT's mode
    try:
        data = _convert_into(options, checked, work)
        _replace(work, out)
        return data
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        if created is not None:
            shutil.rmtree(created, ignore_errors=True)
        raise


def _replace(work: str, out: str) -> None:
    """Move the finished folder to ``out`` (replacing a previous convert output there)."""
    if os.path.isdir(out):
        old = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.old-", dir=os.path.dirname(out))
        os.rmdir(old)
        os.rename(out, old)
        os.rename(work, out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(work, out)


def _convert_into(options: Options, checked: Checked, work: str) -> dict:
    import relay_amp

    from ..policy import Policy
    from ..relax_utils import TVM_ERRORS

    began, progress, timings = time.perf_counter(), options.progress, {}
    advice: list = []  # what the user can do about a result: printed after the summary
    notes = list(checked.target_notes)
    for note in notes:
        print(f"relay-amp convert: {note}", file=sys.stderr)
    start = time.perf_counter()
    with _stage(f"import {os.path.basename(options.model)}", progress):
        imported = import_model(options.model, checked.fmt, checked.specs)
    timings["import_s"] = time.perf_counter() - start
    notes.extend(imported.notes)
    symbols = symbols_of({i.source: i.shape for i in imported.inputs})
    mod = with_bounds(imported.mod, symbols)  # the bounds TVM plans memory for
    symbolic = describe(imported.inputs, symbols)
    if symbolic_line(symbolic):
        notes.append(symbolic_line(symbolic))
    _check_exclusions(mod, split_list(options.exclude))
    dtype = checked.policy.dtype
    policy_data, io = _io_settings(checked.policy, checked, imported, dtype)
    search_policy = Policy.from_dict(_without_io(policy_data))

    data = load_calibration(checked.calibration_kind, options.calibrate, imported.inputs,
                            checked.normalize, io, options.max_samples, progress)
    if data is not None and data.source.get("note"):  # a symbolic image batch's size
        notes.append(data.source["note"])
    calibration = None
    if data is not None:
        start = time.perf_counter()
        with _stage(f"calibrate ({len(data.reference)} batches, float32 on this CPU)", progress):
            try:
                calibration = relay_amp.calibrate(mod, data.reference)
            except ValueError as err:
                raise UsageError(f"--calibrate: {one_line(err)}") from None
        timings["calibrate_s"] = time.perf_counter() - start

    fp32_bindings: list = []
    io_policy = Policy.from_dict(policy_data)
    if options.tolerance is not None:
        start = time.perf_counter()
        bar = progress_bar(total=options.max_evaluations,
                           desc=f"search (tolerance {options.tolerance:g})",
                           unit="evaluation", disable=not progress)
        def step(fp32, value):
            bar.update(1)
            bar.set_postfix_str(f"{len(fp32)} float32, error {value:.3g}")

        try:
            converted, report = relay_amp.auto_mixed_precision(
                mod, data.reference, options.tolerance, metric=options.metric, dtype=dtype,
                target=checked.target, max_evaluations=options.max_evaluations,
                policy=search_policy, calibrated=calibration if calibration is not None else True,
                on_evaluation=step, output_policy=io_policy)
        except RuntimeError as err:
            raise ConvertFailure(f"{one_line(err)}: raise --tolerance or --max-evaluations") \
                from None
        finally:
            bar.close()
        timings["search_s"] = time.perf_counter() - start
        fp32_bindings = list(report.search.fp32_bindings)
    else:
        start = time.perf_counter()
        with _stage(f"convert to {dtype}", progress):
            converted, report = relay_amp.convert(mod, policy=io_policy, target=checked.target,
                                                  calibration=calibration)
        timings["convert_s"] = time.perf_counter() - start
    converted = with_bounds(converted, symbols)
    policy = Policy.from_dict(policy_data).exclude(  # what policy.json holds
        *[name for name in fp32_bindings if name not in policy_data["exclude_names"]])
    storage = [row for row in report.ops if row.code == "target_storage_only"]
    if storage:
        x86, arm = ("avx512fp16", "fullfp16") if dtype == "float16" else ("avx512bf16", "bf16")
        target_name = storage[0].reason("target_storage_only").values["target"]
        note = (f"compute stays float32 in {len(storage)} ops: target {target_name} has no fast "
                f"{dtype} arithmetic, so {dtype} only stores them; for {dtype} compute give a "
                f"target that has it, e.g. --target 'llvm -mattr=+{x86}' (x86) or "
                f"'llvm -mtriple=aarch64-linux-gnu -mattr=+{arm}' (ARM)")
        notes.append(note)
        advice.append(note)

    start = time.perf_counter()
    with _stage(f"build for {checked.target.get('kind')}", progress):
        try:
            executable, library, build_note, rule_log = _build(converted, checked.target,
                                                               work, timings)
        except (*TVM_ERRORS, OSError) as err:  # TVM rejects the module, or the library's files
            raise ConvertFailure(f"compiling for {options.target} failed: {one_line(err)}") \
                from None
    timings["build_s"] = time.perf_counter() - start
    if build_note:
        notes.append(build_note)
    rule_errors = rule_log.errors
    notes.extend(error.text() for error in rule_errors)
    notes.extend(build_notes(converted, checked.target))

    accuracy, effects = None, None
    if data is not None:
        start = time.perf_counter()
        accuracy = measure_accuracy(mod, converted, executable, checked.target, data, progress)
        if options.tolerance is not None:
            accuracy["tolerance"] = options.tolerance
            accuracy["metric"] = options.metric
        if accuracy["relative_l2"] > options.warn_above or accuracy["nonfinite"]:
            effects = output_effects_of(mod, report, data, dtype, progress)
            accuracy["contributors"] = contributors(effects)
            if report.search is None and not accuracy["nonfinite"]:
                accuracy["advice"] = measured_advice(
                    mod, io_policy, checked.target, calibration, data, effects,
                    accuracy["relative_l2"], options.warn_above, progress)
        timings["accuracy_s"] = time.perf_counter() - start
        with open(os.path.join(work, "accuracy.json"), "w", encoding="utf-8") as handle:
            json.dump(_json_safe(accuracy), handle, indent=2)

    dump = None
    if options.dump_errors:
        start = time.perf_counter()
        if effects is None or (report.search is not None and report.search.contributors):
            effects = output_effects_of(mod, report, data, dtype, progress, complete=True)
        goal, goal_from = ((options.tolerance, "--tolerance") if options.tolerance is not None
                           else (options.warn_above, "--warn-above"))

        def measure(names):  # on top of policy.json: the search's float32 bindings stay
            return measure_exclusions(mod, policy, checked.target, calibration, data, names,
                                      "error dump: check the --exclude", progress)

        dump = _json_safe(dump_errors(mod, converted, report, data, effects, goal, goal_from,
                                      accuracy["relative_l2"], measure, accuracy.get("advice"),
                                      progress))
        # the effects measured here, where the warning did not, are the dump's cost too
        timings["dump_errors_s"] = dump["seconds"] = time.perf_counter() - start
        with open(os.path.join(work, ERRORS_FILE), "w", encoding="utf-8") as handle:
            json.dump(dump, handle, indent=2)

    with open(os.path.join(work, "policy.json"), "w", encoding="utf-8") as handle:
        handle.write(policy.to_json() + "\n")
    timings["total_s"] = time.perf_counter() - began

    saved = {
        "report_format": REPORT_FORMAT,
        "relay_amp_version": relay_amp.__version__,
        "command": options.command,
        "model": {"path": os.path.abspath(options.model), "format": checked.fmt,
                  "inputs": [{"name": i.source, "parameter": i.name,
                              "shape": [d if isinstance(d, int) else str(d) for d in i.shape],
                              "dtype": i.dtype, "fed_as": io.get(i.name, i.dtype)}
                             for i in imported.inputs],
                  "symbolic": symbolic},
        "dtype": dtype,
        "target": _plain(checked.target),  # as chosen: TVM would add its default mtriple
        "target_given": options.target,
        "library": library,
        "policy": "policy.json",
        "calibration": data.source if data is not None else None,
        "tolerance": options.tolerance,
        "accuracy": ({k: v for k, v in accuracy.items() if k not in ("per_batch", "outputs")}
                     if accuracy else None),
        "accuracy_warning": accuracy_warning(accuracy, options.warn_above),
        "error_dump": None if dump is None else {"file": ERRORS_FILE,
                                                  "summary": summary_line(dump)},
        "timings_s": timings,
        "schedule_rule_errors": [asdict(error) for error in rule_errors],
        "kernel_schedules": [asdict(schedule) for schedule in rule_log.schedules],
        "notes": notes,
        "advice": advice,
        "conversion": report.to_dict(),
    }
    saved = _json_safe(saved)
    with open(os.path.join(work, "report.json"), "w", encoding="utf-8") as handle:
        json.dump(saved, handle, indent=2)
    with open(os.path.join(work, "report.md"), "w", encoding="utf-8") as handle:
        handle.write(markdown_report(saved, dump))
    return saved
