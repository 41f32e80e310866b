"""bfloat16 dot products on BFDOT (FEAT_BF16, ``+bf16``): eight multiply-accumulates per
instruction, where ``fmla v.4s`` does four.

``bfdot v.4s, v.8h, v.2h[j]`` adds to each of four float32 sums the products of a *pair* of
bfloat16 values: lane ``i`` gets ``b[2i] * a[2j] + b[2i+1] * a[2j+1]``. So a pair of the
reduction sits in adjacent halves of the register, for every output lane: a weight ``W[k, n]``
is read as ``W'[k // 2, n, k % 2]``. Two steps make the build read it so:

- :func:`packed_bfloat16_weights` (a Relax pass, before legalization): a bfloat16 matmul or
  NHWC convolution with float32 sums and a constant weight becomes a ``call_tir`` of the same
  sum written over the packed weight (``sum(p, t) a[.., 2p + t] * W'[p, n, t]``), the weight
  packed once, at build time. The sum keeps its order (``k = 2p + t``, ascending).
- :func:`bfdot_tile`: :class:`relay_amp.builds.cpu_pipeline.VectorizeDotProduct`'s register
  tile on that kernel runs four pairs of a row's values per vector load, each pair one lane of
  the ``bfdot``.

LLVM selects ``bfdot`` only from its intrinsic, and TVM's bfloat16 legalization turns the
intrinsic's operands into float32 vectors. The kernel instead passes raw 16-bit vectors to a
function of its own, :data:`LLVM_IR`, linked into the library (TVM's ``pragma_import_llvm``)
and inlined. LLVM 22 does not select the by-element form from the lane broadcast ARM's header
writes (it emits a ``dup`` per pair), so the function states the instruction in inline
assembly.

BFDOT rounds differently from the plain bfloat16 build (Arm's BFDotAdd: each pair summed
before it is added, denormals flushed), so the outputs equal that build's to float32 rounding
of the sums, not bit for bit.
"""

from __future__ import annotations

import tvm

from ..relax_utils import TVM_ERRORS, bfloat16_cast_source, mutate_functions, read_counts
from . import bfmmla
from .constants import constant_value
from .cpu_features import cpu_has
from .neon_tiles import _loads, _row_step, is_aarch64
from .schedule_rules import decide, link_llvm
from .tir_script import script

#: The functions the kernels call: ``relay_amp_bfdot(sums, pairs, row, j)`` is ``bfdot
#: sums.4s, pairs.8h, row.2h[j]``, ``j`` a constant after unrolling (the switch folds away);
#: ``relay_amp_bfmlalb``/``t(sums, a, b)`` multiply the even/odd halves of ``a`` and ``b`` into
#: ``sums`` (``bfmlalb``/``bfmlalt``).
LLVM_IR = "\n".join([
    "define linkonce_odr <4 x float> @relay_amp_bfdot(<4 x float> %acc, <8 x i16> %b, "
    "<4 x float> %a, i32 %j) alwaysinline {",
    "  switch i32 %j, label %l3 [ i32 0, label %l0 i32 1, label %l1 i32 2, label %l2 ]",
    *(line for j in range(4) for line in (
        f"l{j}:",
        f'  %r{j} = call <4 x float> asm "bfdot $0.4s, $2.8h, $3.2h[{j}]", "=w,0,w,w"'
        f"(<4 x float> %acc, <8 x i16> %b, <4 x float> %a) #0",
        f"  ret <4 x float> %r{j}")),
    "}",
    # no memory, so LLVM keeps the sums in registers across the tile
    "attributes #0 = { nounwind memory(none) }",
    *(line for half in "bt" for line in (
        f"define linkonce_odr <4 x float> @relay_amp_bfmlal{half}(<4 x float> %acc, "
        "<8 x i16> %a, <8 x i16> %b) alwaysinline {",
        "  %x = bitcast <8 x i16> %a to <8 x bfloat>",
        "  %y = bitcast <8 x i16> %b to <8 x bfloat>",
        f"  %r = call <4 x float> @llvm.aarch64.neon.bfmlal{half}(<4 x float> %acc, "
        "<8 x bfloat> %x, <8 x bfloat> %y)",
        "  ret <4 x float> %r",
        "}",
        f"declare <4 x float> @llvm.aarch64.neon.bfmlal{half}(<4 x float>, <8 x bfloat>, "
        "<8 x bfloat>)")),
])
#: Pairs of a row's values a tile adds per call, widest first: 8 (two loads of four pairs; the
#: sums are loaded and stored once per call), 4 (one load of eight bfloat16 values) or 2.
DEPTHS = (8, 4, 2)
#: How far apart a tile's rows may lie in the input: a convolution's strides.
STEPS = (1, 2)

_REGISTERED: dict = {}


def has_bfdot(target) -> bool:
    """Whether ``target`` is an aarch64 ``llvm`` target with FEAT_BF16 (``+bf16``, or an
    ``mcpu`` that has it)."""
    return is_aarch64(target) and cpu_has("bf16", target)


def _pack(weight, axis: int):
    """The weight with its reduction ``axis`` (next to last in a matmul's ``[K, N]``, third from
    last in HWIO) split into pairs, each pair after the output channel: ``[.., K/2, N, 2]``."""
    import numpy as np
    from tvm import relax

    value = weight
    shape = value.shape
    pairs = value.reshape(*shape[:axis], shape[axis] // 2, 2, *shape[axis + 1:])
    order = list(range(pairs.ndim))
    order.append(order.pop(axis + 1))
    return relax.const(np.ascontiguousarray(pairs.transpose(order)))


def _matmul(pairs, packed):
    """``pairs``: the input, its last axis reshaped into ``[K/2, 2]``, so that each index is
    an axis of the loop nest (what ``pad_einsum`` pads a symbolic row count of)."""
    from tvm import te

    p = te.reduce_axis((0, packed.shape[0]), "p")
    t = te.reduce_axis((0, 2), "t")
    return te.compute(
        (*pairs.shape[:-2], packed.shape[1]),
        lambda *i: te.sum(pairs[(*i[:-1], p, t)].astype("float32")
                          * packed[p, i[-1], t].astype("float32"), axis=[p, t]),
        name="matmul")


def shared_casts(func) -> set:
    """The bfloat16 variables of ``func`` bound to a cast of a float32 tensor that something
    else reads too, or of a parameter: the cast is then a kernel of its own (TVM fuses it into
    its producer's only where it is the producer's one reader), a pass over the tensor that a
    kernel copying its input anyway can do in that copy (:func:`cast_source`)."""
    from tvm import relax

    reads, params = read_counts(func), set(func.params)
    shared = set()
    for block in func.body.blocks if isinstance(func.body, relax.SeqExpr) else ():
        for binding in block.bindings:
            source = bfloat16_cast_source(getattr(binding, "value", None))
            if source is not None and (reads.get(source, 0) > 1 or source in params):
                shared.add(binding.var)
    return shared


def cast_source(mutator, x, shared: set):
    """The float32 tensor that ``x`` is a cast of, where ``x`` is among ``shared``
    (:func:`shared_casts`), else None."""
    from tvm import relax

    if not isinstance(x, relax.Var) or x not in shared:
        return None
    return mutator.lookup_binding(x).args[0]


def _padded(x, padding, extra_channels: int = 0):
    """``x`` padded with zeros (and ``extra_channels`` zero channels), as the 16-bit patterns
    of its values (:func:`~relay_amp.builds.bfmmla.bits`): TVM's bfloat16 legalization stores a
    kernel's own bfloat16 buffer in float32, where the ``bfdot`` reads a pair as 32 bits of the
    buffer."""
    from tvm import te, tirx

    top, left, bottom, right = padding
    n, height, width, channels = x.shape

    zero = tirx.const(0, "uint16")

    def value(b, h, w, c):
        inside = tirx.all(h >= top, h < height + top, w >= left, w < width + left)
        if not extra_channels:
            return tirx.if_then_else(inside, bfmmla.bits(x[b, h - top, w - left, c]), zero)
        # the extra channels are masked to zero. They read the next pixels' first channels
        # where the input goes on that far, so each pixel's channels load as one vector (a
        # condition on the channel would leave TVM's vectorizer one scalar store a channel);
        # the last pixels read their last channel again
        mask = tirx.Select(c < channels, tirx.const(0xFFFF, "uint16"), zero)
        pixel = (b * height + h - top) * width + w - left
        within = (pixel + 1) * channels + extra_channels <= n * height * width * channels
        return tirx.if_then_else(inside, tirx.bitwise_and(tirx.if_then_else(
            within, bfmmla.bits(x[b, h - top, w - left, c]),
            bfmmla.bits(x[b, h - top, w - left, tirx.min(c, channels - 1)])), mask), zero)

    return te.compute((n, height + top + bottom, width + left + right,
                       channels + extra_channels), value, name="pad_temp")


def _unpadded(sums, outputs: int):
    """``sums`` without the zero channels past ``outputs`` (a weight's channels padded to whole
    vectors), as a stage the write-back folds in."""
    from tvm import te

    if outputs == int(sums.shape[-1]):
        return sums
    return te.compute((*sums.shape[:-1], outputs), lambda *i: sums[i],
                      name=f"{sums.op.name}_unpadded")


def _conv2d(x, packed, strides, padding, dilation, outputs: int):
    """A groups-1 NHWC convolution over :func:`_pack`'s ``packed`` weight, its first
    ``outputs`` channels; ``x`` may be the float32 tensor the input is a cast of where the
    input is copied (padded)."""
    from tvm import te, tirx

    def element(*index):
        return x[index].astype("float32")

    extra = 2 * int(packed.shape[2]) - int(x.shape[3])  # zero channels to a multiple of 4
    if any(padding) or extra or str(x.dtype) != "bfloat16":
        x = _padded(x, padding, extra)

        def element(*index):  # noqa: F811 - the padded input holds bit patterns
            return tirx.reinterpret("bfloat16", x[index]).astype("float32")

    kh, kw, pairs, channels, _ = packed.shape
    (sh, sw), (dh, dw) = strides, dilation
    height = (x.shape[1] - (kh - 1) * dh - 1) // sh + 1
    width = (x.shape[2] - (kw - 1) * dw - 1) // sw + 1
    ry, rx = te.reduce_axis((0, kh), "ry"), te.reduce_axis((0, kw), "rx")
    p, t = te.reduce_axis((0, pairs), "p"), te.reduce_axis((0, 2), "t")
    return _unpadded(te.compute(
        (x.shape[0], height, width, channels),
        lambda n, h, w, c: te.sum(
            element(n, h * sh + ry * dh, w * sw + rx * dw, 2 * p + t)
            * packed[ry, rx, p, c, t].astype("float32"), axis=[ry, rx, p, t]),
        name="conv2d_nhwc"), outputs)


def _depthwise(x, weight, strides, padding, dilation):
    """A depthwise convolution, NHWC with an HWOI weight ``(kh, kw, C, 1)``, its padding as
    bit patterns (see :func:`_padded`), for :func:`tensorize_bfmlal`; a weight with more
    channels than ``x`` (zeros, to whole groups of eight) sums them over zero channels of the
    copy, and the output has ``x``'s."""
    from tvm import te, tirx

    kh, kw, channels, _ = weight.shape
    outputs = int(x.shape[3])
    x = _padded(x, padding, int(channels) - outputs)
    (sh, sw), (dh, dw) = strides, dilation
    height = (x.shape[1] - (kh - 1) * dh - 1) // sh + 1
    width = (x.shape[2] - (kw - 1) * dw - 1) // sw + 1
    ry, rx = te.reduce_axis((0, kh), "ry"), te.reduce_axis((0, kw), "rx")
    return _unpadded(te.compute(
        (x.shape[0], height, width, channels),
        lambda n, h, w, c: te.sum(
            tirx.reinterpret("bfloat16", x[n, h * sh + ry * dh, w * sw + rx * dw, c])
            .astype("float32") * weight[ry, rx, c, 0].astype("float32"), axis=[ry, rx]),
        name="depthwise_conv2d_nhwc"), outputs)


def _window(attrs) -> tuple:
    """A convolution's strides, padding and dilation, as lists of ints."""
    return tuple([int(n) for n in values]
                 for values in (attrs.strides, attrs.padding, attrs.dilation))


def _whole(weight, axis: int, multiple: int):
    """``weight`` with zero channels on ``axis`` up to a ``multiple`` of them: outputs a tile's
    vectors compute and the kernel never writes (:func:`_unpadded`)."""
    import numpy as np

    extra = -weight.shape[axis] % multiple
    if not extra:
        return weight
    widths = [(0, 0)] * weight.ndim
    widths[axis] = (0, extra)
    return np.pad(weight, widths)


def _rewrite(builder, call, weight, source=None):
    """The ``call_tir`` of ``call`` over its packed weight (``weight``: the value of its
    constant weight, or None), or None where it is not a bfloat16 op with float32 sums that
    :func:`packed_bfloat16_weights` writes: a matmul whose reduction has an even extent, a
    groups-1 NHWC/HWIO convolution (its output channels computed to whole vectors of four),
    a depthwise NHWC one (its channels computed to whole groups of eight, BFMLAL's). A
    convolution that copies its input (a depthwise one's padding, BFDOT's padding, a 1 x 1
    BFMMLA's pairs of pixels) reads ``source`` where given: the float32 tensor its input is a
    cast of."""
    from tvm import relax

    if weight is None or str(weight.dtype) != "bfloat16" or str(call.ty.dtype) != "float32" \
            or str(call.args[0].ty.dtype) != "bfloat16":
        return None
    rewritten = bfmmla.rewrite(builder, call, weight, source)
    if rewritten is not None:
        return rewritten
    name, x, attrs = call.op.name, call.args[0], call.attrs
    if name == "relax.matmul" and weight.ndim == 2 and weight.shape[0] % 2 == 0:
        shape = list(x.ty.shape)
        pairs = builder.emit(relax.op.reshape(x, [*shape[:-1], shape[-1] // 2, 2]))
        return builder.call_te(_matmul, pairs, _pack(weight, 0),
                               primfunc_name_hint="matmul_bfdot")
    if name != "relax.nn.conv2d" or weight.ndim != 4 or str(attrs.data_layout) != "NHWC" \
            or str(attrs.out_layout) != "NHWC":
        return None
    if str(attrs.kernel_layout) == "HWIO" and int(attrs.groups) == 1:
        weight = _whole(weight, 2, 4)  # whole pairs of pairs (and zero channels in the copy)
        copied = any(_window(attrs)[1]) or weight.shape[2] != int(x.ty.shape[3])
        outputs = weight.shape[3]
        return builder.call_te(_conv2d, x if source is None or not copied else source,
                               _pack(_whole(weight, 3, 4), 2), *_window(attrs), outputs,
                               primfunc_name_hint="conv2d_nhwc_bfdot")
    channels = {"HWOI": 2, "HWIO": 3}.get(str(attrs.kernel_layout))
    if channels and weight.shape[5 - channels] == 1 \
            and int(attrs.groups) == weight.shape[channels]:
        kh, kw = weight.shape[:2]  # (kh, kw, 1, C) and (kh, kw, C, 1): the same in memory
        return builder.call_te(_depthwise, x if source is None else source,
                               relax.const(_whole(weight.reshape(kh, kw, -1, 1), 2, 8)),
                               *_window(attrs),
                               primfunc_name_hint="depthwise_conv2d_nhwc_bfmlal")
    return None


def packed_bfloat16_weights(rule_log=None) -> tvm.transform.Pass:
    """The Relax pass: bfloat16 matmuls and NHWC convolutions with float32 sums and constant
    weights, as kernels over weights packed in pairs for :func:`bfdot_tile` (see the module's
    docstring). Others are left as they are. A convolution that copies its input anyway
    (BFMMLA's pairs of pixels, a depthwise one's padding) and whose input is a cast of a
    float32 tensor rounds that tensor in its copy (:func:`cast_source`); the cast is dropped
    where nothing else reads it.

    Parameters
    ----------
    rule_log : relay_amp.builds.schedule_rules.RuleLog, optional
        Gets the casts rounded in their readers' copies, for the build's report.

    Returns
    -------
    tvm.transform.Pass
    """
    from tvm import relax

    ops = {tvm.ir.Op.get(name) for name in ("relax.matmul", "relax.nn.conv2d")}

    @relax.expr_functor.mutator
    class Packed(relax.PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            if isinstance(call.op, tvm.ir.Op) and call.op in ops:
                weight = constant_value(self, call.args[1]) if len(call.args) > 1 else None
                try:
                    rewritten = _rewrite(self.builder_, call, weight,
                                         cast_source(self, call.args[0], self.shared))
                except TVM_ERRORS:  # an op TE cannot write so keeps TVM's kernel
                    rewritten = None
                if rewritten is not None:
                    return rewritten
            return call

    @tvm.transform.module_pass(opt_level=0, name="relay_amp.packed_bfloat16_weights")
    def _pack_module(mod, context):
        packed = Packed(mod)
        packed.shared = set().union(*(shared_casts(func) for func in mod.functions.values()
                                      if isinstance(func, relax.Function)))
        # the unpacked weights, and the casts whose rounding a kernel's copy now does
        out = relax.transform.DeadCodeElimination()(mutate_functions(packed))
        left = set().union(*(read_counts(func) for func in out.functions.values()
                             if isinstance(func, relax.Function)))
        folded = sorted(var.name for var in packed.shared if var not in left)
        if rule_log is not None and folded:
            rule_log.scheduled("<relax: packed_bfloat16_weights>", "bfdot", tuple(
                f"{name}: its rounding to bfloat16 done in the copies of the kernels that read"
                " it, no kernel of its own" for name in folded))
        return out

    return _pack_module


class _Rows:
    """How a register tile reads its rows' values: ``depth`` pairs a load, ``stored`` as
    "bfloat16" or "uint16" bit patterns, indexed ``[row * step, 2p + t]`` or, ``paired``,
    ``[row, p, t]``; without a row index where the tile has one row."""

    def __init__(self, depth: int, stored: str, paired: bool, step: int):
        self.depth, self.stored, self.paired, self.step = depth, stored, paired, step

    def shape(self, rows: int) -> tuple:
        if self.paired:
            return (rows, self.depth, 2)
        return ((rows - 1) * self.step + 1, 2 * self.depth)

    def region(self, A, rows):
        depth = self.depth
        if rows is None:
            return A[0:depth, 0:2] if self.paired else A[0:2 * depth]
        return A[0:rows, 0:depth, 0:2] if self.paired else \
            A[0:(rows - 1) * self.step + 1, 0:2 * depth]

    def _value(self, loaded):
        from tvm.script import tirx as T

        return loaded if self.stored == "bfloat16" else T.reinterpret("bfloat16", loaded)

    def value(self, A, r, p, t):
        return self._value(A[r, p, t] if self.paired else A[r * self.step, p * 2 + t])

    def value_row(self, A, p, t):
        return self._value(A[p, t] if self.paired else A[p * 2 + t])

    def vector(self, A, r, p):
        """The four pairs of row ``r`` that pair ``p`` is among, as the four 32-bit lanes
        ``bfdot`` picks a pair from (lane ``p % 4``)."""
        from tvm.script import tirx as T

        width, stored = min(self.depth, 4), self.stored
        chunk = p // 4 * 4  # the first pair of the load
        index = [chunk, 0] if self.paired else [chunk * 2]
        loaded = A.vload(index if r is None else [r * self.step, *index],
                         f"{stored}x{2 * width}")
        if stored != "uint16":
            loaded = T.reinterpret(f"uint16x{2 * width}", loaded)
        if width < 4:
            zeros = tvm.tirx.Broadcast(tvm.tirx.IntImm("uint16", 0), 8 - 2 * width)
            loaded = tvm.tirx.Shuffle([loaded, zeros], list(range(8)))
        return T.reinterpret("float32x4", loaded)


def _intrinsic(rows: int, depth: int, lanes: int, scope: str, stored: str,
               paired: bool, step: int = 1) -> str:
    """The tensor intrinsic: ``rows`` x ``lanes`` float32 sums in a ``scope`` buffer, each
    adding ``depth`` pairs of products, a row's ``2 * depth`` values (one load) times the
    packed weight's ``[depth, lanes, 2]``, one ``bfdot`` per row, pair and four lanes. The
    rows' values are ``stored`` as "bfloat16" or as their "uint16" bit patterns, and indexed
    ``[row, 2p + t]`` or, ``paired``, ``[row, p, t]`` (a matmul's input, reshaped). ``rows``
    0: a tile of one row, without a loop over rows (a 7-wide feature map, a matmul of one
    row). ``step``: rows of the tile ``step`` rows apart in the input (a convolution of stride
    ``step``)."""
    key = (rows, depth, lanes, scope, stored, paired, step)
    if key in _REGISTERED:
        return _REGISTERED[key]
    from tvm.s_tir import TensorIntrin
    from tvm.script import tirx as T

    rows_of = _Rows(depth, stored, paired, step)
    row, value, value_row = rows_of.vector, rows_of.value, rows_of.value_row
    shape, one_row = rows_of.shape(rows), rows_of.shape(rows)[1:]

    def whole(A):
        return rows_of.region(A, rows)

    def whole_row(A):
        return rows_of.region(A, None)

    def update(C, A, B, r, p, g):
        sums = C[r, tvm.tirx.Ramp(g * 4, 1, 4)]
        pairs = T.reinterpret("uint16x8", B.vload([p, g * 4, 0], "bfloat16x8"))
        return T.call_pure_extern("float32x4", "relay_amp_bfdot", sums, pairs, row(A, r, p),
                                  T.Cast("int32", p % 4))

    @script.prim_func(s_tir=True)
    def desc(a: T.handle, b: T.handle, c: T.handle) -> None:
        sa, sb, sc = T.int64(), T.int64(), T.int64()
        A = T.match_buffer(a, shape, stored, offset_factor=1,
                           strides=[sa, 2, 1] if paired else [sa, 1])
        B = T.match_buffer(b, (depth, lanes, 2), "bfloat16", offset_factor=1,
                           strides=[sb, 2, 1])
        C = T.match_buffer(c, (rows, lanes), "float32", offset_factor=1, strides=[sc, 1],
                           scope=scope)
        with T.sblock("root"):
            T.reads(C[0:rows, 0:lanes], whole(A), B[0:depth, 0:lanes, 0:2])
            T.writes(C[0:rows, 0:lanes])
            for p, t, r, i in T.grid(depth, 2, rows, lanes):
                with T.sblock("update"):
                    vr, vi, vp, vt = T.axis.remap("SSRR", [r, i, p, t])
                    C[vr, vi] = C[vr, vi] + T.Cast("float32", value(A, vr, vp, vt)) \
                        * T.Cast("float32", B[vp, vi, vt])

    @script.prim_func(s_tir=True)
    def impl(a: T.handle, b: T.handle, c: T.handle) -> None:
        sa, sb, sc = T.int64(), T.int64(), T.int64()
        A = T.match_buffer(a, shape, stored, offset_factor=1,
                           strides=[sa, 2, 1] if paired else [sa, 1])
        B = T.match_buffer(b, (depth, lanes, 2), "bfloat16", offset_factor=1,
                           strides=[sb, 2, 1])
        C = T.match_buffer(c, (rows, lanes), "float32", offset_factor=1, strides=[sc, 1],
                           scope=scope)
        with T.sblock("root"):
            T.reads(C[0:rows, 0:lanes], whole(A), B[0:depth, 0:lanes, 0:2])
            T.writes(C[0:rows, 0:lanes])
            for p in T.unroll(depth):
                for r in T.unroll(rows):
                    for g in T.unroll(lanes // 4):
                        C[r, T.ramp(g * 4, 1, 4)] = update(C, A, B, r, p, g)

    @script.prim_func(s_tir=True)
    def desc_one_row(a: T.handle, b: T.handle, c: T.handle) -> None:
        sb = T.int64()
        A = T.match_buffer(a, one_row, stored, offset_factor=1)
        B = T.match_buffer(b, (depth, lanes, 2), "bfloat16", offset_factor=1,
                           strides=[sb, 2, 1])
        C = T.match_buffer(c, (lanes,), "float32", offset_factor=1, scope=scope)
        with T.sblock("root"):
            T.reads(C[0:lanes], whole_row(A), B[0:depth, 0:lanes, 0:2])
            T.writes(C[0:lanes])
            for p, t, i in T.grid(depth, 2, lanes):
                with T.sblock("update"):
                    vi, vp, vt = T.axis.remap("SRR", [i, p, t])
                    C[vi] = C[vi] + T.Cast("float32", value_row(A, vp, vt)) \
                        * T.Cast("float32", B[vp, vi, vt])

    @script.prim_func(s_tir=True)
    def impl_one_row(a: T.handle, b: T.handle, c: T.handle) -> None:
        sb = T.int64()
        A = T.match_buffer(a, one_row, stored, offset_factor=1)
        B = T.match_buffer(b, (depth, lanes, 2), "bfloat16", offset_factor=1,
                           strides=[sb, 2, 1])
        C = T.match_buffer(c, (lanes,), "float32", offset_factor=1, scope=scope)
        with T.sblock("root"):
            T.reads(C[0:lanes], whole_row(A), B[0:depth, 0:lanes, 0:2])
            T.writes(C[0:lanes])
            for p in T.unroll(depth):
                for g in T.unroll(lanes // 4):
                    C[T.ramp(g * 4, 1, 4)] = T.call_pure_extern(
                        "float32x4", "relay_amp_bfdot", C[T.ramp(g * 4, 1, 4)],
                        T.reinterpret("uint16x8", B.vload([p, g * 4, 0], "bfloat16x8")),
                        row(A, None, p), T.Cast("int32", p % 4))

    name = (f"relay_amp_bfdot_{stored}{'_paired' if paired else ''}_{rows or 'one'}x{lanes}"
            f"_p{depth}_s{step}_{scope}")
    if not rows:
        desc, impl = desc_one_row, impl_one_row
    TensorIntrin.register(name, desc, impl, override=True)
    _REGISTERED[key] = name
    return name


def _halves(c) -> list:
    """Where a depthwise tile keeps channel ``c``'s sum: in its group of eight, the even
    channels' four, then the odd channels' four (the lanes ``bfmlalb`` and ``bfmlalt``
    write)."""
    return [c // 8, c % 2, c % 8 // 2]


def _bfmlal_intrinsic(lanes: int, stored: str, scope: str) -> str:
    """Per tap of a depthwise convolution: ``lanes`` (a multiple of 8) float32 sums plus an
    input vector (stored as "bfloat16" or "uint16" bit patterns) times a weight vector
    (``(lanes, 1)``). Each eight channels' sums are kept as the even channels' four, then the
    odd channels' four (``C[c // 8, c % 2, c % 8 // 2]``: :func:`_halves`), so that one
    ``bfmlalb`` (even channels) and one ``bfmlalt`` (odd) each update four adjacent sums, which
    LLVM keeps in a register across a tile's rows and taps."""
    key = ("bfmlal", lanes, stored, scope)
    if key in _REGISTERED:
        return _REGISTERED[key]
    from tvm.s_tir import TensorIntrin
    from tvm.script import tirx as T

    groups = lanes // 8

    def value(P, i):
        return P[i] if stored == "bfloat16" else T.reinterpret("bfloat16", P[i])

    def bits(buffer, offset, dtype, units):
        loaded = buffer.vload([offset] + [0] * units, f"{dtype}x8")
        return loaded if dtype == "uint16" else T.reinterpret("uint16x8", loaded)

    def update(C, P, Q, g, half):
        return T.call_pure_extern("float32x4", f"relay_amp_bfmlal{half}",
                                  C[g, half == "t", T.ramp(0, 1, 4)],
                                  bits(P, g * 8, stored, 0), bits(Q, g * 8, "bfloat16", 1))

    @script.prim_func(s_tir=True)
    def desc(p: T.handle, q: T.handle, c: T.handle) -> None:
        P = T.match_buffer(p, (lanes,), stored, offset_factor=1)
        Q = T.match_buffer(q, (lanes, 1), "bfloat16", offset_factor=1)
        C = T.match_buffer(c, (groups, 2, 4), "float32", offset_factor=1, scope=scope)
        with T.sblock("root"):
            T.reads(C[0:groups, 0:2, 0:4], P[0:lanes], Q[0:lanes, 0:1])
            T.writes(C[0:groups, 0:2, 0:4])
            for i in T.serial(0, lanes):
                with T.sblock("update"):
                    vi = T.axis.remap("S", [i])
                    C[vi // 8, vi % 2, vi % 8 // 2] = C[vi // 8, vi % 2, vi % 8 // 2] \
                        + T.Cast("float32", value(P, vi)) * T.Cast("float32", Q[vi, 0])

    @script.prim_func(s_tir=True)
    def impl(p: T.handle, q: T.handle, c: T.handle) -> None:
        P = T.match_buffer(p, (lanes,), stored, offset_factor=1)
        Q = T.match_buffer(q, (lanes, 1), "bfloat16", offset_factor=1)
        C = T.match_buffer(c, (groups, 2, 4), "float32", offset_factor=1, scope=scope)
        with T.sblock("root"):
            T.reads(C[0:groups, 0:2, 0:4], P[0:lanes], Q[0:lanes, 0:1])
            T.writes(C[0:groups, 0:2, 0:4])
            for g in T.unroll(groups):
                C[g, 0, T.ramp(0, 1, 4)] = update(C, P, Q, g, "b")
                C[g, 1, T.ramp(0, 1, 4)] = update(C, P, Q, g, "t")

    name = f"relay_amp_bfmlal_{stored}_{lanes}_{scope}"
    TensorIntrin.register(name, desc, impl, override=True)
    _REGISTERED[key] = name
    return name


def tensorize_bfmlal(sch, tile, lanes_loop, lanes: int, scope: str) -> bool:
    """Tensorize the update under ``lanes_loop`` of a depthwise convolution
    :func:`packed_bfloat16_weights` wrote (an input and a ``(.., C, 1)`` weight, both vectors
    of the lanes) into ``bfmlalb``/``bfmlalt``, its sums first laid out by :func:`_halves`;
    the ``tile`` loop links :data:`LLVM_IR`. False where it is not that or ``lanes`` is not a
    multiple of 8 (``sch`` unchanged), or where the tensorization fails after the layout (the
    sums keep it, which the write-back reads as it reads any other)."""
    from tvm import s_tir

    from .neon_tiles import _operands

    if lanes % 8 or _operands(sch, lanes_loop) != (0, 1):
        return False
    stored = str(_loads(sch.get(lanes_loop).body.block)[0].source.dtype)
    update = sch.get_child_blocks(lanes_loop)[0]
    try:
        sch.transform_layout(update, ("write", 0),
                             lambda *index: [*index[:-1], *_halves(index[-1])])
        sch.tensorize(lanes_loop, _bfmlal_intrinsic(lanes, stored, scope))
    except (s_tir.ScheduleError, RuntimeError):  # TVMScript's DiagnosticError is one
        return False
    link_llvm(sch, tile, LLVM_IR)
    return True


def bfdot_tile(sch, tile, lanes_loop, rows_loop, reduce_loops, lanes: int, rows: int,
               scope: str):
    """A copy of ``sch`` whose tile runs on ``bfdot``, or None where the kernel is not one
    :func:`packed_bfloat16_weights` wrote (its last two reductions the pairs and the pair's
    halves) or lanes are not a multiple of 4 (without ``rows_loop``, a tile of one row): the
    pairs' loop is split by the depth (:data:`DEPTHS`) and its inner part tensorized, its rows
    :data:`STEPS` apart in the input; the ``tile`` loop links :data:`LLVM_IR`."""
    from tvm import s_tir

    if lanes % 4 or len(reduce_loops) < 2:
        return None
    pairs, halves = (sch.get(loop) for loop in reduce_loops[-2:])
    if not isinstance(halves.extent, tvm.tirx.IntImm) or int(halves.extent) != 2 \
            or not isinstance(pairs.extent, tvm.tirx.IntImm):
        return None
    depth = next((d for d in DEPTHS if int(pairs.extent) % d == 0), None)
    if depth is None:  # an odd number of pairs: one at a time costs more than it saves
        return None
    row_values = _loads(sch.get(lanes_loop).body.block)[0]
    func = sch.mod["main"]
    if str(row_values.source.dtype) == "bfloat16" and not any(
            row_values.source.same_as(b) for b in func.params):
        return None  # a kernel's own bfloat16 buffer (a padded copy) is stored as float32
    last = row_values.source.shape[-1]  # a matmul's input in pairs: [.., K / 2, 2]
    stored = str(row_values.source.dtype)
    paired = len(row_values.indices) > 1 and isinstance(last, tvm.tirx.IntImm) and int(last) == 2
    steps = (1,)
    if rows_loop is not None and not paired:
        step = _row_step(sch.get(lanes_loop).body, row_values, sch.get(rows_loop).loop_var)
        steps = (step,) if step in STEPS else ()
    for step in steps:
        trial = sch.copy()
        name = _intrinsic(rows if rows_loop is not None else 0, depth, lanes, scope, stored,
                          paired, step)
        try:
            _, inner = trial.split(reduce_loops[-2], [None, depth])
            trial.tensorize(inner, name)
            link_llvm(trial, tile, LLVM_IR)
        except (s_tir.ScheduleError, RuntimeError):  # TVMScript's DiagnosticError is one
            continue
        decide(f"update: tensor intrinsic {name}")
        return trial
    return None


__all__ = ["DEPTHS", "LLVM_IR", "bfdot_tile", "has_bfdot", "packed_bfloat16_weights",
           "tensorize_bfmlal"]
