"""Tensor cores for float16 and bfloat16, for every spelling of a CUDA arch
(relay_amp.builds.tensor_cores), proven in the generated CUDA and, with nvcc, in the PTX it compiles
to (no GPU needed); TVM's CUDA intrinsics registered as schedules name them, with the same CUDA as
TVM's own import gives."""

import inspect
import json
import os
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tvm
from cuda_checks import (
    FRAGMENT,
    PTX,
    TARGETS,
    cuda_source,
    fragment_dtypes,
    ptx_tensor_core_inputs,
)
from helpers import NVCC
from tvm import relax

import relay_amp
from relay_amp.builds import tensor_cores
from relay_amp.builds.pipeline import SM_COUNT, sm_count


def _matmul(dtype, rows=128, depth=768, cols=768):
    builder = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((rows, depth), dtype))
    w = relax.Var("w", relax.TensorType((depth, cols), dtype))
    with builder.function("main", [x, w]):
        with builder.dataflow():
            out = builder.emit_output(relax.op.matmul(x, w, out_dtype="float32"))
        builder.emit_func_output(out)
    return builder.get()


@pytest.mark.parametrize("spelling", list(TARGETS))
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_matmuls_use_tensor_cores_for_every_spelling_of_the_arch(spelling, dtype, tmp_path):
    source = cuda_source(_matmul(dtype), TARGETS[spelling])
    assert fragment_dtypes(source) == {FRAGMENT[dtype]}
    assert "wmma::mma_sync" in source
    if NVCC is not None:
        arch = str(tvm.target.Target(TARGETS[spelling]).attrs["arch"])
        assert ptx_tensor_core_inputs(source, tmp_path, arch) == {PTX[dtype]}


def test_targets_without_tensor_cores_for_the_dtype_are_named_and_get_none():
    assert fragment_dtypes(cuda_source(_matmul("bfloat16"), {"kind": "cuda",
                                                               "arch": "sm_75"})) == set()
    assert fragment_dtypes(cuda_source(_matmul("float16"), {"kind": "cuda",
                                                              "arch": "sm_75"})) == {"half"}
    old = tvm.target.Target({"kind": "cuda", "arch": "sm_61"})
    note = tensor_cores.tensor_core_note(old, "float16")
    assert "has no float16 tensor cores" in note and "sm_70" in note
    _, report = relay_amp.convert(_matmul("float32"), "float16", target=old)
    assert any("sm_61 has no float16 tensor cores" in n for n in report.notes)
    assert tensor_cores.tensor_core_note(tvm.target.Target("llvm"), "float16") is None


def test_the_note_says_where_tvms_own_pipeline_gives_none():
    plain = tensor_cores.tensor_core_note(tvm.target.Target(TARGETS["sm_90"]), "float16")
    h100 = tensor_cores.tensor_core_note(tvm.target.Target(TARGETS["h100 tag"]), "float16")
    bf16 = tensor_cores.tensor_core_note(tvm.target.Target(TARGETS["sm_90"]), "bfloat16")
    assert "TVM's own" not in plain
    assert "TVM's own CUDA pipeline gives float16 on sm_90a none" in h100
    assert "gives bfloat16 on sm_90 none" in bf16


def test_small_extents_stay_on_cuda_cores_as_in_dlight():
    """dlight's threshold (every extent but the batch above 64) holds for bfloat16 too."""
    source = cuda_source(_matmul("bfloat16", rows=128, depth=64, cols=768), TARGETS["sm_90"])
    assert fragment_dtypes(source) == set()


def test_tvms_lookup_is_restored_and_dlight_still_names_intrinsics_through_it():
    """The bfloat16 schedule is dlight's own, whose intrinsics are named through
    ``get_wmma_intrin_group`` with ``in_dtype="float16"``; if TVM changes that, the bfloat16
    tests above lose their tensor cores and this says why."""
    from tvm.s_tir.dlight.gpu.matmul import MatmulTensorization

    cuda = tensor_cores.cuda_intrinsics()
    original = cuda.get_wmma_intrin_group
    cuda_source(_matmul("bfloat16"), TARGETS["sm_90"])
    assert cuda.get_wmma_intrin_group is original
    assert 'in_dtype="float16"' in inspect.getsource(MatmulTensorization.apply)
    from tvm.s_tir import TensorIntrin

    group = tensor_cores.bfloat16_intrinsic_group("shared.dyn", "shared.dyn", "float32", True)
    assert all(TensorIntrin.get(name) is not None for name in group.values())
    with pytest.raises(ValueError, match="float32"):
        tensor_cores.bfloat16_intrinsic_group("shared", "shared", "float16", False)


def test_the_arch_is_read_as_a_number_everywhere():
    h100 = tvm.target.Target(TARGETS["h100 tag"])
    assert tensor_cores.arch_number(h100) == 90
    assert str(tensor_cores.numeric_arch_target(h100).attrs["arch"]) == "sm_90"
    assert sm_count(h100) == SM_COUNT["sm_90"] == sm_count(tvm.target.Target(TARGETS["sm_90"]))
    assert tensor_cores.arch_number(tvm.target.Target("llvm")) is None


# ------------------------------------------------------------------------------ TVM's intrinsics
def _tvm_module() -> tuple:
    path = tensor_cores._module_file()
    return pathlib.Path(path).read_text(encoding="utf-8"), path


#: Changes of TVM's module that the lazy loader does not know how to hold back.
RESHAPED = {
    "no get_wmma_intrin_group": ("def get_wmma_intrin_group(", "def get_wmma_intrins("),
    "a computed name": ("TensorIntrin.register(WMMA_FILL_16x16x16_F32_INTRIN,",
                        "TensorIntrin.register(WMMA_FILL_16x16x16_F32_INTRIN + '',"),
    "a name bound twice": ("\nM_DIM = 16\n", "\nM_DIM = 16\nM_DIM = 16\n"),
    "a global statement": ("def index_map_m16n8k8_matrixC(ind):\n",
                           "def index_map_m16n8k8_matrixC(ind):\n    global M_DIM\n"),
    "not Python": ("\nM_DIM = 16\n", "\nM_DIM = = 16\n"),
    "the registry read on load": ("\nM_DIM = 16\n",
                                  "\nM_DIM = TensorIntrin.get('wmma_fill_16x16x16_f32')\n"),
}


def test_the_lazy_plan_holds_back_every_top_level_registration():
    source, path = _tvm_module()
    _, registrations = tensor_cores.plan_cuda_intrinsics(source, path)
    assert len(registrations) == source.count("\nTensorIntrin.register(")
    assert {"wmma_fill_16x16x16_f32", "wmma_sync_16x16x16_f16f16f32_trans",
            "mma_ldmatrix_f16_a", "mma_init_m16n8k8_f16"} <= set(registrations)


@pytest.mark.parametrize("change", list(RESHAPED))
def test_a_module_of_another_shape_is_not_planned(change):
    source, path = _tvm_module()
    old, new = RESHAPED[change]
    assert source.count(old) == 1, "TVM's module changed: update the case"
    assert tensor_cores.plan_cuda_intrinsics(source.replace(old, new), path) is None


#: Builds a float16 and a bfloat16 matmul and a BERT layer converted to float16 and bfloat16
#: for sm_90 in a fresh process, and writes their CUDA and which of TVM's intrinsics got
#: registered. ``fallback``: TVM's module looks reshaped to the lazy loader, which imports it as
#: it is; ``lazy``: then imports TVM's package, which must register the rest.
CHILD = textwrap.dedent("""
    import json, sys
    mode, out = sys.argv[1], sys.argv[2]
    import tvm
    from tvm.s_tir import TensorIntrin
    import relay_amp
    from relay_amp.builds import pipeline, tensor_cores
    from test_target_table import bert_layer
    from test_tensor_cores import _matmul

    path = tensor_cores._module_file()
    plan = tensor_cores.plan_cuda_intrinsics
    names = sorted(plan(open(path).read(), path)[1])
    if mode == "fallback":
        tensor_cores.plan_cuda_intrinsics = lambda source, filename: plan(
            source.replace("def get_wmma_intrin_group(", "def get_wmma_intrins("), filename)

    def registered():
        return [n for n in names if TensorIntrin.get(n, allow_missing=True) is not None]

    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})
    modules = {dtype: _matmul(dtype) for dtype in ("float16", "bfloat16")}
    for dtype in ("float16", "bfloat16"):
        modules["bert " + dtype] = relay_amp.convert(bert_layer(), dtype, target=target)[0]
    sources = {}
    for name, mod in modules.items():
        executable = pipeline.build(mod, target)
        sources[name] = "\\n".join(m.inspect_source("cuda")
                                   for m in executable.mod.imports[0].imports)
    result = {"sources": sources, "names": names, "registered": registered(),
              "lazy": type(tensor_cores.cuda_intrinsics()).__name__,
              "package": "tvm.s_tir.tensor_intrin" in sys.modules}
    if mode == "lazy":
        import tvm.s_tir.tensor_intrin
        result["registered_with_package"] = registered()
    json.dump(result, open(out, "w"))
""")


def _child(mode: str, folder: pathlib.Path) -> tuple:
    here = pathlib.Path(__file__).parent
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(here.parents[1]), str(here), str(here.parent),
                                         env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    out = folder / f"{mode}.json"
    process = subprocess.Popen([sys.executable, "-c", CHILD, mode, str(out)], env=env,
                               stderr=subprocess.PIPE, text=True)
    return process, out


@pytest.mark.slow  # two fresh processes, one importing all of TVM's tensor intrinsics
def test_tvms_intrinsics_are_registered_as_named_and_the_cuda_is_the_same(tmp_path):
    """In a fresh process a tensor-core build registers only the intrinsics dlight names and
    leaves TVM's package (every target's intrinsics) unimported, and importing the package
    registers the rest; with TVM's module imported as it is (the fallback for a module of
    another shape) the CUDA of every build is byte for byte the same."""
    runs = {mode: _child(mode, tmp_path) for mode in ("lazy", "fallback")}
    results = {}
    for mode, (process, out) in runs.items():
        _, err = process.communicate(timeout=600)
        assert process.returncode == 0, err[-3000:]
        results[mode] = json.loads(out.read_text())
    lazy, plain = results["lazy"], results["fallback"]
    assert lazy["lazy"] == "_LazyIntrinsics" and not lazy["package"]
    assert set(lazy["registered"]) == {
        "wmma_fill_16x16x16_f32", "wmma_load_16x16x16_f16_a_shared_dyn",
        "wmma_load_16x16x16_f16_b_trans_shared_dyn", "wmma_sync_16x16x16_f16f16f32_trans",
        "wmma_store_16x16x16_f32_shared_dyn"}
    assert lazy["registered_with_package"] == lazy["names"]
    assert plain["lazy"] == "module" and plain["package"]
    assert plain["registered"] == plain["names"]
    for name, source in plain["sources"].items():
        assert "wmma::mma_sync" in source, name
        assert lazy["sources"][name] == source, name


@pytest.mark.gpu
@pytest.mark.skipif(not tvm.cuda(0).exist, reason="needs a CUDA GPU to run the kernel")
def test_a_bfloat16_tensor_core_matmul_matches_numpy_on_a_gpu():
    import ml_dtypes

    rng = np.random.default_rng(0)
    x = rng.normal(size=(128, 768)).astype(ml_dtypes.bfloat16)
    w = rng.normal(size=(768, 768)).astype(ml_dtypes.bfloat16)
    target = tvm.target.Target.from_device(tvm.cuda(0))
    executable = tvm.compile(_matmul("bfloat16"), target,
                             relax_pipeline=relay_amp.cuda_pipeline(target))
    vm = relax.VirtualMachine(executable, tvm.cuda(0))
    got = vm["main"](tvm.runtime.tensor(x, tvm.cuda(0)), tvm.runtime.tensor(w, tvm.cuda(0)))
    want = x.astype("float32") @ w.astype("float32")
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-3, atol=1e-2)
