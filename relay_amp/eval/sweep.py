"""The model-zoo sweep: float32 vs relay_amp float16/bfloat16 vs TVM's built-in pass, per model.

Each model runs in its own process (a crash or a timeout costs one row, never the sweep), and
finished models are kept in ``results.json`` so a sweep resumes where it stopped.
"""

from __future__ import annotations

import contextlib
import csv
import json
import multiprocessing
import os
import platform
import re
import resource
import statistics
import sys
import tempfile
import time
import traceback
from datetime import datetime, timezone

import numpy as np

from ..cli.progress import progress_bar
from .models import DEFAULT_MODELS, REGISTRY, get_spec

VARIANTS = ("relay_amp:float16", "relay_amp:bfloat16", "tvm:float16")
STATUSES = ("ok", "import error", "convert error", "compile error", "run error", "timeout",
            "crash")


def variant_names(dtypes) -> list[str]:
    names = [f"relay_amp:{d}" for d in dtypes]
    if "float16" in dtypes:
        names.append("tvm:float16")
    return names


# ------------------------------------------------------------------------------ one model
_FILLER = re.compile(r"^\(\.\.\. \d+ lines skipped \.\.\.\)$")


def error_message(err: BaseException) -> str:
    """``Type: reason`` in one line of at most 300 characters: TVM errors end with the reason
    after a traceback; others (a model list...) lead with it."""
    text = str(err).strip()
    lines = [line.strip() for line in text.splitlines()
             if line.strip() and not _FILLER.match(line.strip())]
    message = (lines[-1] if text.startswith("Traceback") else lines[0]) if lines else (
        type(err).__name__)
    return f"{type(err).__name__}: {message}"[:300]


def _error(status: str, err: BaseException) -> dict:
    return {"status": status, "message": error_message(err)}


def _run_all(vm, batches):
    """Outputs of every batch, and the wall time of the first run."""
    from ..execution import run

    start = time.perf_counter()
    outputs = [run(vm, batches[0])]
    first = time.perf_counter() - start
    return outputs + [run(vm, batch) for batch in batches[1:]], first


#: GluonCV detection rows: the float32 run's highest-scoring boxes that each variant must find
#: (same class, IoU >= 0.5) among all of its own.
GLUON_REFERENCE_BOXES = 20


def task_metrics(spec, reference: list, outputs: list, extra: dict) -> dict:
    """Task agreement of ``outputs`` with ``reference`` (lists of per-batch output lists)."""
    from . import metrics, ocr

    task = spec.task
    if task == "classification":
        ref = np.concatenate([r[0] for r in reference])
        out = np.concatenate([o[0] for o in outputs])
        top1, top5 = metrics.topk_agreement(ref, out)
        return {"top1_agreement": top1, "top5_overlap": top5}
    if task == "segmentation":
        return {"pixel_agreement": float(np.mean(
            [metrics.pixel_agreement(r[0], o[0]) for r, o in zip(reference, outputs)]))}
    if task == "pose":
        return {"keypoint_agreement": float(np.mean(
            [metrics.keypoint_agreement(r[0], o[0]) for r, o in zip(reference, outputs)]))}
    if task == "ocr-det":
        return {"pixel_agreement": float(np.mean(
            [metrics.threshold_agreement(r[0], o[0], 0.3) for r, o in zip(reference, outputs)]))}
    if task == "ocr-cls":
        return {"top1_agreement": float(np.mean(
            [r[0].argmax() == o[0].argmax() for r, o in zip(reference, outputs)]))}
    if task == "ocr-rec":
        chars, truth = extra["characters"], extra["truth"]
        ref_text = [ocr.ctc_decode(r[0], chars).strip() for r in reference]
        out_text = [ocr.ctc_decode(o[0], chars).strip() for o in outputs]
        return {"exact_match_vs_fp32": float(np.mean([a == b for a, b in zip(ref_text, out_text)])),
                "exact_match_vs_truth": float(np.mean([a == b for a, b in zip(out_text, truth)])),
                "fp32_exact_match_vs_truth": float(np.mean(
                    [a == b for a, b in zip(ref_text, truth)]))}
    if task == "encoder":  # output 1 is the pooled ([CLS], pooler or time-mean) vector
        cosines = np.concatenate([metrics.row_cosines(r[1], o[1])
                                  for r, o in zip(reference, outputs)])
        return {"pooled_cosine": float(cosines.mean()), "pooled_cosine_min": float(cosines.min())}
    if task == "causal-lm":
        ref = np.concatenate([r[0].reshape(-1, r[0].shape[-1]) for r in reference])
        out = np.concatenate([o[0].reshape(-1, o[0].shape[-1]) for o in outputs])
        top1, top5 = metrics.next_token_agreement(ref, out)
        return {"next_token_top1": top1, "next_token_top5_overlap": top5}
    if task == "detection":
        recalls, ious = [], []
        for ref, out in zip(reference, outputs):
            if spec.family == "yolov8":
                pairs = [(metrics.decode_yolov8(ref[0]), metrics.decode_yolov8(out[0]))]
            else:  # seeded weights score low: rank, not a threshold, picks the boxes compared
                order = extra.get("detection_outputs", [0, 1, 2])
                pairs = [(metrics.gluon_detections(*[ref[j][i] for j in order],
                                                   score_threshold=None,
                                                   top=GLUON_REFERENCE_BOXES),
                          metrics.gluon_detections(*[out[j][i] for j in order],
                                                   score_threshold=None))
                         for i in range(ref[0].shape[0])]
            for ref_dets, out_dets in pairs:
                recall, iou = metrics.detection_agreement(ref_dets, out_dets)
                recalls.append(recall)
                ious.append(iou)
        return {"detection_recall": float(np.mean(recalls)), "matched_iou": float(np.mean(ious))}
    return {}


def output_agreement(reference: list, outputs: list, extra: dict) -> dict:
    """:class:`relay_amp.execution.Agreement` fields of ``outputs`` (per-batch output lists)
    against ``reference``.

    Where the loader names ``extra["error_outputs"]`` (a detector's NMS inputs: boxes in
    pixels, scores below 1), each is compared on its own and the worst figure of each measure
    is the row's, so the larger values cannot hide the error of the smaller; the measures over
    the model's own outputs (the others) together are kept as ``output_*``. ``nonfinite``
    counts every output."""
    from ..execution import agreement

    per_output = [agreement([batch[i] for batch in reference],
                            [batch[i] for batch in outputs]).relative_l2
                  for i in range(len(reference[0]))]
    weighed = {"relative_l2_per_output": per_output,
               "effective_batches_per_output": effective_batches(reference)}
    chosen = extra.get("error_outputs")
    if not chosen:
        return {**agreement([o for batch in reference for o in batch],
                            [o for batch in outputs for o in batch]).as_dict(), **weighed}
    own = [i for i in range(len(reference[0])) if i not in chosen]
    every = agreement([batch[i] for batch in reference for i in own],
                      [batch[i] for batch in outputs for i in own]).as_dict()
    each = [agreement([batch[i] for batch in reference], [batch[i] for batch in outputs])
            for i in chosen]
    return {"relative_l2": max(a.relative_l2 for a in each),
            "max_abs": max(a.max_abs for a in each), "cosine": min(a.cosine for a in each),
            "relative_l2_each": [a.relative_l2 for a in each], "error_outputs": list(chosen),
            **weighed,
            "nonfinite": every["nonfinite"] + sum(a.nonfinite for a in each),
            **{f"output_{key}": value for key, value in every.items() if key != "nonfinite"}}


def effective_batches(reference: list) -> list:
    """Per output, how many batches its relative L2 error is really measured on: a batch
    weighs in by its squared norm in ``reference`` (per-batch output lists), so a probability
    output that is large on one input is decided by that input. Kish's effective sample size,
    ``(sum w)**2 / sum w**2`` over the batches' squared norms ``w``: the batch count when all
    weigh the same, 1 when one decides alone."""
    counts = []
    for i in range(len(reference[0])):
        weights = _sums_of_squares(batch[i] for batch in reference)
        squares = float(np.sum(weights ** 2))
        counts.append(float(np.sum(weights) ** 2 / squares) if squares > 0 else 0.0)
    return counts


def _sums_of_squares(arrays) -> np.ndarray:
    """Each array's sum of squares, in float64."""
    return np.array([float(np.sum(np.square(np.asarray(a, np.float64)))) for a in arrays])


def ratio_interval(reference: list, ours: list, theirs: list, index: int, draws: int = 2000,
                   coverage: float = 0.9, seed: int = 0) -> tuple:
    """Output ``index``'s relative L2 error in ``ours`` ÷ that in ``theirs`` (per-batch output
    lists against ``reference``), and a paired bootstrap interval of it: the batches drawn
    with replacement ``draws`` times, the same draw for both. Returns ``(ratio, low, high)``
    with ``coverage`` of the draws between ``low`` and ``high``; an interval that spans 1.1
    says the batches do not decide the per-output criterion."""
    mine, base = (_sums_of_squares(np.asarray(o[index], np.float64) - r[index]
                                   for o, r in zip(outputs, reference))
                  for outputs in (ours, theirs))
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(reference), (draws, len(reference)))
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = np.sqrt(mine[picks].sum(1) / base[picks].sum(1))
        ratio = float(np.sqrt(mine.sum() / base.sum()))
    tail = (1 - coverage) / 2 * 100
    low, high = np.nanpercentile(ratios, [tail, 100 - tail])
    return ratio, float(low), float(high)


#: The target whose defaults relay_amp converts for: the output a GPU user gets (it runs on the
#: CPU here; the target only sets the conversion's defaults).
DEFAULT_TARGET = {"kind": "cuda", "arch": "sm_90"}


def measure_model(name: str, dtypes=("float16", "bfloat16"), workdir: str | None = None,
                  on_row=None, calibrated: bool = True, target=DEFAULT_TARGET,
                  batches: int | None = None, gpu_cost: bool = True,
                  policy: dict | None = None) -> dict:
    """Measure one model: the float32 baseline and every variant. Never raises.

    With ``calibrated``, relay_amp converts with ranges from :func:`relay_amp.calibrate` run on
    the model's own input batches (TVM's built-in pass has no such input). ``target`` sets
    relay_amp's defaults (None: the defaults without a target). ``batches`` asks the loader for
    at least that many input batches (:func:`relay_amp.eval.models.load`; None: its own); the
    result's ``batches`` is how many were measured, ``batches_requested`` what was asked.
    ``gpu_cost`` adds the GPU cost rows (:func:`gpu_cost_rows`; without it the row has no
    ``gpu_cost`` entry: they took 4-62 % of a model's time in the 2026-11-25 sweeps, and an
    accuracy sweep or one for a CPU target does not read them). ``policy`` (a
    :meth:`relay_amp.Policy.to_dict`) is what relay_amp converts with (None: the defaults); the
    GPU cost rows keep the defaults."""
    import relay_amp

    from ..builds.pipeline import compile_module
    from . import models
    from .stats import builtin_convert, latency_ms, module_stats

    spec = get_spec(name)
    result = {"model": name, "family": spec.family, "task": spec.task, "weights": spec.weights,
              "input_size": list(spec.input_size), "notes": [], "fp32": {}, "variants": {},
              "batches_requested": batches}
    report = on_row or (lambda result: None)
    try:
        start = time.perf_counter()
        loaded = models.load(name, workdir, batches=batches)
        result["load_s"] = time.perf_counter() - start
        result["notes"] = loaded.notes
        result["batches"] = len(loaded.batches)
    except Exception as err:  # any import failure is a row with its reason
        result["fp32"] = _error("import error", err)
        report(result)
        return result
    reference_mod, nms_inputs = (models.expose_nms_inputs(loaded.mod)
                                 if loaded.extra.get("expose_nms_inputs") else (loaded.mod, 0))

    def expose(mod):
        if not nms_inputs:
            return mod
        exposed, count = models.expose_nms_inputs(mod)
        if count != nms_inputs:
            raise RuntimeError(f"the converted module has {count} NMS inputs to expose; the "
                               f"float32 module has {nms_inputs}")
        return exposed

    try:
        start = time.perf_counter()
        vm = compile_module(reference_mod)
        compile_s = time.perf_counter() - start
        reference, first_run = _run_all(vm, loaded.batches)
        if nms_inputs:
            total = len(reference[0])
            loaded.extra["error_outputs"] = list(range(total - nms_inputs, total))
            result["notes"].append("error measured on what NMS reads (every anchor's decoded "
                                   "boxes and scores, each output on its own, the worst kept), "
                                   "added as outputs after conversion")
        stats = module_stats(loaded.mod)
        result["fp32"] = {"status": "ok", "compile_s": compile_s,
                          "latency_ms": latency_ms(vm, loaded.batches[0],
                                                            previous_run_s=first_run),
                          "param_bytes": stats["param_bytes"], "ops": stats["ops"]}
        if spec.task == "ocr-rec":
            result["fp32"].update(task_metrics(spec, reference, reference, loaded.extra))
    except Exception as err:
        result["fp32"] = _error("compile error" if "vm" not in locals() else "run error", err)
        report(result)
        return result
    calibration = None
    if calibrated:
        try:
            start = time.perf_counter()
            calibration = relay_amp.calibrate(loaded.mod, loaded.batches)
            result["calibrate_s"] = time.perf_counter() - start
        except Exception as err:  # the row says so; the variants run uncalibrated
            result["notes"].append(f"calibration failed: {_error('run error', err)['message']}")
    result["calibrated"] = calibration is not None
    report(result)
    if gpu_cost:
        gpu_cost_rows(result, loaded, calibration, target, dtypes)
        report(result)
    for variant in variant_names(dtypes):
        tool, dtype = variant.split(":")
        row: dict = {}
        try:
            start = time.perf_counter()
            batches = loaded.batches
            if tool == "relay_amp":
                integer = loaded.extra.get("uint8")
                options = {}
                if integer:  # images go in as uint8 from relay_amp.eval.data.ImageBatches
                    options = {"input_dtypes": {integer["input"]: "uint8"},
                               "input_normalization": {integer["input"]: integer["normalization"]}}
                    batches = integer["batches"]
                    row["input"] = ("uint8 (relay_amp.eval.data.ImageBatches, normalization "
                                    "folded in)")
                if policy is not None:
                    options = {"policy": relay_amp.Policy.from_dict({**policy, **options})}
                converted, conversion = relay_amp.convert(loaded.mod, dtype, target=target,
                                                          calibration=calibration, **options)
                row["summary"] = conversion.summary()
            else:
                converted = builtin_convert(loaded.mod)
            row["convert_s"] = time.perf_counter() - start
        except Exception as err:
            result["variants"][variant] = _error("convert error", err)
            report(result)
            continue
        row.update(module_stats(converted, dtype))
        try:
            start = time.perf_counter()
            vm = compile_module(expose(converted))
            row["compile_s"] = time.perf_counter() - start
        except Exception as err:
            result["variants"][variant] = {**row, **_error("compile error", err)}
            report(result)
            continue
        try:
            outputs, first_run = _run_all(vm, batches)
            row["latency_ms"] = latency_ms(vm, batches[0], previous_run_s=first_run)
        except Exception as err:
            result["variants"][variant] = {**row, **_error("run error", err)}
            report(result)
            continue
        row.update(output_agreement(reference, outputs, loaded.extra))
        row.update(task_metrics(spec, reference, outputs, loaded.extra))
        row["status"] = "ok"
        result["variants"][variant] = row
        report(result)
    return result


#: The target of the sweep's GPU cost columns when the sweep's own target is not CUDA.
GPU_COST_TARGET = {"kind": "cuda", "arch": "sm_90"}
#: The GPU cost entry of relay_amp float16 converted with the sweep's calibration.
CALIBRATED_COST = "relay_amp:float16 calibrated"


def gpu_cost_rows(result: dict, loaded, calibration, target, dtypes) -> None:
    """Kernels, bytes at kernel boundaries, standalone casts and copies
    (:func:`relay_amp.gpu_cost`) of what ``relay_amp.cuda_pipeline`` builds of float32, of
    relay_amp's conversion for each dtype (the sweep's target's defaults, float32 inputs and
    outputs, uncalibrated: what a user gets by default; and float16 with the sweep's
    calibration, which keeps out-of-range values float32) and of TVM's built-in float16 pass,
    into the result's ``gpu_cost`` entries, each with the kernels and bytes of TVM's own
    pipeline (``tvm_pipeline``: the fused module relay_amp's pipeline starts from); symbolic
    extents take the sizes of the model's first input batch. A variant that fails is an
    ``error`` there."""
    import relay_amp

    from ..builds.gpu_cost import gpu_cost, symbolic_sizes
    from .stats import builtin_convert

    cuda = target if target and target.get("kind") == "cuda" else GPU_COST_TARGET
    sizes = symbolic_sizes(loaded.mod, loaded.batches[0])
    start = time.perf_counter()
    def measure(mod) -> tuple:
        built, fused = gpu_cost(mod, cuda, sizes), gpu_cost(mod, cuda, sizes, pipeline="tvm")
        return built, {**built.as_dict(), "tvm_pipeline": {"kernels": fused.kernels,
                                                           "bytes": fused.bytes}}

    try:
        base, costs_fp32 = measure(loaded.mod)
    except Exception as err:  # the table says why this model has no GPU cost
        result["gpu_cost"] = _error("convert error", err)
        return
    costs = {"target": cuda, "symbolic": sizes, "pipeline": "relay_amp.cuda_pipeline",
             "fp32": costs_fp32}
    builds = {f"relay_amp:{d}": (lambda d=d: relay_amp.convert(loaded.mod, d, target=target)[0])
              for d in dtypes}
    if "float16" in dtypes and calibration is not None:
        builds[CALIBRATED_COST] = lambda: relay_amp.convert(loaded.mod, "float16", target=target,
                                                            calibration=calibration)[0]
    if "float16" in dtypes:
        builds["tvm:float16"] = lambda: builtin_convert(loaded.mod)
    for variant, build in builds.items():
        try:
            cost, entry = measure(build())
        except Exception as err:
            costs[variant] = _error("convert error", err)
            continue
        costs[variant] = {**entry, "bytes_ratio": cost.bytes / base.bytes if base.bytes else None}
    costs["seconds"] = time.perf_counter() - start
    result["gpu_cost"] = costs


#: relay_amp's pipeline may launch at most this many times the kernels of the fused module it
#: starts from (TVM's own pipeline on the same conversion).
PIPELINE_LAUNCH_LIMIT = 1.1


def gpu_cost_meets_goal(cost: dict, base: dict) -> bool:
    """Bytes at most 0.55 of float32's, no more kernels than float32, no standalone cast, and
    (where recorded) at most :data:`PIPELINE_LAUNCH_LIMIT` times the kernels of TVM's pipeline."""
    fused = cost.get("tvm_pipeline", {}).get("kernels")
    return (cost.get("bytes_ratio") is not None and cost["bytes_ratio"] <= 0.55
            and cost["kernels"] <= base["kernels"] and cost["casts"] == 0
            and (fused is None or cost["kernels"] <= PIPELINE_LAUNCH_LIMIT * fused))


def gpu_cost_markdown(results: dict, order=None) -> str:
    """The GPU cost table: per model, float32's kernels, and per variant bytes ÷ float32,
    kernels and standalone casts; ✓ where relay_amp meets the goal."""
    names = [n for n in (order or []) if n in results["models"]]
    names += [n for n in results["models"] if n not in names]
    variants = ["relay_amp:float16", "relay_amp:bfloat16", CALIBRATED_COST, "tvm:float16"]
    lines = ["| model | float32 kernels | " + " | ".join(variants) + " |",
             "|---|---:|" + "---|" * len(variants)]
    for name in names:
        costs = results["models"][name].get("gpu_cost")
        if not costs:
            continue
        if "fp32" not in costs:
            lines.append(f"| {name} | {costs.get('status')}: {_fmt(costs.get('message'))[:80]} |"
                         + " |" * len(variants))
            continue
        base, cells = costs["fp32"], []
        for variant in variants:
            cost = costs.get(variant)
            if cost is None:
                cells.append("")
            elif "status" in cost:
                cells.append(f"fails: {_fmt(cost.get('message'))[:60]}")
            else:
                mark = " ✓" if variant in variants[:2] and gpu_cost_meets_goal(
                    cost, base) else ""
                ratio = "-" if cost["bytes_ratio"] is None else f"{cost['bytes_ratio']:.3f}"
                fused = cost.get("tvm_pipeline", {}).get("kernels")
                kernels = f"{cost['kernels']}" + ("" if fused is None else f" ({fused})")
                cells.append(f"{ratio}, {kernels}, {cost['casts']}{mark}")
        fused = base.get("tvm_pipeline", {}).get("kernels")
        lines.append(f"| {name} | {base['kernels']}" + ("" if fused is None else f" ({fused})")
                     + " | " + " | ".join(cells) + " |")
    lines += ["", "Each cell: bytes at kernel boundaries ÷ float32's, kernels launched (in "
              "brackets: TVM's own pipeline on the same module, where recorded), standalone "
              "float casts, all of what relay_amp.cuda_pipeline builds, float32 built the same "
              "way; ✓: at most 0.55 of float32's bytes, no more kernels, no standalone cast and "
              f"at most {PIPELINE_LAUNCH_LIMIT} × the kernels of TVM's pipeline (the goal, for "
              "the default conversion: uncalibrated, float32 I/O). The calibrated column keeps "
              "what calibration found out of float16's range in float32 (the conversion the "
              "accuracy columns measure)."]
    return "\n".join(lines)


def _worker(name, dtypes, path, workdir, calibrated, target, batches=None,
            gpu_cost=True, policy=None):  # a child process
    def save(result):
        result["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        with open(path + ".tmp", "w", encoding="utf-8") as handle:
            json.dump(result, handle, default=float)
        os.replace(path + ".tmp", path)

    try:
        measure_model(name, dtypes, workdir, on_row=save, calibrated=calibrated, target=target,
                      batches=batches, gpu_cost=gpu_cost, policy=policy)
    except BaseException:  # pragma: no cover - measure_model catches; this is a last resort
        traceback.print_exc()
        raise


#: What one model's process is assumed to need when no sweep has measured it (GiB); the
#: registry's largest (bert_base, deeplab) peak near this on the 2026-11 re-run.
MODEL_MEMORY_GIB = 4.0
#: Environment variables that size a child's thread pools (TVM's, OpenMP's, BLAS's).
THREAD_VARIABLES = ("TVM_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                    "MKL_NUM_THREADS")


def _available_memory_gib() -> float | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 2**20
    except OSError:
        return None
    return None


def default_jobs() -> int:
    """How many models to measure at once here: one per core, fewer where the available
    memory does not hold :data:`MODEL_MEMORY_GIB` per model."""
    jobs = os.cpu_count() or 1
    memory = _available_memory_gib()
    if memory is not None:
        jobs = min(jobs, int(memory // MODEL_MEMORY_GIB))
    return max(1, jobs)


@contextlib.contextmanager
def _thread_environment(threads: int | None):
    """``os.environ`` with every thread pool sized to ``threads`` while a child is spawned (a
    spawned child reads its environment at start, before any library sizes a pool)."""
    if threads is None:
        yield
        return
    saved = {name: os.environ.get(name) for name in THREAD_VARIABLES}
    os.environ.update({name: str(threads) for name in THREAD_VARIABLES})
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


class _Isolated:
    """One model measured in a child process: started, then :meth:`result` once it ended."""

    def __init__(self, name, dtypes, timeout_s, calibrated, target, batches, threads=None,
                 gpu_cost=True, policy=None):
        self.name, self.dtypes = name, tuple(dtypes)
        self.workdir = tempfile.TemporaryDirectory(prefix="relay_amp_sweep_")
        self.path = os.path.join(self.workdir.name, "result.json")
        context = multiprocessing.get_context("spawn")
        self.process = context.Process(target=_worker,
                                       args=(name, self.dtypes, self.path, self.workdir.name,
                                             calibrated, target, batches, gpu_cost, policy))
        self.timeout_s = timeout_s
        self.started = time.monotonic()
        with _thread_environment(threads):
            self.process.start()
        self.deadline = self.started + timeout_s
        self.concurrency = 1

    def result(self) -> dict:
        """The row of an ended (or overdue: killed here) child; a timeout or crash marks the
        variants it did not measure."""
        status = None
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
            status = {"status": "timeout", "message": f"no result within {self.timeout_s:.0f} s"}
        else:
            self.process.join()
            if self.process.exitcode != 0:
                status = {"status": "crash",
                          "message": f"process exited with code {self.process.exitcode}"}
        if os.path.exists(self.path):
            with open(self.path, encoding="utf-8") as handle:
                result = json.load(handle)
        else:
            spec = get_spec(self.name)
            result = {"model": self.name, "family": spec.family, "task": spec.task,
                      "weights": spec.weights, "input_size": list(spec.input_size),
                      "notes": [], "fp32": {}, "variants": {}}
        self.workdir.cleanup()
        if status is not None:
            if not result["fp32"]:
                result["fp32"] = dict(status)
            elif result["fp32"].get("status") == "ok":
                for variant in variant_names(self.dtypes):
                    result["variants"].setdefault(variant, dict(status))
        result["wall_s"] = time.monotonic() - self.started
        result["concurrency"] = self.concurrency
        return result


def measure_isolated(name: str, dtypes, timeout_s: float, calibrated: bool = True,
                     target=DEFAULT_TARGET, batches: int | None = None,
                     gpu_cost: bool = True, policy: dict | None = None) -> dict:
    """:func:`measure_model` in a child process; a timeout or crash marks the missing rows."""
    child = _Isolated(name, dtypes, timeout_s, calibrated, target, batches, gpu_cost=gpu_cost,
                      policy=policy)
    child.process.join(timeout_s)
    return child.result()


def measure_parallel(names, dtypes, timeout_s: float, jobs: int, calibrated: bool = True,
                     target=DEFAULT_TARGET, batches: int | None = None, gpu_cost: bool = True,
                     policy: dict | None = None):
    """Measure ``names``, ``jobs`` child processes at a time; yields each model's row as its
    child ends, in the order they end.

    Each child's thread pools get ``cores // jobs`` threads so that the children do not
    oversubscribe the cores. Each row records ``concurrency``, the most models that were being
    measured at once while it was (1: alone), so its timing columns can say whether they are
    this machine's or taken under load."""
    from multiprocessing.connection import wait

    if jobs < 1:
        raise ValueError(f"jobs must be at least 1; got {jobs}")
    threads = max(1, (os.cpu_count() or 1) // jobs) if jobs > 1 else None
    waiting, running = list(names), []
    while waiting or running:
        while waiting and len(running) < jobs:
            running.append(_Isolated(waiting.pop(0), dtypes, timeout_s, calibrated, target,
                                     batches, threads, gpu_cost, policy))
        for child in running:
            child.concurrency = max(child.concurrency, len(running))
        now = time.monotonic()
        wait([c.process.sentinel for c in running],
             timeout=max(0.0, min(c.deadline for c in running) - now))
        now = time.monotonic()
        ended = [c for c in running if not c.process.is_alive() or now >= c.deadline]
        for child in ended:
            running.remove(child)
            yield child.name, child.result()


# ------------------------------------------------------------------------------ the sweep
def code_version() -> str:
    """relay_amp's version and, in a git checkout, its commit (``+dirty`` with local changes
    under ``relay_amp/``): rows measured by different code are not merged silently."""
    import subprocess

    import relay_amp

    version = f"relay_amp {relay_amp.__version__}"
    package = os.path.dirname(os.path.abspath(relay_amp.__file__))
    try:
        commit = subprocess.run(["git", "-C", package, "rev-parse", "--short=12", "HEAD"],
                                capture_output=True, text=True, timeout=10, check=True)
        dirty = subprocess.run(["git", "-C", package, "status", "--porcelain", "--", "."],
                               capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return version
    return f"{version} git {commit.stdout.strip()}{'+dirty' if dirty.stdout.strip() else ''}"


def run_sweep(names, dtypes=("float16", "bfloat16"), out_dir="results", timeout_s=900.0,
              force=False, progress=True, calibrated: bool = True,
              target=DEFAULT_TARGET, batches: int | None = None, jobs: int = 1,
              shard: str | None = None, gpu_cost: bool = True,
              policy: dict | None = None) -> dict:
    """Measure ``names`` and write results.json/.csv/.md and error.png into ``out_dir``.

    ``batches`` asks every loader for at least that many input batches (None: each loader's
    own; GluonCV's is one). With it, a finished row of ``results.json`` is kept only if it was
    measured with the same request, or without one on at least ``batches`` batches (what the
    request would measure again); any other row of ``names`` is measured again. Without it,
    finished rows are kept whatever their count (each row records ``batches``, which results.md
    shows, and the summary says when the counts differ).

    ``jobs`` models are measured at once, each in its own process (:func:`measure_parallel`);
    the outputs are written as each model ends. ``shard`` (``"I/N"``) only labels the results:
    :func:`relay_amp.eval.shards.shard_names` picks the names. ``gpu_cost`` False leaves out the
    GPU cost rows (the accuracy columns are the same). ``policy`` (a
    :meth:`relay_amp.Policy.to_dict`) is what relay_amp converts with; a finished row measured
    with another policy is measured again."""
    if batches is not None and batches < 1:
        raise ValueError(f"batches must be at least 1; got {batches}")
    for name in names:
        get_spec(name)
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "results.json")
    results = {"models": {}}
    if os.path.exists(path):  # finished rows are kept; --force re-measures only ``names``
        with open(path, encoding="utf-8") as handle:
            results = json.load(handle)
    results.setdefault("models", {})
    version = code_version()
    results["meta"] = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                       "machine": machine_description(), "dtypes": list(dtypes),
                       "note": "GluonCV rows use seeded weights with BatchNorm statistics "
                               "re-estimated on real photos: they measure float16/bfloat16 "
                               "agreement with float32, not ImageNet accuracy.",
                       "calibrated": calibrated,
                       "relay_amp_target": target, "batches_requested": batches,
                       "jobs": jobs, "shard": shard, "code_version": version,
                       "gpu_cost": gpu_cost, "policy": policy}
    todo = [n for n in names
            if force or not _finished(results["models"].get(n), dtypes, target, batches,
                                      gpu_cost, policy)]
    bar = progress_bar(total=len(todo), desc="sweep", unit="model", disable=not progress)
    children = (measure_parallel(todo, dtypes, timeout_s, jobs, calibrated, target, batches,
                                 gpu_cost, policy)
                if jobs > 1 else
                ((n, measure_isolated(n, dtypes, timeout_s, calibrated, target, batches=batches,
                                      gpu_cost=gpu_cost, policy=policy))
                 for n in todo))
    with bar:
        for name, result in children:
            result.update({"relay_amp_target": target, "batches_requested": batches,
                           "calibrated_requested": calibrated, "dtypes": list(dtypes),
                           "code_version": version, "policy": policy})
            results["models"][name] = result
            write_outputs(results, out_dir, order=names)
            bar.update(1)
            if progress:
                bar.write(progress_line(name, result), file=sys.stderr)
    write_outputs(results, out_dir, order=names)
    return results


def progress_line(name: str, result: dict) -> str:
    """One line per measured model: its float32 status, its variants' and its wall time."""
    statuses = [result.get("fp32", {}).get("status", "?")]
    statuses += [f"{v} {r.get('status', '?')}" for v, r in result.get("variants", {}).items()]
    wall = result.get("wall_s")
    load = result.get("concurrency", 1)
    timing = f"{wall:.0f} s" if isinstance(wall, (int, float)) else "? s"
    if load > 1:
        timing += f", {load} models at once"
    return f"{name}: float32 {', '.join(statuses)} ({timing})"


def same_batches(result: dict, batches: int | None) -> bool:
    """Whether ``result`` stands for a sweep asking for ``batches`` input batches: any count
    when None; else measured with that request, or with none on at least that many batches
    (a loader that already gives as many keeps its own, so the request would measure the same).
    A row measured before counts were recorded has no ``batches`` and does not stand."""
    if batches is None:
        return True
    requested = result.get("batches_requested")
    if requested is not None:
        return requested == batches
    return (result.get("batches") or 0) >= batches


def _finished(result, dtypes, target=DEFAULT_TARGET, batches=None, gpu_cost=False,
              policy=None) -> bool:
    if result and result.get("relay_amp_target", None) != target:
        return False  # measured for another target's defaults
    if result and result.get("policy") != policy:
        return False  # converted with another policy
    if result and not same_batches(result, batches):
        return False  # measured on another number of input batches
    if not result or result.get("fp32", {}).get("status") not in ("ok", "import error"):
        return False
    if result["fp32"]["status"] != "ok":
        return True
    if gpu_cost and "gpu_cost" not in result:
        return False  # measured with --no-gpu-cost; this sweep wants the cost rows
    return all(v in result["variants"] for v in variant_names(dtypes))


def machine_description() -> str:
    import tvm

    return (f"{platform.machine()} {tvm.target.codegen.llvm_get_system_cpu()}, "
            f"{os.cpu_count()} cores, Python {platform.python_version()}, TVM {tvm.__version__}")


# ------------------------------------------------------------------------------ outputs
COLUMNS = ("model", "task", "variant", "status", "relative_l2", "max_abs", "cosine", "nonfinite",
           "agreement", "low_op_fraction", "low_mac_fraction", "casts", "round_trips",
           "param_bytes", "convert_s", "compile_s", "latency_ms", "batches", "concurrency",
           "message")
#: The columns timed by the clock: taken under load where other models ran at the same time.
TIMED_COLUMNS = ("convert_s", "compile_s", "latency_ms")


def _agreement_text(row: dict) -> str:
    keys = ("top1_agreement", "top5_overlap", "detection_recall", "matched_iou",
            "pixel_agreement", "keypoint_agreement", "exact_match_vs_fp32",
            "exact_match_vs_truth", "next_token_top1", "next_token_top5_overlap",
            "pooled_cosine", "pooled_cosine_min")
    digits = {"pooled_cosine": 6, "pooled_cosine_min": 6}  # cosines sit near 1
    parts = [f"{k.replace('_agreement', '').replace('_', ' ')} {row[k]:.{digits.get(k, 3)}f}"
             for k in keys if row.get(k) is not None]
    if row.get("output_relative_l2") is not None:  # relative_l2 is of the named outputs
        parts.append(f"relative L2 of the model's outputs {row['output_relative_l2']:.3g}")
    return "; ".join(parts)


def flat_rows(results: dict, order=None) -> list[dict]:
    """One row per model and variant (float32 first)."""
    names = [n for n in (order or []) if n in results["models"]]
    names += [n for n in results["models"] if n not in names]
    rows = []
    for name in names:
        result = results["models"][name]
        base = {"model": name, "task": result.get("task", ""), "batches": result.get("batches"),
                "concurrency": result.get("concurrency", 1)}
        fp32 = result.get("fp32", {})
        rows.append({**base, "variant": "fp32", **{k: fp32.get(k) for k in COLUMNS if k in fp32},
                     "agreement": "", "status": fp32.get("status", "")})
        for variant, row in result.get("variants", {}).items():
            rows.append({**base, "variant": variant, **{k: row.get(k) for k in COLUMNS if k in row},
                         "agreement": _agreement_text(row)})
    return rows


def _fmt(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        if value != value:
            return "nan"
        if value == 0:
            return "0"
        return f"{value:.3g}" if abs(value) < 1e4 else f"{value:.3e}"
    return str(value).replace("|", "/")


def markdown_table(results: dict, order=None) -> str:
    columns = ("model", "variant", "status", "relative_l2", "max_abs", "nonfinite", "agreement",
               "low_mac_fraction", "casts", "round_trips", "param_bytes", "convert_s",
               "latency_ms", "batches")
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in flat_rows(results, order):
        cells = [_fmt(row.get(c)) + ("*" if c in TIMED_COLUMNS and row.get(c) is not None
                                         and row["concurrency"] > 1 else "") for c in columns]
        if row.get("status") not in ("ok", None, "") and row.get("message"):
            cells[2] = f"{row['status']}: {_fmt(row['message'])[:120]}"
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary_lines(results: dict) -> list[str]:
    """Headline counts: rows per status, and where relay_amp's float16 error beats TVM's."""
    models = results["models"].values()
    imported = {name: m for name, m in results["models"].items()
                if m.get("fp32", {}).get("status") == "ok"}
    lines = [f"{len(results['models'])} models, {len(imported)} imported and ran in float32"]
    ours_nonfinite = sum(1 for m in imported.values() for v, r in m["variants"].items()
                         if v.startswith("relay_amp") and r.get("nonfinite", 0))
    ours_failed = sum(1 for m in imported.values() for v, r in m["variants"].items()
                      if v.startswith("relay_amp") and r.get("status") != "ok")
    both = [(name, m["variants"]["relay_amp:float16"], m["variants"]["tvm:float16"])
            for name, m in imported.items()
            if m["variants"].get("relay_amp:float16", {}).get("status") == "ok"
            and m["variants"].get("tvm:float16", {}).get("status") == "ok"]
    better = sum(1 for _, ours, theirs in both if ours["relative_l2"] <= theirs["relative_l2"])
    builtin_failed = sum(1 for m in imported.values()
                         if m["variants"].get("tvm:float16", {}).get("status", "ok") != "ok")
    builtin_nonfinite = sum(1 for m in imported.values()
                            if m["variants"].get("tvm:float16", {}).get("nonfinite", 0))
    lines.append(f"relay_amp: {ours_failed} failed rows, {ours_nonfinite} rows with NaN/Inf")
    lines.append(f"TVM built-in float16: {builtin_failed} failed, {builtin_nonfinite} with NaN/Inf")
    lines.append(f"relay_amp float16 error <= built-in on {better}/{len(both)} models where "
                 "both ran")
    ratios = sorted((ours["relative_l2"] / theirs["relative_l2"], name) for name, ours, theirs
                    in both if theirs["relative_l2"])
    if ratios:
        largest, worst = ratios[-1]
        lines.append(f"relay_amp float16 error ÷ built-in's: median "
                     f"{statistics.median(r for r, _ in ratios):.3g}, largest {largest:.3g} "
                     f"({worst}), above 1.1 on {sum(r > 1.1 for r, _ in ratios)}")
    lines += per_output_lines(both)
    counts = batch_counts(results)
    if counts:
        lines.append("input batches measured per model (the batches column): " + ", ".join(
            f"{'not recorded' if count is None else count} on {len(names)}"
            for count, names in counts.items()))
    loaded = [m.get("concurrency", 1) for m in models if m.get("concurrency", 1) > 1]
    if loaded:
        lines.append(f"timings marked * ({', '.join(TIMED_COLUMNS)}) of {len(loaded)} models "
                     f"were taken while up to {max(loaded)} models were measured at once: they "
                     "are not this machine's figures (measure alone with --jobs 1)")
    costs = [m["gpu_cost"] for m in models if "fp32" in m.get("gpu_cost", {})]
    for dtype in ("float16", "bfloat16"):
        measured = [c for c in costs if "kernels" in c.get(f"relay_amp:{dtype}", {})]
        if measured:
            met = sum(gpu_cost_meets_goal(c[f"relay_amp:{dtype}"], c["fp32"]) for c in measured)
            lines.append(f"GPU cost of the build, relay_amp {dtype}: the goal (bytes <= 0.55 x "
                         "float32, kernels <= float32, no standalone cast, kernels <= "
                         f"{PIPELINE_LAUNCH_LIMIT} x TVM's pipeline) met on "
                         f"{met}/{len(measured)} models")
    return lines


def measured_outputs(row: dict) -> list | None:
    """The outputs whose error a row's figures stand for: a detector's NMS inputs where the
    loader named them (``error_outputs``; rows measured before it was recorded give their count
    as ``relative_l2_each``, the last outputs), else None for every output. A detector's own
    outputs are what NMS selected (class ids, scores and boxes in score order): one near-tied box
    that swaps places moves their relative L2 by more than any rounding, so detection recall
    and matched IoU measure them instead."""
    if "error_outputs" in row:
        return list(row["error_outputs"])
    each, every = row.get("relative_l2_each"), row.get("relative_l2_per_output")
    if each and every:
        return list(range(len(every) - len(each), len(every)))
    return None


def per_output_ratios(ours: dict, theirs: dict) -> list:
    """relay_amp's error ÷ the built-in's on each output of one model (``relative_l2_per_output``
    of both rows) whose error the rows measure (:func:`measured_outputs`); an output the
    built-in gets exact and relay_amp not counts as infinite, one both get exact is left out."""
    mine, base = ours.get("relative_l2_per_output"), theirs.get("relative_l2_per_output")
    if not mine or not base or len(mine) != len(base):
        return []
    chosen = measured_outputs(ours)
    return [(i, a / b if b else float("inf")) for i, (a, b) in enumerate(zip(mine, base))
            if (a or b) and (chosen is None or i in chosen)]


def per_output_lines(both: list) -> list:
    """The summary's per-output criterion: relay_amp float16 error ≤ 1.1 × the built-in's on
    every output of every model where both ran (not only the model's aggregate), a detector's
    on what its NMS reads (:func:`measured_outputs`). Each output above names how many batches
    its figure is measured on (:func:`effective_batches`)."""
    ratios = [(ratio, name, i, ours.get("effective_batches_per_output"))
              for name, ours, theirs in both for i, ratio in per_output_ratios(ours, theirs)]
    if not ratios:
        return []

    def named(name, index, counts) -> str:
        weighed = (f", {counts[index]:.1f} effective batches"
                   if counts and index < len(counts) else "")
        return f"{name} output {index}{weighed}"

    above = [named(name, i, counts) for ratio, name, i, counts in sorted(ratios, reverse=True)
             if ratio > 1.1]
    largest, name, index, counts = max(ratios, key=lambda r: r[0])
    after_nms = [len(ours["relative_l2_per_output"]) - len(chosen) for _, ours, _ in both
                 if ours.get("relative_l2_per_output")
                 and (chosen := measured_outputs(ours)) is not None]
    detectors = (f" (of {len(after_nms)} detectors, what NMS reads; their {sum(after_nms)} "
                 "outputs after NMS are measured by detection recall and IoU)"
                 if after_nms else "")
    return [f"per output: relay_amp float16 error ÷ built-in's above 1.1 on {len(above)} of "
            f"{len(ratios)} outputs{detectors}" + (f" ({'; '.join(above)})" if above else "")
            + f"; largest {largest:.3g} ({named(name, index, counts)})"]


def batch_counts(results: dict) -> dict:
    """``{input batches measured: [model names]}`` of the models that ran in float32, in
    ascending count (None, for rows measured before counts were recorded, last); empty when
    no row records a count."""
    counts: dict = {}
    for name, model in results["models"].items():
        if model.get("fp32", {}).get("status") == "ok":
            counts.setdefault(model.get("batches"), []).append(name)
    if set(counts) <= {None}:
        return {}
    return dict(sorted(counts.items(), key=lambda item: (item[0] is None, item[0] or 0)))


def section_markdown(title: str, results: dict) -> str:
    """A section of the accuracy doc for a sweep of further models: its command's target and
    date, the headline counts and the per-row table."""
    meta = results.get("meta", {})
    target = json.dumps(meta.get("relay_amp_target"))
    names = ",".join(results["models"])
    if meta.get("batches_requested"):
        names += f" --batches {meta['batches_requested']}"
    lines = [f"## {title}", "",
             f"Command: `relay-amp sweep --models {names}` (relay_amp with the defaults of "
             f"{target}), {meta.get('date', '')}, {meta.get('machine', '')}.", ""]
    lines += [f"- {line}" for line in summary_lines(results)]
    notes = [f"- `{name}`: {'; '.join(model['notes'])}"
             for name, model in results["models"].items() if model.get("notes")]
    if notes:
        lines += ["", "What each row is:", "", *notes]
    return "\n" + "\n".join(lines) + "\n\n" + markdown_table(results) + "\n"


def write_outputs(results: dict, out_dir: str, order=None) -> None:
    with open(os.path.join(out_dir, "results.json"), "w", encoding="utf-8") as handle:
        json.dump(results, handle, indent=1, default=float)
    rows = flat_rows(results, order)
    with open(os.path.join(out_dir, "results.csv"), "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    meta = results.get("meta", {})
    text = [f"# relay_amp sweep ({meta.get('date', '')})", "",
            f"Machine: {meta.get('machine', '')}",
            "", meta.get("note", ""), "", *[f"- {line}" for line in summary_lines(results)], "",
            markdown_table(results, order), "", "## GPU cost (CUDA, float32 I/O)", "",
            gpu_cost_markdown(results, order), ""]
    with open(os.path.join(out_dir, "results.md"), "w", encoding="utf-8") as handle:
        handle.write("\n".join(text))
    plot_errors(results, os.path.join(out_dir, "error.png"), order)


def plot_errors(results: dict, path: str, order=None) -> None:
    """Relative L2 error per model, relay_amp vs TVM's built-in pass, log scale; NaN/Inf and
    failures drawn as marked points at the top."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n in (order or []) if n in results["models"]]
    names += [n for n in results["models"] if n not in names]
    names = [n for n in names if results["models"][n].get("fp32", {}).get("status") == "ok"]
    if not names:
        return
    styles = {"relay_amp:float16": ("o", "tab:blue"), "relay_amp:bfloat16": ("s", "tab:green"),
              "tvm:float16": ("x", "tab:red")}
    values = [r.get("relative_l2") for n in names for r in results["models"][n]["variants"].values()
              if isinstance(r.get("relative_l2"), float) and np.isfinite(r["relative_l2"])
              and r["relative_l2"] > 0]
    top = max(values) * 10 if values else 1.0
    fig, axis = plt.subplots(figsize=(max(6, 0.35 * len(names) + 2), 4.5))
    for variant, (marker, color) in styles.items():
        xs, ys, bad_x = [], [], []
        for i, name in enumerate(names):
            row = results["models"][name]["variants"].get(variant)
            if row is None:
                continue
            error = row.get("relative_l2")
            if row.get("status") == "ok" and error is not None and np.isfinite(error):
                xs.append(i)
                ys.append(max(error, 1e-8))
            else:
                bad_x.append(i)
        label = variant.replace("relay_amp:", "relay_amp ").replace("tvm:", "TVM built-in ")
        axis.scatter(xs, ys, marker=marker, color=color, label=label, zorder=3)
        if bad_x:
            axis.scatter(bad_x, [top] * len(bad_x), marker="v", color=color, s=60,
                         label=f"{label}: NaN/Inf or failed", zorder=3)
    axis.set_yscale("log")
    axis.set_xticks(range(len(names)))
    axis.set_xticklabels(names, rotation=70, ha="right", fontsize=8)
    axis.set_ylabel("relative L2 error vs float32")
    axis.set_title("Output error per model (lower is better)")
    axis.grid(True, axis="y", which="both", alpha=0.3)
    axis.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def list_models() -> str:
    lines = []
    for name, spec in REGISTRY.items():
        default = " (default)" if name in DEFAULT_MODELS else ""
        lines.append(f"{name:32s} {spec.family:10s} {spec.task:15s} {spec.weights}{default}")
    return "\n".join(lines)


def accuracy_markdown(results: dict, command: str, fallback_rows=None, plot_name="error.png",
                      order=None) -> str:
    """docs/ACCURACY.md: headline counts, the error plot, the full table, the fallback table."""
    meta = results.get("meta", {})
    done = len(results["models"])
    gluon = [m for m in results["models"].values() if m.get("family") == "gluoncv"]
    ran = [m for m in gluon if m.get("fp32", {}).get("status") == "ok"]
    uint8 = sum(1 for m in ran if m.get("variants", {}).get("relay_amp:float16", {}).get("input"))
    square = [m["model"] for m in ran if len(set(m.get("input_size") or [0])) == 1
              and not m.get("variants", {}).get("relay_amp:float16", {}).get("input")]
    other = len(ran) - uint8 - len(square)
    lines = ["# Accuracy: relay_amp vs TVM's built-in pass", "",
             f"Command: `{command}`  ", f"Date: {meta.get('date', '')}  ",
             f"Machine: {meta.get('machine', '')}", "",
             meta.get("note", ""), "",
             f"Models measured: {done} of {len(REGISTRY)} in the registry. relay_amp converts "
             "with calibrated ranges (one float32 run on the model's own inputs). Of the "
             f"{len(ran)} GluonCV rows that ran, relay_amp was fed uint8 batches from "
             "`relay_amp.eval.data.ImageBatches` with the ImageNet normalization folded into the "
             "first "
             f"cast in {uint8} (the rows whose `input` field says so in results.json)"
             + (f"; {len(square)} ({', '.join(square)}) were measured before the sweep switched "
                "to uint8 and got float32 input" if square else "")
             + (f"; {other} with a non-square input took float32 input" if other else "")
             + ". The float32 reference and TVM's pass always get the same pixels normalized on "
             "the host.", "",
             *[f"- {line}" for line in summary_lines(results)], "",
             f"![error per model]({plot_name})", "", markdown_table(results, order), ""]
    if fallback_rows:
        from .bench_fallback import table

        lines += ["## Accuracy-driven fallback: relay_amp's search vs segment bisection", "",
                  "`python scripts/bench_fallback.py` — each model is searched at a tolerance of "
                  "half the relative L2 error of its plain (calibrated) float16 conversion, so "
                  "both methods must keep some ops in float32. An evaluation is a full "
                  "conversion + compile + run; relay_amp's paired run and calibration are not "
                  "counted as evaluations but are included in its wall time.", "",
                  table(fallback_rows), ""]
    return "\n".join(lines)


def target_comparison_markdown(before: dict, after: dict) -> str:
    """Two sweeps of the same models side by side: relay_amp's error without a target
    (``before``) and with a target's defaults (``after``), each against the built-in pass of its
    own run. Only the models ``after`` measured are listed."""
    target = after.get("meta", {}).get("relay_amp_target")
    lines = ["| model | relay_amp float16, no target | relay_amp float16, "
             f"{json.dumps(target)} | built-in float16 | ≤ built-in | relay_amp bfloat16, "
             "target | NaN/Inf (relay_amp) |", "|---|---:|---:|---:|---|---:|---:|"]
    compared = at_most = nonfinite = 0
    for name, model in after["models"].items():
        variants = model.get("variants", {})
        mine, theirs = variants.get("relay_amp:float16", {}), variants.get("tvm:float16", {})
        old = before.get("models", {}).get(name, {}).get("variants", {}).get(
            "relay_amp:float16", {})
        bf16 = variants.get("relay_amp:bfloat16", {})

        def cell(row):
            return f"{row['relative_l2']:.2e}" if row.get("status") == "ok" else \
                row.get("status", "-")

        ok = mine.get("status") == "ok" and theirs.get("status") == "ok"
        if ok:
            compared += 1
            at_most += mine["relative_l2"] <= theirs["relative_l2"]
        bad = sum(row.get("nonfinite", 0) for row in (mine, bf16) if row.get("status") == "ok")
        nonfinite += bad
        verdict = ("yes" if mine["relative_l2"] <= theirs["relative_l2"] else
                   f"no ({mine['relative_l2'] / theirs['relative_l2']:.2f}x)") if ok else "-"
        if model.get("fp32", {}).get("status") != "ok":
            lines.append(f"| {name} | - | {model.get('fp32', {}).get('status', '-')} | - | - | - "
                         "| - |")
            continue
        lines.append(f"| {name} | {cell(old) if old else '-'} | {cell(mine)} | {cell(theirs)} | "
                     f"{verdict} | {cell(bf16)} | {bad} |")
    summary = (f"relay_amp float16 with the target's defaults: error ≤ the built-in pass's on "
               f"{at_most} of {compared} models where both ran; {nonfinite} NaN/Inf values.")
    return summary + "\n\n" + "\n".join(lines) + "\n"
