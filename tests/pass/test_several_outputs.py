"""A row reduction written twice (a post-norm layer_norm: the residual stream in float32, the next
matmul's operand in float16) gets a thread block per row on CUDA, not dlight's fallback."""

import pytest
import tvm
import tvm_ffi
from helpers import NVCC, nvcc_compile
from tvm.script import ir as I
from tvm.script import relax as R

import relay_amp
from relay_amp.builds import pipeline
from relay_amp.builds.schedule_rules import RuleLog
from relay_amp.builds.several_outputs import THREADS, several_outputs_rule

SM90 = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})


@I.ir_module
class WidePostNorm:
    """Two post-norm residual blocks: the first layer_norm's result is the second block's
    residual stream (float32) and its matmul's operand (low precision)."""

    @R.function
    def main(x: R.Tensor((1, 128, 768), "float32"), w: R.Tensor((768, 768), "float32"),
             v: R.Tensor((768, 768), "float32"), g: R.Tensor((768,), "float32"),
             b: R.Tensor((768,), "float32")):
        with R.dataflow():
            y = R.matmul(x, w)
            s = R.add(x, y)
            n = R.nn.layer_norm(s, g, b, axes=[-1])
            z = R.matmul(n, v)
            t = R.add(n, z)
            o = R.nn.layer_norm(t, g, b, axes=[-1])
            R.output(o)
        return o


def _scheduled_kernels(dtype):
    converted, report = relay_amp.convert(WidePostNorm, dtype, target=SM90)
    log = RuleLog()
    with tvm.transform.PassContext(opt_level=3):
        built = pipeline.cuda_pipeline(SM90, rule_log=log)(converted)
    return report, log, built


def _thread_extents(func) -> dict:
    extents = {}

    def visit(node):
        if isinstance(node, tvm.tirx.For) and node.thread_binding is not None:
            tag = node.thread_binding.thread_tag
            extents.setdefault(tag, set()).add(int(node.extent))

    tvm_ffi.structural_walk(func.body, (tvm.tirx.For, visit), order="post")
    return extents


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_the_pair_writing_layer_norm_gets_a_block_per_row(dtype):
    report, log, built = _scheduled_kernels(dtype)
    assert report.find("n").reason("absorbing_kernel").values["writes"] == f"float32 and {dtype}"
    pairs = [name for name, rule in log.rules.items() if rule == "SeveralOutputs"]
    assert pairs, log.rules
    assert "Fallback" not in {log.rules[name] for name in log.rules if "layer_norm" in name}
    for name in pairs:
        func = built[name]
        assert "layer_norm" in name
        assert _thread_extents(func) == {"blockIdx.x": {128}, "threadIdx.x": {THREADS}}


def test_a_kernel_with_one_output_is_left_to_general_reduction():
    _, log, _ = _scheduled_kernels("float16")
    assert "GeneralReduction" in log.rules.values()
    rule = several_outputs_rule()
    single = next(f for g, f in PostNormFloat32Norm().functions_items()
                  if isinstance(f, tvm.tirx.PrimFunc))
    assert rule.apply(single, SM90, False) is None


def PostNormFloat32Norm():
    """TVM's layer_norm of a float32 tensor, legalized: reductions and one output."""
    @I.ir_module
    class Norm:
        @R.function
        def main(x: R.Tensor((1, 128, 768), "float32"), g: R.Tensor((768,), "float32"),
                 b: R.Tensor((768,), "float32")):
            with R.dataflow():
                n = R.nn.layer_norm(x, g, b, axes=[-1])
                R.output(n)
            return n

    return tvm.relax.transform.LegalizeOps()(Norm)


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_the_build_compiles_with_nvcc(tmp_path):
    converted, _ = relay_amp.convert(WidePostNorm, "float16", target=SM90)
    executable = pipeline.build(converted, SM90)
    status, log = nvcc_compile(executable.mod.imports[0].imports[0].inspect_source("cuda"),
                               tmp_path, archs=("sm_90",))
    assert status == 0, log[-1000:]
