"""Step 1, decide (:mod:`relay_amp.decide`), on small functions: each call's category and
reasons, what can exist in low precision, and the result leaves a low-precision signature
keeps float32; its output is frozen."""

import dataclasses

import pytest
from cases import Chain
from stages import CUDA, DTYPES, Stages
from tvm.script import ir as I
from tvm.script import relax as R

from relay_amp.calibrate import Calibration
from relay_amp.kinds import Category, Mode
from relay_amp.reasons import FP32_BOUNDARY

#: An x86 CPU without avx512fp16 or avx512bf16: dot products only store the low dtype.
STORAGE_ONLY = {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "x86-64"}


@I.ir_module
class Thresholds:
    @R.function
    def main(x: R.Tensor((4, 8), "float32"), s: R.Tensor((), "float32")):
        with R.dataflow():
            t = R.multiply(s, R.const(2.0, "float32"))
            m = R.greater(x, t)
            y = R.add(x, R.const(1.0e6, "float32"))
            R.output(m, y)
        return (m, y)


@I.ir_module
class ProductResult:
    @R.function
    def main(x: R.Tensor((12,), "float32")):
        with R.dataflow():
            lv = R.nn.relu(x)
            gv = R.prod(x, axis=None, keepdims=False)
            R.output(lv, gv)
        return (lv, gv)


def categories(stages, decisions, names):
    return {name: decisions.plans[stages.var(name)].category for name in names}


@pytest.mark.parametrize("dtype", DTYPES)
def test_each_call_gets_the_policy_category(dtype):
    stages = Stages(Chain, dtype)
    decisions = stages.decide()
    assert categories(stages, decisions, "abcd") == {
        "a": Category.LOW_PRECISION_FP32_ACCUMULATE, "b": Category.FOLLOW,
        "c": Category.LOW_PRECISION_FP32_ACCUMULATE, "d": Category.ACCUMULATE}
    assert all(plan.mode == Mode.ORIGINAL for plan in decisions.plans.values())
    assert [r.code for r in decisions.plans[stages.var("a")].reasons] == ["builtin_category"]
    # every value can be had in low precision; the dot products' float32 results exist too
    assert all(decisions.can_low[stages.var(n)] for n in "abcd")
    assert decisions.f32_ready[stages.var("a")] and decisions.f32_ready[stages.var("b")]


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_target_rule_applies(dtype):
    """A CPU that only stores ``dtype`` keeps dot products in float32 with stored weights; a
    GPU computes them in ``dtype`` and asks for mixed kernels for the accumulate ops."""
    stored = Stages(Chain, dtype, STORAGE_ONLY, fallback="storage")
    decisions = stored.decide()
    matmul = decisions.plans[stored.var("a")]
    assert matmul.category == Category.STORAGE
    assert [r.code for r in matmul.reasons] == ["target_storage_only"]
    fast = Stages(Chain, dtype, CUDA)
    decisions = fast.decide()
    assert "target_fast" in [r.code for r in decisions.plans[fast.var("a")].reasons]
    assert decisions.plans[fast.var("d")].mixed and not decisions.plans[fast.var("a")].mixed


@pytest.mark.parametrize("dtype", DTYPES)
def test_operand_checks_overrule_the_policy(dtype):
    """A scalar threshold decides a comparison (float32 in both dtypes); a constant float16
    cannot hold keeps its op float32, where bfloat16's range holds it."""
    stages = Stages(Thresholds, dtype)
    decisions = stages.decide()
    threshold = decisions.plans[stages.var("t")]
    assert threshold.category == Category.FP32
    assert [r.code for r in threshold.reasons] == ["decides_discrete"]
    assert threshold.reasons[0].values["consumer"] == "m"
    add = decisions.plans[stages.var("y")]
    if dtype == "float16":
        assert add.category == Category.FP32
        assert [r.code for r in add.reasons] == ["constant_out_of_range"]
    else:
        assert add.category == Category.FOLLOW


def test_a_result_the_low_dtype_cannot_hold_keeps_float32():
    """With a low-precision signature, a calibrated result beyond float16 stays float32: the
    decision says why (``fp32_boundary``) and the result type keeps that leaf float32."""
    calibration = Calibration({("main", "x"): 10.0, ("main", "lv"): 10.0,
                               ("main", "gv"): 1e12}, {}, 1, 2.0)
    stages = Stages(ProductResult, "float16", calibration=calibration, keep_io_dtypes=False)
    decisions = stages.decide()
    gv = stages.var("gv")
    assert [(path, expr) for path, expr, _ in decisions.kept_results] == [((1,), gv)]
    assert [str(f.dtype) for f in decisions.result_type.fields] == ["float16", "float32"]
    assert decisions.plans[gv].reasons[-1].code == FP32_BOUNDARY
    assert gv in decisions.hot and stages.var("lv") not in decisions.hot


def test_decisions_are_frozen():
    stages = Stages(Chain, "float16")
    decisions = stages.decide()
    plan = decisions.plans[stages.var("a")]
    with pytest.raises(TypeError):
        decisions.plans[stages.var("a")] = plan
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.mode = Mode.LOW
    with pytest.raises(TypeError):
        decisions.can_low[stages.var("a")] = False
