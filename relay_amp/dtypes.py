"""Facts about the low-precision dtypes relay_amp converts to."""

from __future__ import annotations

import ml_dtypes
import numpy as np

LOW_PRECISION_DTYPES = ("float16", "bfloat16")
FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")


def numpy_dtype(dtype: str) -> np.dtype:
    """The numpy dtype for a TVM dtype name (``bfloat16`` through ml_dtypes)."""
    if dtype == "bfloat16":
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(dtype)


def finfo(dtype: str):
    """``numpy.finfo``-like limits for float16, bfloat16, float32 and float64."""
    return ml_dtypes.finfo(numpy_dtype(dtype))


def max_finite(dtype: str) -> float:
    return float(finfo(dtype).max)


def smallest_subnormal(dtype: str) -> float:
    return float(finfo(dtype).smallest_subnormal)


def check_low_precision_dtype(dtype) -> str:
    """Return ``dtype`` as a string if it is a supported low-precision dtype, else raise."""
    if not isinstance(dtype, str) or dtype not in LOW_PRECISION_DTYPES:
        raise ValueError(
            f"dtype must be one of {', '.join(map(repr, LOW_PRECISION_DTYPES))}; got {dtype!r}"
        )
    return dtype


def is_float(dtype: str) -> bool:
    return dtype in FLOAT_DTYPES


def is_floating(dtype) -> bool:
    """Is ``dtype`` (a name, or None) a floating-point dtype of any width (``float8_e4m3fn``,
    ``bfloat16``, ``float32`` ...)?"""
    return dtype is not None and str(dtype).startswith(("float", "bfloat"))


def short_dtype(dtype: str) -> str:
    """``f16``, ``bf16``, ``f32`` for the report's compact columns and the names of casts;
    other dtypes as they are."""
    return {"float16": "f16", "bfloat16": "bf16", "float32": "f32"}.get(dtype, dtype)


class OutOfRange(str):
    """Why a value cannot be stored in a dtype: the text the report quotes, with the magnitude
    it names and the limit of the dtype that magnitude violates."""

    magnitude: float
    bound: float

    def __new__(cls, text: str, magnitude: float, bound: float):
        reason = super().__new__(cls, text)
        reason.magnitude, reason.bound = float(magnitude), float(bound)
        return reason


def out_of_range_reason(largest: float, dtype: str, margin: float = 1.0) -> OutOfRange | None:
    """Why a value whose largest magnitude is ``largest`` cannot be stored in ``dtype`` (its
    maximum, times ``margin``, overflows; or every non-zero value is below the smallest normal
    number), or None if it can."""
    info = finfo(dtype)
    if largest * margin > float(info.max):
        margin_words = f" (with a {margin:g}x margin)" if margin != 1 else ""
        return OutOfRange(f"observed max {largest:.3g} exceeds {dtype} max "
                          f"{float(info.max):.6g}{margin_words}", largest, float(info.max))
    if 0 < largest < float(info.smallest_normal):
        return OutOfRange(f"observed max {largest:.3g} is below {dtype}'s smallest normal "
                          f"{float(info.smallest_normal):.3g}", largest,
                          float(info.smallest_normal))
    return None


def out_of_range_value(values: np.ndarray, dtype: str):
    """The first value that ``dtype`` cannot hold, or None.

    A finite value beyond the dtype's largest finite value overflows to inf. A *scalar* that is
    non-zero but rounds to zero underflows (an epsilon of 1e-12 becoming 0 changes what an
    expression means; a tiny entry in a weight tensor does not, so only scalars are checked).
    """
    values = np.asarray(values)
    if values.size:
        peak = max(abs(float(values.max())), abs(float(values.min())))
        if not np.isfinite(peak):  # infinities and NaN are representable: look past them
            finite = values[np.isfinite(values)]
            peak = float(np.max(np.abs(finite))) if finite.size else 0.0
        if peak > max_finite(dtype):
            return peak
    if values.size == 1:
        scalar = float(values.reshape(()))
        if np.isfinite(scalar) and scalar != 0.0:
            if float(np.asarray(scalar).astype(numpy_dtype(dtype))) == 0.0:
                return scalar
    return None


def converted_tensor(values: np.ndarray, dtype: str):
    """``values`` converted to ``dtype`` in a new ``tvm.runtime.Tensor``.

    The converted copy is written into 64-byte aligned numpy memory that the tensor then
    shares through DLPack: about five times faster than ``tvm.runtime.tensor`` for the many small
    weights of a model, whose cost is dominated by the allocation.
    """
    import tvm

    target = numpy_dtype(dtype)
    if values.size == 0:
        return tvm.runtime.tensor(values.astype(target))
    nbytes = values.size * target.itemsize
    buffer = np.empty(nbytes + 64, np.uint8)
    offset = -buffer.ctypes.data % 64
    out = buffer[offset:offset + nbytes].view(target).reshape(values.shape)
    out[...] = values
    if dtype == "bfloat16":  # numpy's DLPack export knows no bfloat16: share the bits as uint16
        return tvm.runtime.from_dlpack(out.view(np.uint16))._create_view(out.shape, "bfloat16")  # noqa: SLF001 - no public bfloat16 view of DLPack memory in TVM
    return tvm.runtime.from_dlpack(out)
