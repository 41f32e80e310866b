"""aarch64 codegen of converted modules: native half arithmetic with +fullfp16, none without."""

import re

import tvm
from cases import ConvMatmul

import relay_amp

FULLFP16 = {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon", "+fullfp16"]}
NEON_ONLY = {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon"]}
HALF_ARITHMETIC = re.compile(r"\b(fmla|fmadd|fadd|fmul|fmax|fmaxnm|fsub)\s+(v\d+\.(4|8)h|h\d+)\b")


def assembly(mod, target):
    executable = tvm.compile(mod, target=tvm.target.Target(target))
    modules = [executable.mod, *executable.mod.imports]
    return "\n".join(m.inspect_source("asm") for m in modules if m.kind == "llvm")


def test_fullfp16_accumulates_in_float32_by_default():
    """The default sums dot products in float32 (the accurate choice): LLVM widens the half
    operands, no half FMA; the report says so and how to choose float16 accumulation."""
    converted, report = relay_amp.convert(ConvMatmul, "float16", target=FULLFP16)
    conv = report.find("lv")
    assert (conv.compute_dtype, conv.accumulation_dtype) == ("float16", "float32")
    reason = conv.reason("target_float32_accumulation")
    assert reason.values["instruction"] == "fmadd h / fmla v.8h"
    assert "set_accumulation_dtype('nn.conv2d', 'float16')" in reason.text()
    asm = assembly(converted, FULLFP16)
    assert len(re.findall(r"\bfmla\s+v\d+\.8h", asm)) == 0
    assert len(re.findall(r"\bfcvt", asm)) > 50


def test_float16_accumulation_when_asked_uses_native_half_instructions():
    policy = relay_amp.Policy("float16").set_accumulation_dtype("nn.conv2d", "float16") \
        .set_accumulation_dtype("matmul", "float16")
    converted, report = relay_amp.convert(ConvMatmul, policy=policy, target=FULLFP16)
    conv = report.find("lv")
    assert (conv.compute_dtype, conv.accumulation_dtype) == ("float16", "float16")
    assert "target_float32_accumulation" not in conv.codes  # the user's choice wins
    asm = assembly(converted, FULLFP16)
    assert len(re.findall(r"\bfmla\s+v\d+\.8h", asm)) >= 8  # vector half FMA in conv/matmul
    assert len(HALF_ARITHMETIC.findall(asm)) >= 16


def test_without_fullfp16_no_half_arithmetic_is_emitted():
    converted, report = relay_amp.convert(ConvMatmul, "float16", target=NEON_ONLY)
    assert not report.converted
    assert report.find("lv").category == "storage"
    asm = assembly(converted, NEON_ONLY)
    assert HALF_ARITHMETIC.findall(asm) == []
