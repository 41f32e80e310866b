"""``convert`` runs the algorithm per function with one context: a nested function and an If
branch are converted under the enclosing function's target, policy and kernel settings."""

import pytest
from helpers import convert_checked
from tvm.script import ir as I
from tvm.script import relax as R

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
