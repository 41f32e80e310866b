"""Casts and constants of step 3 (the algorithm is stated in :mod:`relay_amp.transform`): one
cast cache per scope that stores both directions, so a cast back returns the original value;
float32 constants checked and converted once per conversion (:class:`Constants`, which the
stages read through the context too)."""

from __future__ import annotations

import numpy as np
from tvm import relax
from tvm.relax import (
    DataflowVar,
    TensorType,
    TupleGetItem,
)

from .dtypes import (
    converted_tensor,
    numpy_dtype,
    out_of_range_value,
)
from .dtypes import short_dtype as _short
from .relax_utils import (
    GenericConst,
    TupleType,
    is_var,
    same_dtypes,
)


class Constants:
    """The float32 constants of one conversion: each read once, checked once against the
    low-precision range and converted at most once, at conversion time.

    Parameters
    ----------
    low : str
        The low-precision dtype.
    """

    def __init__(self, low: str):
        self.low = low
        self._entries: dict = {}  # handle -> [constant, numpy value, out of range, low copy]
        self.converted = 0

    def _entry(self, const) -> list:
        key = const.__chandle__()
        entry = self._entries.get(key)
        if entry is None:
            value = const.value
            try:  # a read-only view of the constant's memory, no copy
                array = np.from_dlpack(value)
            except (TypeError, BufferError, RuntimeError):
                array = value.numpy()
            entry = self._entries[key] = [const, array, out_of_range_value(array, self.low),
                                          None]
        return entry

    def out_of_range(self, const) -> float | None:
        """A value of the float32 ``const`` that the low dtype cannot hold, or None."""
        return self._entry(const)[2]

    def low_copy(self, const):
        """The low-precision copy of a float32 constant, converted once, at conversion time."""
        entry = self._entry(const)
        if entry[3] is None:
            entry[3] = relax.const(converted_tensor(entry[1], self.low))
            entry[1] = None  # the float32 copy is not needed any more
            self.converted += 1
        return entry[3]


class CastCache:
    """The casts the rewrite emits, through one cache per scope.

    Parameters
    ----------
    builder : relax.BlockBuilder
        The rewrite's builder; casts are emitted into its current block.
    low : str
        The low-precision dtype.
    dtype_of : relay_amp.relax_utils.DtypeCache
        The dtype of an expression.
    constants : Constants
        The conversion's float32 constants.
    cast_params_offline : bool
        Float32 constants are converted at conversion time instead of cast at run time.
    counted : callable, optional
        Called once for each run-time cast emitted (the report's count,
        :meth:`relay_amp.report.ReportBuilder.cast`).
    """

    def __init__(self, builder, low: str, dtype_of, constants: Constants,
                 cast_params_offline: bool = True, counted=None):
        self.builder = builder
        self.low = low
        self.dtype_of = dtype_of
        self.constants = constants
        self.cast_params_offline = cast_params_offline
        self._stack: list[dict] = []
        self._dataflow: list[bool] = []  # parallel to _stack: is it a dataflow block's layer
        self._kernel_copies: set = set()  # handles of low-precision copies a kernel writes
        self.counted = counted or (lambda: None)

    def push_layer(self, is_dataflow: bool):
        """A new scope (a SeqExpr, or a dataflow block within one)."""
        self._stack.append({})
        self._dataflow.append(is_dataflow)

    def pop_layer(self):
        self._stack.pop()
        self._dataflow.pop()

    def lookup(self, key, dtype):
        for layer in reversed(self._stack):
            hit = layer.get((key, dtype))
            if hit is not None:
                return hit
        return None

    def emit_named(self, expr, name: str, output: bool):
        """Bind ``expr`` to ``name``: a dataflow output when ``output`` (the value leaves the
        dataflow block), else a binding of the current block."""
        if output and self.builder.current_block_is_dataflow():
            return self.builder.emit_output(expr, name)
        return self.builder.emit(expr, name)

    def cast(self, expr, dtype: str, output: bool = False):
        """``expr`` as ``dtype`` (a float32 <-> low-precision tensor cast), through the cache."""
        source = self.dtype_of(expr)
        if source == dtype or source is None or {source, dtype} != {"float32", self.low}:
            return expr
        key = expr.__chandle__()
        hit = self.lookup(key, dtype)
        if hit is not None:
            return hit
        if type(expr) is GenericConst and self.cast_params_offline:
            if dtype == self.low:
                new = self.constants.low_copy(expr)
            else:
                new = relax.const(expr.value.numpy().astype(numpy_dtype(dtype)), dtype)
                self.constants.converted += 1
        else:
            name = (expr.name if is_var(expr) else "const") + "_" + _short(dtype)
            new = self.count_cast(self.emit_named(relax.op.astype(expr, dtype), name, output))
        layer = self.cache_layer(new)
        layer[(key, dtype)] = new
        layer[(new.__chandle__(), source)] = expr
        self.dtype_of(new)  # keeps ``new`` alive while its handle is a cache key
        return new

    def written_low(self, value) -> bool:
        """Did the kernel that computes ``value`` also write its low-precision copy?"""
        copy = self.lookup(value.__chandle__(), self.low)
        return copy is not None and copy.__chandle__() in self._kernel_copies

    def cache_layer(self, value) -> dict:
        """The innermost cache layer in which ``value`` stays visible: a dataflow block's layer
        holds only its dataflow vars; output vars and constants outlive the block."""
        if type(value) is DataflowVar:
            return self._stack[-1]
        for layer, is_dataflow in zip(reversed(self._stack), reversed(self._dataflow)):
            if not is_dataflow:
                return layer
        return self._stack[0]

    def cast_to_type(self, expr, want):
        """``expr`` with each float tensor leaf cast to the dtype of the same leaf of ``want``."""
        if want is None:
            return expr
        want_type = type(want)
        if want_type is TensorType:
            return self.cast(expr, str(want.dtype.dtype))
        if want_type is TupleType and type(expr.ty) is TupleType:
            if type(expr) is relax.Tuple:
                fields = [self.cast_to_type(f, w) for f, w in zip(expr.fields, want.fields)]
                if all(a.same_as(b) for a, b in zip(fields, expr.fields)):
                    return expr
                return relax.Tuple(fields)
            if same_dtypes(expr.ty, want):
                return expr
            fields = []
            for i, field_want in enumerate(want.fields):
                item = self.builder.emit(TupleGetItem(expr, i), "item")
                fields.append(self.cast_to_type(item, field_want))
            return self.builder.emit(relax.Tuple(fields), "tuple")
        return expr

    def storage_constant(self, const):
        """A float32 constant stored in the low-precision dtype and widened where it is used."""
        if self.constants.out_of_range(const) is not None:
            return const
        key = const.__chandle__()
        hit = self.lookup(key, "storage")
        if hit is not None:
            return hit
        widened = self.count_cast(self.builder.emit(
            relax.op.astype(self.constants.low_copy(const), "float32"), "weight_f32"))
        self.cache_layer(widened)[(key, "storage")] = widened
        return widened

    def widen(self, value):
        """A float32 copy of a low-precision value for one consumer: not shared, so the cast
        stays inside that consumer's kernel."""
        name = (value.name if is_var(value) else "const") + "_f32"
        return self.count_cast(self.builder.emit(relax.op.astype(value, "float32"), name))

    def count_cast(self, var):
        """``var``, a cast this binding added, counted in the report."""
        self.counted()
        return var

    def adopt_cast(self, source, result):
        """A float32 <-> low-precision cast already in the program joins the cast cache, so a
        later cast back returns its source instead of casting twice."""
        source_dtype, result_dtype = self.dtype_of(source), self.dtype_of(result)
        if {source_dtype, result_dtype} == {"float32", self.low}:
            layer = self.cache_layer(result)
            layer.setdefault((source.__chandle__(), result_dtype), result)
            layer.setdefault((result.__chandle__(), source_dtype), source)

    def kernel_copy(self, source, copy):
        """``copy``, the low-precision copy of ``source`` that a kernel writes beside it, joins
        the cache."""
        self.adopt_cast(source, copy)
        self._kernel_copies.add(copy.__chandle__())
        self.dtype_of(copy)  # keeps ``copy`` alive while its handle is a set member
