"""relay_amp.cpu_pipeline: TVM's CPU pipeline with dot products vectorized
(``VectorizeDotProduct``). The schedule changes how outputs are computed, not what: the same
numbers as TVM's build, in vector FMAs instead of scalar ones."""

import re

import numpy as np
import pytest
import tvm
from helpers import asm_kernel
from tvm import relax
from tvm.relax.backend.cpu_generic import pipeline as cpu_generic
from tvm.s_tir import dlight as dl
from tvm.script import ir as I
from tvm.script import relax as R

import relay_amp
from relay_amp.builds.cpu_pipeline import VectorizeDotProduct, lanes_for, registers_hold_the_sums
from relay_amp.builds.neon_tiles import TILE_REGISTERS, lane_rows, tile_shape
from relay_amp.builds.nhwc import nhwc_convolutions

FULLFP16 = {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon", "+fullfp16"]}
FP16FML = {"kind": "llvm", "mtriple": "aarch64-linux-gnu",
           "mattr": ["+neon", "+fullfp16", "+fp16fml"]}
NEON = {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon"]}
AVX2 = {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "haswell"}
A64_SCALAR_FMA = r"\bfmadd\s+[sh]\d+"
A64_F32_VECTOR_FMA = r"\bfmla\s+v\d+\.4s"
A64_F16_VECTOR_FMA = r"\bfmla\s+v\d+\.8h"
A64_FMLAL = r"\bfmlal2?\s+v\d+\.4s"
A64_WIDEN = r"\bfcvtl2?\s+v\d+\.4s"


@I.ir_module
class ConvMatmul:
    @R.function
    def main(x: R.Tensor((1, 16, 16, 16), "float32"), w: R.Tensor((16, 16, 3, 3), "float32"),
             m: R.Tensor((256, 32), "float32")):
        with R.dataflow():
            lv = R.nn.conv2d(x, w, padding=[1, 1])
            lv1 = R.nn.relu(lv)
            lv2 = R.reshape(lv1, (16, 256))
            gv = R.matmul(lv2, m)
            R.output(gv)
        return gv


@I.ir_module
class SoftmaxOdd:
    @R.function
    def main(x: R.Tensor((8, 64), "float32"), m: R.Tensor((64, 19), "float32")):
        with R.dataflow():
            lv = R.nn.softmax(x, axis=-1)
            gv = R.matmul(lv, m)
            R.output(gv)
        return gv


@I.ir_module
class SymbolicRows:
    @R.function
    def main(x: R.Tensor(("n", 32), "float32"), w: R.Tensor((32, 48), "float32"),
             b: R.Tensor((48,), "float32")):
        with R.dataflow():
            lv = R.matmul(x, w)
            gv = R.add(lv, b)
            R.output(gv)
        return gv



@I.ir_module
class SymbolicScores:
    """Attention's scores: a query times the keys, both over a sequence length."""

    @R.function
    def main(q: R.Tensor((2, "n", 16), "float32"), k: R.Tensor((2, 16, "n"), "float32")):
        with R.dataflow():
            gv = R.matmul(q, k)
            R.output(gv)
        return gv

def _inputs(mod, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal([int(d) for d in p.ty.shape.values]) / 4).astype("float32")
            for p in mod["main"].params]


def _scheduled(mod, target):
    """The module after TVM's CPU legalize passes and the rule: PrimFunc name -> script."""
    target = tvm.target.Target(target)
    passes = tvm.transform.Sequential(
        cpu_generic.library_dispatch_passes(target) + cpu_generic.legalize_passes(target)
        + [dl.ApplyDefaultSchedule(VectorizeDotProduct())])
    with target:
        out = passes(mod)
    return {gv.name_hint: f.script() for gv, f in out.functions.items()
            if isinstance(f, tvm.tirx.PrimFunc)}


def _assembly(mod, target, schedules=True):
    executable = tvm.compile(mod, target=tvm.target.Target(target),
                             relax_pipeline=relay_amp.cpu_pipeline(target, schedules))
    modules = [executable.mod, *executable.mod.imports]
    return "\n".join(m.inspect_source("asm") for m in modules if m.kind == "llvm")


def _convert(mod, dtype, target, accumulation=None):
    policy = relay_amp.Policy(dtype)
    if accumulation:
        policy = policy.set_accumulation_dtype("nn.conv2d", accumulation) \
            .set_accumulation_dtype("matmul", accumulation)
    return relay_amp.convert(mod, dtype, policy=policy, target=target)[0]


@pytest.mark.parametrize("target", [NEON, AVX2])
def test_dot_products_get_a_vector_of_partial_sums(target):
    """The convolution and the matmul: the last output axis split by the lanes, the partial
    sums in a buffer of the tile, initialised and written back by vectorized loops; on x86 the
    sums on the stack (a "global" buffer under 1 KiB: LLVM keeps it in registers) and the
    tiles in a parallel loop; on aarch64 serial tiles (``registers_hold_the_sums``), the sums
    on the stack where the update is tensorized (the matmul: NEON's register tile), else a
    local buffer (the NCHW convolution, left to LLVM's SLP vectorizer, which would rebuild
    stacked sums lane by lane); a padded input's copy vectorized, likewise parallel."""
    x86 = target is AVX2
    kernels = _scheduled(ConvMatmul, target)
    dots = {name: script for name, script in kernels.items()
            if "conv2d" in name or "matmul" in name}
    assert len(dots) == 2, sorted(kernels)
    for name, script in dots.items():
        stacked = x86 or "T.call_llvm_pure_intrin" in script
        assert stacked == (name == "matmul" or x86), name
        assert ("_global = T.sblock_alloc_buffer" in script) == stacked, name
        assert ('scope="local"' in script) == (not stacked), name
        padded = "pad_temp" in script  # the padded input's copy: vectorized, rows parallel
        assert script.count("T.vectorized(") == 2 + padded, name
        assert "T.unroll(" in script, name
        assert script.count("T.parallel(") == int(x86) * (1 + padded), name
    # the relu TVM fused after the convolution is computed in the write-back, on the tile
    assert "T.max(" in dots["fused_conv2d_relu"]
    assert 'T.sblock("compute' not in dots["fused_conv2d_relu"]


def test_lanes_divide_the_axis_multiples_of_four_first():
    assert [lanes_for(n) for n in (768, 112, 56, 36, 28, 14, 7, 20)] == \
        [16, 16, 8, 12, 14, 14, 7, 10]
    assert lanes_for(19) is None and lanes_for(3) is None


def test_the_register_tile_takes_the_shape_with_the_fewest_loads_an_fma():
    """4 x 16 where 4 rows divide the map (8 x 8 loads as few and has fewer lanes), 7 rows of 8
    lanes on a 7- or 14-wide map (1 or 2 rows of 16 loaded a weight vector for every row or
    two), the first axis on a tie, and every shape within NEON's registers."""
    assert tile_shape(64, [56, 56]) == (16, 4, 0)
    assert tile_shape(256, [14, 14]) == (8, 7, 0)
    assert tile_shape(512, [7, 7]) == (8, 7, 0)
    assert tile_shape(48, [1, 7]) == (8, 7, 1)
    assert tile_shape(72, [6]) == (12, 6, 0)
    assert tile_shape(64, [1, 1]) is None and tile_shape(20, [8]) is None
    for lanes in (16, 12, 8):
        for extent in range(2, 65):
            shape = tile_shape(lanes * 3, [extent])
            if shape is not None:
                tile_lanes, rows, _ = shape
                assert rows * tile_lanes // 4 + tile_lanes // 4 + rows <= TILE_REGISTERS
                assert extent % rows == 0 and (lanes * 3) % tile_lanes == 0


def test_depthwise_rows_are_the_most_that_fit_in_registers():
    """Rows of a depthwise convolution share only the weight: each adds its own input vectors,
    so the most rows whose sums and inputs fit, 7 of 8 lanes on a 7-multiple map, 4 of 8 or
    12 on a power of two, then the most lanes (3 rows of 16 on a 9-wide map)."""
    assert lane_rows(112, 96) == (8, 7)
    assert lane_rows(128, 64) == (8, 4)
    assert lane_rows(64, 48) == (12, 4)
    assert lane_rows(9, 48) == (16, 3)
    assert lane_rows(64, 20) is None and lane_rows(7 * 11, 64) == (8, 7)
    assert lane_rows(11, 64) is None
    for extent in range(2, 65):
        shape = lane_rows(extent, 48)
        if shape is not None:
            lanes, rows = shape
            assert 2 * rows * lanes // 4 + lanes // 4 <= TILE_REGISTERS and extent % rows == 0


def test_other_reductions_and_odd_axes_are_left_alone():
    """softmax reduces without multiply-accumulating; a 19-wide matmul output has no lanes."""
    for name, script in _scheduled(SoftmaxOdd, NEON).items():
        assert "T.vectorized(" not in script and "T.parallel(" not in script, name


def _both_builds(mod, target, inputs) -> dict:
    """``mod``'s output on ``inputs`` built by TVM's CPU pipeline (False) and relay_amp's
    (True) for ``target``, on this host."""
    outputs = {}
    for schedules in (False, True):
        executable = tvm.compile(mod, target=tvm.target.Target(target),
                                 relax_pipeline=relay_amp.cpu_pipeline(target, schedules))
        vm = relax.VirtualMachine(executable, tvm.cpu())
        outputs[schedules] = vm["main"](*[tvm.runtime.tensor(x) for x in inputs]).numpy()
    return outputs


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_the_schedule_keeps_the_numbers(dtype):
    """Each output sums in the same order: on this host the scheduled build agrees with TVM's
    to float32 rounding (FMA contraction aside), in every dtype."""
    target = relay_amp.host_target()
    mod = ConvMatmul if dtype == "float32" else _convert(ConvMatmul, dtype, target)
    outputs = _both_builds(mod, target, _inputs(ConvMatmul))
    scale = np.abs(outputs[False]).max()
    np.testing.assert_allclose(outputs[True], outputs[False], rtol=0, atol=1e-5 * scale)


@pytest.mark.parametrize("columns", [1, 2, 63])
def test_a_matmul_with_fewer_columns_than_a_tile_writes_the_real_ones(columns):
    """A weight of 1 column is padded to a tile's 32 lanes: the kernel computes 32 sums and
    its output keeps the first. TVM's ``reverse_compute_inline`` took that one-column copy for
    elementwise and wrote every sum into it, so the last, a zero, came out (hand_landmark's
    presence and handedness heads, 2026-11-29); the copy now stays a loop of its own."""
    rng = np.random.default_rng(0)
    x = relax.Var("x", relax.TensorType((1, 672), "float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            weight = relax.const(rng.standard_normal((672, columns)).astype("float32") / 16)
            bias = relax.const(rng.standard_normal((columns,)).astype("float32"))
            y = builder.emit(relax.op.add(relax.op.matmul(x, weight), bias))
            out = builder.emit_output(relax.op.sigmoid(y))
        builder.emit_func_output(out)
    mod = builder.get()
    target = relay_amp.host_target()
    outputs = _both_builds(mod, target, [rng.standard_normal((1, 672)).astype("float32")])
    np.testing.assert_allclose(outputs[True], outputs[False], rtol=0, atol=1e-5)
    from relay_amp.builds.schedule_rules import RuleLog

    log = RuleLog()  # a rule that raises leaves TVM's loops, right and slow: none may
    with tvm.target.Target(target):
        lowered = relay_amp.cpu_pipeline(target, rule_log=log)(mod)
    assert not log.errors, [error.text for error in log.errors]
    kernel = next(f for gv, f in lowered.functions.items() if "matmul" in gv.name_hint)
    assert "T.vectorized" in kernel.script() and "T.parallel" in kernel.script()
    (schedule,) = [s for s in log.schedules if "matmul" in s.kernel]  # the refusal, reported
    assert schedule.rule == "VectorizeDotProduct"
    refused = [d for d in schedule.decisions if d.startswith("left in loops of their own")]
    assert (columns == 1) == bool(refused) and (not refused or "constant index" in refused[0])


@pytest.mark.parametrize("target, dtype, tile", [
    (AVX2, "float32", "relay_amp_x86_tile_"), (NEON, "float32", "relay_amp_tile_float32_"),
    (FP16FML, "float16", "relay_amp_tile_float16_"),
    # bfloat16 operands that are not constants have no packed pairs for BFDOT to read
    ({**NEON, "mattr": ["+neon", "+bf16"]}, "bfloat16", None)])
def test_every_dot_product_kernel_reports_its_tile_and_update(target, dtype, tile):
    """The build's decisions are data (``RuleLog.schedules``, in ``relay-amp convert``'s
    report): each dot-product kernel names the rule that scheduled it, its tile's shape, where
    its sums live, its epilogue and the update's intrinsic, or that it has none."""
    from relay_amp.builds.schedule_rules import RuleLog

    mod = ConvMatmul if dtype == "float32" else _convert(ConvMatmul, dtype, target)
    log = RuleLog()
    with tvm.target.Target(target):
        relay_amp.cpu_pipeline(target, rule_log=log)(mod)
    dots = {s.kernel: s for s in log.schedules if "conv2d" in s.kernel or "matmul" in s.kernel}
    assert len(dots) == 2 and not log.errors
    conv = next(s for name, s in dots.items() if "conv2d" in name)
    assert conv.rule == "VectorizeDotProduct" and "relu" in conv.kernel
    assert any(d.startswith("tile: 16 lanes of output axis 3 (16) x") for d in conv.decisions)
    assert any(d.startswith("epilogue folded into the write-back") for d in conv.decisions)
    in_registers = target is AVX2
    assert ("sums in registers, tiles in parallel" in conv.decisions) == in_registers
    update = f"update: tensor intrinsic {tile}" if tile else "update: rows and lanes unrolled"
    for schedule in dots.values():
        assert any(d.startswith(update) for d in schedule.decisions), schedule.text()


def test_a_dot_product_without_lanes_says_why_it_is_passed_on():
    """A matmul of two inputs into 17 columns (no divisor from 4 to 16, no constant weight to
    pad): VectorizeDotProduct passes it to the next rule and says why."""
    from relay_amp.builds.schedule_rules import RuleLog

    x = relax.Var("x", relax.TensorType((8, 64), "float32"))
    y = relax.Var("y", relax.TensorType((64, 17), "float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x, y]):
        with builder.dataflow():
            out = builder.emit_output(relax.op.matmul(x, y))
        builder.emit_func_output(out)
    log = RuleLog()
    with tvm.target.Target(AVX2):
        relay_amp.cpu_pipeline(AVX2, rule_log=log)(builder.get())
    (schedule,) = log.schedules
    assert schedule.rule != "VectorizeDotProduct"
    assert schedule.passed_on == ("VectorizeDotProduct: its output's last axis (17) has no "
                                  "divisor from 4 to 16",)


def test_aarch64_dot_products_are_vector_fmas():
    """TVM's build multiplies one lane at a time (``fmadd s``); the scheduled one in ``fmla
    v.4s`` (float32 and the float16 default, which accumulates in float32) and ``fmla v.8h``
    (float16 accumulation asked)."""
    plain = _assembly(ConvMatmul, NEON, schedules=False)
    assert re.findall(A64_SCALAR_FMA, plain)
    for mod, target in ((ConvMatmul, NEON), (_convert(ConvMatmul, "float16", FULLFP16), FULLFP16)):
        asm = _assembly(mod, target)
        assert re.findall(A64_F32_VECTOR_FMA, asm) and not re.findall(A64_SCALAR_FMA, asm)
    asm = _assembly(_convert(ConvMatmul, "float16", FULLFP16, "float16"), FULLFP16)
    assert re.findall(A64_F16_VECTOR_FMA, asm) and not re.findall(A64_SCALAR_FMA, asm)


@I.ir_module
class StridedConv:
    @R.function
    def main(x: R.Tensor((1, 8, 16, 16), "float32"), w: R.Tensor((16, 8, 3, 3), "float32")):
        with R.dataflow():
            gv = R.nn.conv2d(x, w, strides=[2, 2], padding=[1, 1])
            R.output(gv)
        return gv


def test_float16_dot_products_run_on_fmlal_where_the_cpu_has_it():
    """With ``+fp16fml`` the float16 convolution and matmul (float32 accumulation) multiply
    their float16 operands into float32 sums in ``fmlal``/``fmlal2`` (relay_amp.builds.neon_tiles):
    no operand widened, no ``fmla v.4s``. Without the feature, the same kernels widen their
    operands (``fcvtl``) into ``fmla v.4s`` and no ``fmlal`` appears."""
    asm = _assembly(_convert(ConvMatmul, "float16", FP16FML), FP16FML)
    assert re.findall(A64_FMLAL, asm) and not re.findall(A64_WIDEN, asm)
    assert not re.findall(A64_F32_VECTOR_FMA, asm) and not re.findall(A64_SCALAR_FMA, asm)
    plain = _assembly(_convert(ConvMatmul, "float16", FULLFP16), FULLFP16)
    assert not re.findall(A64_FMLAL, plain) and re.findall(A64_WIDEN, plain)


@I.ir_module
class NHWCBlock:
    """A MobileNet/MediaPipe block in TFLite's layout: pointwise then depthwise convolution."""

    @R.function
    def main(x: R.Tensor((1, 8, 8, 32), "float32"), pw: R.Tensor((1, 1, 32, 48), "float32"),
             dw: R.Tensor((3, 3, 48, 1), "float32")):
        with R.dataflow():
            lv = R.nn.conv2d(x, pw, data_layout="NHWC", kernel_layout="HWIO")
            lv1 = R.nn.relu(lv)
            gv = R.nn.conv2d(lv1, dw, padding=[1, 1], groups=48, data_layout="NHWC",
                             kernel_layout="HWOI")
            R.output(gv)
        return gv


A64_F32_BY_ELEMENT = r"\bfmla\s+v\d+\.4s, v\d+\.4s, v\d+\.s\[[1-3]\]"
A64_FMLAL_BY_ELEMENT = r"\bfmlal2?\s+v\d+\.4s, v\d+\.4h, v\d+\.h\[[1-7]\]"


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_aarch64_matmuls_and_pointwise_convolutions_run_on_a_register_tile(dtype):
    """Where the scalar operand's innermost axis is a reduction (a matmul's row, an NHWC
    convolution's input channels), the tile loads a vector of it per row and multiplies by
    its lanes (``fmla v.4s, ..., v.s[k]``; ``fmlal ..., v.h[k]`` with ``+fp16fml``), as
    XNNPACK's micro-kernels do; the depthwise convolution (both operands vectors) runs on
    ``fmlal`` too, and no kernel multiplies a lane at a time."""
    target = NEON if dtype == "float32" else FP16FML
    for mod in (ConvMatmul, NHWCBlock):
        mod = mod if dtype == "float32" else _convert(mod, "float16", target)
        asm = _assembly(mod, target)
        assert re.findall(A64_F32_BY_ELEMENT if dtype == "float32" else A64_FMLAL_BY_ELEMENT,
                          asm)
        assert not re.findall(A64_SCALAR_FMA, asm)
        if dtype == "float16":
            assert not re.findall(A64_WIDEN, asm) and not re.findall(A64_F32_VECTOR_FMA, asm)



def _sequence_matmul():
    """A transformer's projection: rows over a symbolic sequence length, a constant weight."""
    weight = np.random.default_rng(0).standard_normal((256, 256)).astype("float32")
    builder = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, tvm.tirx.Var("n", "int64"), 256), "float32"))
    with builder.function("main", [x]):
        with builder.dataflow():
            y = builder.emit(relax.op.matmul(x, relax.const(weight)))
            gv = builder.emit_output(relax.op.add(y, x))
        builder.emit_func_output(gv)
    return builder.get()


def test_the_float16_tile_loads_a_row_of_scalars_once_per_step():
    """Each ``fmlal`` reads one lane of a row's float16 scalars: the tile loads every row once
    per step (LLVM had narrowed a load per lane read into ``ld1r``, 80 in this kernel)."""
    asm = _assembly(_convert(_sequence_matmul(), "float16", FP16FML), FP16FML)
    kernel = asm_kernel(asm, "fused_matmul")
    assert len(re.findall(A64_FMLAL_BY_ELEMENT, kernel)) >= 64
    assert not re.findall(r"\bld1r\s", kernel) and not re.findall(r"\bld1\s+\{ v\d+\.[hs] \}\[",
                                                                  kernel)


@pytest.mark.parametrize("target", [NEON, AVX2], ids=["aarch64", "x86"])
def test_a_convolution_reads_its_input_in_place_and_pads_with_vectors(target):
    """TVM's convolution copies its input into ``pad_temp`` in a scalar loop, padding or not:
    without padding the dot product reads the input in place; with padding the copy is one
    vector per lanes of channels."""
    kernels = _scheduled(NHWCBlock, target).values()
    pointwise = next(s for s in kernels if "conv2d_nhwc" in s and "group_conv2d" not in s)
    depthwise = next(s for s in kernels if "group_conv2d" in s)
    assert "pad_temp" not in pointwise
    lines = depthwise.splitlines()
    copy = next(n for n, line in enumerate(lines) if 'T.sblock("pad_temp")' in line)
    assert "T.vectorized" in lines[copy - 1]


def test_the_input_copies_keep_the_numbers():
    """Reading the input in place and the vectorized padding compute what TVM's build does,
    bit for bit on this host."""
    target = relay_amp.host_target()
    inputs = [tvm.runtime.tensor(x) for x in _inputs(NHWCBlock)]
    outputs = []
    for schedules in (False, True):
        executable = tvm.compile(NHWCBlock, target=tvm.target.Target(target),
                                 relax_pipeline=relay_amp.cpu_pipeline(target, schedules))
        outputs.append(relax.VirtualMachine(executable, tvm.cpu())["main"](*inputs).numpy())
    scale = np.abs(outputs[0]).max()
    np.testing.assert_allclose(outputs[1], outputs[0], rtol=0, atol=1e-6 * scale)


@I.ir_module
class Depthwise24:
    """A depthwise convolution over 24 channels: FMLAL's lanes are 12, eight and four."""

    @R.function
    def main(x: R.Tensor((1, 8, 8, 24), "float32"), dw: R.Tensor((3, 3, 24, 1), "float32")):
        with R.dataflow():
            gv = R.nn.conv2d(x, dw, padding=[1, 1], groups=24, data_layout="NHWC",
                             kernel_layout="HWOI")
            R.output(gv)
        return gv


def test_fmlal_on_four_lanes_reads_them_without_a_copy():
    """``fmlal`` multiplies the low four of eight float16 lanes: four loaded values are that
    low half as the 64-bit load leaves it, not copied into the high half (``mov v.d[1]``)."""
    asm = _assembly(_convert(Depthwise24, "float16", FP16FML), FP16FML)
    assert re.findall(A64_FMLAL, asm)
    assert not re.findall(r"\b(mov|ins)\s+v\d+\.d\[1\]", asm)

def test_a_strided_operand_keeps_the_widening_kernel():
    """In NCHW a stride-2 convolution's lanes read every other input: FMLAL's tensor intrinsic
    (contiguous lanes) does not match, and the kernel keeps the unrolled widening update. The
    aarch64 pipeline's NHWC layout (relay_amp.builds.nhwc) makes its lanes output channels,
    contiguous, and the whole convolution runs on ``fmlal``."""
    converted = _convert(StridedConv, "float16", FP16FML)
    (script,) = [s for name, s in _scheduled(converted, FP16FML).items() if "conv2d" in name]
    assert "T.unroll(" in script and "llvm.aarch64.neon.fmlal" not in script
    asm = _assembly(converted, FP16FML)
    assert re.findall(A64_FMLAL, asm) and not re.findall(A64_WIDEN, asm)
    assert not re.findall(A64_SCALAR_FMA, asm)


@pytest.mark.parametrize("rows", [1, 5, 8])
def test_a_symbolic_extent_is_padded_to_blocks_of_rows(rows):
    """A sequence length (symbolic) cannot be split exactly: the rule pads it to a multiple of
    the rows of the x86 tile that costs least per FMA (6 x 16 lanes on AVX2: zeros, computed
    and never written out), so each loaded vector
    still serves every row; the write-back writes the rows that exist, the bias add folded
    in."""
    from relay_amp.builds.x86_tiles import tile_shape

    (script,) = [s for n, s in _scheduled(SymbolicRows, AVX2).items() if "matmul" in n]
    tile_rows = tile_shape(48, [None], 8, 16)[1]
    assert tile_rows == 6
    assert "T.if_then_else(" in script and "T.where(" in script
    assert f"(n + T.int64({tile_rows - 1})) // T.int64({tile_rows}) * T.int64({tile_rows})" \
        in script
    assert f"for r in T.unroll(T.int64({tile_rows}))" in script  # the x86 tile's rows
    assert 'T.sblock("T_add"' not in script
    rng = np.random.default_rng(rows)
    inputs = [rng.standard_normal(shape).astype("float32") for shape in
              ((rows, 32), (32, 48), (48,))]
    outputs = [relay_amp.execution.run(relay_amp.compile_module(SymbolicRows, None, schedules),
                                       inputs)[0] for schedules in (False, True)]
    assert outputs[1].shape == (rows, 48)
    np.testing.assert_allclose(outputs[1], outputs[0], rtol=0, atol=1e-5)



@pytest.mark.parametrize("length", [1, 7, 40])
@pytest.mark.parametrize("target", [NEON, AVX2], ids=["aarch64", "x86"])
def test_a_symbolic_last_axis_is_padded_to_whole_vectors(target, length):
    """Attention's scores have a sequence length as their last axis too: it is padded to a
    multiple of the widest lanes, so the scores are vector FMAs, not TVM's scalar loop; the
    outputs that exist are TVM's."""
    (script,) = [s for n, s in _scheduled(SymbolicScores, target).items() if "matmul" in n]
    assert "T.vectorized(T.int64(16))" in script
    assert "T.unroll(" in script or "T.call_llvm_pure_intrin" in script
    if target is AVX2:
        rng = np.random.default_rng(length)
        inputs = [rng.standard_normal(shape).astype("float32")
                  for shape in ((2, length, 16), (2, 16, length))]
        outputs = [relay_amp.execution.run(relay_amp.compile_module(SymbolicScores, None,
                                                                    schedules), inputs)[0]
                   for schedules in (False, True)]
        assert outputs[1].shape == (2, length, length)
        np.testing.assert_allclose(outputs[1], outputs[0], rtol=0, atol=1e-5)

def _llvm_ir(mod, target, schedules=True):
    executable = tvm.compile(mod, target=tvm.target.Target(target),
                             relax_pipeline=relay_amp.cpu_pipeline(target, schedules))
    modules = [executable.mod, *executable.mod.imports]
    return "\n".join(m.inspect_source("ll") for m in modules if m.kind == "llvm")


WORKSPACE = "load ptr, ptr @__TVMBackendAllocWorkspace"


def test_registers_hold_the_sums_on_x86_only():
    assert registers_hold_the_sums(tvm.target.Target(AVX2))
    assert not registers_hold_the_sums(tvm.target.Target(NEON))


def test_partial_sums_live_in_registers_and_tiles_run_in_parallel_on_x86():
    """A buffer of any scope but "global" is a ``TVMBackendAllocWorkspace`` call on a CPU:
    LLVM would load and store each partial sum around every FMA. The tile's sums add no
    workspace to TVM's build, and no ``alloca`` survives LLVM (all promoted to registers); the
    tiles are handed to TVM's thread pool (on aarch64, where the sums stay in memory, they are
    not; an elementwise kernel runs in parallel there too)."""
    plain, scheduled = (_llvm_ir(ConvMatmul, AVX2, schedules) for schedules in (False, True))
    assert scheduled.count(WORKSPACE) <= plain.count(WORKSPACE)
    assert not re.findall(r"alloca (?:\[\d+ x (?:float|half)\]|<\d+ x )", scheduled)
    assert "@__TVMBackendParallelLaunch" in scheduled
    assert "@__TVMBackendParallelLaunch" not in plain
    neon = _llvm_ir(ConvMatmul, NEON).split("\ndefine ")[1:]
    tiles = [body for body in neon if re.match(r"[^@]*@\w*(?:conv2d|matmul)", body)]
    assert tiles and not any("@__TVMBackendParallelLaunch" in body for body in tiles)


def test_build_takes_the_cpu_pipeline_for_llvm_targets():
    executable = relay_amp.builds.pipeline.build(ConvMatmul, NEON)
    asm = "\n".join(m.inspect_source("asm") for m in [executable.mod, *executable.mod.imports]
                    if m.kind == "llvm")
    assert re.findall(A64_F32_VECTOR_FMA, asm) and not re.findall(A64_SCALAR_FMA, asm)


def _conv_with_constant_weight():
    rng = np.random.default_rng(4)
    x = relax.Var("x", relax.TensorType((1, 8, 12, 12), "float32"))
    w = relax.const((rng.standard_normal((16, 8, 3, 3)) / 8).astype("float32"))
    b = relax.const(rng.standard_normal((1, 16, 1, 1)).astype("float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            y = builder.emit(relax.op.nn.conv2d(x, w, padding=[1, 1]))
            out = builder.emit_output(relax.op.nn.relu(relax.op.add(y, b)))
        builder.emit_func_output(out)
    return builder.get()


def test_aarch64_convolutions_are_nhwc_with_weights_transposed_at_build_time():
    """The NCHW convolution becomes NHWC with HWIO weights; the weight's transpose, left by
    the layout pass for the passes that pack weights, is folded into a constant by numpy (no
    transpose of it left to run), and the module computes what it did."""
    from relay_amp.builds.constants import numpy_layout_constants

    mod = _conv_with_constant_weight()
    converted = numpy_layout_constants()(nhwc_convolutions()(mod))
    bindings = converted["main"].body.blocks[0].bindings
    calls = [b.value for b in bindings if isinstance(b.value, relax.Call)]
    (conv,) = [c for c in calls if c.op.name == "relax.nn.conv2d"]
    assert (conv.attrs.data_layout, conv.attrs.kernel_layout) == ("NHWC", "HWIO")
    (weight,) = [b.value for b in bindings if b.var.same_as(conv.args[1])]
    assert isinstance(weight, tvm.ir.expr.Constant)
    assert [int(d) for d in weight.ty.shape.values] == [3, 3, 8, 16]
    assert [c.op.name for c in calls].count("relax.permute_dims") == 2  # the input and output
    x = np.random.default_rng(5).standard_normal((1, 8, 12, 12)).astype("float32")
    outputs = [relay_amp.run(relay_amp.compile_module(m, None, False), [x])[0]
               for m in (mod, converted)]
    np.testing.assert_allclose(outputs[1], outputs[0], rtol=0, atol=1e-5)


def test_a_layout_tvm_cannot_convert_leaves_the_module_and_says_why(monkeypatch):
    from relay_amp.builds.schedule_rules import RuleLog

    def refuse(layouts):
        raise tvm.error.InternalError("no layout rule for this op")

    monkeypatch.setattr(relax.transform, "ConvertLayout", refuse)
    log, mod = RuleLog(), _conv_with_constant_weight()
    assert nhwc_convolutions(log)(mod).same_as(mod)
    (error,) = log.errors
    assert error.rule == "ConvertLayout" and "no layout rule" in error.error


@I.ir_module
class ConvBatchNorm:
    """GluonCV's block: an inference batch_norm after a convolution, then a relu."""

    @R.function
    def main(x: R.Tensor((1, 8, 12, 12), "float32"), w: R.Tensor((16, 8, 3, 3), "float32"),
             g: R.Tensor((16,), "float32"), b: R.Tensor((16,), "float32"),
             m: R.Tensor((16,), "float32"), v: R.Tensor((16,), "float32")):
        with R.dataflow():
            c = R.nn.conv2d(x, w, padding=[1, 1])
            bn = R.nn.batch_norm(c, g, b, m, v, axis=1, training=False)
            y = bn[0]
            z = R.nn.relu(y)
            R.output(z)
        return z


@pytest.mark.parametrize("target", [None, FULLFP16], ids=["host", "aarch64"])
def test_an_inference_batch_norm_is_computed_in_its_convolutions_kernel(target):
    """The batch_norm becomes elementwise ops that FuseOps puts in the convolution's kernel
    with the relu after it: one kernel, no pass over memory of its own (TVM's pipeline keeps a
    batch_norm kernel beside the convolution's); the numbers stay TVM's."""
    target = tvm.target.Target(target or relay_amp.host_target())
    with target:
        lowered = relay_amp.cpu_pipeline(target)(ConvBatchNorm)
        plain = relay_amp.cpu_pipeline(target, relay_amp_schedules=False)(ConvBatchNorm)
    kernels = sorted(gv.name_hint for gv, f in lowered.functions.items()
                     if isinstance(f, tvm.tirx.PrimFunc) and "conv2d" in gv.name_hint
                     or "batch_norm" in gv.name_hint)
    (conv,) = kernels
    assert "subtract" in conv and "divide" in conv and "relu" in conv
    assert any("batch_norm" in gv.name_hint for gv in plain.functions)
    if target.attrs.get("mtriple") is None:
        rng = np.random.default_rng(3)
        x, w, g, b, m = (rng.standard_normal([int(d) for d in p.ty.shape.values])
                         .astype("float32") for p in ConvBatchNorm["main"].params[:5])
        v = rng.uniform(0.5, 2.0, 16).astype("float32")
        outputs = [relay_amp.run(relay_amp.compile_module(ConvBatchNorm, None, schedules),
                                 [x, w, g, b, m, v])[0] for schedules in (True, False)]
        np.testing.assert_allclose(outputs[0], outputs[1], rtol=0,
                                   atol=1e-5 * np.abs(outputs[1]).max())


def test_a_training_batch_norm_keeps_its_own_kernel():
    """A training batch_norm computes its batch's statistics: it is not decomposed with the
    moving ones, and the build computes what TVM's does."""
    from relay_amp.builds.batch_norm import inference_batch_norms

    training = ConvBatchNorm.script().replace("training=False", "training=True")
    mod = tvm.script.from_source(training)
    assert inference_batch_norms()(mod).same_as(mod)
    assert inference_batch_norms()(ConvBatchNorm)["main"].script().count("batch_norm") == 0


def _chain(length):
    """A MatMul and ``length`` alternating ReLU and sigmoid ops, its epilogue once fused."""
    builder = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((8, 64), "float32"))
    weight = relax.const(np.random.default_rng(0).standard_normal((64, 64)).astype("float32"))
    with builder.function("main", [x]):
        with builder.dataflow():
            y = builder.emit(relax.op.matmul(x, weight))
            for i in range(length):
                y = builder.emit(relax.op.nn.relu(y) if i % 2 == 0 else relax.op.sigmoid(y))
            out = builder.emit_output(y)
        builder.emit_func_output(out)
    return builder.get()


def _scheduled_with_exp(mod, target):
    """PrimFunc name -> PrimFunc after legalization with ``fast_math``'s sigmoid and the rule."""
    from relay_amp.builds.fast_math import vector_math

    target = tvm.target.Target(target)
    passes = tvm.transform.Sequential(
        cpu_generic.library_dispatch_passes(target) + [vector_math()]
        + cpu_generic.legalize_passes(target)
        + [dl.ApplyDefaultSchedule(VectorizeDotProduct())])
    with target:
        out = passes(mod)
    return {gv.name_hint: f for gv, f in out.functions.items()
            if isinstance(f, tvm.tirx.PrimFunc)}


@pytest.mark.parametrize(("target", "lanes", "parallel"), [(NEON, 4, False), (AVX2, 8, True)])
def test_an_epilogue_folds_into_the_write_back_within_its_flops(target, lanes, parallel):
    """Each sigmoid's polynomial exp uses its input about 25 times, so a chain folded whole
    into the tile's write-back, which is unrolled, grows with every op (4 ops built in 96 s):
    the write-back takes the chain while its arithmetic stays within ``EPILOGUE_FLOPS``, the
    first sigmoid included. The rest runs as loops of up to four vector registers, in parallel
    where the tiles are, each op inlined into the next within ``INLINED_FLOPS``: one exp a
    loop. Left to LLVM as a loop each, every ``exp`` was unrolled whole (a chain of 100 ops
    built in 102 s, TVM's in 29 s); inlined whole, 50 nested exps did not build in 300 s."""
    from tvm.s_tir import Schedule

    from relay_amp.builds.cpu_pipeline import EPILOGUE_FLOPS
    from relay_amp.builds.elementwise import INLINED_FLOPS
    from relay_amp.builds.flops import expanded_flops

    (kernel,) = (f for name, f in _scheduled_with_exp(_chain(12), target).items()
                 if "matmul" in name)
    sch = Schedule(kernel)
    blocks = {sch.get(b).name_hint: b for b in sch.get_child_blocks(sch.get_sblock("root"))}
    (write_back,) = (sch.get(block) for name, block in blocks.items()
                     if name in ("matmul_intermediate_global", "matmul_intermediate_local"))
    assert 82 < expanded_flops(write_back.body) <= EPILOGUE_FLOPS
    clamp = "T.float32(88.376"  # the exp's clamp
    per_exp = write_back.script().count(clamp)
    rest = [sch.get(b) for name, b in blocks.items() if not name.startswith("matmul")]
    assert per_exp > 0 and sum(block.script().count(clamp) for block in rest) == 5 * per_exp
    for name, block in blocks.items():
        if name.startswith("matmul"):
            continue
        assert expanded_flops(sch.get(block).body) <= INLINED_FLOPS
        assert sch.get(block).script().count(clamp) == per_exp
        outer, inner = (sch.get(loop) for loop in sch.get_loops(block))
        assert inner.kind == tvm.tirx.ForKind.VECTORIZED
        assert int(inner.extent) in (lanes, 2 * lanes, 4 * lanes)
        assert (outer.kind == tvm.tirx.ForKind.PARALLEL) == parallel


@I.ir_module
class ConvSiLU:
    @R.function
    def main(x: R.Tensor((1, 16, 16, 16), "float32"), w: R.Tensor((32, 16, 3, 3), "float32"),
             b: R.Tensor((1, 32, 1, 1), "float32")):
        with R.dataflow():
            lv = R.nn.conv2d(x, w, padding=[1, 1])
            lv1 = R.add(lv, b)
            gv = R.multiply(lv1, R.sigmoid(lv1))
            R.output(gv)
        return gv


@I.ir_module
class ConvReLU:
    @R.function
    def main(x: R.Tensor((1, 16, 16, 16), "float32"), w: R.Tensor((32, 16, 3, 3), "float32"),
             b: R.Tensor((1, 32, 1, 1), "float32")):
        with R.dataflow():
            lv = R.nn.conv2d(x, w, padding=[1, 1])
            gv = R.nn.relu(R.add(lv, b))
            R.output(gv)
        return gv


@pytest.mark.parametrize(("target", "register_lanes"), [(NEON, 4), (AVX2, 8)])
@pytest.mark.parametrize("activation", ["silu", "relu"])
def test_a_silu_folds_into_the_write_back(target, register_lanes, activation):
    """A SiLU reads the convolution's result twice (``x * sigmoid(x)``): the sigmoid's blocks
    are inlined into the multiply, which then folds into the write-back, so no loop over the
    whole output is left for the activation. Its write-back computes one vector register of
    lanes at a time (on all 16, NEON spilled the polynomial's temporaries); a ReLU's all of the
    tile's lanes at once."""
    (kernel,) = _scheduled_with_exp(ConvSiLU if activation == "silu" else ConvReLU,
                                    target).values()
    script = kernel.script()
    assert 'T.sblock("exp")' not in script and 'T.sblock("T_multiply")' not in script
    assert 'T.sblock("compute")' not in script
    lanes = int(re.findall(r"T\.vectorized\(T\.int64\((\d+)\)\)", script)[-1])
    if activation == "silu":
        assert script.count("T.float32(88.376") >= 2 and lanes == register_lanes
    else:
        assert lanes > register_lanes


@pytest.mark.parametrize("name", ["chain", "silu"])
def test_folded_epilogues_keep_the_numbers(name):
    """Twelve ops after a MatMul, and a convolution's SiLU, compute what TVM's build computes
    (the time a chain's build takes is bench_peers.py's ``--chains``)."""
    mod = _chain(12) if name == "chain" else ConvSiLU
    inputs = _inputs(mod, seed=1)
    ours = relay_amp.run(relay_amp.compile_module(mod, None, True), inputs)[0]
    plain = relay_amp.run(relay_amp.compile_module(mod, None, False), inputs)[0]
    np.testing.assert_allclose(ours, plain, rtol=0, atol=2.0 ** -20 * max(1, np.abs(plain).max()))


@pytest.mark.parametrize("target", [None, FULLFP16], ids=["host", "aarch64"])
def test_softmax_and_layer_norm_run_parallel_over_rows_and_vectorized(target):
    """dlight's CPU reduction rule schedules the normalizations: rows in parallel (the
    runtime's threads), the elementwise parts vectorized; in the same order of sums."""
    target = tvm.target.Target(target or relay_amp.host_target())
    builder = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((16, 64), "float32"))
    g = relax.Var("g", relax.TensorType((64,), "float32"))
    with builder.function("main", [x, g]):
        with builder.dataflow():
            s = builder.emit(relax.op.nn.softmax(x, axis=-1))
            n = builder.emit_output(relax.op.nn.layer_norm(s, g, g, axes=[-1]))
        builder.emit_func_output(n)
    mod = builder.get()
    with target:
        lowered = relay_amp.cpu_pipeline(target)(mod)
    scripts = {gv.name_hint: f.script() for gv, f in lowered.functions.items()
               if isinstance(f, tvm.tirx.PrimFunc)}
    assert {"softmax", "layer_norm"} <= set(scripts)
    for script in scripts.values():
        assert "T.parallel(" in script and "T.vectorized(" in script
    if target.attrs.get("mtriple") is None:
        inputs = _inputs(mod)
        outputs = [relay_amp.run(relay_amp.compile_module(mod, None, schedules), inputs)[0]
                   for schedules in (True, False)]
        np.testing.assert_allclose(outputs[0], outputs[1], rtol=1e-6, atol=1e-6)


def test_a_batch_norm_with_constant_parameters_is_folded_into_a_scale_and_a_shift():
    """An imported model's batch_norm (constant parameters) becomes ``x * scale + shift`` with
    the two constants computed at build time in numpy: the convolution's kernel multiplies and
    adds, no kernel computes a square root, and the output is TVM's within float32 rounding."""
    rng = np.random.default_rng(4)
    g, b, m = (rng.standard_normal(16).astype("float32") for _ in range(3))
    v = rng.uniform(0.5, 2.0, 16).astype("float32")
    mod = relax.transform.BindParams("main", {"g": g, "b": b, "m": m, "v": v})(ConvBatchNorm)
    target = tvm.target.Target(relay_amp.host_target())
    with target:
        lowered = relay_amp.cpu_pipeline(target)(mod)
    names = [gv.name_hint for gv, f in lowered.functions.items()
             if isinstance(f, tvm.tirx.PrimFunc)]
    (conv,) = [name for name in names if "conv2d" in name]  # x86 adds NHWC transposes
    assert "multiply" in conv and "add" in conv and "relu" in conv and "divide" not in conv
    assert "sqrt" not in lowered[conv].script()
    x, w = (rng.standard_normal(s).astype("float32") for s in ((1, 8, 12, 12), (16, 8, 3, 3)))
    outputs = [relay_amp.run(relay_amp.compile_module(mod, None, schedules), [x, w])[0]
               for schedules in (True, False)]
    np.testing.assert_allclose(outputs[0], outputs[1], rtol=0,
                               atol=1e-5 * np.abs(outputs[1]).max())


def _conv_then_transposed(seed=6):
    rng = np.random.default_rng(seed)
    builder = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 8, 8, 8), "float32"))
    with builder.function("main", [x]):
        with builder.dataflow():
            y = builder.emit(relax.op.nn.conv2d(
                x, relax.const(rng.standard_normal((8, 8, 3, 3)).astype("float32")),
                padding=[1, 1]))
            z = builder.emit_output(relax.op.nn.conv2d_transpose(
                y, relax.const(rng.standard_normal((8, 4, 2, 2)).astype("float32")),
                strides=[2, 2]))
        builder.emit_func_output(z)
    return builder.get()


def _layouts(mod) -> dict:
    return {b.value.op.name: str(b.value.attrs.data_layout)
            for b in mod["main"].body.blocks[0].bindings
            if isinstance(b.value, relax.Call) and hasattr(b.value.attrs, "data_layout")}


def test_a_transposed_convolution_keeps_nchw_and_the_convolutions_take_nhwc():
    """TVM has no NHWC kernel for a transposed convolution (ppocrv4_det's build failed when
    ConvertLayout moved one into NHWC): it stays NCHW, transposed around, the convolution
    before it takes NHWC, and the aarch64 build compiles with TVM's build's numbers."""
    from relay_amp.builds.schedule_rules import RuleLog

    mod = _conv_then_transposed()
    log = RuleLog()
    converted = nhwc_convolutions(log)(mod)
    assert _layouts(converted) == {"relax.nn.conv2d": "NHWC", "relax.nn.conv2d_transpose": "NCHW"}
    assert not log.errors
    assert re.search(A64_F32_VECTOR_FMA, _assembly(mod, NEON))  # it compiles, vectorized
    x = np.random.default_rng(7).standard_normal((1, 8, 8, 8)).astype("float32")
    plain, ours = (relay_amp.execution.run(relay_amp.compile_module(mod, None, s), [x])[0]
                   for s in (False, True))
    np.testing.assert_allclose(ours, plain, rtol=0, atol=72 * 2.0**-23 * np.abs(plain).max())


def test_an_op_that_would_follow_into_an_unlowered_layout_keeps_nchw(monkeypatch):
    """Where an op other than those of ``LAYOUTS`` would follow its input into NHWC (here the
    transposed convolution, once it is no longer pinned), the module keeps NCHW and the rule
    log says why."""
    from relay_amp.builds import nhwc
    from relay_amp.builds.schedule_rules import RuleLog

    monkeypatch.setattr(nhwc, "LAYOUTS", {"relax.nn.conv2d": ["NHWC", "HWIO"]})
    log = RuleLog()
    kept = nhwc_convolutions(log)(_conv_then_transposed())
    assert _layouts(kept) == {"relax.nn.conv2d": "NCHW", "relax.nn.conv2d_transpose": "NCHW"}
    (error,) = log.errors
    assert "conv2d_transpose" in error.error and "NCHW kept" in error.error




def _nhwc_conv(groups):
    rng = np.random.default_rng(4)
    channels = 32 if groups == 1 else 16
    x = relax.Var("x", relax.TensorType((1, 16, 12, 12), "float32"))
    w = relax.const((rng.standard_normal((channels, 16 // groups, 3, 3)) / 8).astype("float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            y = builder.emit(relax.op.nn.conv2d(x, w, padding=[1, 1], groups=groups))
            out = builder.emit_output(relax.op.nn.relu(y))
        builder.emit_func_output(out)
    return builder.get()


@pytest.mark.parametrize("groups", [1, 16])
def test_tiles_of_a_weights_lanes_run_over_all_rows_before_the_next_lanes(groups):
    """A convolution's tiles (x86: one parallel loop) take one block of output channels over
    every output pixel, then the next: that block's weights stay in cache while the pixels
    stream. A depthwise convolution, whose lanes index its input, keeps the pixels outer."""
    from relay_amp.builds.packed_weights import packed_weights

    target = tvm.target.Target(AVX2)
    passes = tvm.transform.Sequential(
        cpu_generic.library_dispatch_passes(target)
        + [nhwc_convolutions(), packed_weights(target)]
        + cpu_generic.legalize_passes(target) + [dl.ApplyDefaultSchedule(VectorizeDotProduct())])
    with target:
        mod = passes(_nhwc_conv(groups))
    scripts = {gv.name_hint: f.script() for gv, f in mod.functions.items()
               if isinstance(f, tvm.tirx.PrimFunc) and "conv2d" in gv.name_hint}
    assert len(scripts) == 1, {n: re.findall(r"for (\w+) in T\.parallel", s)
                               for n, s in scripts.items()}
    (script,) = scripts.values()
    (lanes,) = re.findall(r"for (\w+)_1_init in T\.vectorized", script)
    (tile,) = [loop for loop in re.findall(r"for (\w+)_fused in T\.parallel", script)
               if f"{lanes}_0" in loop]  # not the input copy's
    if groups == 1:
        assert tile.startswith(f"{lanes}_0_"), (tile, lanes)
    else:
        assert tile.endswith(f"_{lanes}_0"), (tile, lanes)
    x = np.random.default_rng(5).standard_normal((1, 16, 12, 12)).astype("float32")
    outputs = [relay_amp.run(relay_amp.compile_module(_nhwc_conv(groups), None, schedules), [x])
               [0] for schedules in (False, True)]
    np.testing.assert_allclose(outputs[1], outputs[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("target, dtype", [(FP16FML, "float16"), (NEON, "float32")],
                         ids=["fmlal", "float32"])
def test_sums_on_the_stack_of_lanes_no_power_of_two_stay_whole_registers(target, dtype):
    """36 outputs on tiles of 12 lanes, their sums on the stack: initialised and written back
    one register of four lanes at a time, so that LLVM keeps three vectors of sums across the
    reduction, not one ``<12 x float>`` that the AArch64 backend moves a lane at a time
    (``mov s``, ``mov v.s[]``, ``ins``) around every FMA."""
    from helpers import projection

    mod = projection(1, 64, 36)
    if dtype != "float32":
        mod = _convert(mod, dtype, target)
    log = relay_amp.builds.schedule_rules.RuleLog()
    executable = tvm.compile(mod, target=tvm.target.Target(target),
                             relax_pipeline=relay_amp.cpu_pipeline(target, rule_log=log))
    texts = [s.text() for s in log.schedules if "matmul" in s.kernel]
    assert len(texts) == 1 and "12 lanes" in texts[0] and "on the stack" in texts[0], texts
    asm = "\n".join(m.inspect_source("asm") for m in [executable.mod, *executable.mod.imports]
                    if m.kind == "llvm")
    code = asm_kernel(asm, "matmul")
    assert re.search(r"\bfmlal\b" if dtype == "float16" else r"\bfmla\b", code)
    assert not re.search(r"\bmov\s+s\d+, v\d+\.s\[|\bmov\s+v\d+\.s\[\d\], v|\bins\b", code)
