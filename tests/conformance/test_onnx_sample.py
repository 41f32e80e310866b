"""A fixed sample of the ONNX backend test suite (the script runs all of it)."""

import os

import pytest

from relay_amp.eval import conformance

SAMPLE = [
    # tuple-valued ops, shape-valued arguments, call_tir (Clip), If: where TVM's pass breaks
    "test_batchnorm_epsilon", "test_batchnorm_example", "test_dropout_default",
    "test_unsqueeze_axis_0", "test_squeeze", "test_range_float_type_positive_delta",
    "test_reshape_extended_dims", "test_clip", "test_clip_default_min", "test_if",
    "test_expand_dim_unchanged",
    # dot products that run in low precision
    "test_basic_conv_with_padding", "test_conv_with_strides_padding", "test_convtranspose",
    "test_gemm_default_matrix_bias", "test_matmul_2d", "test_einsum_batch_matmul",
    # reductions, norms, activations, data movement, QDQ
    "test_softmax_axis_0", "test_instancenorm_example", "test_globalaveragepool",
    "test_maxpool_2d_default", "test_averagepool_2d_default", "test_gelu_default_1",
    "test_erf", "test_exp", "test_lrn", "test_concat_2d_axis_0", "test_gather_0",
    "test_where_example", "test_flatten_axis0", "test_cast_FLOAT_to_FLOAT16",
    "test_dequantizelinear", "test_quantizelinear",
]
PATHS = {os.path.basename(p): p for p in conformance.case_dirs(["node"])}


@pytest.mark.parametrize("name", SAMPLE)
def test_onnx_case_never_crashes_or_fails_after_conversion(name):
    row = conformance.run_case(PATHS[name])
    assert row["outcome"] in ("pass", "skip"), row
    if row["outcome"] == "skip":  # TVM itself cannot import or run it in float32
        assert row["reason"].startswith(("import", "float32")), row


def test_sample_runs_low_precision_ops_where_there_are_dot_products():
    rows = [conformance.run_case(PATHS[n]) for n in ("test_matmul_2d", "test_basic_conv_with_padding")]
    assert all(r["outcome"] == "pass" and r["float16_low_ops"] >= 1 for r in rows), rows


def test_comparison_at_dtype_tolerance():
    import numpy as np

    reference = [np.array([1.0, 2.0, 100.0], "float32")]
    assert conformance._compare(reference, [reference[0] * (1 + 1e-3)], "float16") is None
    assert "differs" in conformance._compare(reference, [reference[0] + 5.0], "float16")
    assert "differs" in conformance._compare([np.array([1, 2])], [np.array([1, 3])], "float16")
