"""relay_amp.cuda_pipeline: attention decomposed into matmuls and a softmax, and short reductions
(depthwise convolutions) scheduled one output per thread."""

import shutil
import subprocess

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R

import relay_amp
from relay_amp import execution
from relay_amp.builds import pipeline

SM90 = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})


def _attention_module(dtype, causal=None, scale=0.25, seq=16, seq_kv=16, bias=False):
    builder = relax.BlockBuilder()
    q = relax.Var("q", relax.TensorType((2, seq, 4, 16), dtype))
    k = relax.Var("k", relax.TensorType((2, seq_kv, 4, 16), dtype))
    v = relax.Var("v", relax.TensorType((2, seq_kv, 4, 8), dtype))
    params = [q, k, v]
    if bias:
        params.append(relax.Var("b", relax.TensorType((2, 4, seq, seq_kv), dtype)))
    with builder.function("main", params):
        with builder.dataflow():
            out = builder.emit_output(relax.op.nn.attention(
                q, k, v, params[3] if bias else None, scale=scale, causal_mask=causal))
        builder.emit_func_output(out)
    return builder.get()


def _inputs(mod, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.normal(size=[int(d) for d in p.ty.shape.values]).astype(str(p.ty.dtype))
            for p in mod["main"].params]


def _ops(mod) -> list:
    names = []
    relax.analysis.post_order_visit(mod["main"], lambda e: names.append(e.op.name) if isinstance(
        e, relax.Call) and isinstance(e.op, tvm.ir.Op) else None)
    return names


@pytest.mark.parametrize("causal, scale, bias, seq_kv", [
    (None, 0.25, False, 16), ("TopLeft", None, False, 16), ("BottomRight", 0.5, False, 24),
    (None, 0.25, True, 16)])
def test_float32_decomposition_equals_tvms_legalization(causal, scale, bias, seq_kv):
    before = _attention_module("float32", causal, scale, seq_kv=seq_kv, bias=bias)
    after = pipeline.DecomposeAttention(before)
    relax.analysis.well_formed(after)
    assert not any(op.startswith("relax.nn.attention") for op in _ops(after))
    assert _ops(after).count("relax.matmul") == 2
    inputs = _inputs(before)
    reference = execution.run(relay_amp.compile_module(before), inputs)
    outputs = execution.run(relay_amp.compile_module(after), inputs)
    np.testing.assert_allclose(outputs[0], reference[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_low_precision_attention_accumulates_in_float32(dtype):
    after = pipeline.DecomposeAttention(_attention_module(dtype))
    matmuls = []
    relax.analysis.post_order_visit(after["main"], lambda e: matmuls.append(e) if isinstance(
        e, relax.Call) and getattr(e.op, "name", "") == "relax.matmul" else None)
    assert [str(m.attrs.out_dtype) for m in matmuls] == ["float32", "float32"]
    softmax = [op for op in _ops(after) if op == "relax.nn.softmax"]
    assert softmax  # on the float32 scores
    assert str(after["main"].ret_ty.dtype) == dtype


def test_float16_decomposition_is_closer_to_float32_than_tvms_legalization():
    """TVM's legalization sums q·kᵀ in float16; the decomposition sums in float32."""
    reference_mod = _attention_module("float32", seq=128, seq_kv=128)
    low = _attention_module("float16", seq=128, seq_kv=128)
    inputs = _inputs(reference_mod, 3)
    reference = execution.run(relay_amp.compile_module(reference_mod), inputs)
    low_inputs = [x.astype("float16") for x in inputs]
    tvm_error = execution.agreement(
        reference, execution.run(relay_amp.compile_module(low), low_inputs)).relative_l2
    ours = execution.agreement(reference, execution.run(
        relay_amp.compile_module(pipeline.DecomposeAttention(low)), low_inputs)).relative_l2
    assert ours <= tvm_error


def test_causal_attention_over_symbolic_lengths_stays_whole():
    @I.ir_module
    class Symbolic:
        @R.function
        def main(q: R.Tensor((1, "n", 2, 8), "float32"), k: R.Tensor((1, "n", 2, 8), "float32"),
                 v: R.Tensor((1, "n", 2, 8), "float32")):
            with R.dataflow():
                out = R.nn.attention(q, k, v, causal_mask="TopLeft")
                R.output(out)
            return out

    after = pipeline.DecomposeAttention(Symbolic)
    assert "relax.nn.attention" in _ops(after)
    tvm.ir.assert_structural_equal(after, Symbolic)


def test_the_input_module_is_not_modified():
    before = _attention_module("float16")
    copy = tvm.ir.load_json(tvm.ir.save_json(before))
    pipeline.DecomposeAttention(before)
    tvm.ir.assert_structural_equal(before, copy)


def _depthwise_fused(channels=96, size=56, kernel=3, groups=None):
    """A float16 convolution with float32 accumulation and a cast epilogue, legalized and fused
    as TVM's CUDA pipeline fuses it."""
    groups = channels if groups is None else groups
    builder = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, channels, size, size), "float16"))
    w = relax.Var("w", relax.TensorType((channels, channels // groups, kernel, kernel),
                                       "float16"))
    with builder.function("main", [x, w]):
        with builder.dataflow():
            conv = builder.emit(relax.op.nn.conv2d(x, w, padding=kernel // 2, groups=groups,
                                                   out_dtype="float32"))
            out = builder.emit_output(relax.op.astype(relax.op.nn.relu(conv), "float16"))
        builder.emit_func_output(out)
    with SM90:
        fused = tvm.transform.Sequential([
            relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(),
            relax.transform.FuseOps(), relax.transform.FuseTIR()])(builder.get())
    return [f for gv, f in fused.functions_items() if isinstance(f, tvm.tirx.PrimFunc)][0]


def test_depthwise_convolution_with_an_epilogue_gets_one_output_per_thread():
    from tvm.s_tir import dlight as dl

    func = _depthwise_fused()
    assert pipeline._reductions(func) == [(9, 96 * 56 * 56)]
    assert dl.gpu.Matmul().apply(func, SM90, False) is None
    assert dl.gpu.GeneralReduction().apply(func, SM90, False) is not None  # TVM's choice
    schedule = pipeline._small_reduction_rule().apply(func, SM90, False)
    assert schedule is not None
    script = schedule.mod.script()
    assert "threadIdx.x" in script and "blockIdx.x" in script


@pytest.mark.parametrize("flags", [dict(channels=96, groups=1, kernel=3),  # 864 products
                                   dict(channels=96, size=4)])  # 1,536 outputs
def test_long_reductions_and_small_outputs_are_left_to_dlight(flags):
    func = _depthwise_fused(**flags)
    assert pipeline._small_reduction_rule().apply(func, SM90, False) is None


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_cuda_pipeline_builds_attention_and_depthwise_kernels_that_nvcc_compiles(tmp_path):
    @I.ir_module
    class Block:
        @R.function
        def main(x: R.Tensor((1, 32, 28, 28), "float16"), w: R.Tensor((32, 1, 3, 3), "float16"),
                 q: R.Tensor((1, 128, 4, 64), "float16"), k: R.Tensor((1, 128, 4, 64), "float16"),
                 v: R.Tensor((1, 128, 4, 64), "float16")):
            with R.dataflow():
                conv = R.nn.conv2d(x, w, padding=1, groups=32, out_dtype="float32")
                y = R.astype(R.nn.relu(conv), "float16")
                att = R.nn.attention(q, k, v, scale=0.125)
                R.output(y, att)
            return (y, att)

    with tvm.transform.PassContext(opt_level=3):
        executable = tvm.compile(Block, target=SM90,
                                 relax_pipeline=relay_amp.cuda_pipeline(SM90))
    source = executable.mod.imports[0].imports[0].inspect_source("cuda")
    path = tmp_path / "kernels.cu"
    path.write_text(source)
    result = subprocess.run(["nvcc", "-cubin", "-arch=sm_90", "-o", str(tmp_path / "k.cubin"),
                             str(path)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr[-1000:]
    assert "attention" not in source  # decomposed: matmul and softmax kernels instead


@pytest.mark.parametrize("rows, cols, depth, factor", [
    (128, 768, 768, 4), (128, 768, 3072, 16), (128, 3072, 768, 4), (2048, 2048, 2048, 1),
    (128, 32000, 2048, 1), (128, 768, 100, 1), (1, 1000, 2048, 1), (64, 768, 3072, 1),
    (128, 64, 3072, 1)])
def test_split_k_factor_fills_the_gpu_with_slices_of_at_least_128(rows, cols, depth, factor):
    assert pipeline.split_k_factor(rows, cols, depth, 132) == factor


@pytest.mark.parametrize("dtype, out_dtype", [("float16", "float32"), ("bfloat16", "float32"),
                                              ("float32", "float32")])
def test_split_k_is_partial_products_and_their_sum_with_the_same_result(dtype, out_dtype):
    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((1, 128, 1024), "float32"), w: R.Tensor((1024, 256), "float32")):
            with R.dataflow():
                y = R.matmul(x, w)
                R.output(y)
            return y

    if dtype != "float32":
        Before = relay_amp.convert(Before, dtype)[0]
    after = pipeline.SplitK(132)(Before)
    relax.analysis.well_formed(after)
    assert "relax.matmul" not in _ops(after)
    calls = [b.value for b in after["main"].body.blocks[0].bindings
             if isinstance(b.value, relax.Call) and b.value.op.name == "relax.call_tir"]
    partial = calls[0].ty
    assert [int(d) for d in partial.shape.values] == [8, 1, 128, 256]
    assert str(partial.dtype) == out_dtype
    inputs = _inputs(Before)
    reference = execution.run(relay_amp.compile_module(Before), inputs)
    outputs = execution.run(relay_amp.compile_module(after), inputs)
    tolerance = {"float32": 1e-5, "float16": 1e-3, "bfloat16": 1e-2}[dtype]
    scale = float(np.abs(reference[0]).max())  # another summation order: error ~ the sum's size
    np.testing.assert_allclose(outputs[0], reference[0], rtol=0, atol=tolerance * scale)


def test_split_k_leaves_large_and_symbolic_matmuls_alone():
    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor(("n", 1024), "float32"), w: R.Tensor((1024, 1024), "float32"),
                 y: R.Tensor((4096, 1024), "float32")):
            with R.dataflow():
                a = R.matmul(x, w)
                b = R.matmul(y, w)
                R.output(a, b)
            return (a, b)

    tvm.ir.assert_structural_equal(pipeline.SplitK(132)(Before), Before)


def _static_matmul_relu():
    @I.ir_module
    class Module:
        @R.function
        def main(x: R.Tensor((128, 256), "float16"), w: R.Tensor((256, 256), "float16")):
            R.func_attr({"num_input": 1})
            with R.dataflow():
                lv = R.matmul(x, w, out_dtype="float32")
                lv1 = R.astype(R.nn.relu(lv), "float16")
                gv = R.matmul(lv1, w, out_dtype="float32")
                R.output(gv)
            return gv

    return Module


@pytest.mark.parametrize("config, flags, captured", [
    ({}, {}, True),  # relay_amp's default: CUDA graphs on
    ({"relax.backend.use_cuda_graph": False}, {}, False),  # the user's PassContext decides
    ({}, {"cuda_graph": False}, False),
    ({"relax.backend.use_cuda_graph": True}, {"relay_amp_schedules": False}, True),
    ({}, {"relay_amp_schedules": False}, False),  # TVM's own pipeline keeps TVM's default
])
def test_cuda_graphs_are_on_by_default_unless_the_caller_says_otherwise(config, flags, captured):
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})
    with tvm.transform.PassContext(opt_level=3, config=config):
        lowered = relay_amp.cuda_pipeline(target, **flags)(_static_matmul_relu())
    assert ("vm.builtin.cuda_graph" in lowered.script()) == captured


def test_tvms_default_schedule_pass_is_replaced_exactly_once():
    """relay_amp's pipeline drops the pass named pipeline.TVM_SCHEDULE_PASS from TVM's legalize
    passes (by name) and adds dlight's ApplyDefaultSchedule with its own rules; if TVM's legalize
    passes stop holding exactly one pass of that name, or it is no longer dlight's scheduler, this
    fails before the filter silently drops nothing and a pipeline runs TVM's rules first."""
    from tvm.relax.backend.cuda import pipeline as tvm_pipeline
    from tvm.s_tir import dlight as dl

    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})
    named = [p for p in tvm_pipeline.legalize_passes(target)
             if p.info.name == pipeline.TVM_SCHEDULE_PASS]
    assert len(named) == 1 and isinstance(named[0], dl.ApplyDefaultSchedule)
