"""Benchmarks: conversion speed and scaling, casts, parameter bytes and CPU latency, relay_amp
side by side with TVM's built-in ``relax.transform.ToMixedPrecision`` in the same run.

Timings are medians of repeated runs, interleaved (relay_amp, built-in, relay_amp, ...) so that
load on a noisy machine hits both alike; results are ratios measured in one run.
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import time
from datetime import datetime, timezone

import numpy as np
import tvm
from tvm import relax

from ..builds.pipeline import compile_module
from ..cli.progress import progress_bar
from ..execution import host_target
from ..transform import convert
from .stats import builtin_convert, module_stats
from .sweep import error_message, machine_description
from .synthetic import KINDS, count_bindings, synthetic_module

SIZES = (1000, 5000, 20000, 50000)
MODELS = ("resnet18_v1", "resnet50_v1", "mobilenetv2_1.0", "mobilenet0.25", "densenet121",
          "inceptionv3", "vgg11", "squeezenet1.1", "yolov8n_320", "ppocrv4_rec",
          "palm_detection_full")
LATENCY_MODELS = ("cifar_resnet20_v1", "squeezenet1.1", "mobilenet0.25", "resnet18_v1",
                  "mobilenetv2_1.0")
GOALS = {"conversion_ratio": 2.0, "casts_ratio": 0.60, "param_ratio": 0.51,
         "default_slowdown": 0.05}

# A pass variant: (label, convert function mod -> mod, low-precision dtype of its output)
HOST_DEFAULT = "relay_amp:host default"


def _relay_amp(dtype: str, target=None):
    def run(mod):
        return convert(mod, dtype, target=target)[0]
    return run


def variants(include_bf16: bool = True) -> dict:
    """The conversions compared: relay_amp with this host's target defaults, relay_amp with
    low-precision compute forced (no target), and TVM's built-in pass."""
    found = {HOST_DEFAULT: (_relay_amp("float16", host_target()), "float16"),
             "relay_amp:float16": (_relay_amp("float16"), "float16")}
    if include_bf16:
        found["relay_amp:bfloat16"] = (_relay_amp("bfloat16"), "bfloat16")
    found["tvm:float16"] = (builtin_convert, "float16")
    return found


def _timed(function, *args) -> float:
    gc.collect()
    begin = time.perf_counter()
    function(*args)
    return time.perf_counter() - begin


def interleaved_times(functions: dict, args: tuple, repeats: int) -> dict:
    """Seconds of each function on ``args``, one per round: one warm-up each, then ``repeats``
    rounds in which every function runs once."""
    for function in functions.values():
        function(*args)
    times = {name: [] for name in functions}
    for _ in range(repeats):
        for name, function in functions.items():
            times[name].append(_timed(function, *args))
    return times


def interleaved_medians(functions: dict, args: tuple, repeats: int) -> dict:
    """Median seconds of each function over :func:`interleaved_times`' rounds."""
    times = interleaved_times(functions, args, repeats)
    return {name: statistics.median(values) for name, values in times.items()}


def scaling_exponent(bindings, seconds) -> float:
    """The slope of log(time) over log(size): 1 is linear, 2 quadratic."""
    return float(np.polyfit(np.log(np.asarray(bindings, float)),
                            np.log(np.asarray(seconds, float)), 1)[0])


# ------------------------------------------------------------------------------ conversion speed
def conversion_benchmark(kinds=KINDS, sizes=SIZES, repeats: int = 3,
                         progress: bool = True) -> list[dict]:
    """relay_amp vs the built-in pass on synthetic graphs of each kind and size."""
    passes = {"relay_amp": _relay_amp("float16"), "tvm": builtin_convert}
    rows = []
    jobs = [(kind, size) for kind in kinds for size in sizes]
    for kind, size in progress_bar(jobs, desc="conversion", unit="graph", disable=not progress):
        mod = synthetic_module(kind, size)
        medians = interleaved_medians(passes, (mod,), repeats if size < 20000 else max(
            1, min(repeats, 3)))
        rows.append({"graph": kind, "target_bindings": size, "bindings": count_bindings(mod),
                     "relay_amp_s": medians["relay_amp"], "tvm_s": medians["tvm"],
                     "ratio": medians["relay_amp"] / medians["tvm"]})
    return rows


def scaling_summary(rows: list[dict]) -> dict:
    """Scaling exponent per graph kind and pass."""
    summary = {}
    for kind in sorted({row["graph"] for row in rows}):
        mine = [row for row in rows if row["graph"] == kind]
        if len(mine) < 2:
            continue
        bindings = [row["bindings"] for row in mine]
        summary[kind] = {name: scaling_exponent(bindings, [row[f"{name}_s"] for row in mine])
                         for name in ("relay_amp", "tvm")}
    return summary


def profile_conversion(kind: str = "transformer", size: int = 50000, top: int = 12) -> dict:
    """cProfile of one relay_amp conversion: the functions that take the most time."""
    import cProfile
    import pstats

    mod = synthetic_module(kind, size)
    profiler = cProfile.Profile()
    profiler.enable()
    convert(mod, "float16")
    profiler.disable()
    stats = pstats.Stats(profiler)
    rows = []
    for (filename, line, function), (_, calls, tottime, cumtime, _) in stats.stats.items():
        where = os.path.basename(filename) if filename != "~" else "builtin"
        rows.append({"function": f"{where}:{line}({function})", "calls": calls,
                     "tottime_s": tottime, "cumtime_s": cumtime})
    rows.sort(key=lambda row: row["tottime_s"], reverse=True)
    return {"graph": kind, "bindings": count_bindings(mod), "total_s": stats.total_tt,
            "top": rows[:top]}


# ------------------------------------------------------------------------------ models
def model_benchmark(name: str, repeats: int = 5, latency: bool = False,
                    latency_repeats: int = 5, workdir: str | None = None) -> dict:
    """Conversion time, casts, round trips and parameter bytes of one sweep model for every
    variant; with ``latency``, the compiled CPU latency of float32 and every variant."""
    from . import models

    loaded = models.load(name, workdir)  # no workdir: a folder that goes with ``loaded``
    mod, inputs = loaded.mod, loaded.batches[0]
    found = variants()
    row = {"model": name, "bindings": count_bindings(mod), "fp32": module_stats(mod)}
    converted = {}
    for label, (function, low) in found.items():
        try:
            converted[label] = function(mod)
        except Exception as err:
            row[label] = {"error": error_message(err)}
            continue
        row[label] = module_stats(converted[label], low)
    timed = {label: found[label][0] for label in ("relay_amp:float16", "tvm:float16")
             if label in converted}
    row["convert_s"] = interleaved_medians(timed, (mod,), repeats)
    if latency:
        row["latency_ms"] = latency_benchmark({"fp32": mod, **converted}, inputs,
                                              latency_repeats)
    return row


def latency_benchmark(modules: dict, inputs, repeats: int = 5) -> dict:
    """Median milliseconds of each module compiled for this host, runs interleaved."""
    target = host_target()
    machines = {label: compile_module(module, target) for label, module in modules.items()}
    args = [tvm.runtime.tensor(np.ascontiguousarray(x)) for x in inputs]

    def runner(vm):
        return lambda: vm["main"](*args)

    medians = interleaved_medians({label: runner(vm) for label, vm in machines.items()}, (),
                                  repeats)
    return {label: seconds * 1e3 for label, seconds in medians.items()}


def run_models(names, repeats: int = 5, latency_names=(), latency_repeats: int = 5,
               progress: bool = True) -> list[dict]:
    """:func:`model_benchmark` for each model, each in its own process (a model that fails
    becomes a row with its error)."""
    import multiprocessing

    rows = []
    context = multiprocessing.get_context("spawn")
    for name in progress_bar(list(names), desc="models", unit="model", disable=not progress):
        with context.Pool(1) as pool:
            try:
                rows.append(pool.apply(model_benchmark, (name, repeats, name in latency_names,
                                                         latency_repeats)))
            except Exception as err:
                rows.append({"model": name, "error": error_message(err)})
    return rows


# ------------------------------------------------------------------------------ goals
def goals(conversion: list[dict], model_rows: list[dict]) -> dict:
    """Each done-when goal of the benchmark: the measured figure and whether it holds."""
    out = {}
    if conversion:
        worst = max(conversion, key=lambda row: row["ratio"])
        exponents = scaling_summary(conversion)
        out["conversion_ratio"] = {
            "goal": f"relay_amp conversion <= {GOALS['conversion_ratio']:g}x the built-in's at "
                    "every size",
            "measured": f"worst {worst['ratio']:.2f}x ({worst['graph']}, "
                        f"{worst['bindings']} bindings)",
            "met": worst["ratio"] <= GOALS["conversion_ratio"]}
        if exponents:
            top = max(v["relay_amp"] for v in exponents.values())
            out["scaling"] = {"goal": "linear scaling (exponent ~1)",
                              "measured": ", ".join(f"{k} {v['relay_amp']:.2f}"
                                                    for k, v in exponents.items()),
                              "met": top <= 1.15}
    ok_rows = [row for row in model_rows if "error" not in row
               and "error" not in row.get("relay_amp:float16", {"error": "missing"})]
    casts = cast_ratios(ok_rows)
    if casts:
        median_model, ratio = _median_item(casts)
        trips = [row["relay_amp:float16"]["round_trips"] for row in ok_rows]
        out["casts_ratio"] = {
            "goal": f"casts <= {GOALS['casts_ratio']:.0%} of the built-in's on the median "
                    "model, zero round trips",
            "measured": f"median {ratio:.0%} ({median_model}); round trips "
                        f"{max(trips) if trips else 0} at most",
            "met": ratio <= GOALS["casts_ratio"] and not any(trips)}
    # only models whose weights are all float32 (some .tflite files already store float16)
    params = [(row["model"], label, row[label]["param_bytes"] / row["fp32"]["param_bytes"])
              for row in ok_rows for label in ("relay_amp:float16", "relay_amp:bfloat16")
              if label in row and row["fp32"]["param_bytes"]
              and row["fp32"].get("float32_param_bytes", row["fp32"]["param_bytes"])
              == row["fp32"]["param_bytes"]]
    if params:
        worst = max(params, key=lambda item: item[2])
        out["param_ratio"] = {
            "goal": f"parameter bytes <= {GOALS['param_ratio']:.0%} of float32 (fp16 and bf16)",
            "measured": f"worst {worst[2]:.1%} ({worst[0]}, {worst[1].split(':')[1]}) over "
                        f"{len(params) // 2} models with float32 weights",
            "met": worst[2] <= GOALS["param_ratio"]}
    slowdowns = [(row["model"], row["latency_ms"][HOST_DEFAULT] / row["latency_ms"]["fp32"] - 1)
                 for row in ok_rows if HOST_DEFAULT in row.get("latency_ms", {})]
    if slowdowns:
        worst = max(slowdowns, key=lambda item: item[1])
        out["default_slowdown"] = {
            "goal": f"host-default policy at most {GOALS['default_slowdown']:.0%} slower than "
                    "float32",
            "measured": f"worst {worst[1]:+.1%} ({worst[0]})",
            "met": worst[1] <= GOALS["default_slowdown"]}
    return out


def cast_ratios(rows: list[dict]) -> dict:
    return {row["model"]: row["relay_amp:float16"]["casts"] / row["tvm:float16"]["casts"]
            for row in rows if row.get("tvm:float16", {}).get("casts")}


def cast_ratios_from_sweep(models: dict) -> dict:
    """relay_amp float16 casts / built-in casts per model of a sweep's ``results.json``."""
    ratios = {}
    for name, row in models.items():
        mine = row.get("variants", {}).get("relay_amp:float16", {})
        theirs = row.get("variants", {}).get("tvm:float16", {})
        if mine.get("casts") is not None and theirs.get("casts"):
            ratios[name] = mine["casts"] / theirs["casts"]
    return ratios


def _median_item(values: dict):
    ordered = sorted(values.items(), key=lambda item: item[1])
    return ordered[(len(ordered) - 1) // 2]


# ------------------------------------------------------------------------------ outputs
def write_outputs(results: dict, out_dir: str) -> list[str]:
    """``bench.json``, ``conversion_time.png`` (log-log) and ``bench.md`` in ``out_dir``."""
    os.makedirs(out_dir, exist_ok=True)
    paths = [os.path.join(out_dir, "bench.json")]
    with open(paths[0], "w", encoding="utf-8") as handle:
        json.dump(results, handle, indent=1)
    if results.get("conversion"):
        paths.append(plot_conversion(results["conversion"],
                                     os.path.join(out_dir, "conversion_time.png")))
    paths.append(os.path.join(out_dir, "bench.md"))
    with open(paths[-1], "w", encoding="utf-8") as handle:
        handle.write(markdown(results))
    return paths


def plot_conversion(rows: list[dict], path: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4.5))
    styles = {"transformer": "o", "convnet": "s"}
    for kind in sorted({row["graph"] for row in rows}):
        mine = [row for row in rows if row["graph"] == kind]
        bindings = [row["bindings"] for row in mine]
        marker = styles.get(kind, "^")
        axis.loglog(bindings, [row["relay_amp_s"] for row in mine], marker=marker,
                    color="tab:blue", label=f"relay_amp, {kind}")
        axis.loglog(bindings, [row["tvm_s"] for row in mine], marker=marker, linestyle="--",
                    color="tab:gray", label=f"TVM built-in, {kind}")
    axis.set_xlabel("bindings in the graph")
    axis.set_ylabel("conversion time (s, median)")
    axis.set_title("Conversion time vs graph size (log-log)")
    axis.grid(True, which="both", alpha=0.3)
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path


def _mb(value: int) -> str:
    return f"{value / 1e6:.2f} MB"


def markdown(results: dict) -> str:
    """The tables of ``docs/PERFORMANCE.md``."""
    lines = []
    if results.get("gpu_cost"):
        lines += [f"### GPU cost (CUDA {GPU_COST_TARGET['arch']}, after TVM's legalize-and-fuse "
                  "passes)", "", gpu_cost_markdown(results["gpu_cost"]), ""]
    conversion = results.get("conversion", [])
    if conversion:
        lines += ["### Conversion time, synthetic graphs (float16, median)", "",
                  "| graph | bindings | relay_amp (s) | built-in (s) | ratio |",
                  "|---|---:|---:|---:|---:|"]
        lines += [f"| {row['graph']} | {row['bindings']:,} | {row['relay_amp_s']:.3f} | "
                  f"{row['tvm_s']:.3f} | {row['ratio']:.2f}x |" for row in conversion]
        exponents = scaling_summary(conversion)
        if exponents:
            lines += ["", "Fitted scaling exponent (log time over log bindings): " + "; ".join(
                f"{kind}: relay_amp {v['relay_amp']:.2f}, built-in {v['tvm']:.2f}"
                for kind, v in exponents.items()), ""]
    rows = [row for row in results.get("models", []) if "error" not in row
            and "error" not in row.get("relay_amp:float16", {"error": "missing"})]
    if rows:
        lines += ["### Models: conversion time, casts, round trips, parameter bytes", "",
                  "| model | bindings | convert relay_amp (s) | convert built-in (s) | ratio | "
                  "casts relay_amp / built-in | round trips relay_amp / built-in | "
                  "params fp32 | params fp16 (relay_amp) | params bf16 (relay_amp) |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for row in rows:
            mine = row["convert_s"]["relay_amp:float16"]
            theirs = row["convert_s"].get("tvm:float16")
            builtin = row.get("tvm:float16", {})
            fp32 = row["fp32"]["param_bytes"]
            f16, b16 = row["relay_amp:float16"], row.get("relay_amp:bfloat16", {})
            lines.append(
                f"| {row['model']} | {row['bindings']} | {mine:.3f} | "
                + (f"{theirs:.3f} | {mine / theirs:.1f}x | " if theirs else "fails | - | ")
                + f"{f16['casts']} / {builtin.get('casts', '-')} | "
                f"{f16['round_trips']} / {builtin.get('round_trips', '-')} | {_mb(fp32)} | "
                f"{_mb(f16['param_bytes'])} ({f16['param_bytes'] / fp32:.1%}) | "
                + (f"{_mb(b16['param_bytes'])} ({b16['param_bytes'] / fp32:.1%}) |"
                   if "param_bytes" in b16 else "- |"))
        lines.append("")
        for row in rows:
            for label in ("relay_amp:float16", "relay_amp:bfloat16", "tvm:float16"):
                if "error" in row.get(label, {}):
                    lines.append(f"- {row['model']}, {label}: conversion failed "
                                 f"({row[label]['error']})")
        lines.append("")
    latency = [row for row in rows if "latency_ms" in row]
    if latency:
        labels = list(dict.fromkeys(label for row in latency for label in row["latency_ms"]
                                    if label != "fp32"))
        lines += ["### CPU latency (this host, median ms; ratio to float32)", "",
                  "| model | float32 | " + " | ".join(labels) + " |",
                  "|---|---:|" + "---:|" * len(labels)]
        for row in latency:
            base = row["latency_ms"]["fp32"]
            cells = [f"{row['latency_ms'][label]:.1f} ({row['latency_ms'][label] / base:.2f}x)"
                     if label in row["latency_ms"] else "-" for label in labels]
            lines.append(f"| {row['model']} | {base:.1f} | " + " | ".join(cells) + " |")
        lines.append("")
    sweep = results.get("sweep_cast_ratios")
    if sweep:
        ordered = sorted(sweep.values())
        lines += [f"Casts relay_amp / built-in over the {len(ordered)} models of the sweep's "
                  f"results ({results['meta'].get('sweep_results')}): median "
                  f"{statistics.median(ordered):.0%}, range {ordered[0]:.0%} to "
                  f"{ordered[-1]:.0%}.", ""]
    profile = results.get("profile")
    if profile:
        lines += [f"### Profile: relay_amp on the {profile['graph']} graph of "
                  f"{profile['bindings']:,} bindings (cProfile, {profile['total_s']:.2f} s "
                  "with profiling overhead)", "",
                  "| function | calls | own time (s) | with callees (s) |", "|---|---:|---:|---:|"]
        lines += [f"| `{row['function']}` | {row['calls']:,} | {row['tottime_s']:.3f} | "
                  f"{row['cumtime_s']:.3f} |" for row in profile["top"]]
        lines.append("")
    failed = [row for row in results.get("models", []) if "error" in row]
    for row in failed:
        lines.append(f"- {row['model']}: not measured ({row['error']})")
    if results.get("goals"):
        lines += ["", "### Goals", "", "| goal | measured | met |", "|---|---|---|"]
        lines += [f"| {goal['goal']} | {goal['measured']} | {'yes' if goal['met'] else 'no'} |"
                  for goal in results["goals"].values()]
    return "\n".join(lines) + "\n"


def run_bench(sizes=SIZES, kinds=KINDS, model_names=MODELS, latency_names=LATENCY_MODELS,
              repeats: int = 5, sweep_results: str | None = None, progress: bool = True,
              profile_size: int | None = None, gpu_cost_names=None) -> dict:
    """Everything :mod:`scripts/bench.py` measures, as one JSON-ready dict (``gpu_cost_names``:
    default :data:`GPU_COST_MODELS`, ``()`` for none)."""
    gpu_cost_names = GPU_COST_MODELS if gpu_cost_names is None else gpu_cost_names
    results = {"meta": {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                        "machine": machine_description(), "repeats": repeats}}
    if gpu_cost_names:
        results["gpu_cost"] = gpu_cost_benchmark(gpu_cost_names, progress=progress)
    results["conversion"] = conversion_benchmark(kinds, sizes, repeats, progress) if sizes else []
    if profile_size:
        results["profile"] = profile_conversion("transformer", profile_size)
    names = list(dict.fromkeys(list(model_names) + list(latency_names)))
    results["models"] = run_models(names, repeats, set(latency_names), repeats, progress)
    sweep_rows = None
    if sweep_results:
        with open(sweep_results, encoding="utf-8") as handle:
            sweep_rows = json.load(handle)["models"]
        results["meta"]["sweep_results"] = sweep_results
        results["sweep_cast_ratios"] = cast_ratios_from_sweep(sweep_rows)
    results["goals"] = goals(results["conversion"], results["models"])
    return results


# ------------------------------------------------------------------------------ GPU cost
GPU_COST_MODELS = ("resnet50_v1", "mobilenetv2_1.0", "bert_base", "vit_b16", "llama_decoder")
GPU_COST_TARGET = {"kind": "cuda", "arch": "sm_90"}
_SETTINGS_OFF = {"decompose_batch_norm": False, "mixed_kernels": False,
                 "low_precision_boundaries": False}
#: (label, tool, dtype, float32 data inputs and outputs, policy settings): the variants of the
#: GPU cost table. Weights given as parameters are always in the low-precision dtype.
GPU_COST_VARIANTS = (
    ("relay_amp float16", "relay_amp", "float16", False, {}),
    ("relay_amp bfloat16", "relay_amp", "bfloat16", False, {}),
    ("relay_amp float16, float32 I/O", "relay_amp", "float16", True, {}),
    ("relay_amp float16, low-precision residuals", "relay_amp", "float16", False,
     {"low_precision_residuals": True}),
    ("relay_amp float16, kernel settings off", "relay_amp", "float16", False, _SETTINGS_OFF),
    ("built-in float16", "tvm", "float16", False, {}),
)


def gpu_cost_model(name: str):
    """``(module, weight parameter names)`` of a GPU cost model: GluonCV models through ONNX
    with weights as constants, the transformer graphs with weights as parameters."""
    from . import gpu_bench, models, transformer_graphs

    builders = {"bert_base": gpu_bench.bert_encoder, "vit_b16": transformer_graphs.vit_encoder,
                "llama_decoder": transformer_graphs.llama_decoder}
    if name in builders:
        model = builders[name]()
        return model.mod, list(model.weights)
    return models.load(name).mod, []


def gpu_cost_variant(mod, weights, tool: str, dtype: str, keep_io: bool, settings, target):
    """One variant of the GPU cost table: the ``weights`` parameters in the low-precision dtype,
    the other float parameters (data inputs) too unless ``keep_io``."""
    import relay_amp

    floats = [p.name for p in mod["main"].params
              if str(getattr(p.ty, "dtype", "")) == "float32"]
    low = [name for name in floats if name in weights] if keep_io else floats
    if tool == "tvm":
        return relax.transform.ToMixedPrecision(out_dtype="float32",
                                                fp16_input_names=low)(mod)
    return relay_amp.convert(mod, dtype, target=target, keep_io_dtypes=keep_io,
                             low_precision_inputs=low, **settings)[0]


def gpu_cost_benchmark(names=GPU_COST_MODELS, target=GPU_COST_TARGET,
                       progress: bool = True) -> list[dict]:
    """Kernels and bytes at kernel boundaries after TVM's CUDA legalize-and-fuse passes, for
    float32, each variant of :data:`GPU_COST_VARIANTS`, and the ideal (float32's kernels with
    every float tensor at 2 bytes)."""
    from ..builds.gpu_cost import gpu_cost

    rows = []
    for name in progress_bar(names, desc="gpu cost", unit="model", disable=not progress):
        mod, weights = gpu_cost_model(name)
        fp32 = gpu_cost(mod, target)
        row = {"model": name, "fp32": fp32.as_dict(),
               "ideal_bytes": fp32.ideal_low_precision_bytes()}
        for label, tool, dtype, keep_io, settings in GPU_COST_VARIANTS:
            try:
                start = time.perf_counter()
                converted = gpu_cost_variant(mod, weights, tool, dtype, keep_io, settings, target)
                convert_s = time.perf_counter() - start
                row[label] = {**gpu_cost(converted, target).as_dict(), "convert_s": convert_s}
            except Exception as err:  # a variant that fails is a message in its row
                row[label] = {"error": error_message(err)}
        rows.append(row)
    return rows


def gpu_cost_markdown(rows: list[dict]) -> str:
    """The GPU cost table: bytes as a fraction of float32's, kernels, standalone casts."""
    labels = [label for label, *_ in GPU_COST_VARIANTS]
    lines = ["| model | float32 kernels | ideal bytes | " + " | ".join(labels) + " |",
             "|---|---:|---:|" + "---:|" * len(labels)]
    for row in rows:
        fp32 = row["fp32"]
        cells = []
        for label in labels:
            cost = row.get(label, {})
            if "error" in cost:
                cells.append(f"fails: {cost['error'][:60]}")
            elif cost:
                cells.append(f"{cost['bytes'] / fp32['bytes']:.3f}, {cost['kernels']} "
                             f"({cost['casts']} casts, {cost['parameter_casts']} of parameters)")
            else:
                cells.append("-")
        lines.append(f"| {row['model']} | {fp32['kernels']} | "
                     f"{row['ideal_bytes'] / fp32['bytes']:.3f} | " + " | ".join(cells) + " |")
    lines += ["", "Each cell: bytes at kernel boundaries ÷ float32's, kernels (standalone casts, "
              "and of those the casts of a parameter or constant)."]
    return "\n".join(lines)
