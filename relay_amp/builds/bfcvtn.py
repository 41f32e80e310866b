"""A tile's rounding to bfloat16 on BFCVTN (FEAT_BF16, ``+bf16``): four values an instruction.

A bfloat16 kernel sums in float32 and rounds once, where it writes its output: the
``cast`` TVM fused after the sums and their epilogue. TVM's ``BF16ComputeLegalize`` writes that
rounding as integer arithmetic (``ushr``, ``and``, ``add``, ``addhn`` and a constant: about five
instructions for four values on aarch64; 6.8 M of MobileNetV2's 69.9 M). LLVM selects
``bfcvtn`` from an ``fptrunc`` to ``bfloat``, which that legalization removes before code
generation, and a call TVM does not vectorize is scalarized. So :func:`round_in_tile` keeps the
rounding out of the tile's write-back: the write-back computes the epilogue into a buffer of the
tile's own (float32, on the stack: a "global" buffer under 1 KiB, which LLVM keeps in
registers, every index a constant once unrolled; TVM allocates a buffer of any other scope with
``TVMBackendAllocWorkspace``, whose stores LLVM keeps), and the rounding, moved into the tile,
is tensorized on :data:`LLVM_IR`'s function, which converts a vector of :data:`LANES` in one
``bfcvtn`` and one ``bfcvtn2``.

Both round to nearest even, so the outputs are the plain build's bit for bit, but for a NaN's
payload (BFCVTN quiets it) and denormals where the CPU flushes them (``FPCR.FZ``, off on
Linux).
"""

from __future__ import annotations

import math

import tvm

from ..relax_utils import last_line
from .schedule_rules import decide, link_llvm
from .tir_script import script

#: ``relay_amp_bfcvtn8(x)``: eight float32 values rounded to bfloat16 (``bfcvtn`` and
#: ``bfcvtn2`` with ``+bf16``; LLVM's own integer rounding without it), as 16-bit patterns.
LLVM_IR = "\n".join([
    "define linkonce_odr <8 x i16> @relay_amp_bfcvtn8(<8 x float> %x) alwaysinline {",
    "  %b = fptrunc <8 x float> %x to <8 x bfloat>",
    "  %r = bitcast <8 x bfloat> %b to <8 x i16>",
    "  ret <8 x i16> %r",
    "}",
])
#: Values one call of the intrinsic rounds: one 128-bit register of bfloat16.
LANES = 8
_REGISTERED: dict = {}


def is_rounding(block) -> bool:
    """Whether ``block`` only rounds a float32 buffer to bfloat16, element by element."""
    body = block.body
    if not isinstance(body, tvm.tirx.BufferStore) or str(body.buffer.dtype) != "bfloat16":
        return False
    value = body.value
    return (isinstance(value, tvm.tirx.Cast) and isinstance(value.value, tvm.ir.expr.TensorLoad)
            and str(value.value.source.dtype) == "float32" and len(block.reads) == 1)


def _intrinsic() -> str:
    """:data:`LANES` float32 values of the tile's own buffer rounded into a bfloat16 one."""
    if "name" in _REGISTERED:
        return _REGISTERED["name"]
    from tvm.s_tir import TensorIntrin
    from tvm.script import tirx as T

    lanes = LANES

    @script.prim_func(s_tir=True)
    def desc(a: T.handle, b: T.handle) -> None:
        A = T.match_buffer(a, (lanes,), "float32", offset_factor=1)
        B = T.match_buffer(b, (lanes,), "bfloat16", offset_factor=1)
        with T.sblock("root"):
            T.reads(A[0:lanes])
            T.writes(B[0:lanes])
            for i in T.serial(lanes):
                with T.sblock("round"):
                    vi = T.axis.remap("S", [i])
                    B[vi] = T.Cast("bfloat16", A[vi])

    @script.prim_func(s_tir=True)
    def impl(a: T.handle, b: T.handle) -> None:
        A = T.match_buffer(a, (lanes,), "float32", offset_factor=1)
        B = T.match_buffer(b, (lanes,), "bfloat16", offset_factor=1)
        with T.sblock("root"):
            T.reads(A[0:lanes])
            T.writes(B[0:lanes])
            B[T.ramp(0, 1, lanes)] = T.reinterpret(f"bfloat16x{lanes}", T.call_pure_extern(
                f"uint16x{lanes}", "relay_amp_bfcvtn8", A.vload([0], f"float32x{lanes}")))

    name = f"relay_amp_bfcvtn_{lanes}"
    TensorIntrin.register(name, desc, impl, override=True)
    _REGISTERED["name"] = name
    return name


def rounding_after(sch, write_back):
    """The block that rounds ``write_back``'s float32 result to bfloat16 as the kernel's
    output (:func:`is_rounding`, no block reads it, its last axis a multiple of
    :data:`LANES`), or None."""
    consumers = sch.get_consumers(write_back)
    if len(consumers) != 1:
        return None
    block = sch.get(consumers[0])
    extent = block.writes[0].source.shape[-1]
    if not is_rounding(block) or sch.get_consumers(consumers[0]) \
            or not isinstance(extent, tvm.tirx.IntImm) or int(extent) % LANES:
        return None
    return consumers[0]


def _inside(sch, block, loop) -> list:
    """``block``'s loops inside ``loop``."""
    loops = sch.get_loops(block)
    tile = sch.get(loop)
    return loops[next(n for n, it in enumerate(loops) if sch.get(it).same_as(tile)) + 1:]


def _points(sch, loops) -> int:
    """The iterations of a nest of ``loops`` of constant extents."""
    return math.prod(int(sch.get(loop).extent) for loop in loops)


def round_in_tile(sch, write_back, rounding, tile):
    """``(a copy of sch, its lanes loop)``: the copy runs ``rounding`` (:func:`rounding_after`
    of ``write_back``) in the ``tile`` loop, after ``write_back`` has computed the tile's
    values into a buffer of the tile's own on the stack (LLVM keeps it in registers: every
    index is a constant once the loops are unrolled), :data:`LANES` values a step; the lanes
    are left for :func:`tensorize_rounding`. None where a step fails, or where the rounding
    would cover more of the output than the tile writes: a tile of 8 pixels over rows of 7 or
    28 spans two rows, and the rounding, moved into it, covers both whole (TVM's region is a box),
    reading values of the tile's buffer no write-back wrote. The tensorization comes
    last, after the tile's own: TVM cannot copy a schedule once it has tensorized a block
    inside another's loop."""
    from tvm import s_tir

    trial = sch.copy()
    try:
        trial.reverse_compute_at(rounding, tile)
        trial.set_scope(write_back, 0, "global")
        loops = _inside(trial, rounding, tile)
        written = _inside(trial, write_back, tile)
        if not all(isinstance(trial.get(loop).extent, tvm.tirx.IntImm)
                   for loop in (*written, *loops)) \
                or int(trial.get(loops[-1]).extent) % LANES \
                or _points(trial, loops) != _points(trial, written):
            return None
        unrolled = [*written[:-1], *loops[:-1]]
        steps, lanes = trial.split(loops[-1], [None, LANES])
        for loop in (*unrolled, steps):
            trial.unroll(loop)
    except s_tir.ScheduleError:
        return None
    return trial, lanes


def tensorize_rounding(sch, tile, lanes) -> None:
    """Tensorize the rounding's ``lanes`` loop (:func:`round_in_tile`) on BFCVTN, the ``tile``
    loop linking :data:`LLVM_IR`, in place; where TVM refuses, the loop is vectorized (TVM's
    own rounding, on the tile's registers)."""
    from tvm import s_tir

    try:
        sch.tensorize(lanes, _intrinsic())
    except (s_tir.ScheduleError, RuntimeError) as err:  # TVMScript's DiagnosticError is one
        sch.vectorize(lanes)
        decide(f"rounding to bfloat16 in the tile, not on BFCVTN: {last_line(err)}")
        return
    link_llvm(sch, tile, LLVM_IR)
    decide(f"rounding to bfloat16: BFCVTN, {LANES} values a call, from the tile's registers")


__all__ = ["LANES", "LLVM_IR", "is_rounding", "round_in_tile", "rounding_after",
           "tensorize_rounding"]
