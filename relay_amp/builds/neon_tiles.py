"""aarch64 dot products on NEON register tiles: FMLA by element for float32, FMLAL for float16.

:class:`relay_amp.builds.cpu_pipeline.VectorizeDotProduct` leaves a tile's update as rows of
``sums[r, l] += a[r] * b[l]`` over ``lanes`` adjacent outputs: one operand a scalar per row (a
matmul row's element, an NHWC convolution's input channel), the other a vector the lanes read.
LLVM's vectorizer turns that into one FMA per 4 lanes, but loads each scalar on its own, with
its address computed, and for float16 operands widens everything it loads (``fcvtl``,
``fcvt``) before a float32 ``fmla v.4s``: it never emits ``fmlal`` from such TIR.

Two tensor intrinsics, tried in this order:

- :func:`register_tile`: where the scalar operand's innermost axis is a reduction (``k``), the
  tile adds ``depth`` values of ``k`` at once: one vector load of each row's scalars, and each
  product reads its scalar as a lane of that register (``fmla v.4s, v.4s, v.s[k]``;
  ``fmlal v.4s, v.4h, v.h[k]`` for float16): the register tile of XNNPACK's and MLAS's GEMM
  micro-kernels.
- :func:`tensorize_fmlal` (float16 only): any other float16 update whose vector operands are
  contiguous (a depthwise convolution, an NCHW convolution), one ``k`` at a time.

FMLAL (``+fp16fml``) multiplies two float16 values exactly in float32 and adds the product with
one rounding, as the FMA LLVM contracts the widened TIR into, and every output sums in the same
order: the outputs are the plain build's bit for bit (float16), or to FMA contraction (float32,
whose plain build contracts the same way).
"""

from __future__ import annotations

import tvm

from .cpu_features import cpu_has
from .schedule_rules import decide, uses
from .tir_script import script

#: The tensor intrinsics registered so far: (lanes, operands, scope) -> name.
_REGISTERED: dict = {}
#: How far apart in the scalar operand a register tile's rows may be: adjacent, or every other
#: row (a convolution of stride 2).
STEPS = (1, 2)
#: Reduction steps a float16 register tile adds per call, by preference: a power of two is one
#: load a row; 7, 5 or 3 (an RGB image's channels) two overlapping ones.
FLOAT16_DEPTHS = (8, 4, 2, 7, 5, 3)
#: The vector registers a register tile may hold at once: its sums, one step's vectors of the
#: lanes and its rows' scalars (NEON has 32; two are left to LLVM, which spills past them).
TILE_REGISTERS = 30
#: The most rows a register tile computes, and the lanes it may take (float32 lanes: four to a
#: register).
TILE_ROWS, TILE_LANES = 8, (16, 12, 8)


def tile_shape(extent: int, row_extents) -> tuple | None:
    """``(lanes, rows, n)``: the register tile for an output axis of ``extent`` lanes and row
    axes of ``row_extents`` (constant extents; ``n`` the one taken) that executes the fewest
    loads per FMA, among those whose rows divide their axis and whose registers fit
    (:data:`TILE_REGISTERS`); None where no axis has 2 rows or more.

    Per four steps of the reduction a tile of ``rows`` x ``lanes`` executes ``rows * lanes``
    FMAs (by element, four lanes each), one load of each row's four scalars and the weights'
    ``lanes`` vectors in pairs (``ldp``): ``(rows + lanes / 2) / (rows * lanes)`` loads an FMA,
    4 x 16 and 8 x 8 alike (0.19), 7 x 8 0.20, 2 x 16 0.31. Ties go to more lanes, then to the
    first axis."""
    options = []
    for lanes in TILE_LANES:
        if extent % lanes:
            continue
        for n, rows_extent in enumerate(row_extents):
            for rows in range(TILE_ROWS, 1, -1):
                sums, vectors = rows * lanes // 4, lanes // 4
                if rows_extent % rows or sums + vectors + rows > TILE_REGISTERS:
                    continue
                cost = (rows + lanes / 2) / (rows * lanes)
                options.append((round(cost, 9), -lanes, n, -rows))
    if not options:
        return None
    _, lanes, n, rows = min(options)
    return -lanes, -rows, n


def is_aarch64(target) -> bool:
    """Whether the ``llvm`` target ``target`` compiles for aarch64 (its ``mtriple`` or, without
    one, this machine's)."""
    triple = target.attrs.get("mtriple") or tvm.target.codegen.llvm_get_system_triple()
    return target.kind.name == "llvm" and str(triple).startswith(("aarch64", "arm64"))


def has_fmlal(target) -> bool:
    """Whether ``target`` is an aarch64 ``llvm`` target with FEAT_FHM (``+fp16fml``, or an
    ``mcpu`` that has it)."""
    return is_aarch64(target) and cpu_has("fp16fml", target)


def lane_rows(extent: int, channels: int, lanes_options=TILE_LANES) -> tuple | None:
    """``(lanes, rows)`` for a dot product whose operands are both vectors of the lanes (a
    depthwise convolution: input and weight), ``rows`` adjacent outputs of an axis of ``extent``
    sharing the weight's vectors: per reduction step ``rows`` input vectors and one weight
    vector feed ``rows`` FMAs, ``(rows + 1) / rows`` loads an FMA (2 with one row), so the most
    rows whose sums and inputs fit :data:`TILE_REGISTERS`, ties to more lanes (of
    ``lanes_options``); None where no two rows divide the axis or no lanes divide
    ``channels``."""
    options = []
    for lanes in lanes_options:
        if channels % lanes:
            continue
        vectors = lanes // 4
        for rows in range(TILE_ROWS, 1, -1):
            if extent % rows == 0 and 2 * rows * vectors + vectors <= TILE_REGISTERS:
                options.append((-rows, -lanes))
    if not options:
        return None
    rows, lanes = min(options)
    return -lanes, -rows


def _low_half(four):
    """Four float16 values as the low half of the eight ``fmlal`` reads (it multiplies the low
    four only). The high half is zeros, not a copy: the 64-bit load already zeroes the top of
    its register, where a copy cost an ``ins v.d[1]`` per load."""
    zeros = tvm.tirx.Broadcast(tvm.tirx.FloatImm("float16", 0.0), 4)
    return tvm.tirx.Shuffle([four, zeros], list(range(8)))

def _intrinsic(lanes: int, operands: tuple, scope: str) -> str:
    """The name of the tensor intrinsic for ``lanes`` sums in a ``scope`` buffer, registered
    on first use. ``operands``: for the product's first and second operand, None where it is
    one scalar for all lanes, else the number of unit axes after its lanes axis (a depthwise
    weight's ``(kh, kw, c, 1)``): ``(None, 0)`` a matmul's row element times a weight row,
    ``(0, None)`` a convolution's input times its weight, ``(0, 1)`` a depthwise convolution
    over channels. The description reads them in that order, as the block does."""
    key = (lanes, operands, scope)
    if key in _REGISTERED:
        return _REGISTERED[key]
    from tvm.s_tir import TensorIntrin
    from tvm.script import tirx as T

    p_shape, q_shape = ((1,) if units is None else (lanes,) + (1,) * units
                        for units in operands)
    p_len, q_len = p_shape[0], q_shape[0]
    vectors = tuple(units is not None for units in operands)

    def element(buffer, vector, i):
        return buffer[(i if vector else 0,) + (0,) * (len(buffer.shape) - 1)]

    def halves(buffer, vector, offset, count):
        """Eight float16 operands for fmlal/fmlal2 from lanes ``offset`` on: a scalar
        broadcast, or ``count`` (8, or the last 4 of 12, repeated) loaded (the unit axes
        after the lanes add nothing to the address)."""
        if not vector:
            return tvm.tirx.Broadcast(buffer[0], 8)
        units = len(buffer.shape) - 1
        loaded = buffer.vload([offset] + [0] * units, f"float16x{count}")
        return loaded if count == 8 else _low_half(loaded)

    @script.prim_func(s_tir=True)
    def desc(p: T.handle, q: T.handle, c: T.handle) -> None:
        P = T.match_buffer(p, p_shape, "float16", offset_factor=1)
        Q = T.match_buffer(q, q_shape, "float16", offset_factor=1)
        C = T.match_buffer(c, (lanes,), "float32", offset_factor=1, scope=scope)
        with T.sblock("root"):
            T.reads(C[0:lanes], P[0:p_len], Q[0:q_len])
            T.writes(C[0:lanes])
            for i in T.serial(0, lanes):
                with T.sblock("update"):
                    vi = T.axis.remap("S", [i])
                    C[vi] = C[vi] + T.Cast("float32", element(P, vectors[0], vi)) \
                        * T.Cast("float32", element(Q, vectors[1], vi))

    def first(P, Q, offset, count):
        return halves(P, vectors[0], offset, count) if vectors[0] \
            else halves(Q, vectors[1], offset, count)

    def last(P, Q, offset, count):
        """The other operand: a scalar last, where LLVM reads it as a lane of a register."""
        return halves(Q, vectors[1], offset, count) if vectors[0] \
            else halves(P, vectors[0], offset, count)

    eights, fours = divmod(lanes, 8)
    fours //= 4

    @script.prim_func(s_tir=True)
    def impl(p: T.handle, q: T.handle, c: T.handle) -> None:
        P = T.match_buffer(p, p_shape, "float16", offset_factor=1)
        Q = T.match_buffer(q, q_shape, "float16", offset_factor=1)
        C = T.match_buffer(c, (lanes,), "float32", offset_factor=1, scope=scope)
        with T.sblock("root"):
            T.reads(C[0:lanes], P[0:p_len], Q[0:q_len])
            T.writes(C[0:lanes])
            for g in T.unroll(eights):
                C[T.ramp(g * 8, 1, 4)] = T.call_llvm_pure_intrin(
                    "float32x4", "llvm.aarch64.neon.fmlal", C[T.ramp(g * 8, 1, 4)],
                    first(P, Q, g * 8, 8), last(P, Q, g * 8, 8))
                C[T.ramp(g * 8 + 4, 1, 4)] = T.call_llvm_pure_intrin(
                    "float32x4", "llvm.aarch64.neon.fmlal2", C[T.ramp(g * 8 + 4, 1, 4)],
                    first(P, Q, g * 8, 8), last(P, Q, g * 8, 8))
            for g in T.unroll(fours):  # four lanes after the eights: fmlal reads the low half
                C[T.ramp(eights * 8 + g, 1, 4)] = T.call_llvm_pure_intrin(
                    "float32x4", "llvm.aarch64.neon.fmlal", C[T.ramp(eights * 8 + g, 1, 4)],
                    first(P, Q, eights * 8 + g, 4), last(P, Q, eights * 8 + g, 4))

    shapes = "_".join("s" if units is None else f"v{units}" for units in operands)
    name = f"relay_amp_fmlal_{lanes}_{shapes}_{scope}"
    TensorIntrin.register(name, desc, impl, override=True)
    _REGISTERED[key] = name
    return name


def _row_loads(A, row, depth: int, dtype: str) -> tuple[list, list]:
    """The loads of ``depth`` scalars of ``A``'s ``row`` and the lanes of their concatenation
    that hold them: one load, or for a depth no power of two two overlapping loads of the
    power below it (3: lanes 0-1 and 1-2), each at an immediate offset (a lane loaded alone is
    an ``ld1r``, whose address takes an instruction of its own)."""
    part = _load_lanes(depth)
    if part == depth:
        return [A.vload([row, 0], f"{dtype}x{depth}")], list(range(depth))
    return ([A.vload([row, 0], f"{dtype}x{part}"), A.vload([row, depth - part], f"{dtype}x{part}")],
            [*range(part), *(part + k - (depth - part) for k in range(part, depth))])


def _all_rows(A, rows: int, step: int, depth: int, dtype: str):
    """Every row's ``depth`` scalars of the tile's ``rows`` (``step`` rows of ``A`` apart),
    each row's loads those of :func:`_row_loads`, in one value."""
    loads, lanes = [], []
    for r in range(rows):
        vectors, picked = _row_loads(A, r * step, depth, dtype)
        lanes += [len(loads) * _load_lanes(depth) + i for i in picked]
        loads += vectors
    return tvm.tirx.Shuffle(loads, lanes)


def _load_lanes(depth: int) -> int:
    """The lanes of each load :func:`_row_loads` makes for ``depth`` scalars."""
    return 1 << (depth.bit_length() - 1)


def _blocked_intrinsic(rows: int, depth: int, lanes: int, scope: str, dtype: str,
                       step: int = 1) -> str:
    """The name of the register-tile intrinsic: ``rows`` x ``lanes`` float32 sums in a
    ``scope`` buffer, each adding ``depth`` products of a row's ``depth`` consecutive scalars
    (one vector load per row) and ``depth`` rows of the lanes, by element: ``fmlal``/``fmlal2``
    for float16 operands, ``fmla v.4s`` for float32. The reduction innermost in the scalar
    operand's memory runs inside the tile, as in XNNPACK's and MLAS's GEMM micro-kernels: a
    scalar is one lane of a register, not a load of its own. ``step``: the tile's rows are
    ``step`` rows apart in the scalar operand (a convolution of stride ``step``)."""
    key = ("blocked", rows, depth, lanes, scope, dtype, step)
    if key in _REGISTERED:
        return _REGISTERED[key]
    from tvm.s_tir import TensorIntrin
    from tvm.script import tirx as T

    half = dtype == "float16"
    width = 8 if half else 4  # operands one 128-bit load of the lanes holds
    whole, fours = divmod(lanes, width)
    fours //= 4
    vector = f"{dtype}x{depth}"
    span = (rows - 1) * step + 1  # the scalar operand's rows the tile reads

    def widened(value):
        return T.Cast("float32", value) if half else value

    def lane(scalars, count, index):
        """Lane ``index`` of the ``count`` ``scalars`` in every lane: as the intrinsic's last
        operand LLVM selects the by-element form (no ``dup``)."""
        return tvm.tirx.Shuffle([scalars] * max(1, width // count), [index] * width)

    def row_lane(scalars, r, k):
        """Lane ``k`` of row ``r`` of :func:`_all_rows`, in every lane."""
        return lane(scalars, rows * depth, r * depth + k)

    def weights(B, k, offset, count):
        loaded = B.vload([k, offset], f"{dtype}x{count}")
        return loaded if count == width else _low_half(loaded)

    def update(C, scalar, B, r, k, offset, count, high=False):
        """``count`` sums of row ``r`` from ``offset`` on, plus ``scalar`` times row ``k`` of
        the weights."""
        sums = C[r, tvm.tirx.Ramp(offset, 1, 4)]
        if not half:
            return T.call_llvm_pure_intrin("float32x4", "llvm.fma.v4f32",
                                           weights(B, k, offset, 4), scalar, sums)
        intrinsic = "llvm.aarch64.neon.fmlal2" if high else "llvm.aarch64.neon.fmlal"
        start = offset - 4 if high else offset
        return T.call_llvm_pure_intrin("float32x4", intrinsic, sums,
                                       weights(B, k, start, count), scalar)

    @script.prim_func(s_tir=True)
    def desc(a: T.handle, b: T.handle, c: T.handle) -> None:
        sa, sb, sc = T.int64(), T.int64(), T.int64()
        A = T.match_buffer(a, (span, depth), dtype, offset_factor=1, strides=[sa, 1])
        B = T.match_buffer(b, (depth, lanes), dtype, offset_factor=1, strides=[sb, 1])
        C = T.match_buffer(c, (rows, lanes), "float32", offset_factor=1, strides=[sc, 1],
                           scope=scope)
        with T.sblock("root"):
            T.reads(C[0:rows, 0:lanes], A[0:span, 0:depth], B[0:depth, 0:lanes])
            T.writes(C[0:rows, 0:lanes])
            for k, r, i in T.grid(depth, rows, lanes):
                with T.sblock("update"):
                    vr, vi, vk = T.axis.remap("SSR", [r, i, k])
                    C[vr, vi] = C[vr, vi] + widened(A[vr * step, vk]) * widened(B[vk, vi])

    @script.prim_func(s_tir=True)
    def impl(a: T.handle, b: T.handle, c: T.handle) -> None:
        sa, sb, sc = T.int64(), T.int64(), T.int64()
        A = T.match_buffer(a, (span, depth), dtype, offset_factor=1, strides=[sa, 1])
        B = T.match_buffer(b, (depth, lanes), dtype, offset_factor=1, strides=[sb, 1])
        C = T.match_buffer(c, (rows, lanes), "float32", offset_factor=1, strides=[sc, 1],
                           scope=scope)
        with T.sblock("root"):
            T.reads(C[0:rows, 0:lanes], A[0:span, 0:depth], B[0:depth, 0:lanes])
            T.writes(C[0:rows, 0:lanes])
            if half:
                # every row's scalars one value that all products read: a row loaded for each
                # k, of which one lane is read, LLVM narrowed into loads per lane (BERT-base's
                # matmuls: ld1r, ldr d, ld1 {v.s}[2] beside each row's ldr)
                scalars = T.bind(_all_rows(A, rows, step, depth, dtype))
                for k in T.unroll(depth):
                    for r in T.unroll(rows):
                        for g in T.unroll(whole):
                            C[r, T.ramp(g * 8, 1, 4)] = update(
                                C, row_lane(scalars, r, k), B, r, k, g * 8, 8)
                            C[r, T.ramp(g * 8 + 4, 1, 4)] = update(
                                C, row_lane(scalars, r, k), B, r, k, g * 8 + 4, 8,
                                high=True)
                        for g in T.unroll(fours):  # 4 lanes after the eights: fmlal reads 4
                            C[r, T.ramp(whole * 8 + g, 1, 4)] = update(
                                C, row_lane(scalars, r, k), B, r, k, whole * 8 + g, 4)
            else:  # float32: LLVM keeps one ldr q a row, merging each k's load
                for k in T.unroll(depth):
                    for r in T.unroll(rows):
                        for g in T.unroll(whole):
                            C[r, T.ramp(g * 4, 1, 4)] = update(
                                C, lane(A.vload([r * step, 0], vector), depth, k), B, r, k,
                                g * 4, 4)

    name = f"relay_amp_tile_{dtype}_{rows}x{lanes}_k{depth}_s{step}_{scope}"
    TensorIntrin.register(name, desc, impl, override=True)
    _REGISTERED[key] = name
    return name


def _bits(value):
    """The load under ``value``: itself, or the buffer of 16-bit patterns a
    ``reinterpret`` reads as bfloat16 (:mod:`relay_amp.builds.bfdot`'s padded input)."""
    if isinstance(value, tvm.ir.expr.Call) and value.op.name == "tirx.reinterpret" \
            and str(value.ty) == "bfloat16":
        return value.args[0]
    return value


def operand_dtype(block) -> str | None:
    """What the dot-product ``block`` multiplies, where it sums float32 products of two loads
    of one dtype: "float16" (both widened: what FMLAL computes), "bfloat16" (both widened: what
    BFDOT computes; a load may be of bit patterns read as bfloat16) or "float32"; else None."""
    prim = tvm.ir.prim.expr
    store = block.body
    if not isinstance(store, tvm.tirx.BufferStore) or not isinstance(store.value, prim.Add) \
            or str(store.buffer.dtype) != "float32":
        return None
    product = next((t for t in (store.value.a, store.value.b) if isinstance(t, prim.Mul)), None)
    if product is None:
        return None
    dtypes = set()
    for operand in (product.a, product.b):
        widened = isinstance(operand, prim.Cast)
        load = _bits(operand.value) if widened else operand
        if not isinstance(load, tvm.ir.expr.TensorLoad):
            return None
        bits = widened and not isinstance(operand.value, tvm.ir.expr.TensorLoad)
        dtypes.add(("bfloat16" if bits else str(load.source.dtype), widened))
    return {("float16", True): "float16", ("float32", False): "float32",
            ("bfloat16", True): "bfloat16"}.get(dtypes.pop()) if len(dtypes) == 1 else None


def _loads(block) -> tuple:
    value = block.body.value
    product = next(t for t in (value.a, value.b) if isinstance(t, tvm.ir.prim.expr.Mul))
    return tuple(_bits(o.value) if isinstance(o, tvm.ir.prim.expr.Cast) else o
                 for o in (product.a, product.b))


def _operands(sch, lanes_loop) -> tuple | None:
    """Each operand of the update's product under ``lanes_loop``: None where one scalar serves
    every lane, else the number of unit axes after the axis the lanes index (see
    :func:`_intrinsic`); None where :func:`operand_dtype` is None, or an operand's lanes axis
    is followed by a longer one (not contiguous)."""
    loop = sch.get(lanes_loop)
    realize = loop.body
    if not isinstance(realize, tvm.s_tir.SBlockRealize):
        return None
    lanes = [iv.var for iv, value in zip(realize.block.iter_vars, realize.iter_values)
             if uses(value, loop.loop_var)]
    if len(lanes) != 1 or operand_dtype(realize.block) is None:
        return None
    operands = []
    for operand in _loads(realize.block):
        axes = [n for n, index in enumerate(operand.indices) if uses(index, lanes[0])]
        if not axes:
            operands.append(None)
            continue
        after = operand.source.shape[axes[-1] + 1:]
        if len(axes) != 1 or any(not isinstance(n, tvm.tirx.IntImm) or int(n) != 1
                                 for n in after):
            return None
        operands.append(len(after))
    return tuple(operands) if operands != [None, None] else None


def tensorize_fmlal(sch, lanes_loop, lanes: int, scope: str) -> bool:
    """Tensorize the dot-product update under ``lanes_loop`` (``lanes`` float32 sums in a
    ``scope`` buffer, float16 operands, each a scalar or a contiguous vector of the lanes)
    into FMLAL. False, and ``sch`` unchanged, where the update is not that (other dtypes, a
    strided vector operand, lanes not a multiple of 4: lanes computed one by one cost more
    than the widening kernel, measured): the caller keeps its own loop."""
    from tvm import s_tir

    operands = _operands(sch, lanes_loop)
    if lanes % 4 or operands is None or operand_dtype(sch.get(lanes_loop).body.block) \
            != "float16":
        return False
    try:
        sch.tensorize(lanes_loop, _intrinsic(lanes, operands, scope))
    except (s_tir.ScheduleError, RuntimeError):  # TVMScript's DiagnosticError is one
        return False
    return True


def scalar_reduction(sch, lanes_loop, rows_loop, reduce_loops) -> tuple | None:
    """``(n, extent, step)`` for a register tile: ``reduce_loops[n]`` runs over the innermost
    axis of the update's scalar operand (its ``extent``: an ``IntImm`` or symbolic), and the
    tile's rows are ``step`` rows apart in that operand (:func:`_row_step`); None where no one
    reduction loop is that axis's."""
    realize = sch.get(lanes_loop).body
    scalar = _loads(realize.block)[0]
    bound = [value for iv, value in zip(realize.block.iter_vars, realize.iter_values)
             if uses(scalar.indices[-1], iv.var)]
    found = [n for n, loop in enumerate(reduce_loops)
             if any(uses(value, sch.get(loop).loop_var) for value in bound)]
    if len(found) != 1:
        return None
    step = _row_step(realize, scalar, sch.get(rows_loop).loop_var)
    return found[0], sch.get(reduce_loops[found[0]]).extent, step


def tensorized_tile(sch, rows_loop, reduce_loops, n: int, depth: int, intrinsic: str):
    """A copy of ``sch`` with ``reduce_loops[n]`` split by ``depth``, its inner part moved above
    the rows (``rows_loop``) and tensorized into ``intrinsic``; None where that fails."""
    from tvm import s_tir

    trial = sch.copy()
    try:
        _, inner = trial.split(reduce_loops[n], [None, depth])
        trial.reorder(*reduce_loops[n + 1:], inner, rows_loop)
        trial.tensorize(inner, intrinsic)
    except (s_tir.ScheduleError, RuntimeError):  # TVMScript's DiagnosticError is one
        return None
    decide(f"update: tensor intrinsic {intrinsic}")
    return trial


def register_tile(sch, lanes_loop, rows_loop, reduce_loops, lanes: int, rows: int,
                  scope: str):
    """A copy of ``sch`` whose tile runs on :func:`_blocked_intrinsic`, or None where the
    update does not read so (a tile without rows, a scalar operand whose innermost axis is not
    a reduction of a depth the intrinsic takes, lanes not a multiple of 4, strides it does not
    read): the reduction loop of the scalar operand's innermost axis is split by the depth, its
    inner part moved above the rows and tensorized."""
    if rows_loop is None or lanes % 4 or _operands(sch, lanes_loop) != (None, 0):
        return None
    dtype = operand_dtype(sch.get(lanes_loop).body.block)
    reduction = scalar_reduction(sch, lanes_loop, rows_loop, reduce_loops)
    if reduction is None:
        return None
    n, extent, step = reduction
    depth = next((d for d in (FLOAT16_DEPTHS if dtype == "float16" else (4, 2))
                  if isinstance(extent, tvm.tirx.IntImm) and int(extent) % d == 0), None)
    if depth is None or step not in STEPS:
        return None
    return tensorized_tile(sch, rows_loop, reduce_loops, n, depth,
                           _blocked_intrinsic(rows, depth, lanes, scope, dtype, step))


def _row_step(realize, scalar, rows_var) -> int | None:
    """How many rows of the scalar operand ``scalar`` apart the tile's rows (``rows_var``) are:
    the coefficient of the row's block iterator in the index it moves (a convolution's stride);
    None where that is not one constant."""
    rows = [iv.var for iv, value in zip(realize.block.iter_vars, realize.iter_values)
            if uses(value, rows_var)]
    moved = [index for index in scalar.indices[:-1] if rows and uses(index, rows[0])]
    if len(rows) != 1 or len(moved) != 1:
        return None
    coefficients = tvm.sym.detect_linear_equation(moved[0], [rows[0]])
    if not coefficients or not isinstance(coefficients[0], tvm.tirx.IntImm):
        return None
    return int(coefficients[0])


__all__ = ["STEPS", "TILE_REGISTERS", "has_fmlal", "is_aarch64", "lane_rows", "operand_dtype",
           "register_tile", "tensorize_fmlal", "tile_shape"]
