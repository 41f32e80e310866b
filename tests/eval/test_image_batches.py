"""The harness's uint8 image batches fed straight to a converted model (the pass's side of
integer inputs is tests/pass/test_integer_inputs.py)."""

import numpy as np
from cases import Conv
from helpers import IMAGENET_UINT8

import relay_amp
from relay_amp import execution
from relay_amp.eval import data
from relay_amp.eval.data import ImageBatches, normalize, sample_images


def test_the_tests_imagenet_constants_are_the_harness_ones():
    assert IMAGENET_UINT8 == data.IMAGENET_UINT8


def test_loader_and_uint8_model_match_host_normalized_float32(dtype):
    photos = sample_images(4, 64)
    batches = list(ImageBatches(photos, size=16, batch_size=1))
    rng = np.random.default_rng(0)
    weight = rng.normal(0, 0.3, (8, 3, 3, 3)).astype("float32")
    converted, _ = relay_amp.convert(Conv, dtype, input_dtypes={"data": "uint8"},
                                     input_normalization={"data": IMAGENET_UINT8})
    reference_vm = relay_amp.compile_module(Conv)
    converted_vm = relay_amp.compile_module(converted)
    reference, outputs = [], []
    for batch in batches:
        assert batch.dtype == np.uint8 and batch.shape == (1, 3, 16, 16)
        host = normalize(batch.transpose(0, 2, 3, 1))  # the float32 pipeline normalizes on host
        reference += execution.run(reference_vm, [host, weight])
        outputs += execution.run(converted_vm, [batch, weight])
    agreement = execution.agreement(reference, outputs)
    assert agreement.nonfinite == 0
    assert agreement.relative_l2 < {"float16": 1e-3, "bfloat16": 1e-2}[dtype], agreement
