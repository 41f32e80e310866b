"""The kernels step 3 emits itself (the algorithm is stated in :mod:`relay_amp.transform`): an
accumulate op as one TensorIR kernel that reads low precision and computes in float32 registers
(``mixed_kernels``), a centring normalization that also forms the residual add feeding it, and
a dot product that rounds a float32 operand inside its own kernel, each from TVM's own
legalization of the op; a dot product summed in blocks (its op's ``blocked_sum`` form); and an
integer input's one cast with its normalization folded in (:func:`integer_input`)."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.ir import Call
from tvm.relax import (
    TensorType,
)

from .dtypes import short_dtype as _short
from .kinds import Mode
from .op_hooks import OpSite
from .op_registry import op_info
from .reasons import Reason
from .relax_utils import TVM_ERRORS, last_line


class KernelEmitter:
    """Emits the kernels of the rewrite that TVM's legalization of an op does not give as they
    are: each is that legalization's TE computation, re-emitted with casts inside it.

    Parameters
    ----------
    builder : relax.BlockBuilder
        The rewrite's builder.
    casts : relay_amp.casts.CastCache
        The rewrite's casts (a kernel's low-precision copy joins it).
    low : str
        The low-precision dtype.
    """

    def __init__(self, builder, casts, low: str):
        self.builder = builder
        self.casts = casts
        self.low = low
        #: Why the kernel last asked for was not emitted (a ``kernel_not_emitted`` reason for
        #: the report), or None.
        self.not_emitted = None

    def _attempt(self, kind: str, op: str, build):
        """``build()``, or None with :attr:`not_emitted` saying why TVM would not build it."""
        self.not_emitted = None
        try:
            return build()
        except _NotEmitted as why:
            self.not_emitted = Reason.of("kernel_not_emitted", kernel=kind, op=op, why=str(why))
            return None

    def emit_blocked(self, op: str, call, block: int, name: str, output: bool):
        """``call`` (low-precision operands, typed) with its products summed in blocks of
        ``block`` (the op registry's ``blocked_sum`` form, ``Policy.set_accumulation_block``):
        ``(its var or None, the reason for the report)``."""
        form = op_info(op).blocked_sum
        if form is None:
            return None, Reason.of("blocked_accumulation_refused", block=block,
                                   why=f"{op} has no blocked form")
        try:
            expr, reason = form(OpSite(call, self.low, Mode.LOW, block=block))
            return (None if expr is None else self.casts.emit_named(expr, name, output)), reason
        except TVM_ERRORS as err:  # TVM rejects the form: the plain dot product instead
            return None, Reason.of("blocked_accumulation_refused", block=block,
                                   why=last_line(err))

    def emit_mixed(self, op: str, call, args, out_dtype, name: str, output: bool):
        """``op`` as one TensorIR kernel that widens its float operands to float32, computes
        with TVM's own legalization of ``op`` and writes ``out_dtype``; None (and
        :attr:`not_emitted`) if TVM's legalization does not make one."""
        low = self.low
        return self._attempt("mixed", op, lambda: self._emit_legalized(
            op, call, args, lambda index, tensor: "float32" if str(tensor.dtype) == low else None,
            name, output, out_dtype))

    def _split_pair(self, pair, name: str):
        """The float32 result of a kernel that writes ``(float32, low)``; the low-precision
        copy joins the cast cache."""
        result = self.builder.emit(relax.TupleGetItem(pair, 0), name)
        copy = self.builder.emit(relax.TupleGetItem(pair, 1), f"{name}_{_short(self.low)}")
        self.casts.kernel_copy(result, copy)
        return result

    def emit_absorbing(self, op: str, call, args, operands, out_dtype, name: str,
                               output: bool, add_op: str = "add"):
        """``op`` on the sum of ``operands`` (the absorbed ``add_op``, a ``residual_add`` of the
        op registry), formed in float32 in the same kernel; ``args`` are the op's other operands
        (``args[0]`` is the add). None (and :attr:`not_emitted`) if TVM's legalization does not
        make one: the caller then forms the sum as a kernel of its own."""
        from tvm import topi

        def widened_sum(*tensors):
            total = topi.cast(tensors[0], "float32")
            for tensor in tensors[1:]:
                total = getattr(topi, add_op)(total, topi.cast(tensor, "float32"))
            return total

        low = self.low
        return self._attempt("absorbing", op, lambda: self._emit_legalized(
            op, call, args, lambda index, tensor: "float32" if str(tensor.dtype) == low else None,
            name, output, out_dtype, prologue=(0, widened_sum, operands)))

    def emit_narrowing(self, op: str, call, attrs, args, narrowed, name: str,
                               output: bool):
        """``op`` as one TensorIR kernel that rounds its float32 operands at ``narrowed`` to the
        low dtype itself (a residual stream that crosses the kernel boundary in float32), then
        computes as TVM's legalization of ``op`` does with low-precision operands; None (and
        :attr:`not_emitted`) if TVM's legalization does not make one."""
        low = self.low
        stand_ins = [relax.Var(f"narrowed{i}", TensorType(a.ty.shape, low)) if i in narrowed
                     else a for i, a in enumerate(args)]
        return self._attempt("narrowing", op, lambda: self._emit_legalized(
            op, Call(call.op, stand_ins, attrs, call.ty_args, call.span), args,
            lambda index, tensor: low if index in narrowed else None, name, output))

    def _emit_legalized(self, op: str, legal_call, args, operand_dtype, name: str, output: bool,
                        out_dtype=None, prologue=None):
        """TVM's legalization of ``legal_call`` (one ``call_te``, recorded) re-emitted on
        ``args``, the operands of ``legal_call`` position for position, as one kernel that casts
        operand ``i`` to ``operand_dtype(i, tensor)`` (None: as it is) and its result to
        ``out_dtype`` (a tuple of dtypes: one result in each, the first returned and the
        second a cached low-precision copy). ``prologue``, ``(i, compute, exprs)``: operand
        ``i`` is ``compute`` of the tensors of ``exprs``, in the same kernel. Raises
        :class:`_NotEmitted` if the legalization is anything but one ``call_te`` on the op's
        operands, or TE rejects the kernel."""
        recorder = _TeRecorder()
        legalize = tvm.ir.Op.get("relax." + op).get_attr("FLegalize")
        if legalize is None:
            raise _NotEmitted("TVM has no legalization of it")
        try:
            legalize(recorder, legal_call)
        except TVM_ERRORS as err:  # the recorder's refusal comes back through the FFI as one
            raise _NotEmitted(recorder.refused or f"its legalization rejects the operands: "
                              f"{last_line(err)}") from None
        if len(recorder.calls) != 1:
            raise _NotEmitted(f"its legalization makes {len(recorder.calls)} TE computations, "
                              "not one")
        te_func, te_args, te_kwargs = recorder.calls[0]
        _rebind_builder(te_func, recorder, self.builder)
        te_kwargs = dict(te_kwargs)
        hint = te_kwargs.pop("primfunc_name_hint", op.split(".")[-1])
        positions = {arg.__chandle__(): i for i, arg in enumerate(legal_call.args)}
        keys = list(te_kwargs)
        computed, prologue_compute, extra = (prologue[0], prologue[1], list(prologue[2])) if (
            prologue) else (None, None, [])
        values, indices = [], []
        for value in list(te_args) + [te_kwargs[k] for k in keys]:
            index = positions.get(value.__chandle__()) if isinstance(value, relax.Expr) else None
            if isinstance(value, relax.Expr) and index is None:
                raise _NotEmitted("its legalization computes on a value that is not an operand")
            values.append(args[index] if index is not None else value)
            indices.append(index)
        # the prologue's operand is formed inside the kernel, so call_te does not pass it; a
        # flag per slot, not a placeholder value: TVM passes None itself (mean's axis=None)
        formed = [index is not None and index == computed for index in indices]
        if computed is not None and not any(formed):
            raise _NotEmitted("its legalization does not read the absorbed sum")
        count = len(te_args)
        main = [v for v, inside in zip(values[:count], formed) if not inside]
        passed = {k: v for k, v, inside in zip(keys, values[count:], formed[count:])
                  if not inside}

        def kernel(*tensors, **kwargs):
            from tvm import te, topi

            positional = iter(tensors[:len(main)])
            made = prologue_compute(*tensors[len(main):]) if prologue_compute else None
            given = [made if inside else next(positional) if i < count else kwargs[keys[i - count]]
                     for i, inside in enumerate(formed)]
            operands = []
            for tensor, index, inside in zip(given, indices, formed):
                dtype = (operand_dtype(index, tensor) if isinstance(tensor, te.Tensor)
                         and not inside else None)
                operands.append(topi.cast(tensor, dtype) if dtype else tensor)
            result = te_func(*operands[:count], **dict(zip(keys, operands[count:])))
            if isinstance(out_dtype, tuple):  # one result per dtype, written by one kernel
                return [topi.cast(result, d) if str(result.dtype) != d else result
                        for d in out_dtype]
            if out_dtype is not None and str(result.dtype) != out_dtype:
                return topi.cast(result, out_dtype)
            return result

        if isinstance(out_dtype, tuple):
            pair = self._emit_te(kernel, main + extra, passed, hint, f"{name}_pair", False)
            return None if pair is None else self._split_pair(pair, name)
        return self._emit_te(kernel, main + extra, passed, hint, name, output)

    def _emit_te(self, compute, args, kwargs, hint: str, name: str, output: bool):
        """``compute`` as one PrimFunc named after the op; raises :class:`_NotEmitted` if TE
        rejects it."""
        try:
            value = self.builder.normalize(self.builder.call_te(
                compute, *args, primfunc_name_hint=f"relay_amp_{hint}", **kwargs))
        except TVM_ERRORS as err:  # TE rejects these dtypes: keep the op as it is
            raise _NotEmitted(f"TE rejects it: {last_line(err)}") from None
        return self.casts.emit_named(value, name, output)



class _NotEmitted(Exception):
    """Why a kernel is not emitted (the op then computes as TVM legalizes it, operands cast)."""


class _TeRecorder:
    """Stands in for the BlockBuilder of an op's legalization and records its ``call_te``;
    any other use of the builder means the legalization is more than one TE computation."""

    def __init__(self):
        self.calls = []
        self.refused = None

    def call_te(self, func, *args, **kwargs):
        self.calls.append((func, args, kwargs))
        return None

    def __getattr__(self, name):
        self.refused = f"its legalization uses the builder's {name}, not only call_te"
        raise _NotEmitted(self.refused)


def _rebind_builder(te_func, recorder, builder) -> int:
    """Point the closure cells of ``te_func`` that hold ``recorder`` at ``builder``; returns
    how many it changed.

    A TE function of TVM's legalization may use the builder it was legalized with (matmul's
    infers its output shape with it), and TVM offers no way to legalize an op into a TE
    function without a builder: relay_amp legalizes with a recorder (which cannot cross the
    FFI), so the function gets the real builder back here, the one place relay_amp touches a
    closure of TVM's. tests/pass/test_kernels.py fails if matmul's legalization stops closing over
    its builder (then this is not needed) or closes over it in a way this does not reach."""
    changed = 0
    for cell in getattr(te_func, "__closure__", None) or ():
        if cell.cell_contents is recorder:
            cell.cell_contents = builder
            changed += 1
    return changed


def integer_input(builder, param, int_param, normalization, low: str, float32_readers: bool):
    """``(value, name, note)``: the cast of an integer input, once, straight to the low-precision
    dtype, folding in its normalization: one kernel reads the integers, applies
    ``x * scale + offset`` in float32 registers and writes the low-precision dtype, so the
    value is rounded once and no float32 tensor of the input exists. Where every reader
    computes float32 the kernel writes float32 instead, and FuseOps puts those readers in
    its kernel (it is emitted in the function's first dataflow block)."""
    from tvm import topi

    ndim = param.ty.ndim
    # Readers that all compute float32 (an inference batch_norm on the input, decomposed)
    # get float32 (``float32_readers``): a low-precision copy would round the input twice.
    target_low, low = low, "float32" if float32_readers else low
    note = f"{param.name}: fed as {int_param.ty.dtype}, cast once to {low}"
    name = f"{param.name}_{_short(low)}"
    if not normalization:
        if low == "float32":
            note += f"; float32, not {target_low}: every reader computes float32 (one rounding)"
        return relax.op.astype(int_param, low), name, note
    if "scale" in normalization:
        scale = np.float32(normalization["scale"])
        offset = np.float32(normalization["offset"])
        note += f" with x * {normalization['scale']:g} + {normalization['offset']:g} folded in"
    else:
        axis = normalization["axis"] % ndim
        channels = int(param.ty.shape.values[axis])
        if len(normalization["mean"]) != channels:
            raise ValueError(
                f"input_normalization[{param.name!r}] has {len(normalization['mean'])} "
                f"values, but axis {normalization['axis']} of {param.name} has {channels} "
                "channels")
        shape = [1] * ndim
        shape[axis] = channels
        mean = np.asarray(normalization["mean"], np.float64).reshape(shape)
        std = np.asarray(normalization["std"], np.float64).reshape(shape)
        scale, offset = (1.0 / std).astype(np.float32), (-mean / std).astype(np.float32)
        note += " with (x - mean) / std per channel folded in"
    if low == "float32":
        note += f"; float32, not {target_low}: every reader computes float32 (one rounding)"

    def normalize(data, scale_t, offset_t):
        widened = topi.cast(data, "float32")
        return topi.cast(topi.add(topi.multiply(widened, scale_t), offset_t), low)

    return builder.call_te(normalize, int_param, relax.const(scale, "float32"),
                           relax.const(offset, "float32"),
                           primfunc_name_hint=f"relay_amp_input_{param.name}"), name, note
