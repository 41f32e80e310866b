"""``convert`` runs the algorithm per function with one context: a nested function and an If
branch are converted under the enclosing function's target, policy and kernel settings."""

import pytest
from helpers import convert_checked
from tvm.script import ir as I
from tvm.script import relax as R

import relay_amp

#: An x86 CPU without avx512fp16: matmul keeps float32 compute, its weights stored in float16.
STORAGE_ONLY = {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "x86-64"}
CUDA = {"kind": "cuda", "arch": "sm_90"}


@I.ir_module
class NestedFunction:
    @R.function
    def main(x: R.Tensor((4, 8), "float32"), w: R.Tensor((8, 8), "float32"),
             v: R.Tensor((8, 8), "float32")) -> R.Tensor((4, 8), "float32"):
        @R.function
        def inner(a: R.Tensor((4, 8), "float32"),
                  b: R.Tensor((8, 8), "float32")) -> R.Tensor((4, 8), "float32"):
            with R.dataflow():
                y = R.matmul(a, b)
                R.output(y)
            return y

        outer = R.matmul(x, w)
        result = inner(outer, v)
        return result


@I.ir_module
class IfBranches:
    @R.function
    def main(flag: R.Tensor((), "bool"), x: R.Tensor((4, 8), "float32"),
             w: R.Tensor((8, 8), "float32")) -> R.Tensor((4, 8), "float32"):
        outer = R.matmul(x, w)
        if flag:
            y = R.matmul(outer, w)
            result = y
        else:
            z = R.nn.relu(outer)
            result = z
        return result


def rows(report, name):
    return [row for row in report.rows if row.name == name]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_nested_function_keeps_the_target_rule(dtype):
    """Converted for a CPU that only stores ``dtype``, the nested function's matmul is treated
    as the outer one is (storage, float32 compute), not computed in ``dtype``."""
    _, report = convert_checked(NestedFunction, dtype, target=STORAGE_ONLY,
                                fallback="storage")
    (outer,), (inner,) = rows(report, "outer"), rows(report, "y")
    assert outer.category == "storage" and outer.compute_dtype == "float32"
    assert inner.function == "main.inner"
    assert (inner.category, inner.compute_dtype, inner.codes[0]) == (
        outer.category, outer.compute_dtype, outer.codes[0])


def test_a_nested_function_keeps_the_kernel_settings():
    """With a GPU target the nested function's matmul gets the same kernel settings as the
    outer one: its report row names the target's reasons."""
    _, report = convert_checked(NestedFunction, "float16", target=CUDA)
    (outer,), (inner,) = rows(report, "outer"), rows(report, "y")
    assert "target_fast" in outer.codes and "target_fast" in inner.codes
    assert inner.compute_dtype == outer.compute_dtype == "float16"


def test_an_if_branch_keeps_the_target_rule():
    _, report = convert_checked(IfBranches, "float16", target=STORAGE_ONLY)
    (outer,), (branch,) = rows(report, "outer"), rows(report, "y")
    assert outer.category == branch.category == "storage"
    assert outer.compute_dtype == branch.compute_dtype == "float32"


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_nested_function_is_planned_with_its_enclosing_function(dtype):
    """The nested function's signature and plan are part of ``main``'s plan, made before the
    rewrite; ``convert`` runs its per-function step once per module function, never for a
    nested one."""
    import relay_amp.transform as transform

    planned, jobs = [], []
    plan_function, convert_function = transform.plan_function, transform._convert_function

    def spy_plan(func, signature, context):
        plan = plan_function(func, signature, context)
        planned.append(plan)
        return plan

    def spy_job(job, rewriter, report):
        jobs.append(job.name)
        return convert_function(job, rewriter, report)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(transform, "plan_function", spy_plan)
        patch.setattr(transform, "_convert_function", spy_job)
        _, report = relay_amp.convert(NestedFunction, dtype, target=CUDA)
    assert jobs == ["main"]
    (plan,) = planned
    ((var, nested),) = plan.nested.items()
    assert var.name == "inner" and nested.signature.name == "main.inner"
    (inner,) = [p for p in nested.plan.plans.values() if p.name == "y"]
    assert rows(report, "y")[0].codes[:len(inner.reasons)] == tuple(r.code for r in inner.reasons)
    assert rows(report, "y")[0].function == "main.inner"


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_the_report_counts_every_cast_the_rewrite_emits(dtype):
    """The rewrite counts its casts through the report: the report's total is the number of
    ``astype`` bindings in the converted module, and each binding's own casts sum to it."""
    new, report = convert_checked(NestedFunction, dtype)
    text = new.script(show_meta=False)
    assert report.casts == text.count("R.astype(") == 4  # x, w; and a, b in the nested one
    assert sum(row.casts_added for row in report.rows) == report.casts
    assert [row.casts_added for row in rows(report, "y")] == [2]
