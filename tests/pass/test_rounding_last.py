"""A ReLU or clip of a value just rounded to bfloat16 runs before the rounding
(relay_amp.builds.rounding_last): which bindings change, their outputs bit for bit, and the
kernel's rounding then on BFCVTN."""

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

import relay_amp
from relay_amp.builds.rounding_last import activations_before_rounding
from relay_amp.builds.schedule_rules import RuleLog
from relay_amp.execution import run

BF16 = {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon", "+bf16"]}


@I.ir_module
class Before:
    @R.function
    def main(x: R.Tensor((2, 8), dtype="float32")) -> R.Tensor((2, 8), dtype="float32"):
        with R.dataflow():
            lv: R.Tensor((2, 8), dtype="bfloat16") = R.astype(x, dtype="bfloat16")
            lv1: R.Tensor((2, 8), dtype="bfloat16") = R.clip(lv, T.float64(0.0), T.float64(6.0))
            lv2: R.Tensor((2, 8), dtype="bfloat16") = R.astype(x, dtype="bfloat16")
            lv3: R.Tensor((2, 8), dtype="bfloat16") = R.nn.relu(lv2)
            lv4: R.Tensor((2, 8), dtype="bfloat16") = R.add(lv1, lv3)
            gv: R.Tensor((2, 8), dtype="float32") = R.astype(lv4, dtype="float32")
            R.output(gv)
        return gv


@I.ir_module
class Expected:
    @R.function
    def main(x: R.Tensor((2, 8), dtype="float32")) -> R.Tensor((2, 8), dtype="float32"):
        with R.dataflow():
            lv: R.Tensor((2, 8), dtype="float32") = R.clip(x, T.float64(0.0), T.float64(6.0))
            lv1: R.Tensor((2, 8), dtype="bfloat16") = R.astype(lv, dtype="bfloat16")
            lv2: R.Tensor((2, 8), dtype="float32") = R.nn.relu(x)
            lv3: R.Tensor((2, 8), dtype="bfloat16") = R.astype(lv2, dtype="bfloat16")
            lv4: R.Tensor((2, 8), dtype="bfloat16") = R.add(lv1, lv3)
            gv: R.Tensor((2, 8), dtype="float32") = R.astype(lv4, dtype="float32")
            R.output(gv)
        return gv


@I.ir_module
class Stays:
    """What stays: a cast something else reads too, a bound bfloat16 does not hold (0.1), a
    cast from float16, a clip of a bfloat16 value that is no cast."""

    @R.function
    def main(x: R.Tensor((2, 8), dtype="float32"), h: R.Tensor((2, 8), dtype="float16"),
             b: R.Tensor((2, 8), dtype="bfloat16")) -> R.Tensor((2, 8), dtype="bfloat16"):
        with R.dataflow():
            lv: R.Tensor((2, 8), dtype="bfloat16") = R.astype(x, dtype="bfloat16")
            lv1: R.Tensor((2, 8), dtype="bfloat16") = R.clip(lv, T.float64(0.0), T.float64(6.0))
            lv2: R.Tensor((2, 8), dtype="bfloat16") = R.add(lv1, lv)
            lv3: R.Tensor((2, 8), dtype="bfloat16") = R.astype(x, dtype="bfloat16")
            lv4: R.Tensor((2, 8), dtype="bfloat16") = R.clip(lv3, T.float64(0.1), T.float64(6.0))
            lv5: R.Tensor((2, 8), dtype="bfloat16") = R.astype(h, dtype="bfloat16")
            lv6: R.Tensor((2, 8), dtype="bfloat16") = R.nn.relu(lv5)
            lv7: R.Tensor((2, 8), dtype="bfloat16") = R.nn.relu(b)
            lv8: R.Tensor((2, 8), dtype="bfloat16") = R.add(lv2, lv4)
            lv9: R.Tensor((2, 8), dtype="bfloat16") = R.add(lv6, lv7)
            gv: R.Tensor((2, 8), dtype="bfloat16") = R.add(lv8, lv9)
            R.output(gv)
        return gv


def test_an_activation_of_a_rounded_value_runs_before_the_rounding():
    text = Before.script()
    log = RuleLog()
    after = activations_before_rounding(log)(Before)
    assert Before.script() == text  # the input unchanged
    tvm.ir.assert_structural_equal(after, Expected)
    (report,) = [s.text() for s in log.schedules if "activations_before_rounding" in s.kernel]
    assert "1 clip, 1 relu of a cast to bfloat16 applied before the rounding" in report, report


@I.ir_module
class IntegerBounds:
    """TFLite's ReLU6 as TVM's importer writes it: the bounds are integers."""

    @R.function
    def main(x: R.Tensor((2, 8), dtype="float32")) -> R.Tensor((2, 8), dtype="bfloat16"):
        with R.dataflow():
            lv: R.Tensor((2, 8), dtype="bfloat16") = R.astype(x, dtype="bfloat16")
            gv: R.Tensor((2, 8), dtype="bfloat16") = R.clip(lv, T.int64(0), T.int64(6))
            R.output(gv)
        return gv


@I.ir_module
class IntegerBoundsExpected:
    @R.function
    def main(x: R.Tensor((2, 8), dtype="float32")) -> R.Tensor((2, 8), dtype="bfloat16"):
        with R.dataflow():
            lv: R.Tensor((2, 8), dtype="float32") = R.clip(x, T.int64(0), T.int64(6))
            gv: R.Tensor((2, 8), dtype="bfloat16") = R.astype(lv, dtype="bfloat16")
            R.output(gv)
        return gv


def test_integer_bounds_move_too():
    """hand_landmark_lite's and hand_landmark_full's 31 ReLU6s have integer bounds: when
    only floating-point ones moved, their bfloat16 builds executed 38.20 M and 65.27 M
    instructions on the emulated CPU against 34.55 M and 60.48 M."""
    log = RuleLog()
    tvm.ir.assert_structural_equal(activations_before_rounding(log)(IntegerBounds),
                                   IntegerBoundsExpected)
    assert any("1 clip of a cast to bfloat16" in s.text() for s in log.schedules)


def test_what_cannot_move_stays():
    log = RuleLog()
    tvm.ir.assert_structural_equal(activations_before_rounding(log)(Stays), Stays)
    assert not log.schedules


def test_both_orders_give_the_same_bits():
    """Every float32 input but a NaN: values either side of the bounds, ties of the rounding,
    infinities, signed zeros, denormals."""
    words = np.array([0x40C00000, 0x40C08000, 0x40BFFFFF, 0x40C00001, 0x80000000, 0x00000000,
                      0x00000001, 0x807FFFFF, 0x7F800000, 0xFF800000, 0x3F808000, 0xBF808000,
                      0x7F7FFFFF, 0xFF7FFFFF, 0x40BF8000, 0x40BF7FFF], np.uint32)
    inputs = [words.view(np.float32).reshape(2, 8),
              (np.random.default_rng(0).standard_normal((2, 8)) * 4).astype(np.float32)]
    for x in inputs:
        before, after = (run(relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu()),
                             [x])[0] for mod in (Before, activations_before_rounding()(Before)))
        np.testing.assert_array_equal(before.view(np.uint32), after.view(np.uint32))


def test_a_relu6_after_the_rounding_lets_the_kernel_round_on_bfcvtn():
    """A bfloat16 convolution with float32 sums, its bias, the sums' cast and a clip of 0 and
    6 (TFLite's ReLU6 as relay_amp's conversion leaves it): one kernel that ends in its
    rounding, which runs on BFCVTN (TVM's integer rounding before)."""
    import ml_dtypes

    rng = np.random.default_rng(1)
    x = relax.Var("x", relax.TensorType((1, 8, 8, 32), "bfloat16"))
    weight = (rng.standard_normal((1, 1, 32, 32)) / 4).astype(ml_dtypes.bfloat16)
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            y = builder.emit(relax.op.nn.conv2d(x, relax.const(weight), data_layout="NHWC",
                                                kernel_layout="HWIO", out_dtype="float32"))
            y = builder.emit(relax.op.add(y, relax.const(rng.standard_normal(32)
                                                         .astype("float32"))))
            y = builder.emit(relax.op.clip(builder.emit(relax.op.astype(y, "bfloat16")),
                                           0.0, 6.0))
            out = builder.emit_output(y)
        builder.emit_func_output(out)
    log = RuleLog()
    tvm.compile(builder.get(), target=tvm.target.Target(BF16),
                relax_pipeline=relay_amp.cpu_pipeline(BF16, rule_log=log))
    (text,) = [s.text() for s in log.schedules if "conv2d" in s.kernel]
    assert "rounding to bfloat16: BFCVTN" in text, text
    assert any("1 clip of a cast to bfloat16" in s.text() for s in log.schedules)


@pytest.mark.parametrize("target", [{"kind": "llvm"}, {"kind": "llvm", "mtriple":
                                                        "aarch64-linux-gnu"}])
def test_without_bf16_the_pipeline_leaves_the_order(target):
    log = RuleLog()
    with tvm.target.Target(target):
        lowered = relay_amp.cpu_pipeline(target, rule_log=log)(Before)
    names = [g.name_hint for g in lowered.functions]
    assert any("cast" in n and "clip" in n for n in names), names
