"""Synthetic float32 Relax graphs of a chosen size, for conversion-speed benchmarks.

The graphs mimic what frontends produce: a transformer-like stack (matmul + bias, layer norm,
multi-head attention with reshape/permute, softmax, gelu, residual adds) and a convnet-like
stack (conv2d, batch norm, relu, residual adds, pooling), with weights as constants. Shapes are
small: the benchmarks time the pass, not the kernels.
"""

from __future__ import annotations

import numpy as np
from tvm import relax

KINDS = ("transformer", "convnet")


def _const(rng, shape, scale=0.05):
    return relax.const((rng.standard_normal(shape) * scale).astype(np.float32), "float32")


def _transformer_layer(bb, rng, x, tokens: int, hidden: int, heads: int):
    """One pre-norm encoder layer: 30 bindings."""
    head = hidden // heads
    h = bb.emit(relax.op.nn.layer_norm(x, _const(rng, (hidden,)), _const(rng, (hidden,)),
                                       axes=[-1]))
    qkv = []
    for _ in range(3):
        y = bb.emit(relax.op.matmul(h, _const(rng, (hidden, hidden))))
        y = bb.emit(relax.op.add(y, _const(rng, (hidden,))))
        y = bb.emit(relax.op.reshape(y, (1, tokens, heads, head)))
        qkv.append(bb.emit(relax.op.permute_dims(y, [0, 2, 1, 3])))
    q, k, v = qkv
    kt = bb.emit(relax.op.permute_dims(k, [0, 1, 3, 2]))
    scores = bb.emit(relax.op.matmul(q, kt))
    scores = bb.emit(relax.op.multiply(scores, relax.const(1.0 / np.sqrt(head), "float32")))
    probs = bb.emit(relax.op.nn.softmax(scores, axis=-1))
    ctx = bb.emit(relax.op.matmul(probs, v))
    ctx = bb.emit(relax.op.permute_dims(ctx, [0, 2, 1, 3]))
    ctx = bb.emit(relax.op.reshape(ctx, (1, tokens, hidden)))
    out = bb.emit(relax.op.matmul(ctx, _const(rng, (hidden, hidden))))
    out = bb.emit(relax.op.add(out, _const(rng, (hidden,))))
    x = bb.emit(relax.op.add(x, out))
    h = bb.emit(relax.op.nn.layer_norm(x, _const(rng, (hidden,)), _const(rng, (hidden,)),
                                       axes=[-1]))
    h = bb.emit(relax.op.matmul(h, _const(rng, (hidden, 2 * hidden))))
    h = bb.emit(relax.op.add(h, _const(rng, (2 * hidden,))))
    h = bb.emit(relax.op.nn.gelu(h))
    h = bb.emit(relax.op.matmul(h, _const(rng, (2 * hidden, hidden))))
    h = bb.emit(relax.op.add(h, _const(rng, (hidden,))))
    return bb.emit(relax.op.add(x, h))


def _conv_block(bb, rng, x, channels: int):
    """One residual basic block with batch norms: 12 bindings."""
    def conv_bn(y):
        y = bb.emit(relax.op.nn.conv2d(y, _const(rng, (channels, channels, 3, 3)), padding=1))
        y = bb.emit(relax.op.nn.batch_norm(
            y, _const(rng, (channels,), 1.0), _const(rng, (channels,)),
            _const(rng, (channels,)), relax.const(np.ones(channels, np.float32)), axis=1))
        return bb.emit(relax.TupleGetItem(y, 0))

    y = conv_bn(x)
    y = bb.emit(relax.op.nn.relu(y))
    y = conv_bn(y)
    y = bb.emit(relax.op.add(y, x))
    y = bb.emit(relax.op.nn.relu(y))
    y = bb.emit(relax.op.reshape(y, (1, channels, 8, 8)))
    y = bb.emit(relax.op.nn.max_pool2d(y, pool_size=(3, 3), padding=(1, 1)))
    return bb.emit(relax.op.multiply(y, relax.const(0.5, "float32")))


def synthetic_module(kind: str, bindings: int, seed: int = 0):
    """A float32 ``main`` of about ``bindings`` bindings (within one layer's worth).

    Parameters
    ----------
    kind : {"transformer", "convnet"}
        The layer the graph repeats.
    bindings : int
        Target number of bindings in ``main``.
    seed : int
        Seed of the constant weights.

    Returns
    -------
    tvm.IRModule
    """
    if kind not in KINDS:
        raise ValueError(f"unknown graph kind {kind!r}; expected one of {', '.join(KINDS)}")
    if bindings < 1:
        raise ValueError(f"bindings must be positive; got {bindings}")
    rng = np.random.default_rng(seed)
    bb = relax.BlockBuilder()
    if kind == "transformer":
        tokens, hidden, heads = 8, 16, 2
        x = relax.Var("x", relax.TensorType((1, tokens, hidden), "float32"))
        per_layer = 30
    else:
        channels = 4
        x = relax.Var("x", relax.TensorType((1, channels, 8, 8), "float32"))
        per_layer = 12
    layers = max(1, round(bindings / per_layer))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = x
            for _ in range(layers):
                if kind == "transformer":
                    y = _transformer_layer(bb, rng, y, tokens, hidden, heads)
                else:
                    y = _conv_block(bb, rng, y, channels)
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def count_bindings(mod) -> int:
    """Bindings in the Relax functions of ``mod``."""
    from .stats import all_bindings

    return sum(sum(1 for _ in all_bindings(func.body)) for _, func in mod.functions_items()
               if isinstance(func, relax.Function))
