"""Property-based fuzzing: random Relax functions keep every invariant of the conversion."""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relay_amp.eval import fuzz

SETTINGS = dict(deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@settings(max_examples=150, **SETTINGS)
@given(case=fuzz.cases(), dtype=st.sampled_from(["float16", "bfloat16"]))
def test_random_functions_keep_the_invariants(case, dtype):
    fuzz.check_invariants(case, dtype)


@settings(max_examples=40, **SETTINGS)
@given(case=fuzz.cases(max_ops=5, allow_if=False),
       dtype=st.sampled_from(["float16", "bfloat16"]))
def test_random_functions_stay_close_to_float32(case, dtype):
    converted, _ = fuzz.check_invariants(case, dtype)
    fuzz.check_numerics(case, converted, dtype)


CUDA = {"kind": "cuda", "arch": "sm_90"}


@settings(max_examples=150, **SETTINGS)
@given(case=fuzz.cases(), dtype=st.sampled_from(["float16", "bfloat16"]))
def test_random_functions_keep_the_invariants_with_cuda_defaults(case, dtype):
    """The kernel settings (decomposition, mixed kernels, kernel boundaries, residual streams)
    keep every invariant too."""
    fuzz.check_invariants(case, dtype, CUDA)


@settings(max_examples=40, **SETTINGS)
@given(case=fuzz.cases(max_ops=5, allow_if=False),
       dtype=st.sampled_from(["float16", "bfloat16"]))
def test_random_functions_stay_close_to_float32_with_cuda_defaults(case, dtype):
    converted, _ = fuzz.check_invariants(case, dtype, CUDA)
    fuzz.check_numerics(case, converted, dtype)
