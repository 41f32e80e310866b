"""aarch64 codegen of converted modules: native half arithmetic with +fullfp16, none without."""

import re

import tvm
from tvm.script import ir as I
from tvm.script import relax as R

import relay_amp

FULLFP16 = {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon", "+fullfp16"]}
NEON_ONLY = {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon"]}
HALF_ARITHMETIC = re.compile(r"\b(fmla|fmadd|fadd|fmul|fmax|fmaxnm|fsub)\s+(v\d+\.(4|8)h|h\d+)\b")


@I.ir_module
class ConvMatmul:
    @R.function
    def main(x: R.Tensor((1, 16, 16, 16), "float32"), w: R.Tensor((16, 16, 3, 3), "float32"),
             m: R.Tensor((16, 32), "float32")):
        with R.dataflow():
            lv = R.nn.conv2d(x, w, padding=[1, 1])
            lv1 = R.nn.relu(lv)
            lv2 = R.reshape(lv1, (16, 256))
            lv3 = R.matmul(R.permute_dims(lv2, [1, 0]), m)
            gv = R.multiply(lv3, lv3)
            R.output(gv)
        return gv


def assembly(mod, target):
    executable = tvm.compile(mod, target=tvm.target.Target(target))
    modules = [executable.mod, *executable.mod.imports]
    return "\n".join(m.inspect_source("asm") for m in modules if m.kind == "llvm")


def test_fullfp16_uses_native_half_instructions():
    converted, report = relay_amp.convert(ConvMatmul, "float16", target=FULLFP16)
    conv = report.find("lv")
    assert (conv.compute_dtype, conv.accumulation_dtype) == ("float16", "float16")
    assert conv.reason("target_native_accumulation").values["instruction"] == "fmla v.8h"
    asm = assembly(converted, FULLFP16)
    assert len(re.findall(r"\bfmla\s+v\d+\.8h", asm)) >= 8  # vector half FMA in conv/matmul
    assert len(HALF_ARITHMETIC.findall(asm)) >= 16


def test_float32_accumulation_widens_every_element():
    """What the target default avoids: with float32 accumulation LLVM converts per element."""
    policy = relay_amp.Policy("float16").set_accumulation_dtype("nn.conv2d", "float32") \
        .set_accumulation_dtype("matmul", "float32")
    converted, report = relay_amp.convert(ConvMatmul, policy=policy, target=FULLFP16)
    assert report.find("lv").accumulation_dtype == "float32"  # the user's choice wins
    asm = assembly(converted, FULLFP16)
    assert len(re.findall(r"\bfmla\s+v\d+\.8h", asm)) == 0
    assert len(re.findall(r"\bfcvt", asm)) > 50


def test_without_fullfp16_no_half_arithmetic_is_emitted():
    converted, report = relay_amp.convert(ConvMatmul, "float16", target=NEON_ONLY)
    assert not report.converted
    assert report.find("lv").category == "storage"
    asm = assembly(converted, NEON_ONLY)
    assert HALF_ARITHMETIC.findall(asm) == []
