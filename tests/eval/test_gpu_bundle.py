"""The GPU bundle: built here, run by its runner with TVM's runtime only and nothing of ours.

The CPU bundle (``llvm``) runs here exactly as the CUDA bundle runs on a GPU host: the runner is
started by a Python that sees neither relay_amp nor the installed TVM (``-S``: no site-packages,
numpy alone on its path), so the bundle is proven to carry everything it needs.
"""

import gzip
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from relay_amp.eval import bundle_runner, gpu_bench, gpu_bundle, transformer_graphs


def small_models():
    bert = gpu_bench.bert_encoder(layers=1, hidden=64, heads=4, ffn=128, seq=16)
    llama = transformer_graphs.llama_decoder(layers=1, hidden=64, heads=4, kv_heads=2,
                                             intermediate=96, vocab=128, seq=8)
    llama.name = "llama_small"
    return [bert, llama]


def isolated_python(tmp_path):
    """A command that runs Python without site-packages, with only numpy importable."""
    import numpy  # noqa: PLC0415

    site = tmp_path / "site"
    site.mkdir()
    numpy_dir = os.path.dirname(numpy.__file__)
    for name in ("numpy", "numpy.libs"):
        path = os.path.join(os.path.dirname(numpy_dir), name)
        if os.path.exists(path):
            os.symlink(path, site / name)
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(site), "HOME": str(tmp_path)}
    return [sys.executable, "-S"], env


@pytest.fixture(scope="module")
def cpu_bundle(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bundle") / "cpu"
    manifest = gpu_bundle.build_bundle(str(folder), small_models(), kind="llvm", progress=False)
    return folder, manifest


def test_cpu_bundle_runs_with_the_runtime_only_and_nothing_of_ours(cpu_bundle, tmp_path):
    folder, manifest = cpu_bundle
    assert manifest["bytes"] < gpu_bundle.MAX_BUNDLE_BYTES
    assert not list(folder.glob("tvm/lib/libtvm_compiler*"))
    python, env = isolated_python(tmp_path)
    out = tmp_path / "results"
    result = subprocess.run(python + [str(folder / "bundle_runner.py"), "--out", str(out),
                                      "--repeats", "5", "--warmup", "1", "--profile"],
                            capture_output=True, text=True, env=env, check=False, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    environment = results["environment"]
    assert environment["runtime_only"] and environment["tvm_file"].startswith(str(folder))
    assert environment["tvm_libraries"], "the runner reports the TVM libraries it loaded"
    assert all(path.startswith(str(folder)) for path in environment["tvm_libraries"])
    assert not any("compiler" in os.path.basename(p) for p in environment["tvm_libraries"])
    assert set(results["models"]) == {"bert_1x64", "llama_small"}
    for model, rows in results["models"].items():
        assert list(rows) == list(gpu_bench.VARIANTS), model
        for variant, row in rows.items():
            assert "error" not in row, (model, variant, row)
            assert row["runs"] == 5 and row["latency_ms"] > 0 and row["nonfinite"] == 0
            profile = row["profile"]  # every call the VM made, timed, longest first
            assert profile["calls"] > 10 and profile["call_ms"] > 0
            assert [r[1] for r in profile["top"]] == sorted((r[1] for r in profile["top"]),
                                                             reverse=True)
            assert any("matmul" in r[0] for r in profile["top"]), profile["top"]
            if variant.startswith("tvm"):  # the built-in pass's error is its own (LLaMA: ~1)
                assert np.isfinite(row["relative_l2"])
                continue
            limit = 0 if variant == "fp32" else 3e-2 if "bfloat16" in variant else 5e-3
            assert row["relative_l2"] <= limit, (model, variant, row)
            assert row["speedup_vs_fp32"] > 0
    table = (out / "results.md").read_text()
    assert "| bert_1x64 | relay_amp:float16 |" in table


def test_the_isolated_runner_says_pytorch_was_not_timed(cpu_bundle, tmp_path):
    folder, _ = cpu_bundle
    python, env = isolated_python(tmp_path)
    out = tmp_path / "results"
    result = subprocess.run(python + [str(folder / "bundle_runner.py"), "--out", str(out),
                                      "--repeats", "1", "--warmup", "0", "--models",
                                      "llama_small"],
                            capture_output=True, text=True, env=env, check=False, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert results["environment"]["torch"] is None
    assert list(results["models"]["llama_small"]) == list(gpu_bench.VARIANTS)
    assert "PyTorch not installed" in (out / "results.md").read_text()


def test_manifest_names_each_models_pytorch_counterpart(cpu_bundle):
    _, manifest = cpu_bundle
    assert manifest["models"]["bert_1x64"]["torch"] == {
        "kind": "bert_encoder", "hidden": 64, "layers": 1, "heads": 4, "ffn": 128,
        "inputs": ["x"]}
    assert manifest["models"]["llama_small"]["torch"]["kv_heads"] == 2


def test_bundle_models_are_built_per_batch_size():
    bert = gpu_bundle.bundle_model("bert_base", batch=8)
    assert bert.name == "bert_base_b8" and bert.data["x"].shape == (8, 128, 768)
    assert bert.torch["heads"] == 12 and bert.torch["ffn"] == 3072
    llama = gpu_bundle.bundle_model("llama_decoder")
    assert llama.name == "llama_decoder" and llama.data["input_ids"].shape == (1, 128)
    with pytest.raises(ValueError, match="positive"):
        gpu_bundle.build_bundle("unused", ["bert_base"], kind="llvm", batches=(0,))


@pytest.mark.zoo  # torch and transformers: requirements.txt
@pytest.mark.parametrize("model", small_models(), ids=lambda m: m.name)
def test_the_runner_times_the_pytorch_counterpart(model):
    pytest.importorskip("transformers", reason="the PyTorch counterparts are built with it")
    eager = [v for v in bundle_runner.TORCH_VARIANTS if not v[1] and v[2] != "float16"]
    rows = bundle_runner.time_torch(model.torch, model.data, "cpu", repeats=2, warmup=0,
                                    variants=eager)
    assert list(rows) == [v[0] for v in eager]
    for name, row in rows.items():
        assert "error" not in row, (name, row)
        assert row["runs"] == 2 and row["latency_ms"] > 0 and row["nonfinite"] == 0
    missing = bundle_runner.time_torch({"kind": "torchvision", "name": "no_such_net",
                                        "inputs": []}, {}, "cpu", 1, 0, eager[:1])
    assert "error" in missing[eager[0][0]]


def test_manifest_describes_each_library(cpu_bundle):
    folder, manifest = cpu_bundle
    on_disk = json.loads((folder / "manifest.json").read_text())
    assert on_disk["models"] == manifest["models"] and on_disk["device"] == "cpu"
    bert = manifest["models"]["bert_1x64"]
    assert bert["weight_seed"] == 0 and bert["weights"][0][0] == "l0.wq"
    for variant, entry in bert["variants"].items():
        assert (folder / entry["library"]).is_file()
        dtypes = {p["name"]: p["dtype"] for p in entry["params"]}
        low = {"fp32": "float32", "relay_amp:float16": "float16",
               "relay_amp:bfloat16": "bfloat16", "tvm:float16": "float16"}[variant]
        assert dtypes["x"] == "float32" and dtypes["l0.w1"] == low  # weights in their own dtype
    with np.load(folder / bert["inputs"]) as inputs:
        assert inputs["x"].shape == (1, 16, 64)


def test_scalar_weights_and_inputs_stay_zero_dimensional():
    """MobileNetV2's relu6 bounds are 0-d parameters: a (1,) array made them fail on the GPU."""
    weights = bundle_runner.make_weights({"relu6_min": (), "w": (2, 3)})
    assert weights["relu6_min"].shape == () and weights["relu6_min"].dtype == np.float32
    assert bundle_runner.bfloat16_bits(np.float32(1.5)).shape == ()
    import tvm

    for dtype in ("float32", "float16", "bfloat16"):
        assert bundle_runner.to_device(tvm, np.float32(2), dtype, tvm.cpu()).shape == ()


def test_weights_are_the_same_on_every_host():
    shapes = {"l0.wq": (64, 64), "l0.g1": (64,), "bn_running_var": (8,), "l0.bq": (64,)}
    first, again = bundle_runner.make_weights(shapes, 7), bundle_runner.make_weights(shapes, 7)
    assert all(np.array_equal(first[k], again[k]) for k in shapes)
    assert first["l0.wq"].std() == pytest.approx(1 / 8, rel=0.2)
    assert abs(first["l0.g1"].mean() - 1) < 0.1 and first["bn_running_var"].min() >= 0.5
    assert not np.array_equal(first["l0.wq"], bundle_runner.make_weights(shapes, 8)["l0.wq"])


def test_bfloat16_bits_round_to_nearest_even():
    import ml_dtypes  # noqa: PLC0415

    values = np.array([1.0, -2.5, 3.14159, 1e-40, 65504.0, np.inf, 1.00390625], np.float32)
    bits = bundle_runner.bfloat16_bits(values)
    assert np.array_equal(bits, values.astype(ml_dtypes.bfloat16).view(np.uint16))
    assert np.array_equal(bundle_runner.bfloat16_to_float32(bits),
                          values.astype(ml_dtypes.bfloat16).astype(np.float32))
    assert bundle_runner.bfloat16_bits(np.array([np.nan], np.float32))[0] == 0x7FC0


def test_compare_counts_nonfinite_and_ignores_them_in_the_error():
    reference = [np.ones((4,), np.float32)]
    got = bundle_runner.compare(reference, [np.array([1, 1, 1, np.inf], np.float32)])
    assert got == {"relative_l2": 0.0, "nonfinite": 1}
    with pytest.raises(ValueError, match="shape"):
        bundle_runner.compare(reference, [np.ones((5,), np.float32)])


def test_runner_reports_a_missing_gpu_per_row(cpu_bundle, tmp_path):
    """A CUDA bundle on a host without a GPU: every row says why, the exit status is 1."""
    folder, _ = cpu_bundle
    copy = tmp_path / "cuda_bundle"
    shutil.copytree(folder, copy, symlinks=True)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["device"] = "cuda"
    (copy / "manifest.json").write_text(json.dumps(manifest))
    python, env = isolated_python(tmp_path)
    result = subprocess.run(python + [str(copy / "bundle_runner.py"), "--out", str(tmp_path / "o"),
                                      "--repeats", "1"],
                            capture_output=True, text=True, env=env, check=False, timeout=300)
    assert result.returncode == 1
    results = json.loads((tmp_path / "o" / "results.json").read_text())
    rows = [row for model in results["models"].values() for row in model.values()]
    assert rows and all("error" in row for row in rows)


def test_bundle_refuses_a_folder_in_use_and_unknown_models(tmp_path):
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "file").write_text("x")
    with pytest.raises(FileExistsError, match="not empty"):
        gpu_bundle.build_bundle(str(tmp_path / "used"), small_models()[:1], kind="llvm",
                                progress=False)
    with pytest.raises(ValueError, match="unknown bundle model 'resnet5'"):
        gpu_bundle.build_bundle(str(tmp_path / "new"), ["resnet5"], kind="llvm", progress=False)
    with pytest.raises(ValueError, match="'cuda' or 'llvm'"):
        gpu_bundle.build_bundle(str(tmp_path / "new"), small_models()[:1], kind="rocm",
                                progress=False)


def test_cuda_bundle_carries_cuda_source_for_the_loader(tmp_path):
    """Built for sm_90 here: each library holds the CUDA source TVM's loader compiles on the
    host; the TVM-pipeline variants are there too."""
    bert = small_models()[0]
    manifest = gpu_bundle.build_bundle(str(tmp_path / "b"), [bert], kind="cuda", arch="sm_90",
                                       python=None, progress=False)
    variants = manifest["models"]["bert_1x64"]["variants"]
    assert len(variants) == len(gpu_bench.VARIANTS) + len(gpu_bundle.TVM_PIPELINE_VARIANTS)
    assert {v["mode"] for v in variants.values()} == {"vm", "vm_tvm_pipeline"}
    assert "relay_amp:float16 (TVM pipeline)" in variants
    for entry in variants.values():
        assert entry["library"].endswith(".so.gz")
        data = gzip.decompress((tmp_path / "b" / entry["library"]).read_bytes())
        assert b"__global__" in data and b"extern \"C\"" in data  # CUDA source, not a cubin
    assert manifest["device"] == "cuda" and "sm_90" in manifest["target"]
