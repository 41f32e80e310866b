"""The GPU-cost property on the shapes real exports have (issue: hand-built graphs hid them):
with CUDA defaults and float32 I/O, a conversion moves at most 0.55 of float32's bytes at kernel
boundaries, launches no more kernels than float32 and has no standalone cast kernel.

Each graph is small and written as its exporter writes it: a BERT layer as torch.export writes
it (symbolic sequence length, 2-D reshapes before the matmuls, an attention mask), a TFLite
residual block (NHWC, a depthwise convolution, float16 weights behind an ``astype`` to float32),
a YOLO-style head (SiLU as ``x * sigmoid(x)``, split, concat, resize), and image inputs fed as
float32 or as uint8."""

import numpy as np
import pytest
import tvm
from helpers import IMAGENET_UINT8, convert_checked, run_module
from tvm import relax

import relay_amp
from relay_amp.builds.gpu_cost import gpu_cost, lower_for_cuda

CUDA = {"kind": "cuda", "arch": "sm_90"}
DTYPES = ("float16", "bfloat16")
SEQ = 16
op = relax.op


def _const(rng, shape, dtype="float32", scale=0.1):
    return relax.const((rng.normal(size=shape) * scale).astype(dtype))


def exported_bert_layer(hidden=64, heads=2, ffn=128):
    """One post-norm encoder layer over ``(1, s, hidden)`` with a symbolic ``s``, as torch.export
    writes it: weights transposed by ``permute_dims``, each matmul on a 2-D reshape, heads split
    by reshape and transpose, the attention mask turned into ``where(mask, 0, -inf)``."""
    rng = np.random.default_rng(0)
    s = tvm.tirx.Var("s", "int64")
    head = hidden // heads
    x = relax.Var("x", relax.TensorType((1, s, hidden), "float32"))
    mask = relax.Var("mask", relax.TensorType((1, s), "int64"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x, mask]):
        with builder.dataflow():
            emit = builder.emit

            def linear(value, rows, cols):
                flat = emit(op.reshape(value, (s, rows)))
                weight = emit(op.permute_dims(_const(rng, (cols, rows)), [1, 0]))
                out = emit(op.add(op.matmul(flat, weight), _const(rng, (cols,))))
                return emit(op.reshape(out, (1, s, cols)))

            def split_heads(value):
                return emit(op.permute_dims(op.reshape(value, (1, s, heads, head)), [0, 2, 1, 3]))

            q, k, v = (split_heads(linear(x, hidden, hidden)) for _ in range(3))
            keep = emit(op.astype(mask, "bool"))
            bias = emit(op.where(op.reshape(keep, (1, 1, 1, s)), relax.const(0.0),
                                 relax.const(float("-inf"))))
            q = emit(op.reshape(op.multiply(q, relax.const(head ** -0.5)), (heads, s, head)))
            kt = emit(op.reshape(op.permute_dims(k, [0, 1, 3, 2]), (heads, head, s)))
            scores = emit(op.add(op.reshape(op.matmul(q, kt), (1, heads, s, s)), bias))
            probs = emit(op.reshape(op.nn.softmax(scores, axis=-1), (heads, s, s)))
            context = emit(op.reshape(op.matmul(probs, op.reshape(v, (heads, s, head))),
                                      (1, heads, s, head)))
            context = emit(op.reshape(op.permute_dims(context, [0, 2, 1, 3]), (1, s, hidden)))
            attended = emit(op.add(linear(context, hidden, hidden), x))
            h = emit(op.nn.layer_norm(attended, relax.const(np.ones(hidden, "float32")),
                                      relax.const(np.zeros(hidden, "float32")), axes=[-1]))
            inner = emit(op.nn.gelu(linear(h, hidden, ffn)))
            out = emit(op.add(linear(inner, ffn, hidden), h))
            result = builder.emit_output(op.nn.layer_norm(
                out, relax.const(np.ones(hidden, "float32")),
                relax.const(np.zeros(hidden, "float32")), axes=[-1]))
        builder.emit_func_output(result)
    return builder.get(), {"s": SEQ}


def tflite_residual_block(channels=16, size=32):
    """TFLite's residual blocks, NHWC, after a stem convolution: a depthwise 3x3 and a pointwise
    convolution with float16 weights behind ``astype`` to float32 (TFLite's DEQUANTIZE), added
    to the block's input, then relu; six blocks, so the stream crosses kernel boundaries."""
    rng = np.random.default_rng(1)
    x = relax.Var("x", relax.TensorType((1, 2 * size, 2 * size, 3), "float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            emit = builder.emit

            def weight(shape):
                return emit(op.astype(_const(rng, shape, "float16", 0.3), "float32"))

            stem = emit(op.permute_dims(weight((channels, 3, 3, 3)), [1, 2, 3, 0]))
            stream = emit(op.nn.relu(op.nn.conv2d(x, stem, strides=2, padding=1,
                                                  data_layout="NHWC", kernel_layout="HWIO")))
            for _ in range(6):
                depthwise = emit(op.reshape(weight((1, 3, 3, channels)), (3, 3, channels, 1)))
                h = emit(op.nn.conv2d(stream, depthwise, padding=1, groups=channels,
                                      data_layout="NHWC", kernel_layout="HWOI"))
                h = emit(op.add(h, weight((channels,))))
                pointwise = emit(op.permute_dims(weight((channels, 1, 1, channels)),
                                                 [1, 2, 3, 0]))
                h = emit(op.nn.conv2d(h, pointwise, data_layout="NHWC", kernel_layout="HWIO"))
                h = emit(op.add(h, weight((channels,))))
                stream = emit(op.nn.relu(op.add(stream, h)))
            result = builder.emit_output(stream)
        builder.emit_func_output(result)
    return builder.get(), None


def yolo_head(channels=16, size=32):
    """YOLOv8's C2f and neck: convolution + SiLU written ``x * sigmoid(x)`` (a diamond FuseOps
    keeps in one kernel), a split whose halves feed a bottleneck and a concat, a nearest
    resize and a concat with an earlier level."""
    rng = np.random.default_rng(2)
    image = relax.Var("image", relax.TensorType((1, 3, 2 * size, 2 * size), "float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [image]):
        with builder.dataflow():
            emit = builder.emit

            def conv_silu(value, cin, cout, kernel=1, stride=1):
                h = emit(op.nn.conv2d(value, _const(rng, (cout, cin, kernel, kernel)),
                                      strides=stride, padding=kernel // 2))
                h = emit(op.add(h, _const(rng, (1, cout, 1, 1))))
                return emit(op.multiply(h, op.sigmoid(h)))

            def c2f(value):
                parts = emit(op.split(conv_silu(value, 2 * channels, 2 * channels), 2, axis=1))
                first = emit(relax.TupleGetItem(parts, 0))
                second = emit(relax.TupleGetItem(parts, 1))
                bottleneck = emit(op.add(second, conv_silu(
                    conv_silu(second, channels, channels, 3), channels, channels, 3)))
                joined = emit(op.concat([first, second, bottleneck], axis=1))
                return conv_silu(joined, 3 * channels, 2 * channels)

            x = conv_silu(image, 3, channels, 3, 2)
            stem = conv_silu(x, channels, 2 * channels, 3, 2)
            level = conv_silu(c2f(c2f(stem)), 2 * channels, channels)
            up = emit(op.image.resize2d(level, (size, size), method="nearest_neighbor"))
            result = builder.emit_output(conv_silu(emit(op.concat([up, x], axis=1)),
                                                   2 * channels, channels))
        builder.emit_func_output(result)
    return builder.get(), None


def image_convnet(channels=16, size=32):
    """An image input read by the first convolution (its cast is the only one float32 I/O
    would add)."""
    rng = np.random.default_rng(3)
    x = relax.Var("data", relax.TensorType((1, 3, size, size), "float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            h = builder.emit(op.nn.relu(op.nn.conv2d(x, _const(rng, (channels, 3, 3, 3)),
                                                     padding=1)))
            h = builder.emit(op.nn.conv2d(h, _const(rng, (channels, channels, 3, 3)), padding=1))
            result = builder.emit_output(op.mean(h, axis=[2, 3]))
        builder.emit_func_output(result)
    return builder.get(), None


SHAPES = {"exported_bert_layer": exported_bert_layer,
          "tflite_residual_block": tflite_residual_block, "yolo_head": yolo_head,
          "image_convnet": image_convnet}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_half_the_bytes_no_more_kernels_and_no_cast_kernel(shape, dtype):
    mod, sizes = SHAPES[shape]()
    fp32 = gpu_cost(mod, CUDA, sizes)
    converted, _ = convert_checked(mod, dtype, target=CUDA)
    cost = gpu_cost(converted, CUDA, sizes)
    assert cost.casts == 0, cost
    assert cost.kernels <= fp32.kernels, (cost, fp32)
    assert cost.bytes <= 0.55 * fp32.bytes, (cost.bytes / fp32.bytes, cost, fp32)


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_the_shapes_stay_close_to_float32(shape):
    mod, sizes = SHAPES[shape]()
    rng = np.random.default_rng(4)
    inputs = []
    for param in mod["main"].params:
        dims = [sizes[d.name] if isinstance(d, tvm.tirx.Var) else int(d)
                for d in param.ty.shape.values]
        inputs.append(np.ones(dims, "int64") if str(param.ty.dtype) == "int64"
                      else rng.uniform(-1, 1, dims).astype("float32"))
    reference = np.asarray(run_module(mod, inputs)[0], "float64")
    converted, _ = relay_amp.convert(mod, "float16", target=CUDA)
    out = np.asarray(run_module(converted, inputs)[0], "float64")
    assert np.all(np.isfinite(out))
    assert np.linalg.norm(out - reference) / np.linalg.norm(reference) < 5e-3


def test_symbolic_reshapes_are_views_a_cast_cannot_cross():
    """TVM leaves a reshape over a symbolic extent opaque (FuseOps fuses nothing into it), so the
    matmul after it reads the copy its producer's kernel wrote: no cast between the two."""
    mod, sizes = exported_bert_layer()
    converted, report = relay_amp.convert(mod, "float16", target=CUDA)
    cost, fp32 = gpu_cost(converted, CUDA, sizes), gpu_cost(mod, CUDA, sizes)
    assert cost.casts == 0 and cost.integer_casts == fp32.integer_casts == 1  # the mask's own
    views = [row for row in report.rows if row.op == "reshape" and row.compute_dtype == "float16"]
    assert views, "the reshapes between the projections and the matmuls run in float16"


def test_float16_weights_behind_an_astype_count_as_constants():
    """TFLite's float16 weight with ``astype`` to float32 is a constant at build time: the
    layout op on it runs on the float16 constant (no float32 activation), and the residual
    stream it ends up in is stored in float16."""
    mod, _ = tflite_residual_block()
    _, report = relay_amp.convert(mod, "float16", target=CUDA)
    layouts = [row for row in report.rows if row.op in ("reshape", "permute_dims")]
    assert layouts and all("constant_copy" in row.codes for row in layouts)
    streams = [row for row in report.rows if row.op == "nn.relu"][:-1]
    assert streams and all("residual_low" in row.codes for row in streams)


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_float32_input_is_rounded_in_the_first_convolution(dtype):
    mod, _ = image_convnet()
    converted, report = relay_amp.convert(mod, dtype, target=CUDA)
    first = report.rows[0]
    assert first.op == "nn.conv2d" and first.reason("narrowing_kernel").values == {
        "inputs": "data", "dtype": dtype}
    assert str(converted["main"].params[0].ty.dtype) == "float32"


def batch_norm_on_the_input(channels=16, size=32):
    """GluonCV's v2 ResNet stem: an inference batch_norm on the image, then a convolution."""
    rng = np.random.default_rng(5)
    x = relax.Var("data", relax.TensorType((1, 3, size, size), "float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            stats = [relax.const(v.astype("float32")) for v in (
                rng.uniform(0.5, 1.5, 3), rng.normal(size=3), rng.normal(size=3),
                rng.uniform(0.5, 1.5, 3))]
            normed = builder.emit(relax.TupleGetItem(
                op.nn.batch_norm(x, *stats, axis=1, training=False), 0))
            h = builder.emit(op.nn.conv2d(normed, _const(rng, (channels, 3, 3, 3)), padding=1))
            result = builder.emit_output(op.mean(h, axis=[2, 3]))
        builder.emit_func_output(result)
    return builder.get(), None


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("build", [image_convnet, batch_norm_on_the_input],
                         ids=["conv", "batch_norm"])
def test_a_uint8_input_is_one_kernel_that_writes_the_compute_dtype(build, dtype):
    """The integer input's cast is in the function's dataflow block, so FuseOps puts it with
    its elementwise readers (a batch_norm that computes float32 from it) and no float32 copy
    of the input crosses a kernel boundary."""
    mod, _ = build()
    converted, report = relay_amp.convert(mod, dtype, target=CUDA,
                                          input_dtypes={"data": "uint8"},
                                          input_normalization={"data": IMAGENET_UINT8})
    lowered = lower_for_cuda(converted, CUDA)
    calls = [b for block in lowered["main"].body.blocks for b in block.bindings
             if isinstance(b.value, relax.Call) and b.value.op.name == "relax.call_tir"]
    readers = [b for b in calls if any(getattr(a, "name", "") == "data"
                                       for a in b.value.args[1].fields)]
    assert len(readers) == 1
    (reader,) = readers
    assert str(reader.var.ty.dtype) == dtype  # no float32 copy of the input exists
    float32 = [b for b in calls if str(getattr(b.var.ty, "dtype", "")) == "float32"]
    assert reader not in float32
    assert gpu_cost(converted, CUDA).casts == 0
