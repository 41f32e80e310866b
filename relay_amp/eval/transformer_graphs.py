"""Transformer graphs built in Relax directly, at realistic shapes, with weights as parameters.

A ViT-B/16-shaped encoder (pre-norm, GELU) and a LLaMA-style decoder stack (RMSNorm, rotary
position embedding, SiLU-gated MLP, grouped key/value heads, causal attention). Weights are
function parameters so that a benchmark can generate them where it runs
(:func:`relay_amp.eval.gpu_bench.make_weights`) and every variant takes them in its own dtype.
"""

from __future__ import annotations

import numpy as np
from tvm import relax

from .gpu_bench import BenchModel

_op = relax.op


class _Weights:
    """Creates weight parameters and remembers their order."""

    def __init__(self):
        self.params: list = []

    def __call__(self, name: str, shape) -> relax.Var:
        var = relax.Var(name, relax.TensorType(tuple(shape), "float32"))
        self.params.append(var)
        return var


def vit_encoder(layers=12, hidden=768, heads=12, mlp=3072, image=224, patch=16, classes=1000,
                batch=1) -> BenchModel:
    """A ViT-B/16-shaped image classifier: patch embedding, class token, pre-norm encoder."""
    tokens = (image // patch) ** 2 + 1
    head_dim = hidden // heads
    w = _Weights()
    x = relax.Var("pixels", relax.TensorType((batch, 3, image, image), "float32"))
    patch_w, patch_b = w("patch.w", (hidden, 3, patch, patch)), w("patch.b", (1, hidden, 1, 1))
    cls, pos = w("cls_token", (1, 1, hidden)), w("pos_embed", (1, tokens, hidden))
    blocks = [{k: w(f"l{i}.{k}", s) for k, s in (
        ("ln1.g", (hidden,)), ("ln1.b", (hidden,)), ("wqkv", (hidden, 3 * hidden)),
        ("bqkv", (3 * hidden,)), ("wo", (hidden, hidden)), ("bo", (hidden,)),
        ("ln2.g", (hidden,)), ("ln2.b", (hidden,)), ("w1", (hidden, mlp)), ("b1", (mlp,)),
        ("w2", (mlp, hidden)), ("b2", (hidden,)))} for i in range(layers)]
    norm_g, norm_b = w("norm.g", (hidden,)), w("norm.b", (hidden,))
    head_w, head_b = w("head.w", (hidden, classes)), w("head.b", (classes,))
    builder = relax.BlockBuilder()
    with builder.function("main", [x] + w.params):
        with builder.dataflow():
            emit = builder.emit
            h = emit(_op.add(_op.nn.conv2d(x, patch_w, strides=[patch, patch]), patch_b))
            h = emit(_op.permute_dims(_op.reshape(h, (batch, hidden, tokens - 1)), [0, 2, 1]))
            h = emit(_op.concat([_op.broadcast_to(cls, (batch, 1, hidden)), h], axis=1))
            h = emit(_op.add(h, pos))
            for p in blocks:
                normed = emit(_op.nn.layer_norm(h, p["ln1.g"], p["ln1.b"], axes=[-1]))
                qkv = emit(_op.add(_op.matmul(normed, p["wqkv"]), p["bqkv"]))
                qkv = emit(_op.reshape(qkv, (batch, tokens, 3, heads, head_dim)))
                q, k, v = (emit(_op.squeeze(_op.strided_slice(qkv, [2], [i], [i + 1]), [2]))
                           for i in range(3))
                context = emit(_op.nn.attention(q, k, v, scale=head_dim ** -0.5))
                context = emit(_op.reshape(context, (batch, tokens, hidden)))
                h = emit(_op.add(h, _op.add(_op.matmul(context, p["wo"]), p["bo"])))
                normed = emit(_op.nn.layer_norm(h, p["ln2.g"], p["ln2.b"], axes=[-1]))
                inner = emit(_op.nn.gelu(_op.add(_op.matmul(normed, p["w1"]), p["b1"])))
                h = emit(_op.add(h, _op.add(_op.matmul(inner, p["w2"]), p["b2"])))
            h = emit(_op.nn.layer_norm(h, norm_g, norm_b, axes=[-1]))
            first = emit(_op.squeeze(_op.strided_slice(h, [1], [0], [1]), [1]))
            logits = builder.emit_output(_op.add(_op.matmul(first, head_w), head_b))
        builder.emit_func_output(logits)
    data = {"pixels": np.random.default_rng(0).normal(size=(batch, 3, image, image))
            .astype("float32")}
    name = "vit_b16" if (layers, hidden) == (12, 768) else f"vit_{layers}x{hidden}"
    return BenchModel(name, builder.get(), data, [p.name for p in w.params])


def rotary_tables(seq: int, head_dim: int, base: float = 10000.0) -> tuple:
    """cos and sin of the rotary position embedding, shaped (seq, 1, head_dim)."""
    inv_freq = 1.0 / base ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    angles = np.outer(np.arange(seq, dtype=np.float64), inv_freq)
    angles = np.concatenate([angles, angles], axis=-1)[:, None, :]
    return np.cos(angles).astype("float32"), np.sin(angles).astype("float32")


def llama_decoder(layers=4, hidden=2048, heads=32, kv_heads=4, intermediate=5632, vocab=32000,
                  seq=128, batch=1, eps=1e-5) -> BenchModel:
    """A LLaMA-style decoder stack (TinyLlama-1.1B layer shapes by default) over token ids:
    RMSNorm, rotary embedding, grouped key/value heads, causal attention, SiLU-gated MLP."""
    head_dim = hidden // heads
    w = _Weights()
    ids = relax.Var("input_ids", relax.TensorType((batch, seq), "int64"))
    embed = w("embed_tokens", (vocab, hidden))
    blocks = [{k: w(f"l{i}.{k}", s) for k, s in (
        ("input_norm.g", (hidden,)), ("wq", (hidden, heads * head_dim)),
        ("wk", (hidden, kv_heads * head_dim)), ("wv", (hidden, kv_heads * head_dim)),
        ("wo", (heads * head_dim, hidden)), ("post_norm.g", (hidden,)),
        ("w_gate", (hidden, intermediate)), ("w_up", (hidden, intermediate)),
        ("w_down", (intermediate, hidden)))} for i in range(layers)]
    norm_g, lm_head = w("norm.g", (hidden,)), w("lm_head", (hidden, vocab))
    cos, sin = (relax.const(t) for t in rotary_tables(seq, head_dim))
    half = head_dim // 2
    builder = relax.BlockBuilder()
    with builder.function("main", [ids] + w.params):
        with builder.dataflow():
            emit = builder.emit

            def rotate(t, n_heads):
                t = emit(_op.reshape(t, (batch, seq, n_heads, head_dim)))
                first = _op.strided_slice(t, [3], [0], [half])
                second = _op.strided_slice(t, [3], [half], [head_dim])
                rotated = emit(_op.concat([_op.negative(second), first], axis=3))
                return emit(_op.add(_op.multiply(t, cos), _op.multiply(rotated, sin)))

            h = emit(_op.take(embed, ids, axis=0))
            for p in blocks:
                normed = emit(_op.nn.rms_norm(h, p["input_norm.g"], axes=[-1], epsilon=eps))
                q = rotate(emit(_op.matmul(normed, p["wq"])), heads)
                k = rotate(emit(_op.matmul(normed, p["wk"])), kv_heads)
                v = emit(_op.reshape(_op.matmul(normed, p["wv"]),
                                     (batch, seq, kv_heads, head_dim)))
                k = emit(_op.repeat(k, heads // kv_heads, axis=2))
                v = emit(_op.repeat(v, heads // kv_heads, axis=2))
                context = emit(_op.nn.attention(q, k, v, scale=head_dim ** -0.5,
                                                causal_mask="TopLeft"))
                context = emit(_op.reshape(context, (batch, seq, heads * head_dim)))
                h = emit(_op.add(h, _op.matmul(context, p["wo"])))
                normed = emit(_op.nn.rms_norm(h, p["post_norm.g"], axes=[-1], epsilon=eps))
                gate = emit(_op.nn.silu(_op.matmul(normed, p["w_gate"])))
                up = emit(_op.matmul(normed, p["w_up"]))
                h = emit(_op.add(h, _op.matmul(_op.multiply(gate, up), p["w_down"])))
            h = emit(_op.nn.rms_norm(h, norm_g, axes=[-1], epsilon=eps))
            logits = builder.emit_output(_op.matmul(h, lm_head))
        builder.emit_func_output(logits)
    data = {"input_ids": np.random.default_rng(0).integers(0, vocab, size=(batch, seq))
            .astype("int64")}
    name = "llama_decoder" if (hidden, layers) == (2048, 4) else f"llama_{layers}x{hidden}"
    torch = {"kind": "llama", "hidden": hidden, "layers": layers, "heads": heads,
             "kv_heads": kv_heads, "intermediate": intermediate, "vocab": vocab,
             "inputs": ["input_ids"]}
    return BenchModel(name, builder.get(), data, [p.name for p in w.params], torch)
