"""The CPU-side parts of scripts/bench_gpu.py: models, weights, and building every variant."""

import shutil

import numpy as np
import pytest
import tvm

from relay_amp.eval import gpu_bench


@pytest.fixture(scope="module")
def tiny_bert():
    return gpu_bench.bert_encoder(layers=2, hidden=64, heads=4, ffn=128, seq=16)


def test_encoder_shape_and_weights(tiny_bert):
    params = tiny_bert.mod["main"].params
    assert params[0].name == "x" and len(tiny_bert.weights) == 2 * 16
    weights = gpu_bench.make_weights(gpu_bench.weight_shapes(tiny_bert), seed=3)
    again = gpu_bench.make_weights(gpu_bench.weight_shapes(tiny_bert), seed=3)
    assert all(np.array_equal(weights[k], again[k]) for k in weights)
    assert weights["l0.wq"].std() == pytest.approx(1 / 8, rel=0.2)  # 1/sqrt(fan_in=64)
    assert abs(weights["l0.g1"].mean() - 1) < 0.1


def test_variants_take_weights_in_their_own_dtype(tiny_bert):
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_80"})
    for variant, dtype in (("fp32", "float32"), ("relay_amp:float16", "float16"),
                           ("relay_amp:bfloat16", "bfloat16"), ("tvm:float16", "float16")):
        mod = gpu_bench.variant_module(tiny_bert, variant, target)
        dtypes = {p.name: str(p.ty.dtype) for p in mod["main"].params}
        assert dtypes["x"] == "float32" and dtypes["l1.w2"] == dtype, variant


@pytest.fixture(scope="module")
def resnet50():
    return gpu_bench.gluon_model("resnet50_v1")


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.parametrize("model, arch", [("tiny_bert", "sm_80"),
                                         pytest.param("resnet50", "sm_90", marks=pytest.mark.zoo)])
def test_build_compiles_every_variant_with_nvcc(model, arch, request, tmp_path):
    """Every variant of the small encoder, and all four of ResNet-50, build and nvcc-compile."""
    bench_model = request.getfixturevalue(model)
    facts = gpu_bench.build(bench_model, arch, str(tmp_path))
    assert list(facts) == list(gpu_bench.VARIANTS)
    for variant, fact in facts.items():
        assert fact["nvcc"] == "ok", (variant, fact["nvcc"])
        assert fact["kernels"] > 0
    table = gpu_bench.format_table(bench_model.name, facts)
    assert "relay_amp:bfloat16" in table and "nvcc ok" in table


def test_run_needs_a_gpu(tiny_bert):
    if tvm.cuda(0).exist:
        pytest.skip("a GPU is present: run() is exercised by scripts/bench_gpu.py")
    with pytest.raises(RuntimeError, match="no CUDA GPU"):
        gpu_bench.run(tiny_bert)


@pytest.mark.zoo
def test_gluon_import_is_well_formed_with_weights_as_parameters(resnet50):
    """MXNet's ONNX lists every initializer as a graph input too: each weight is one parameter."""
    tvm.relax.analysis.well_formed(resnet50.mod)
    names = [p.name for p in resnet50.mod["main"].params]
    assert len(names) == len(set(names)) == 1 + len(resnet50.weights)
    assert any(name.endswith("_conv0_weight") for name in resnet50.weights)


@pytest.mark.zoo
def test_sweep_loader_keeps_one_parameter():
    from relay_amp.eval import models

    mod = models.load("resnet18_v1").mod
    tvm.relax.analysis.well_formed(mod)
    assert len(mod["main"].params) == 1


def test_tensorize_works_with_the_pinned_tvm_ffi():
    """apache-tvm-ffi 0.1.15 makes TVM 0.27's Schedule.tensorize segfault (no tensor cores)."""
    gpu_bench.check_tensorize()


@pytest.mark.parametrize("dtype, relay_amp_schedules", [("float16", True), ("float16", False),
                                                        ("bfloat16", True)])
def test_matmuls_past_the_tensor_core_threshold_use_tensor_cores(dtype, relay_amp_schedules):
    """What the bundle builds: float16 gets tensor cores with either pipeline, bfloat16 with
    relay_amp's (TVM's own has no bfloat16 tensor-core rule)."""
    from tvm import relax

    builder = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((128, 768), dtype))
    w = relax.Var("w", relax.TensorType((768, 768), dtype))
    with builder.function("main", [x, w]):
        with builder.dataflow():
            out = builder.emit_output(relax.op.matmul(x, w, out_dtype="float32"))
        builder.emit_func_output(out)
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})

    def source(**flags):
        executable = gpu_bench.compile_module(builder.get(), target, **flags)
        return executable.mod.imports[0].imports[0].inspect_source("cuda")

    fragment = {"float16": "half", "bfloat16": "nv_bfloat16"}[dtype]
    with_tensor_cores = source(relay_amp_schedules=relay_amp_schedules)
    assert "wmma::mma_sync" in with_tensor_cores
    assert f"matrix_a, 16, 16, 16, {fragment}" in with_tensor_cores
    assert "wmma::" not in source(relay_amp_schedules=relay_amp_schedules, tensor_cores=False)
