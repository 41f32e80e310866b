"""The conformance run's CUDA-target modes (converted for sm_90, compiled and run on this CPU),
and the ONNX cases that crashed in them."""

import pytest

from relay_amp.eval import conformance

CUDA = {"kind": "cuda", "arch": "sm_90"}


@pytest.mark.zoo
@pytest.mark.parametrize("name", ["test_nllloss_NCd1_expanded",
                                  "test_nllloss_NCd1d2_reduction_mean_expanded"])
def test_the_onnx_cases_that_crashed_pass_in_the_cuda_modes(name):
    path = next(p for p in conformance.case_dirs(["node"]) if p.endswith("/" + name))
    row = conformance.run_case(path, modes=("cuda", "cuda_low_io"))
    for mode in ("cuda", "cuda_low_io"):
        outcome, results = conformance.mode_outcome(row, mode)
        assert outcome == "pass", results


def test_the_cuda_modes_convert_for_cuda_with_and_without_low_precision_io():
    assert conformance.MODES["cuda"].target == conformance.MODES["cuda_low_io"].target == CUDA
    assert conformance.MODES["cuda_low_io"].low_io and not conformance.MODES["cuda"].low_io
    assert conformance.MODES["default"].target is None
    assert {"cuda/float16", "cuda_low_io/bfloat16"} <= set(conformance.units())
