"""relay_amp.gpu_cost measures what relay_amp.cuda_pipeline builds: its kernel count is the number
of CUDA kernels the executable launches per inference, and split-K adds no copy and no cast."""

import re

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R

import relay_amp
from relay_amp.builds import pipeline
from relay_amp.builds.gpu_cost import gpu_cost, lower_for_cuda

SM90 = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})


def feed_forward(seq=128, hidden=768, inner=3072):
    """A BERT feed-forward block with constant weights: matmul, add, GELU, matmul (768→3072),
    ReLU, matmul (3072→768), the input added back, layer_norm."""
    builder, op = relax.BlockBuilder(), relax.op
    rng = np.random.default_rng(0)

    def const(*shape):
        return relax.const((rng.normal(size=shape) * 0.02).astype("float32"))

    x = relax.Var("x", relax.TensorType((1, seq, hidden), "float32"))
    with builder.function("main", [x]):
        with builder.dataflow():
            h = builder.emit(op.nn.gelu(op.add(op.matmul(x, const(hidden, hidden)),
                                               const(hidden))))
            i = builder.emit(op.nn.relu(op.matmul(h, const(hidden, inner))))
            o = builder.emit(op.add(op.matmul(i, const(inner, hidden)), x))
            y = builder.emit_output(op.nn.layer_norm(o, const(hidden), const(hidden), axes=[-1]))
        builder.emit_func_output(y)
    return builder.get()


_KERNEL = re.compile(r"__global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\(")
_CALL = re.compile(r"^\s*call\s+(\S+)", re.MULTILINE)


def executable_launches(executable) -> int:
    """CUDA kernels launched per run of ``main``: each call of a compiled function in the VM
    code, times the ``__global__`` kernels that function holds (``<name>_kernel``,
    ``<name>_kernel_1``, ...)."""
    source = "\n".join(m.inspect_source("cuda") for m in executable.mod.imports[0].imports
                       if m.kind == "cuda")
    kernels = set(_KERNEL.findall(source))
    launches = 0
    for name in _CALL.findall(executable.as_text()):
        launches += sum(1 for k in kernels if re.fullmatch(rf"{re.escape(name)}_kernel(_\d+)?", k))
    return launches


@pytest.mark.parametrize("dtype", [None, "float16"])
def test_kernels_are_what_the_built_executable_launches(dtype):
    mod = feed_forward()
    if dtype:
        mod = relay_amp.convert(mod, dtype, target=SM90)[0]
    cost = gpu_cost(mod, SM90)
    executable = pipeline.build(mod, SM90)
    assert cost.kernels == executable_launches(executable)


@pytest.mark.parametrize("dtype, kernels", [(None, 7), ("float16", 6), ("bfloat16", 6)])
def test_split_k_in_the_feed_forward_block_adds_no_copy_and_no_cast(dtype, kernels):
    """Three matmuls with 6 to 24 output tiles: each split in K. Before the slices were read in
    place the float32 build launched 11 kernels (3 transpose copies, 3 sums) and float16 9,
    one a standalone cast."""
    mod = feed_forward()
    if dtype:
        mod = relay_amp.convert(mod, dtype, target=SM90)[0]
    cost = gpu_cost(mod, SM90)
    fused = gpu_cost(mod, SM90, pipeline="tvm")
    assert (cost.kernels, cost.copies, cost.casts) == (kernels, 0, 0)
    # TVM's pipeline: one kernel per matmul and its epilogue, and layer_norm; split-K adds the
    # sums (the float16 build's first matmul is relay_amp's mixed kernel, which is not split)
    assert (fused.kernels, fused.copies, fused.casts) == (4, 0, 0)


def _low_precision_matmul(dtype):
    builder = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 128, 1024), dtype))
    w = relax.Var("w", relax.TensorType((1024, 256), dtype))
    with builder.function("main", [x, w]):
        with builder.dataflow():
            y = builder.emit_output(relax.op.matmul(x, w, out_dtype="float32"))
        builder.emit_func_output(y)
    return builder.get()


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_split_k_reads_the_slices_in_place(dtype):
    """The partial products read the function's operands themselves; the only other kernel is
    their sum (no reshape or transpose kernel)."""
    mod = _low_precision_matmul(dtype)
    lowered = lower_for_cuda(mod, SM90)
    calls = [b.value for b in lowered["main"].body.blocks[0].bindings
             if isinstance(b.value, relax.Call) and b.value.op.name == "relax.call_tir"]
    assert [c.args[0].name_hint for c in calls] == ["matmul_k_slices", "sum_k_slices"]
    params = {p.name for p in lowered["main"].params}
    assert {a.name for a in calls[0].args[1].fields} <= params
    assert gpu_cost(mod, SM90).copies == 0


def test_a_transpose_kernel_counts_as_a_copy():
    @I.ir_module
    class Module:
        @R.function
        def main(x: R.Tensor((64, 32), "float32")):
            with R.dataflow():
                y = R.permute_dims(x, [1, 0])
                z = R.exp(y)
                R.output(y, z)
            return (y, z)

    cost = gpu_cost(Module, SM90)
    assert (cost.kernels, cost.copies) == (2, 1)


def test_pipeline_names_what_is_measured():
    with pytest.raises(ValueError, match="pipeline must be one of"):
        gpu_cost(_low_precision_matmul("float32"), SM90, pipeline="xla")
