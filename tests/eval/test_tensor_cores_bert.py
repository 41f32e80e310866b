"""A converted BERT layer of the benchmark's graphs runs its matmuls on tensor cores, for every
spelling of the arch (the pass's tensor-core tests are tests/pass/test_tensor_cores.py)."""

import re

import pytest
from cuda_checks import (
    FRAGMENT,
    PTX,
    TARGETS,
    cuda_source,
    fragment_dtypes,
    ptx_tensor_core_inputs,
)
from helpers import NVCC

import relay_amp
from relay_amp.eval import gpu_bench


@pytest.mark.parametrize("spelling", list(TARGETS))
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_converted_bert_layer_runs_its_matmuls_on_tensor_cores(spelling, dtype, tmp_path):
    layer = gpu_bench.bert_encoder(layers=1, hidden=128, heads=2, ffn=256, seq=128)
    converted, report = relay_amp.convert(layer.mod, dtype, target=TARGETS[spelling])
    assert any("run on tensor cores" in note for note in report.notes)
    source = cuda_source(converted, TARGETS[spelling])
    assert fragment_dtypes(source) == {FRAGMENT[dtype]}
    on_tensor_cores = {re.search(r"void (?:__launch_bounds__\(\d+\) )?(\w+)\(", kernel).group(1)
                       for kernel in source.split("__global__")[1:] if "mma_sync" in kernel}
    assert len(on_tensor_cores) >= 3  # the projections, the MLP's up and (split-K) down
    if NVCC is not None and spelling in ("sm_90a", "h100 tag"):
        assert ptx_tensor_core_inputs(source, tmp_path, "sm_90a") == {PTX[dtype]}
