"""A bfloat16 kernel's rounding of its float32 results on BFCVTN (relay_amp.builds.bfcvtn):
the aarch64 ``+bf16`` build, read off its assembly. The outputs are checked on the emulated
CPU (tests/arm: every bfloat16 model there is built with it)."""

import re

import numpy as np
import pytest
import tvm
from helpers import asm_functions
from test_bfmmla import A64_BFMMLA, A64_LANE_LOAD, BF16, conv
from tvm import relax

import relay_amp
from relay_amp.builds import bfcvtn
from relay_amp.builds.schedule_rules import RuleLog, link_llvm

A64_BFCVTN = r"\bbfcvtn2?\s+v\d+\.[48]h,\s*v\d+\.4s"
#: TVM's own rounding: ``(bits + 0x7fff + (bits >> 16 & 1)) >> 16``, the high halves taken by
#: ``addhn``
A64_INTEGER_ROUNDING = r"\baddhn2?\s+v\d+\.[48]h"


def _built(model, activation=relax.op.nn.relu, **shape):
    mod, _ = relay_amp.convert(model(then_pointwise=True, activation=activation, **shape)[0],
                               "bfloat16", target=BF16)
    log = RuleLog()
    executable = tvm.compile(mod, target=tvm.target.Target(BF16),
                             relax_pipeline=relay_amp.cpu_pipeline(BF16, rule_log=log))
    lib = executable.mod.imports[0] if executable.mod.imports else executable.mod
    return asm_functions(lib.inspect_source("asm")), log


def _bias(y):
    """A bias per output channel: an epilogue in float32 that calls nothing."""
    bias = np.random.default_rng(2).standard_normal((1, int(y.ty.shape[1]), 1, 1))
    return relax.op.add(y, relax.const(bias.astype("float32")))


def test_a_tiles_bfloat16_result_is_rounded_on_bfcvtn():
    """The first convolution's result, its bias added in float32, is stored in bfloat16 for
    the second: its BFMMLA tile rounds on ``bfcvtn``/``bfcvtn2`` (two for eight values), none
    of TVM's integer rounding left, the values read from registers, as the build's report
    says."""
    functions, log = _built(conv, _bias)
    (first,) = [code for code in functions.values()
                if re.search(A64_BFMMLA, code) and re.search(r"\bbfcvtn", code)]
    assert len(re.findall(A64_BFCVTN, first)) >= 2
    assert not re.search(A64_INTEGER_ROUNDING, first)
    assert not re.search(A64_LANE_LOAD, first)
    texts = [s.text() for s in log.schedules]
    assert sum("rounding to bfloat16: BFCVTN" in text for text in texts) == 1, texts
    assert not log.errors


@pytest.mark.parametrize("activation", [relax.op.nn.silu, relax.op.nn.gelu],
                         ids=["silu", "gelu"])
def test_a_write_back_that_calls_a_function_keeps_tvms_rounding(activation):
    """A SiLU's ``exp`` (``expf`` on aarch64) and GELU's ``erf`` are calls, which take the
    vector registers: the tile's values would go through the stack, so the rounding is folded
    into the write-back as before (TVM's rounding, no ``bfcvtn``), and the report says why.
    GELU's write-back stays a loop; a SiLU's is unrolled, but its ``exp`` still calls."""
    functions, log = _built(conv, activation)
    kernels = [code for code in functions.values() if re.search(A64_BFMMLA, code)]
    assert len(kernels) == 2
    assert not any(re.search(A64_BFCVTN, code) for code in kernels)
    texts = [s.text() for s in log.schedules]
    assert not any("rounding to bfloat16: BFCVTN" in text for text in texts)
    assert sum("rounding to bfloat16 folded into the write-back, not on BFCVTN: the epilogue "
               "calls a function" in text for text in texts) == 1, texts
    assert not log.errors


def test_the_rounding_is_recognized_by_its_block_alone():
    """``is_rounding``: a float32 buffer's values rounded to bfloat16, element by element; a
    cast that also computes (an add before it), or to float16, is not one."""
    from tvm.script import tirx as T

    @T.prim_func(s_tir=True)
    def kernel(a: T.Buffer((8,), "float32"), b: T.Buffer((8,), "float32"),
               r: T.Buffer((8,), "bfloat16"), s: T.Buffer((8,), "bfloat16"),
               h: T.Buffer((8,), "float16")):
        for i in range(8):
            with T.sblock("round"):
                vi = T.axis.remap("S", [i])
                r[vi] = T.Cast("bfloat16", a[vi])
        for i in range(8):
            with T.sblock("add_round"):
                vi = T.axis.remap("S", [i])
                s[vi] = T.Cast("bfloat16", a[vi] + b[vi])
        for i in range(8):
            with T.sblock("half"):
                vi = T.axis.remap("S", [i])
                h[vi] = T.Cast("float16", a[vi])

    sch = tvm.s_tir.Schedule(kernel)
    assert [bfcvtn.is_rounding(sch.get(sch.get_sblock(name)))
            for name in ("round", "add_round", "half")] == [True, False, False]


def test_a_loop_links_each_modules_llvm_once():
    """``link_llvm``: a loop that links a tile's functions links the rounding's beside them,
    and linking the same text twice adds nothing (TVM's ``annotate`` keeps a key's first
    value, so the annotation is replaced, not set again)."""
    from tvm.script import tirx as T

    @T.prim_func(s_tir=True)
    def kernel(a: T.Buffer((8,), "float32")):
        for i in range(8):
            with T.sblock("zero"):
                vi = T.axis.remap("S", [i])
                a[vi] = T.float32(0)

    sch = tvm.s_tir.Schedule(kernel)
    (loop,) = sch.get_loops(sch.get_sblock("zero"))
    for text in ("define void @f() { ret void }", bfcvtn.LLVM_IR, bfcvtn.LLVM_IR):
        link_llvm(sch, loop, text)
    linked = str(sch.get(loop).annotations["pragma_import_llvm"])
    assert linked == "define void @f() { ret void }\n" + bfcvtn.LLVM_IR
