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


def test_compare_says_when_the_reference_itself_is_not_finite():
    """A float32 reference that is NaN everywhere compares nothing: the error is NaN (it was
    0.0, which the results table showed as a perfect match), and the row counts the reference's
    non-finite values."""
    reference = [np.full((4,), np.nan, np.float32)]
    got = bundle_runner.compare(reference, [np.ones((4,), np.float32)])
    assert np.isnan(got["relative_l2"]) and got["reference_nonfinite"] == 4
    partly = bundle_runner.compare([np.array([1, np.inf], np.float32)],
                                   [np.array([1, 2], np.float32)])
    assert partly == {"relative_l2": 0.0, "nonfinite": 0, "reference_nonfinite": 1}
    assert np.isnan(bundle_runner.compare([np.arange(3)], [np.arange(3)])["relative_l2"])


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


# ------------------------------------------------------------------------------ registry exports
def exported_like():
    """A module with its weights as constants, as the registry's exports are: a transposed
    weight (folded by a build with constants), a LayerNorm, a scalar and a constant that no
    table names; and its weight table."""
    import tvm  # noqa: PLC0415
    from tvm import relax  # noqa: PLC0415

    from relay_amp.eval import bundle_zoo  # noqa: PLC0415

    rng = np.random.default_rng(3)
    table = {"fc.weight": rng.normal(size=(32, 16)).astype("float32") / 4,
             "fc.bias": rng.normal(size=(32,)).astype("float32"),
             "norm.weight": (1 + 0.1 * rng.normal(size=(32,))).astype("float32"),
             "norm.bias": np.zeros((32,), "float32")}
    unnamed = rng.normal(size=(32,)).astype("float32")
    builder = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 16), "float32"))
    op = relax.op
    with builder.function("main", [x]):
        with builder.dataflow():
            weight = builder.emit(op.permute_dims(relax.const(table["fc.weight"]), [1, 0]))
            h = builder.emit(op.add(op.matmul(x, weight), relax.const(table["fc.bias"])))
            h = builder.emit(op.nn.layer_norm(h, relax.const(table["norm.weight"]),
                                              relax.const(table["norm.bias"]), axes=[-1]))
            h = builder.emit(op.multiply(op.add(h, relax.const(unnamed)), relax.const(0.5)))
            out = builder.emit_output(h)
        builder.emit_func_output(out)
    data = {"x": rng.normal(size=(4, 16)).astype("float32")}
    model = gpu_bench.BenchModel("exported_like", builder.get(), data, [], None,
                                 bundle_zoo.WeightTable(table),
                                 {"kind": "file", "origin": "the test's table"})
    return model, table, tvm


def test_lifted_weights_give_the_outputs_of_the_constants_and_fold_like_them():
    from relay_amp.builds.pipeline import build  # noqa: PLC0415
    from relay_amp.eval import bundle_zoo  # noqa: PLC0415

    model, table, tvm = exported_like()
    mod, params, embedded = bundle_zoo.lift_weights(model.mod, model.weight_table)
    assert embedded == {"count": 1, "bytes": 128}  # the unnamed vector stays in the library
    assert [p.get("weight") for p in params] == [None, "fc.weight", "fc.bias", "norm.weight",
                                                  "norm.bias"]
    assert "permute_dims" in mod[bundle_zoo.TRANSFORM].script()  # done once, before main
    assert "permute_dims" not in mod["main"].script()
    target = tvm.target.Target("llvm")
    vm = tvm.runtime.vm.VirtualMachine(build(mod, target), tvm.cpu())
    weights = vm[bundle_zoo.TRANSFORM]([tvm.runtime.tensor(table[p["weight"]])
                                        for p in params[1:]])
    got = vm["main"](tvm.runtime.tensor(model.data["x"]), *weights).numpy()
    reference = tvm.runtime.vm.VirtualMachine(build(model.mod, target), tvm.cpu())
    assert np.array_equal(got, reference["main"](tvm.runtime.tensor(model.data["x"])).numpy())


def test_lifted_weights_are_named_in_the_variants_dtype():
    """A float16 constant takes the table's float32 tensor's name when its bits are that
    tensor's rounded to float16; a value the table does not hold stays a constant."""
    from relay_amp.eval import bundle_zoo  # noqa: PLC0415

    weight = np.float32([[1.0, 1.0009765625 + 2 ** -12], [3.0, 4.0]])  # rounds in float16
    table = bundle_zoo.WeightTable({"w": weight, "same": weight.copy(), "scalar": np.ones(1)})
    assert table.names(weight.astype("float16")) == ["w", "same"]
    assert table.names(weight) == ["w", "same"]
    assert table.names(weight.astype("float16").astype("float32")) == []
    assert "scalar" not in table.arrays  # one element: stays a constant


def test_cpu_bundle_of_an_export_carries_and_transforms_its_weights(tmp_path):
    model, table, _ = exported_like()
    folder = tmp_path / "b"
    manifest = gpu_bundle.build_bundle(str(folder), [model], kind="llvm", progress=False)
    record = manifest["models"]["exported_like"]
    assert record["weight_source"] == {"kind": "file", "origin": "the test's table",
                                       "path": "exported_like/weights.npz"}
    assert [w[0] for w in record["weights"]] == list(table)
    assert record["bytes"] > 0 and manifest["runtime"]["bytes"] > 0 and manifest["build_s"] > 0
    for entry in record["variants"].values():
        assert entry["num_input"] == 1 and entry["transform"] == "main_transform_params"
        assert entry["embedded_constants"]["count"] == 1
    with np.load(folder / "exported_like" / "weights.npz") as stored:
        assert all(np.array_equal(stored[name], table[name]) for name in table)
    python, env = isolated_python(tmp_path)
    out = tmp_path / "results"
    result = subprocess.run(python + [str(folder / "bundle_runner.py"), "--out", str(out),
                                      "--repeats", "2", "--warmup", "0"],
                            capture_output=True, text=True, env=env, check=False, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    rows = results["models"]["exported_like"]
    assert list(rows) == list(gpu_bench.VARIANTS)
    assert all("error" not in row and row["transform_params_s"] >= 0 for row in rows.values())
    assert rows["fp32"]["relative_l2"] == 0
    assert results["weights"]["exported_like"] == {"source": "file exported_like/weights.npz"}
    assert "- exported_like: file exported_like/weights.npz" in (out / "results.md").read_text()


def test_a_variant_that_fails_to_build_is_skipped_if_optional(tmp_path, monkeypatch):
    model = small_models()[0]
    real = gpu_bench.variant_module

    def failing(model, variant, target):
        if variant == "tvm:float16":
            raise RuntimeError("InternalError: the built-in pass\nfails here")
        return real(model, variant, target)

    monkeypatch.setattr(gpu_bench, "variant_module", failing)
    manifest = gpu_bundle.build_bundle(str(tmp_path / "b"), [model], kind="llvm",
                                       progress=False, variants=("fp32", "tvm:float16"))
    record = manifest["models"]["bert_1x64"]
    assert list(record["variants"]) == ["fp32"]
    assert record["skipped"] == {"tvm:float16": "RuntimeError: fails here"}
    python, env = isolated_python(tmp_path)
    out = tmp_path / "results"
    result = subprocess.run(python + [str(tmp_path / "b" / "bundle_runner.py"), "--out", str(out),
                                      "--repeats", "1", "--warmup", "0"],
                            capture_output=True, text=True, env=env, check=False, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]  # not an error
    results = json.loads((out / "results.json").read_text())
    assert results["models"]["bert_1x64"]["tvm:float16"] == {"skipped": "RuntimeError: fails here"}
    assert "not built: RuntimeError: fails here" in (out / "results.md").read_text()


def test_registry_exports_refuse_what_they_cannot_build():
    from relay_amp.eval import bundle_zoo  # noqa: PLC0415

    with pytest.raises(ValueError, match="batch 1 only"):
        bundle_zoo.zoo_model("face_detection_short_range", batch=8)
    with pytest.raises(ValueError, match="tiny size"):
        bundle_zoo.zoo_model("yolov8n_320", tiny=True)
    with pytest.raises(ValueError, match="unknown model"):
        gpu_bundle.bundle_model("zoo:no_such_model")
    assert set(gpu_bundle.ZOO_BUNDLE_MODELS) <= set(gpu_bundle.DEFAULT_MODELS)
    assert "resnet50_v1" in gpu_bundle.DEFAULT_MODELS


def test_a_model_fixed_at_batch_1_is_left_out_of_other_batches(tmp_path, monkeypatch):
    from relay_amp.eval import bundle_zoo  # noqa: PLC0415

    def model(name, batch):
        if batch != 1:
            raise bundle_zoo.FixedBatch(f"{name} is built for batch 1 only")
        return small_models()[1]

    monkeypatch.setattr(gpu_bundle, "bundle_model", model)
    manifest = gpu_bundle.build_bundle(str(tmp_path / "b"), ["zoo:fixed"], kind="llvm",
                                       progress=False, variants=("fp32",), batches=(1, 8))
    assert list(manifest["models"]) == ["llama_small"]
    assert manifest["not_built"] == {"zoo:fixed batch 8": "zoo:fixed is built for batch 1 only"}
    with pytest.raises(bundle_zoo.FixedBatch):
        gpu_bundle.build_bundle(str(tmp_path / "c"), ["zoo:fixed"], kind="llvm", batches=(8,))


@pytest.mark.zoo  # mediapipe, tflite, torch and transformers: requirements.txt
def test_real_exports_build_here_and_run_with_their_own_weights(tmp_path):
    """The registry's mediapipe face detector (pretrained weights carried) and its BERT export
    at the tests' size (weights rebuilt by the runner from the config and seed, bit-identical)
    in a CPU bundle, run by the bundle's runner with this Python's torch and transformers."""
    from relay_amp.eval import bundle_zoo  # noqa: PLC0415

    models = [bundle_zoo.zoo_model("face_detection_short_range"),
              bundle_zoo.zoo_model("bert_base", tiny=True)]
    folder = tmp_path / "b"
    manifest = gpu_bundle.build_bundle(str(folder), models, kind="llvm", progress=False)
    assert manifest["bytes"] < gpu_bundle.MAX_BUNDLE_BYTES
    face = manifest["models"]["zoo:face_detection_short_range"]
    bert = manifest["models"]["zoo:bert_base_tiny"]
    assert face["weight_source"]["path"] == "zoo_face_detection_short_range/weights.npz"
    assert face["torch"] is None and "no PyTorch counterpart" in face["notes"][0]
    assert bert["torch"]["kind"] == "transformers" and bert["torch"]["config_class"] == "BertConfig"
    assert len(bert["weight_source"]["sha256"]) == len(bert["weights"]) > 30
    for record in (face, bert):  # every weight of the export was found in the table
        assert all(e["embedded_constants"]["count"] == 0 for e in record["variants"].values())
    out = tmp_path / "results"
    result = subprocess.run([sys.executable, str(folder / "bundle_runner.py"), "--out", str(out),
                             "--repeats", "2", "--warmup", "0", "--torch", "torch eager float32"],
                            capture_output=True, text=True, check=False, timeout=600,
                            cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert results["weights"]["zoo:bert_base_tiny"]["bit_identical"] is True
    for rows in results["models"].values():
        assert all("error" not in row for row in rows.values()), rows
        assert rows["fp32"]["relative_l2"] == 0 and rows["relay_amp:float16"]["nonfinite"] == 0
    assert "torch eager float32" in results["models"]["zoo:bert_base_tiny"]


@pytest.mark.zoo
def test_a_real_export_builds_for_cuda_with_its_size_stated(tmp_path):
    from relay_amp.eval import bundle_zoo  # noqa: PLC0415

    face = bundle_zoo.zoo_model("face_detection_short_range")
    manifest = gpu_bundle.build_bundle(str(tmp_path / "b"), [face], kind="cuda", arch="sm_90",
                                       python=None, progress=False, tvm_pipeline=False,
                                       variants=("fp32", "relay_amp:float16"))
    record = manifest["models"]["zoo:face_detection_short_range"]
    assert list(record["variants"]) == ["fp32", "relay_amp:float16"]
    for entry in record["variants"].values():
        data = gzip.decompress((tmp_path / "b" / entry["library"]).read_bytes())
        assert b"__global__" in data and entry["num_input"] == 1
    assert 0 < record["bytes"] < manifest["bytes"] < gpu_bundle.MAX_BUNDLE_BYTES
    assert json.loads((tmp_path / "b" / "manifest.json").read_text())["bytes"] == manifest["bytes"]


@pytest.mark.zoo
@pytest.mark.slow
@pytest.mark.parametrize("name", ["bert_base", "llama_smollm_135m"])
def test_full_size_exports_regenerate_bit_identically(name):
    """Every float constant of the registry's export is a tensor that the runner's
    ``transformers_weights`` rebuilds, bit for bit (no variant needed: the float32 module)."""
    from relay_amp.eval import bundle_zoo  # noqa: PLC0415

    model = bundle_zoo.zoo_model(name)
    _, params, embedded = bundle_zoo.lift_weights(model.mod, model.weight_table)
    assert embedded["count"] == 0 and sum("weight" in p for p in params) > 50


@pytest.mark.zoo  # torch and transformers
def test_the_runner_says_when_rebuilt_weights_differ_or_cannot_be_rebuilt():
    from relay_amp.eval import transformers_zoo  # noqa: PLC0415

    spec = transformers_zoo.torch_spec("bert_base", tiny=True)
    rebuilt = bundle_runner.transformers_weights(spec)
    name = "model.encoder.layer.0.attention.self.query.weight"
    digests = {n: bundle_runner.sha256(rebuilt[n]) for n in (name, "model.pooler.dense.bias")}
    digests["model.pooler.dense.bias"] = "0" * 64  # as another transformers might draw it
    model = {"weights": [[name, list(rebuilt[name].shape)]], "weight_seed": 0,
             "weight_source": {"kind": "transformers", "torch": spec, "sha256": digests}}
    values, info = bundle_runner.model_weights("unused", model)
    assert np.array_equal(values[name], rebuilt[name])
    assert info["bit_identical"] is False and info["differ"] == ["model.pooler.dense.bias"]
    model["weight_source"]["torch"] = {**spec, "model_class": "NoSuchModel"}
    values, info = bundle_runner.model_weights("unused", model)
    assert info["source"].startswith("seeded (cannot rebuild with transformers: AttributeError")
    assert values[name].shape == rebuilt[name].shape
