"""Step 2, demand (:mod:`relay_amp.demand`), on small functions: the dtypes each value's
consumers want (what an operand must be), and the mode, accumulation and reason of each
binding whose mode steps 1 and 1b left open."""

import pytest
from cases import Chain
from stages import CUDA, DTYPES, Stages
from tvm.script import ir as I
from tvm.script import relax as R

from relay_amp.kinds import Mode


@I.ir_module
class TwoBranches:
    @R.function
    def main(x: R.Tensor((4, 8), "float32"), w: R.Tensor((8, 8), "float32")):
        with R.dataflow():
            a = R.matmul(x, w)
            b = R.nn.relu(a)
            d = R.nn.softmax(b, axis=-1)
            e = R.nn.relu(x)
            f = R.permute_dims(e)
            g = R.matmul(f, x)
            R.output(d, g)
        return (d, g)


def wanted(stages, demand, name):
    return set(demand.demand.get(stages.var(name), ()))


def by_name(mapping):
    return {var.name: value for var, value in mapping.items()}


def reason_codes(demand):
    return {var.name: [reason.code for reason in reasons]
            for var, reasons in demand.reasons.items()}


@pytest.mark.parametrize("dtype", DTYPES)
def test_operands_are_wanted_in_the_dtype_their_consumer_computes_in(dtype):
    """Dot products want ``dtype`` operands and accumulate in float32; softmax wants its
    operand's float32; ``x`` is wanted both ways (a dot product and a float32 relu read it);
    the results are wanted in their original float32."""
    stages = Stages(TwoBranches, dtype)
    demand = stages.demand()
    assert wanted(stages, demand, "w") == {dtype}
    assert wanted(stages, demand, "x") == {dtype, "float32"}
    assert wanted(stages, demand, "b") == {"float32"}
    assert wanted(stages, demand, "d") == wanted(stages, demand, "g") == {"float32"}
    assert by_name(demand.modes) == {"a": Mode.LOW, "g": Mode.LOW}
    assert by_name(demand.accumulation) == {"a": "float32", "d": "float32", "g": "float32"}
    assert reason_codes(demand) == {"b": ["float32_wanted"], "e": ["float32_wanted"],
                                    "f": ["float32_activation"]}


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_low_precision_signature_pulls_follow_ops_low(dtype):
    """With ``keep_io_dtypes=False`` the results are wanted in ``dtype``: the follow ops on
    the low-precision input run in ``dtype``; relu after a float32-accumulating matmul still
    reads the float32 value that exists."""
    stages = Stages(TwoBranches, dtype, keep_io_dtypes=False)
    demand = stages.demand()
    assert wanted(stages, demand, "d") == wanted(stages, demand, "g") == {dtype}
    assert wanted(stages, demand, "x") == {dtype}
    assert by_name(demand.modes) == {"a": Mode.LOW, "e": Mode.LOW, "f": Mode.LOW,
                                     "g": Mode.LOW}
    assert reason_codes(demand) == {"b": ["float32_wanted"], "e": ["low_wanted"],
                                    "f": ["low_wanted"]}


@pytest.mark.parametrize("dtype", DTYPES)
def test_demand_reads_the_kernel_plan(dtype):
    """With kernel boundaries, a value stored low between kernels is wanted low by its
    reader (the mixed softmax widens it in registers); the relu the kernel plan gave a mode
    keeps it, with no reason from demand; the fused dot product's result is wanted float32."""
    stages = Stages(Chain, dtype, CUDA)
    decisions = stages.decide()
    kernels = stages.kernels(decisions)
    demand = stages.demand(decisions, kernels)
    assert wanted(stages, demand, "c") == {dtype}
    assert wanted(stages, demand, "a") == {"float32"}
    assert stages.var("b") not in demand.modes and not demand.reasons
    assert by_name(demand.modes) == {"a": Mode.LOW, "c": Mode.LOW}


def test_demand_is_frozen():
    stages = Stages(TwoBranches, "float16")
    demand = stages.demand()
    with pytest.raises(TypeError):
        demand.modes[stages.var("b")] = Mode.LOW
    with pytest.raises(AttributeError):
        demand.demand[stages.var("a")].add("float16")
