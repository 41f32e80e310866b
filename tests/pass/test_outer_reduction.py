"""relay_amp.builds.outer_reduction: a softmax over an axis other than the innermost (YOLOv8's
box bins) computed once, in vectors along the innermost axis, where dlight's CPU ``Reduction``
rule recomputed it for every value of the reduced axis. Outputs: the same sums in the same
order, so the same numbers as the kernel dlight schedules."""

import math

import numpy as np
import pytest
import tvm
from helpers import block_loops
from tvm import relax
from tvm.s_tir import dlight as dl
from tvm.script import ir as I
from tvm.script import relax as R

import relay_amp
from relay_amp.builds import outer_reduction
from relay_amp.builds.outer_reduction import ReductionAlongOuterAxis, vector_lanes

AVX2 = {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "haswell"}
NEON = {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon"]}


@I.ir_module
class BoxBins:
    @R.function
    def main(x: R.Tensor((1, 16, 4, 2100), "float32")):
        with R.dataflow():
            gv = R.nn.softmax(x, axis=1)
            R.output(gv)
        return gv


def _softmax(shape, axis, dtype="float32"):
    x = relax.Var("x", relax.TensorType(shape, dtype))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            out = builder.emit_output(relax.op.nn.softmax(x, axis=axis))
        builder.emit_func_output(out)
    return builder.get()


def _scheduled(mod, target, rules):
    target = tvm.target.Target(target)
    with target:
        out = dl.ApplyDefaultSchedule(*rules)(relax.transform.LegalizeOps()(mod))
    (func,) = [f for f in out.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
    return func


def _iterations(func) -> dict:
    """Each block's name -> how many times it runs: the product of its enclosing loops'
    extents (a vectorized loop's lanes included)."""
    return {name: sum(math.prod(extent for extent, _ in loops) for loops in places)
            for name, places in block_loops(func).items()}


def _parallel_loops(func) -> list:
    import tvm_ffi

    loops = []
    tvm_ffi.structural_walk(func.body, lambda n: loops.append(int(n.extent)) if (
        isinstance(n, tvm.tirx.For) and n.kind == tvm.tirx.ForKind.PARALLEL) else None)
    return loops


@pytest.mark.parametrize(("target", "lanes"), [(AVX2, 4), (NEON, 4)])
def test_a_softmax_over_box_bins_computes_each_value_once(target, lanes):
    """``[1, 16, 4, 2100]`` along axis 1: dlight's rule ran its last block's first loops (the
    batch, the 16 bins, the 4 sides) in parallel and computed the maximum, every ``exp`` and
    the sum over the whole bins-by-2100 slice under each, 16 times the work. The rule runs the
    4 sides by 2100 / lanes vectors in parallel and computes each stage once; 2100 values take
    vectors of 4 (8 and 16 do not divide them)."""
    before = _iterations(_scheduled(BoxBins, target, [dl.cpu.Reduction()]))
    func = _scheduled(BoxBins, target, [ReductionAlongOuterAxis(), dl.cpu.Reduction()])
    after = _iterations(func)
    values = 16 * 4 * 2100
    assert before["T_softmax_exp"] >= 16 * values  # what the rule replaces
    assert after["T_softmax_exp"] == after["T_softmax_norm"] == values
    assert after["T_softmax_maxelem"] == after["T_softmax_expsum"] == values
    assert _parallel_loops(func) == [4 * 2100 // lanes]
    assert vector_lanes(2100, 32, tvm.target.Target(target)) == lanes


def test_a_softmax_over_the_innermost_axis_is_left_to_dlight():
    assert ReductionAlongOuterAxis().apply(
        relax.transform.LegalizeOps()(_softmax((4, 8, 32), 2))["softmax"],
        tvm.target.Target(AVX2), False) is None


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize(("shape", "axis"), [((1, 16, 4, 2100), 1), ((2, 5, 7, 9), 1),
                                             ((3, 6, 10), 0)])
def test_outputs_are_the_dlight_schedules(monkeypatch, shape, axis, dtype):
    """On this host, through relay_amp's CPU pipeline: the same numbers as the kernel dlight's
    rule schedules (each sum over the reduced axis in its order), bit for bit, in float32 and
    float16; and a softmax (an axis of 9 or 33 values, which no vector divides, runs in
    parallel without vectors)."""
    mod = _softmax(shape, axis, dtype)
    x = (np.random.default_rng(0).standard_normal(shape) * 3).astype(dtype)
    target = tvm.target.Target(relay_amp.host_target())

    def run():
        executable = tvm.compile(mod, target=target,
                                 relax_pipeline=relay_amp.cpu_pipeline(target))
        return relay_amp.execution.run(relax.VirtualMachine(executable, tvm.cpu()), [x])[0]

    ours = run()
    monkeypatch.setattr(outer_reduction.ReductionAlongOuterAxis, "apply",
                        lambda self, func, target, tunable: None)
    np.testing.assert_array_equal(ours, run())
    exact = np.exp(x.astype("float64") - x.max(axis, keepdims=True))
    exact /= exact.sum(axis, keepdims=True)
    np.testing.assert_allclose(ours.astype("float64"), exact, rtol=0,
                               atol=1e-6 if dtype == "float32" else 4e-3)


@pytest.mark.parametrize("target", [AVX2, NEON], ids=["x86", "aarch64"])
def test_a_softmax_fused_with_its_cast_is_computed_once(target):
    """A float16 model's softmax over the box bins, computed in float32 and cast back (one
    fused kernel, whose last block is the cast): the cast is folded into the normalization,
    and each stage runs once, as without the cast. Outputs: numpy's softmax, cast."""
    x = relax.Var("x", relax.TensorType((1, 16, 4, 64), "float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            out = builder.emit_output(relax.op.astype(relax.op.nn.softmax(x, axis=1), "float16"))
        builder.emit_func_output(out)
    fused = tvm.transform.Sequential([
        relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(),
        relax.transform.FuseOps(), relax.transform.FuseTIR()])(builder.get())
    (name,) = [gv.name_hint for gv, f in fused.functions.items()
               if isinstance(f, tvm.tirx.PrimFunc)]
    assert "softmax" in name and "cast" in name
    with tvm.target.Target(target):
        out = dl.ApplyDefaultSchedule(ReductionAlongOuterAxis(), dl.cpu.Reduction())(fused)
    counts = _iterations(out[name])
    values = 16 * 4 * 64
    assert counts["T_softmax_exp"] == counts["T_softmax_norm"] == values
    assert not any(block.startswith("compute") for block in counts)  # the cast, folded
    if target is AVX2 and tvm.target.codegen.llvm_get_system_triple().startswith("x86_64"):
        data = np.random.default_rng(7).standard_normal((1, 16, 4, 64)).astype("float32")
        ex = tvm.compile(out, target=tvm.target.Target(relay_amp.host_target()))
        got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(data)).numpy()
        e = np.exp(data - data.max(axis=1, keepdims=True))
        np.testing.assert_allclose(got.astype("float32"),
                                   (e / e.sum(axis=1, keepdims=True)).astype("float16"),
                                   rtol=1e-3, atol=1e-3)
