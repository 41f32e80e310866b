"""GluonCV models as Relax modules: build, initialize deterministically, export through ONNX.

No pretrained weights can be downloaded here, so a model gets a seeded Xavier initialization and
its BatchNorm statistics are then re-estimated on real photos (one forward pass in which every
BatchNorm first measures its own input). Activations then have realistic magnitudes; comparisons
made with these models measure low-precision agreement with float32, not ImageNet accuracy.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass

import numpy as np

from .data import normalize, sample_images


@dataclass
class ZooModel:
    """A model ready for conversion: the Relax module and a real input batch."""

    name: str
    mod: object  # tvm.IRModule
    inputs: list  # float32 numpy arrays, in parameter order
    onnx_path: str


def _blocks(block):
    yield block
    for child in block._children.values():  # pylint: disable=protected-access
        yield from _blocks(child)


def reestimate_batchnorm(net, batch) -> int:
    """Set every BatchNorm's running statistics to those of its input on ``batch``.

    One inference pass: a pre-hook on each BatchNorm measures its input (which already reflects
    the re-estimated layers before it) before the layer runs. Returns the number of layers set.
    """
    from mxnet.gluon import nn  # pylint: disable=import-outside-toplevel

    norms = [b for b in _blocks(net) if isinstance(b, nn.BatchNorm)]

    def measure(block, inputs):
        data = inputs[0]
        axis = block._kwargs.get("axis", 1) % data.ndim  # pylint: disable=protected-access
        axes = tuple(i for i in range(data.ndim) if i != axis)
        mean = data.mean(axis=axes)
        shape = [1] * data.ndim
        shape[axis] = -1
        var = ((data - mean.reshape(shape)) ** 2).mean(axis=axes)
        block.running_mean.set_data(mean)
        block.running_var.set_data(var)

    hooks = [b.register_forward_pre_hook(measure) for b in norms]
    try:
        net(batch)
    finally:
        for hook in hooks:
            hook.detach()
    return len(norms)


def gluon_to_relax(net, batch: np.ndarray, workdir: str, name: str = "model"):
    """Hybridize ``net``, export it with ``mx.onnx.export_model`` and import it into Relax.

    Returns ``(IRModule, onnx_path)``.
    """
    import mxnet as mx  # pylint: disable=import-outside-toplevel
    import onnx  # pylint: disable=import-outside-toplevel
    from tvm.relax.frontend.onnx import from_onnx  # pylint: disable=import-outside-toplevel

    net.hybridize()
    net(mx.nd.array(batch))
    prefix = os.path.join(workdir, name)
    net.export(prefix)
    onnx_path = prefix + ".onnx"
    mx.onnx.export_model(prefix + "-symbol.json", prefix + "-0000.params", [batch.shape],
                         [np.float32], onnx_path)
    return from_onnx(onnx.load(onnx_path)), onnx_path


def load_gluon(name: str, batch_size: int = 1, image_size: int = 224, seed: int = 0,
               workdir: str | None = None) -> ZooModel:
    """Build GluonCV model ``name``, initialize it and import it into Relax through ONNX."""
    import mxnet as mx  # pylint: disable=import-outside-toplevel
    from gluoncv import model_zoo  # pylint: disable=import-outside-toplevel

    mx.random.seed(seed)
    np.random.seed(seed)
    from .models import _gluon_net  # pylint: disable=import-outside-toplevel

    net = _gluon_net(model_zoo, name)
    net.initialize(mx.init.Xavier(magnitude=2.0))
    calibration = normalize(sample_images(max(batch_size, 8), image_size))
    net(mx.nd.array(calibration[:1]))  # finish deferred initialization
    reestimate_batchnorm(net, mx.nd.array(calibration))
    inputs = calibration[:batch_size]
    workdir = workdir or tempfile.mkdtemp(prefix="relay_amp_")
    mod, onnx_path = gluon_to_relax(net, inputs, workdir, name)
    return ZooModel(name, mod, [inputs], onnx_path)
