"""float32 convolution and matmul weights packed at build time in panels of the x86 register
tile's lanes.

In HWIO a tile of ``lanes`` output channels reads, per reduction step, ``lanes`` weights that
lie a whole row of output channels apart from the next step's: a 3x3 convolution of 256
channels reads 128 bytes of every kilobyte, and the tile waits on those loads (sampled with
``perf`` on this host: a fifth of the kernel's time on the weights' loads). Packed as
``W'[n // lanes, kh, kw, ci, n % lanes]``, the panel a tile reads is contiguous, in the order it
reads it, as MLAS's and XNNPACK's packed weights are.

:func:`packed_weights` (a Relax pass, after :mod:`relay_amp.builds.nhwc`): a float32
groups-1 NHWC/HWIO convolution with a constant weight becomes a ``call_tir`` of the same sum
over the packed weight, its lanes those :func:`relay_amp.builds.x86_tiles.tile_shape` gives the
kernel's tile, so that :class:`relay_amp.builds.cpu_pipeline.VectorizeDotProduct` finds them
contiguous. The sum keeps TOPI's order (``kh``, ``kw``, ``ci``): the outputs are the unpacked
build's bit for bit. A float32 matmul by a constant ``[K, N]`` weight (a transformer's
projections) is packed the same way, ``W'[n // lanes, k, n % lanes]``: unpacked, its tile read
128 bytes of each 12-kilobyte row of a 768 x 3072 weight per step (BERT-base's feed-forward).
Its kernel computes the sums as ``[rows, n // lanes, n % lanes]``, each index one iterator, so
that TVM's ``pad_einsum`` can pad the rows to the tile's where their count is symbolic (a
sequence) or has no divisor that suits the tile (ViT's 197 tokens); a weight whose ``N`` is
not a multiple of a vector (GPT-2's 50,257-word head) gets zero columns
(:func:`padded_outputs`), and so does a convolution's (MobileNetV2's 24 channels on AVX-512,
its 1,000-class 1 x 1 classifier). Either way the kernel writes only the real outputs.
"""

from __future__ import annotations

import tvm

from ..relax_utils import TVM_ERRORS, mutate_functions
from .bfdot import _window
from .constants import const, constant_value
from .x86_tiles import TILE_VECTORS, row_vectors, tile_shape, vector_registers, vector_width


def _conv2d(x, packed, strides, padding, dilation, outputs: int):
    from tvm import te, topi

    batch, height, width, _ = x.shape
    blocks, kh, kw, channels, lanes = packed.shape
    if any(padding):
        x = topi.nn.pad(x, [0, padding[0], padding[1], 0], [0, padding[2], padding[3], 0])
    out_h = (height + padding[0] + padding[2] - (kh - 1) * dilation[0] - 1) // strides[0] + 1
    out_w = (width + padding[1] + padding[3] - (kw - 1) * dilation[1] - 1) // strides[1] + 1
    ry, rx = te.reduce_axis((0, kh), "ry"), te.reduce_axis((0, kw), "rx")
    rc = te.reduce_axis((0, channels), "rc")
    sums = te.compute(
        (batch, out_h, out_w, blocks * lanes),
        lambda b, y, w, f: te.sum(
            x[b, y * strides[0] + ry * dilation[0], w * strides[1] + rx * dilation[1], rc]
            * packed[f // lanes, ry, rx, rc, f % lanes], axis=[ry, rx, rc]),
        name="conv2d_nhwc_packed")
    if outputs == blocks * lanes:
        return sums
    return te.compute((batch, out_h, out_w, outputs), lambda *i: sums[i],
                      name="conv2d_nhwc_unpadded")


def _matmul(x, packed, outputs: int):
    from tvm import te

    blocks, depth, lanes = packed.shape
    k = te.reduce_axis((0, depth), "k")
    # the sums as [rows, panel, lanes], each index one iterator, which TVM's pad_einsum needs
    # to pad a symbolic row count; the second stage, a view of their first ``outputs`` columns,
    # is the kernel's output
    sums = te.compute(
        (*x.shape[:-1], blocks, lanes),
        lambda *i: te.sum(x[(*i[:-2], k)] * packed[i[-2], k, i[-1]], axis=k),
        name="matmul_packed")
    return te.compute((*x.shape[:-1], outputs),
                      lambda *i: sums[(*i[:-1], i[-1] // lanes, i[-1] % lanes)],
                      name="matmul_unpacked")


#: The most zero columns :func:`padded_outputs` adds, as a fraction of the real ones.
PADDED_OUTPUTS_WASTE = 1 / 8


def padded_outputs(outputs: int, width: int) -> int:
    """A weight's ``outputs`` columns, or, where they are not a multiple of the vector
    ``width`` (GPT-2's 50,257-word head, a classifier's 1,000 classes, MobileNetV2's 24
    channels), the next multiple of the widest tile lanes (:data:`TILE_VECTORS`) that adds at
    most :data:`PADDED_OUTPUTS_WASTE` of them, else of one vector: the weight gets zero
    columns, whose sums the kernel computes and never writes, so that every tile of lanes is
    whole (and a matrix times one row gets a chain of FMAs for each of several vectors)."""
    if outputs % width == 0:
        return outputs
    for vectors in sorted(TILE_VECTORS, reverse=True):
        padded = -(-outputs // (vectors * width)) * vectors * width
        if padded - outputs <= PADDED_OUTPUTS_WASTE * outputs or vectors == 1:
            return padded
    raise AssertionError("TILE_VECTORS holds 1")


def matmul_panel_lanes(call, target) -> int | None:
    """The lanes of the tile that will compute ``call`` (a matmul by a ``[K, N]`` weight, N
    padded by :func:`padded_outputs`), by :func:`relay_amp.builds.x86_tiles.tile_shape` over
    its rows as the schedule rule sees them (the constant row axes where one takes
    :data:`~relay_amp.builds.cpu_pipeline.BLOCK_ROWS`, else a symbolic one; either padded to
    the tile's rows where that costs less an FMA); None where no tile fits or the target has
    none."""
    from .cpu_pipeline import BLOCK_ROWS

    width = vector_width(target)
    shape = list(call.ty.shape)
    if width is None or len(shape) < 2 or not isinstance(shape[-1], tvm.tirx.IntImm):
        return None
    constant = [int(n) for n in shape[-2::-1] if isinstance(n, tvm.tirx.IntImm)]
    symbolic = len(constant) < len(shape) - 1
    rows = constant if not symbolic or any(
        n % r == 0 for r in BLOCK_ROWS for n in constant) else [None]
    tile = tile_shape(padded_outputs(int(shape[-1]), width), rows, width,
                      vector_registers(target), paddable=True)
    return None if tile is None else tile[0]


def panel_lanes(call, target) -> int | None:
    """The lanes of the tile that will compute ``call`` (an NHWC convolution, its channels
    padded by :func:`padded_outputs`), by :func:`relay_amp.builds.x86_tiles.tile_shape` over
    its output's axes as the schedule rule sees them; one row's lanes (a classifier's 1 x 1
    convolution of a pooled pixel) as the rule's one-row tile takes them; None where no tile
    fits, the target has no tile, or the channels are fewer than a vector (YOLOv8n's one-channel
    box decoding: TVM's kernel)."""
    width = vector_width(target)
    shape = call.ty.shape
    if width is None or not all(isinstance(n, tvm.tirx.IntImm) for n in shape):
        return None
    batch, height, out_w, channels = (int(n) for n in shape)
    if channels < width:  # fewer than one vector: zeros would be most of its FMAs
        return None
    channels = padded_outputs(channels, width)
    tile = tile_shape(channels, [out_w, height, batch], width, vector_registers(target))
    if tile is None and batch * height * out_w == 1:
        vectors = row_vectors(channels, width)
        return None if vectors is None else vectors * width
    return None if tile is None else tile[0]


def _rewrite_matmul(builder, call, weight, target):
    import numpy as np

    if weight is None or weight.ndim != 2 or str(weight.dtype) != "float32" \
            or str(call.ty.dtype) != "float32" or str(call.args[0].ty.dtype) != "float32":
        return None
    lanes = matmul_panel_lanes(call, target)
    if lanes is None:
        return None
    depth, outputs = weight.shape
    padding = padded_outputs(outputs, vector_width(target)) - outputs
    padded = np.pad(weight, [(0, 0), (0, padding)]) if padding else weight
    panels = padded.reshape(depth, -1, lanes).transpose(1, 0, 2)
    return builder.call_te(_matmul, call.args[0], const(panels), outputs,
                           primfunc_name_hint="matmul_packed")


def _rewrite(builder, call, weight, target):
    if call.op.name == "relax.matmul":
        return _rewrite_matmul(builder, call, weight, target)
    attrs = call.attrs
    if weight is None or weight.ndim != 4 or str(weight.dtype) != "float32" \
            or str(call.ty.dtype) != "float32" or str(call.args[0].ty.dtype) != "float32" \
            or str(attrs.data_layout) != "NHWC" or str(attrs.out_layout) != "NHWC" \
            or str(attrs.kernel_layout) != "HWIO" or int(attrs.groups) != 1:
        return None
    lanes = panel_lanes(call, target)
    if lanes is None:
        return None
    import numpy as np

    kh, kw, channels, outputs = weight.shape
    padding = padded_outputs(outputs, vector_width(target)) - outputs
    padded = np.pad(weight, [(0, 0)] * 3 + [(0, padding)]) if padding else weight
    panels = padded.reshape(kh, kw, channels, -1, lanes).transpose(3, 0, 1, 2, 4)
    return builder.call_te(_conv2d, call.args[0], const(panels), *_window(attrs), outputs,
                           primfunc_name_hint="conv2d_nhwc_packed")


def packed_weights(target) -> tvm.transform.Pass:
    """The Relax pass: float32 groups-1 NHWC convolutions and matmuls with constant weights, as
    kernels over weights packed in panels of their tile's lanes (see the module's docstring);
    others, and every op for a target without an x86 tile, left as they are.

    Parameters
    ----------
    target : tvm.target.Target

    Returns
    -------
    tvm.transform.Pass
    """
    from tvm import relax

    ops = [tvm.ir.Op.get(name) for name in ("relax.nn.conv2d", "relax.matmul")]

    @relax.expr_functor.mutator
    class Packed(relax.PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            if isinstance(call.op, tvm.ir.Op) and any(call.op.same_as(op) for op in ops):
                try:
                    rewritten = _rewrite(self.builder_, call,
                                         constant_value(self, call.args[1]), target)
                except TVM_ERRORS:  # an op TE cannot write so keeps TVM's kernel
                    rewritten = None
                if rewritten is not None:
                    return rewritten
            return call

    @tvm.transform.module_pass(opt_level=0, name="relay_amp.packed_weights")
    def _pack_module(mod, context):
        # the unpacked weights the kernels no longer read
        return relax.transform.DeadCodeElimination()(mutate_functions(Packed(mod)))

    return _pack_module


__all__ = ["matmul_panel_lanes", "packed_weights", "padded_outputs", "panel_lanes"]
