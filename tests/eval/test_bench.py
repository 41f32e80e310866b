"""The benchmark harness: synthetic graphs, medians, scaling fit, goals, outputs, CLI."""

import json
import subprocess
import sys

import numpy as np
import pytest
from tvm import relax

import relay_amp
from relay_amp.builds.pipeline import compile_module
from relay_amp.eval import bench
from relay_amp.eval.stats import builtin_convert
from relay_amp.eval.synthetic import KINDS, count_bindings, synthetic_module
from relay_amp.execution import run


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("size", [100, 1000])
def test_synthetic_graphs_have_about_the_asked_size_and_are_well_formed(kind, size):
    mod = synthetic_module(kind, size)
    relax.analysis.well_formed(mod)
    per_layer = 30 if kind == "transformer" else 12
    assert abs(count_bindings(mod) - size) <= per_layer
    assert tvm_ffi_hash(synthetic_module(kind, size)) == tvm_ffi_hash(mod)  # deterministic


def tvm_ffi_hash(mod):
    import tvm_ffi

    return tvm_ffi.structural_hash(mod, map_free_vars=True)


def test_synthetic_graph_rejects_bad_arguments():
    with pytest.raises(ValueError, match="unknown graph kind 'rnn'"):
        synthetic_module("rnn", 100)
    with pytest.raises(ValueError, match="bindings must be positive"):
        synthetic_module("convnet", 0)


@pytest.mark.parametrize("kind", KINDS)
def test_synthetic_graphs_convert_with_both_passes_and_agree_with_float32(kind, dtype):
    mod = synthetic_module(kind, 60)
    new, report = relay_amp.convert(mod, dtype, verify=True)
    assert report.converted and builtin_convert(mod) is not None
    x = np.random.default_rng(0).uniform(-1, 1, [int(d) for d in
                                                 mod["main"].params[0].ty.shape.values])
    x = x.astype("float32")
    reference = run(compile_module(mod), [x])[0]
    out = run(compile_module(new), [x])[0]
    error = np.linalg.norm(out - reference) / np.linalg.norm(reference)
    assert np.isfinite(out).all() and error < (2e-2 if dtype == "float16" else 1e-1)


def test_scaling_exponent_recovers_the_power():
    sizes = np.array([1e3, 5e3, 2e4, 5e4])
    assert bench.scaling_exponent(sizes, 3e-5 * sizes) == pytest.approx(1.0)
    assert bench.scaling_exponent(sizes, 1e-9 * sizes ** 2) == pytest.approx(2.0)


def test_interleaved_medians_run_every_function_in_every_round():
    calls = []
    medians = bench.interleaved_medians({"a": lambda: calls.append("a"),
                                         "b": lambda: calls.append("b")}, (), 3)
    assert calls == ["a", "b"] * 4  # one warm-up round, then three
    assert set(medians) == {"a", "b"} and all(v >= 0 for v in medians.values())


def _model_row(name, casts, tvm_casts, params, trips=0, slowdown=None):
    row = {"model": name, "bindings": 10, "convert_s": {"relay_amp:float16": 0.2,
                                                        "tvm:float16": 0.1},
           "fp32": {"param_bytes": 100},
           "relay_amp:float16": {"casts": casts, "round_trips": trips, "param_bytes": params},
           "relay_amp:bfloat16": {"casts": casts, "round_trips": trips, "param_bytes": params},
           "tvm:float16": {"casts": tvm_casts, "round_trips": 5, "param_bytes": 100}}
    if slowdown is not None:
        row["latency_ms"] = {"fp32": 10.0, bench.HOST_DEFAULT: 10.0 * (1 + slowdown),
                             "tvm:float16": 12.0}
    return row


def test_goals_are_judged_from_the_measured_rows():
    conversion = [{"graph": "convnet", "bindings": n, "relay_amp_s": n * 1e-4,
                   "tvm_s": n * 1e-4 / ratio, "ratio": ratio}
                  for n, ratio in ((1000, 1.5), (5000, 1.8), (20000, 2.5))]
    rows = [_model_row("a", 10, 40, 50, slowdown=0.01), _model_row("b", 30, 40, 52),
            _model_row("c", 20, 40, 50, slowdown=0.08), {"model": "d", "error": "ValueError: x"}]
    goals = bench.goals(conversion, rows)
    assert not goals["conversion_ratio"]["met"]
    assert "2.50x (convnet, 20000 bindings)" in goals["conversion_ratio"]["measured"]
    assert goals["scaling"]["met"]  # time proportional to size
    assert goals["casts_ratio"]["met"] and "median 50% (c)" in goals["casts_ratio"]["measured"]
    assert not goals["param_ratio"]["met"] and "52.0% (b" in goals["param_ratio"]["measured"]
    assert not goals["default_slowdown"]["met"]
    assert "+8.0% (c)" in goals["default_slowdown"]["measured"]
    rows[0]["relay_amp:float16"]["round_trips"] = 1
    assert not bench.goals([], rows)["casts_ratio"]["met"]


def test_outputs_json_plot_and_markdown(tmp_path):
    conversion = [{"graph": kind, "target_bindings": n, "bindings": n, "relay_amp_s": n * 2e-4,
                   "tvm_s": n * 1e-4, "ratio": 2.0} for kind in KINDS for n in (100, 1000)]
    results = {"meta": {"date": "d", "machine": "m", "repeats": 1}, "conversion": conversion,
               "models": [_model_row("a", 10, 40, 50, slowdown=-0.02),
                          {"model": "d", "error": "ValueError: no"}]}
    results["goals"] = bench.goals(conversion, results["models"])
    paths = bench.write_outputs(results, str(tmp_path))
    assert json.loads((tmp_path / "bench.json").read_text())["conversion"] == conversion
    assert (tmp_path / "conversion_time.png").read_bytes()[:4] == b"\x89PNG"
    text = (tmp_path / "bench.md").read_text()
    assert "| transformer | 1,000 | 0.200 | 0.100 | 2.00x |" in text
    assert "| a | 10 | 0.200 | 0.100 | 2.0x | 10 / 40 | 0 / 5 |" in text
    assert "9.8 (0.98x)" in text and "- d: not measured (ValueError: no)" in text
    assert len(paths) == 3


@pytest.mark.zoo
def test_bench_command_end_to_end(tmp_path):
    """A small real run: two graph sizes, one model with latency."""
    out = tmp_path / "bench"
    result = subprocess.run(
        [sys.executable, "scripts/bench.py", "--sizes", "100,300", "--kinds", "convnet",
         "--models", "cifar_resnet20_v1", "--latency-models", "cifar_resnet20_v1",
         "--repeats", "1", "--profile-size", "200", "--gpu-cost-models", "cifar_resnet20_v1",
         "--quiet", "--out", str(out)],
        capture_output=True, text=True, timeout=900, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    results = json.loads((out / "bench.json").read_text())
    assert [row["target_bindings"] for row in results["conversion"]] == [100, 300]
    (row,) = results["models"]
    assert row["relay_amp:float16"]["round_trips"] == 0
    assert row["relay_amp:float16"]["casts"] < row["tvm:float16"]["casts"]
    assert row["relay_amp:float16"]["param_bytes"] < 0.51 * row["fp32"]["param_bytes"]
    assert set(row["latency_ms"]) == {"fp32", bench.HOST_DEFAULT, "relay_amp:float16",
                                      "relay_amp:bfloat16", "tvm:float16"}
    assert all(value > 0 for value in row["latency_ms"].values())
    assert {"conversion_ratio", "casts_ratio", "param_ratio", "default_slowdown"} <= set(
        results["goals"])
    profile = results["profile"]
    assert profile["bindings"] > 150 and len(profile["top"]) == 12
    assert "### Profile: relay_amp on the transformer graph" in (out / "bench.md").read_text()
    (cost,) = results["gpu_cost"]
    assert cost["model"] == "cifar_resnet20_v1"
    for label, *_ in bench.GPU_COST_VARIANTS:
        assert "error" not in cost[label], (label, cost[label])
    mine = cost["relay_amp float16"]
    assert mine["kernels"] <= cost["fp32"]["kernels"]
    assert mine["bytes"] <= 0.55 * cost["fp32"]["bytes"] and mine["parameter_casts"] == 0
    assert "### GPU cost (CUDA sm_90" in (out / "bench.md").read_text()


@pytest.mark.zoo
def test_gpu_cost_only_runs_just_the_gpu_cost_table(tmp_path):
    out = tmp_path / "bench"
    result = subprocess.run(
        [sys.executable, "-m", "relay_amp.cli", "bench", "--gpu-cost-only",
         "--gpu-cost-models",
         "cifar_resnet20_v1", "--quiet", "--out", str(out)],
        capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    results = json.loads((out / "bench.json").read_text())
    assert results["conversion"] == [] and results["models"] == []
    assert "profile" not in results and len(results["gpu_cost"]) == 1
    assert "| cifar_resnet20_v1 |" in result.stdout


def test_bench_command_rejects_bad_flags():
    for flags, message in ((["--sizes", "1k"], "comma-separated integers"),
                           (["--models", "nonet"], "unknown model"),
                           (["--repeats", "0"], "at least 1"),
                           (["--gpu-cost-models", "resnet5"], "unknown model")):
        result = subprocess.run([sys.executable, "-m", "relay_amp.cli", "bench", *flags],
                                capture_output=True, text=True, check=False, timeout=120)
        assert result.returncode == 2 and message in result.stderr


def test_a_variant_that_fails_to_convert_is_a_message_not_a_lost_row():
    row = _model_row("m", 10, 40, 50, slowdown=0.0)
    row["tvm:float16"] = {"error": "InternalError: Expected TensorType"}
    del row["convert_s"]["tvm:float16"], row["latency_ms"]["tvm:float16"]
    results = {"meta": {}, "conversion": [], "models": [row, _model_row("n", 10, 40, 50)]}
    text = bench.markdown(results)
    assert "| m | 10 | 0.200 | fails | - | 10 / - | 0 / - |" in text
    assert "- m, tvm:float16: conversion failed (InternalError: Expected TensorType)" in text
    goals = bench.goals([], results["models"])
    assert "(n)" in goals["casts_ratio"]["measured"]  # the ratio needs both passes


def test_cpu_latency_and_compile_module_time_relay_amps_cpu_build(monkeypatch):
    """What users see: ``relay_amp.compile_module`` (calibration, the fallback search, the
    sweep) and ``relay-amp bench``'s latency column build ``llvm`` targets with
    ``relay_amp.cpu_pipeline``; TVM's own build stays one argument away."""
    from relay_amp.builds import pipeline

    asked = []
    build = pipeline.build
    monkeypatch.setattr(pipeline, "build", lambda mod, target, **kw: asked.append(
        kw.get("relay_amp_schedules", True)) or build(mod, target, **kw))
    mod = synthetic_module("convnet", 100)
    inputs = [np.zeros([int(d) for d in p.ty.shape.values], "float32")
              for p in mod["main"].params]
    assert set(bench.latency_benchmark({"fp32": mod}, inputs, repeats=1)) == {"fp32"}
    relay_amp.compile_module(mod, relay_amp_schedules=False)
    assert asked == [True, False]
    vm = relay_amp.compile_module(mod)
    (library,) = [m for m in vm.module.imports if m.kind == "llvm"]
    assert "TVMBackendParallelLaunch" in library.inspect_source("ll")
