"""A schedule rule that raises on a kernel costs that kernel its rule, never the library: the next
rule schedules it (relay_amp.builds.schedule_rules), and the build says which rule raised."""

import numpy as np
import pytest
import tvm
from tvm import relax

import relay_amp
from relay_amp import execution
from relay_amp.builds import pipeline
from relay_amp.builds.schedule_rules import RuleError, RuleLog, apply_rules, decide

CUDA = {"kind": "cuda", "arch": "sm_90"}


def complex_magnitude(dtype="float32"):
    """An audio model's kernel, reduced: a (1, 309, 172, 2) spectrum times a (309, 1, 1)
    constant, squared, summed over the last axis; fused into one kernel
    (``fused_multiply_multiply1_sum``), on which TVM 0.27's dlight GEMV rule raises."""
    weight = np.random.default_rng(0).standard_normal((309, 1, 1)).astype(dtype)
    builder = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 309, 172, 2), dtype))
    with builder.function("main", [x]):
        with builder.dataflow():
            scaled = builder.emit(relax.op.multiply(x, relax.const(weight)))
            squared = builder.emit(relax.op.multiply(scaled, scaled))
            out = builder.emit_output(builder.emit(relax.op.sum(squared, axis=[-1])))
        builder.emit_func_output(out)
    return builder.get()


def test_tvms_own_cuda_pipeline_still_fails_on_the_kernel():
    """What the guard is for: if a TVM release fixes its GEMV rule, this fails, and the guard
    below stops being exercised by this kernel."""
    with pytest.raises(AttributeError, match="FloorDiv"):
        pipeline.build(complex_magnitude(), CUDA, relay_amp_schedules=False)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_the_kernel_builds_for_cuda_with_the_rule_that_raised_named(dtype):
    log = RuleLog()
    executable = pipeline.build(complex_magnitude(dtype), CUDA, rule_log=log)
    errors = log.errors
    assert [(e.kernel, e.rule) for e in errors] == [("fused_multiply_multiply1_sum", "GEMV")]
    assert "FloorDiv" in errors[0].error
    assert errors[0].scheduled_by == "SmallReduction"
    text = errors[0].text()
    assert "GEMV raised" in text and "scheduled by SmallReduction instead" in text
    source = executable.mod.imports[0].imports[0].inspect_source("cuda")
    assert "fused_multiply_multiply1_sum_kernel" in source and "threadIdx.x" in source


class _Raises:
    """A rule with a bug: it raises on every kernel."""

    def apply(self, func, target, tunable):
        raise ValueError("a rule's bug")

    def is_target_available(self, target):
        return True


def test_on_a_cpu_a_raising_rule_leaves_the_kernel_as_tvm_legalized_it():
    from tvm.relax.backend.cpu_generic import pipeline as cpu

    mod = complex_magnitude()
    target = tvm.target.Target("llvm")
    log = RuleLog()
    passes = tvm.transform.Sequential(
        cpu.library_dispatch_passes(target) + cpu.legalize_passes(target)
        + [apply_rules([_Raises()], log)] + cpu.dataflow_lower_passes(target)
        + cpu.finalize_passes(target))

    @tvm.transform.module_pass(opt_level=0, name="test_pipeline")
    def relax_pipeline(module, _context):
        with target:
            return passes(module)

    executable = tvm.compile(mod, target=target, relax_pipeline=relax_pipeline)
    assert [(e.kernel, e.rule, e.scheduled_by) for e in log.errors] == [
        ("fused_multiply_multiply1_sum", "_Raises", None)]
    assert "ValueError: a rule's bug" in log.errors[0].error
    assert "no later rule scheduled it" in log.errors[0].text()
    x = np.random.default_rng(1).standard_normal((1, 309, 172, 2)).astype("float32")
    got = execution.run(relax.VirtualMachine(executable, tvm.cpu()), [x])[0]
    want = execution.run(relay_amp.compile_module(mod, relay_amp_schedules=False), [x])[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


class _Declines:
    """A rule that explains why it passes every kernel on."""

    def apply(self, func, target, tunable):
        decide("not mine")
        return None

    def is_target_available(self, target):
        return True


class _Schedules:
    """A rule that schedules every kernel as it is and says so."""

    def apply(self, func, target, tunable):
        decide("kept as legalized")
        decide("twice")
        return tvm.s_tir.Schedule(func)

    def is_target_available(self, target):
        return True


def test_each_kernel_says_which_rule_scheduled_it_what_it_decided_and_who_passed_it_on():
    from tvm.relax.backend.cpu_generic import pipeline as cpu

    target = tvm.target.Target("llvm")
    log = RuleLog()

    def legalized():  # dlight marks the module it schedules in place
        return tvm.transform.Sequential(cpu.legalize_passes(target))(complex_magnitude())

    with target:
        apply_rules([_Declines(), _Schedules()], log)(legalized())
    (schedule,) = log.schedules
    assert schedule.kernel == "fused_multiply_multiply1_sum"
    assert schedule.rule == "_Schedules"
    assert schedule.decisions == ("kept as legalized", "twice")
    assert schedule.passed_on == ("_Declines: not mine",)
    assert schedule.text() == ("fused_multiply_multiply1_sum: scheduled by _Schedules "
                               "(_Declines: not mine; kept as legalized; twice)")
    decide("outside a rule: recorded nowhere")
    log.reset()
    with target:
        apply_rules([_Declines()], log)(legalized())
    (schedule,) = log.schedules
    assert schedule.rule is None and schedule.decisions == ()
    assert schedule.text().endswith("left as TVM legalized it (_Declines: not mine)")


def test_a_rule_error_is_plain_data():
    error = RuleError("k", "GEMV", "AttributeError: x", None)
    assert error.text() == "k: schedule rule GEMV raised (AttributeError: x); no later rule " \
                           "scheduled it"


def grouped_conv(dtype="float32"):
    """ONNX's Conv2d_groups case (PyTorch's grouped convolution with its bias): dlight's
    Reduction rule gives the fused kernel a cross-thread reduction that does not lower."""
    rng = np.random.default_rng(0)
    builder = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 4, 6, 5), dtype))
    with builder.function("main", [x]):
        with builder.dataflow():
            conv = builder.emit(relax.op.nn.conv2d(
                x, relax.const(rng.standard_normal((6, 2, 3, 2)).astype(dtype)), groups=2))
            out = builder.emit_output(builder.emit(relax.op.add(
                conv, relax.const(rng.standard_normal((1, 6, 1, 1)).astype(dtype)))))
        builder.emit_func_output(out)
    return builder.get()


def test_tvms_own_cuda_pipeline_fails_on_a_grouped_convolution():
    with pytest.raises(ValueError, match="Cross-thread reduction"):
        pipeline.build(grouped_conv(), CUDA, relay_amp_schedules=False)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_a_schedule_that_does_not_lower_passes_the_kernel_on(dtype):
    log = RuleLog()
    executable = pipeline.build(grouped_conv(dtype), CUDA, rule_log=log)
    errors = log.errors
    assert [(e.kernel, e.rule, e.scheduled_by) for e in errors] == [
        ("fused_conv2d_add", "Reduction", "GeneralReduction")]
    assert "does not lower" in errors[0].error and "Cross-thread" in errors[0].error
    source = executable.mod.imports[0].imports[0].inspect_source("cuda")
    assert "fused_conv2d_add_kernel" in source



def test_each_cpu_rule_starts_from_its_own_copy_of_one_normalization():
    """``llvm_blocks`` normalizes a kernel once for the rules dlight offers it to in turn:
    the second call does not normalize again, and each gets a schedule of its own, so what
    one rule did (here, a split) is not in the next one's."""
    from unittest import mock

    from tvm import te
    from tvm.s_tir.dlight import analysis

    from relay_amp.builds.schedule_rules import llvm_blocks

    x = te.placeholder((64,), name="x")
    func = te.create_prim_func([x, te.compute((64,), lambda i: x[i] * 2.0, name="y")])
    target = tvm.target.Target({"kind": "llvm"})
    with mock.patch.object(analysis, "normalize_prim_func",
                           wraps=analysis.normalize_prim_func) as normalize:
        first, blocks = llvm_blocks(func, target)
        first.split(first.get_loops(blocks[0].block_rv)[0], [None, 8])
        second, again = llvm_blocks(func, target)
        other = llvm_blocks(te.create_prim_func([x, te.compute((64,), lambda i: x[i] + 1.0)]),
                            target)
    assert normalize.call_count == 2 and other is not None
    assert len(first.get_loops(blocks[0].block_rv)) == 2
    assert len(second.get_loops(again[0].block_rv)) == 1


class _WronglyTyped:
    """A rule that calls a schedule primitive with an argument of the wrong type."""

    def apply(self, func, target, tunable):
        sch = tvm.s_tir.Schedule(func)
        sch.get_loops(1.5)
        return sch

    def is_target_available(self, target):
        return True


def test_the_rules_call_the_primitives_unchecked_and_a_wrong_type_still_passes_the_kernel_on():
    """While the rules run, TVM's schedule primitives skip the Python type check of their
    arguments (``unchecked_schedule_calls``), and every primitive is checked again after, even
    where the block raised. A rule that passes a wrongly typed argument then fails in TVM's
    own conversion: the kernel goes on to the next rule, and the log names the rule."""
    from tvm.relax.backend.cpu_generic import pipeline as cpu
    from tvm.s_tir import Schedule

    from relay_amp.builds.schedule_rules import unchecked_schedule_calls

    checked = {name: getattr(Schedule, name) for name in ("get", "get_loops", "split",
                                                          "tensorize", "reverse_compute_inline")}
    with pytest.raises(TypeError, match="get_loops"):  # the check the rules skip
        Schedule(tvm.te.create_prim_func([tvm.te.placeholder((4,))])).get_loops(1.5)
    with unchecked_schedule_calls():
        for name, method in checked.items():
            assert getattr(Schedule, name) is method.__wrapped__, name
    with pytest.raises(RuntimeError, match="inside"), unchecked_schedule_calls():
        raise RuntimeError("inside")
    assert all(getattr(Schedule, name) is method for name, method in checked.items())

    target = tvm.target.Target("llvm")
    log = RuleLog()
    legalized = tvm.transform.Sequential(cpu.legalize_passes(target))(complex_magnitude())
    with target:
        apply_rules([_WronglyTyped(), _Schedules()], log)(legalized)
    (error,) = log.errors
    assert (error.rule, error.scheduled_by) == ("_WronglyTyped", "_Schedules")
    assert all(getattr(Schedule, name) is method for name, method in checked.items())
