"""relay_amp.builds.elementwise: a CPU kernel of spatial blocks computes in one parallel loop of
register-wide vectors, its stages inlined; the numbers are TVM's build's."""

import re

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import tirx as T

import relay_amp
from relay_amp.builds.elementwise import Elementwise, calls_a_library, register_lanes

AVX512 = {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "skylake-avx512"}
AVX2 = {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "haswell"}
SSE = {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "x86-64"}
NEON = {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon"]}


@T.prim_func(private=True, s_tir=True)
def Before(x: T.Buffer((1, 4, 4, 32), "float32"), scale: T.Buffer((1, 1, 1, 32), "float32"),
           shift: T.Buffer((1, 1, 1, 32), "float32"), out: T.Buffer((1, 4, 4, 32), "float32")):
    T.func_attr({"tirx.noalias": True})
    scaled = T.sblock_alloc_buffer((1, 4, 4, 32))
    shifted = T.sblock_alloc_buffer((1, 4, 4, 32))
    for n, h, w, c in T.grid(1, 4, 4, 32):
        with T.sblock("scaled"):
            vn, vh, vw, vc = T.axis.remap("SSSS", [n, h, w, c])
            scaled[vn, vh, vw, vc] = x[vn, vh, vw, vc] * scale[vn, 0, 0, vc]
    for n, h, w, c in T.grid(1, 4, 4, 32):
        with T.sblock("shifted"):
            vn, vh, vw, vc = T.axis.remap("SSSS", [n, h, w, c])
            shifted[vn, vh, vw, vc] = scaled[vn, vh, vw, vc] + shift[vn, 0, 0, vc]
    for n, h, w, c in T.grid(1, 4, 4, 32):
        with T.sblock("relu"):
            vn, vh, vw, vc = T.axis.remap("SSSS", [n, h, w, c])
            out[vn, vh, vw, vc] = T.max(shifted[vn, vh, vw, vc], T.float32(0.0))


@T.prim_func(private=True, s_tir=True)
def Expected(x: T.Buffer((1, 4, 4, 32), "float32"), scale: T.Buffer((1, 1, 1, 32), "float32"),
             shift: T.Buffer((1, 1, 1, 32), "float32"), out: T.Buffer((1, 4, 4, 32), "float32")):
    T.func_attr({"tirx.noalias": True})
    for fused_0 in T.parallel(16):
        for fused_1 in T.vectorized(32):
            with T.sblock("relu"):
                vn = T.axis.spatial(1, 0)
                vh = T.axis.spatial(4, (fused_0 * 32 + fused_1) // 128)
                vw = T.axis.spatial(4, (fused_0 * 32 + fused_1) % 128 // 32)
                vc = T.axis.spatial(32, (fused_0 * 32 + fused_1) % 32)
                T.reads(x[vn, vh, vw, vc], scale[vn, 0, 0, vc], shift[vn, 0, 0, vc])
                T.writes(out[vn, vh, vw, vc])
                out[vn, vh, vw, vc] = T.max(x[vn, vh, vw, vc] * scale[vn, 0, 0, vc]
                                            + shift[vn, 0, 0, vc], T.float32(0.0))


def _apply(func, target):
    sch = Elementwise().apply(func, tvm.target.Target(target), False)
    return None if sch is None else sch.mod["main"]


def test_stages_inline_into_one_parallel_loop_of_vectors():
    tvm.ir.assert_structural_equal(_apply(Before, AVX2), Expected)


@pytest.mark.parametrize(("target", "lanes", "step"),
                         [(AVX512, 16, 32), (AVX2, 8, 32), (NEON, 4, 16), (SSE, None, None)])
def test_a_step_is_up_to_four_registers_of_the_target(target, lanes, step):
    """Four registers of float32 where the 32 channels allow (AVX-512's four would be 64)."""
    assert register_lanes(tvm.target.Target(target), 32) == lanes
    scheduled = _apply(Before, target)
    if lanes is None:  # a CPU whose registers relay_amp does not know: LLVM's own choice
        assert scheduled is None
        return
    text = scheduled.script()
    assert f"T.vectorized({step})" in text and f"T.parallel({512 // step})" in text
    assert "sblock_alloc_buffer" not in text


@T.prim_func(private=True, s_tir=True)
def RowSums(x: T.Buffer((4, 32), "float32"), out: T.Buffer((4,), "float32")):
    for i, k in T.grid(4, 32):
        with T.sblock("sum"):
            vi, vk = T.axis.remap("SR", [i, k])
            with T.init():
                out[vi] = T.float32(0.0)
            out[vi] = out[vi] + x[vi, vk]


@T.prim_func(private=True, s_tir=True)
def Odd(x: T.Buffer((3, 7), "float32"), out: T.Buffer((3, 7), "float32")):
    for i, j in T.grid(3, 7):
        with T.sblock("relu"):
            vi, vj = T.axis.remap("SS", [i, j])
            out[vi, vj] = T.max(x[vi, vj], T.float32(0.0))


@T.prim_func(private=True, s_tir=True)
def Transpose(x: T.Buffer((32, 32), "float32"), out: T.Buffer((32, 32), "float32")):
    for i, j in T.grid(32, 32):
        with T.sblock("transpose"):
            vi, vj = T.axis.remap("SS", [i, j])
            out[vi, vj] = x[vj, vi]


@pytest.mark.parametrize("func", [RowSums, Odd, Transpose],
                         ids=["reduction", "not-a-multiple-of-lanes", "read-across"])
def test_other_kernels_are_left_alone(func):
    assert _apply(func, AVX2) is None


def test_outputs_are_tvms_own_builds():
    """A batch norm's multiply and add with a ReLU and a sigmoid after it, in relay_amp's CPU
    pipeline on this host: the same arithmetic per element as TVM's build."""
    rng = np.random.default_rng(0)
    x = relax.Var("x", relax.TensorType((2, 24, 10, 16), "float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            y = builder.emit(relax.op.multiply(x, relax.const(
                rng.standard_normal((1, 1, 1, 16)).astype("float32"))))
            y = builder.emit(relax.op.nn.relu(relax.op.add(y, relax.const(
                rng.standard_normal((1, 1, 1, 16)).astype("float32")))))
            out = builder.emit_output(relax.op.sigmoid(y))
        builder.emit_func_output(out)
    mod = builder.get()
    data = rng.standard_normal((2, 24, 10, 16)).astype("float32")
    plain, scheduled = (relay_amp.execution.run(relay_amp.compile_module(mod, None, ours),
                                                [data])[0] for ours in (False, True))
    np.testing.assert_allclose(scheduled, plain, rtol=0, atol=2.0**-21)


@T.prim_func(private=True, s_tir=True)
def ReshapeThenRelu(x: T.Buffer((8, 4), "float32"), out: T.Buffer((32,), "float32")):
    flat = T.sblock_alloc_buffer((32,))
    for i in range(32):
        with T.sblock("reshape"):
            vi = T.axis.spatial(32, i)
            flat[vi] = x[vi // 4, vi % 4]
    for i in range(32):
        with T.sblock("relu"):
            vi = T.axis.spatial(32, i)
            out[vi] = T.max(flat[vi], T.float32(0.0))


def test_a_stage_read_across_is_refused_before_any_inlining(monkeypatch):
    """A fused detection head had hundreds of stages (reshapes, slices): inlining them all
    before refusing the kernel took 21 s on ssd_300_vgg16_atrous_voc. A stage that does not
    read along its last axis refuses the kernel before anything is inlined."""
    from tvm import s_tir

    inlined = []
    original = s_tir.Schedule.compute_inline
    monkeypatch.setattr(s_tir.Schedule, "compute_inline",
                        lambda self, block: inlined.append(block) or original(self, block))
    assert _apply(ReshapeThenRelu, AVX2) is None and not inlined


def _sigmoids(count, shape=(4, 64)):
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            y = x
            for _ in range(count):
                y = builder.emit(relax.op.sigmoid(relax.op.nn.relu(y)))
            out = builder.emit_output(y)
        builder.emit_func_output(out)
    return builder.get()


def test_a_chain_of_exps_is_inlined_one_exp_a_loop():
    """Four sigmoids after ReLUs in one kernel: each loop holds one polynomial ``exp`` (within
    ``INLINED_FLOPS``), vectorized; nested in one loop, 50 such exps did not build in 300 s."""
    from tvm.s_tir import Schedule

    from relay_amp.builds.elementwise import INLINED_FLOPS
    from relay_amp.builds.fast_math import vector_math
    from relay_amp.builds.flops import expanded_flops

    target = tvm.target.Target(AVX2)
    with target:
        mod = tvm.transform.Sequential([vector_math(), relax.transform.LegalizeOps(),
                                        relax.transform.AnnotateTIROpPattern(),
                                        relax.transform.FuseOps(),
                                        relax.transform.FuseTIR()])(_sigmoids(4))
    (func,) = (f for f in mod.functions.values() if isinstance(f, tvm.tirx.PrimFunc))
    sch = Schedule(_apply(func, AVX2))
    blocks = sch.get_child_blocks(sch.get_sblock("root"))
    assert len(blocks) == 4
    for block in blocks:
        assert 82 < expanded_flops(sch.get(block).body) <= INLINED_FLOPS
        assert sch.get(block).script().count("T.float32(-88.376") > 0
        assert sch.get(sch.get_loops(block)[-1]).kind == tvm.tirx.ForKind.VECTORIZED


def test_a_chain_of_exps_keeps_the_numbers():
    mod = _sigmoids(4, (2, 8, 32))
    data = np.random.default_rng(3).standard_normal((2, 8, 32)).astype("float32") * 4
    plain, scheduled = (relay_amp.execution.run(relay_amp.compile_module(mod, None, ours),
                                                [data])[0] for ours in (False, True))
    np.testing.assert_allclose(scheduled, plain, rtol=0, atol=2.0**-21)



def _gelu_cast(dtype):
    @T.prim_func(s_tir=True)
    def gelu_cast(x: T.Buffer((4, 32), "float32"), out: T.Buffer((4, 32), dtype)):
        T.func_attr({"tirx.noalias": True})
        gelu = T.sblock_alloc_buffer((4, 32))
        for i, j in T.grid(4, 32):
            with T.sblock("gelu"):
                vi, vj = T.axis.remap("SS", [i, j])
                gelu[vi, vj] = x[vi, vj] * (T.float32(0.5) + T.erf(x[vi, vj] * T.float32(0.5)))
        for i, j in T.grid(4, 32):
            with T.sblock("cast"):
                vi, vj = T.axis.remap("SS", [i, j])
                out[vi, vj] = T.Cast(dtype, gelu[vi, vj])

    return gelu_cast


@pytest.mark.parametrize(("dtype", "mattr"), [("bfloat16", "+bf16"), ("float16", "+fullfp16")])
def test_a_call_is_not_inlined_into_a_bfloat16_cast(dtype, mattr):
    """TVM's bfloat16 legalization writes the value it rounds out twice, and no pass merges two
    calls of ``erf`` (a ``libm`` call on aarch64): a GELU inlined into its cast to bfloat16
    ran as a scalar loop that called it twice an element (2 call sites; BERT's bfloat16
    build). Kept in its own loop of 16 lanes, it is called once a lane; a float16 cast, one
    instruction, still takes the GELU inlined."""
    scheduled = _apply(_gelu_cast(dtype), NEON)
    text = scheduled.script()
    (store,) = [line for line in text.splitlines() if line.strip().startswith("out[")]
    assert ("T.erf(" in store) == (dtype == "float16") and text.count("T.erf(") == 1
    target = tvm.target.Target({**NEON, "mattr": ["+neon", mattr]})
    asm = tvm.tirx.build(tvm.IRModule({"gelu": scheduled}), target=target).inspect_source("asm")
    assert len(re.findall(r"\bbl\s+erff\b", asm)) == 16


@pytest.mark.parametrize(("function", "library"), [("erf", True), ("sigmoid", False),
                                                   ("tanh", False), ("exp", False)])
def test_what_calls_a_library_is_read_off_the_lowered_intrinsics(function, library):
    """On aarch64 TVM lowers ``erf`` to libm's ``erff`` (a BFMMLA write-back that calls it stays
    one copy, in a loop) and a sigmoid, a tanh or an ``exp`` to arithmetic around LLVM's
    ``exp`` intrinsic (the write-back is unrolled: YOLOv8n's SiLU)."""
    out = tvm.tirx.decl_buffer((8,), "float32", "out")
    x = tvm.tirx.decl_buffer((8,), "float32", "x")
    i = tvm.tirx.Var("i", "int32")
    store = tvm.tirx.BufferStore(out, tvm.tirx.call_intrin(
        "float32", f"tirx.{function}", tvm.tirx.BufferLoad(x, [i])), [i])
    assert calls_a_library(store, tvm.target.Target(NEON)) is library
