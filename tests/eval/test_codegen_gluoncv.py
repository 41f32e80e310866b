"""A GluonCV ResNet block, converted, compiles to CUDA cubins (the pass's CUDA codegen tests are
tests/pass/test_codegen_cuda.py)."""

import numpy as np
import pytest
from cuda_checks import compiles_to_cubin, needs_nvcc

pytestmark = pytest.mark.zoo  # GluonCV: pip install -r requirements.txt


@pytest.fixture(scope="module")
def resnet_block(tmp_path_factory):
    import mxnet as mx

    from relay_amp.eval.models import import_gluoncv

    BasicBlockV1 = import_gluoncv().model_zoo.resnet.BasicBlockV1

    from relay_amp.eval.models import gluon_to_relax

    mx.random.seed(0)
    block = BasicBlockV1(32, 1, downsample=False, in_channels=32)
    block.initialize(mx.init.Xavier())
    batch = np.random.default_rng(0).normal(size=(1, 32, 16, 16)).astype("float32")
    mod, _ = gluon_to_relax(block, batch, str(tmp_path_factory.mktemp("block")), "block")
    return mod


@needs_nvcc
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_gluoncv_resnet_block_compiles_to_cubin_for_sm90(resnet_block, dtype, tmp_path):
    compiles_to_cubin(resnet_block, dtype, tmp_path)
