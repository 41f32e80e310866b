"""relay_amp.builds.flops: an epilogue's arithmetic as ``estimate_tir_flops`` counts it, a
``Let``'s value at each use of its variable."""

import pytest
import tvm
from tvm import tirx as T
from tvm.s_tir.analysis import estimate_tir_flops

from relay_amp.builds.flops import expanded_flops

_X, _Y = T.Var("x", "float32"), T.Var("y", "float32")
_I = T.Var("i", "int32")
_B = T.decl_buffer((8,), "float32", name="B")
_HALF = T.const(0.5, "float32")


def _store(value):
    return T.BufferStore(_B, value, [0])


@pytest.mark.parametrize("value", [
    _X + _Y, (_X + _Y) * (_X + _Y), T.max(_X, _HALF) - T.min(_Y, _HALF), _X / _Y,
    T.Select(_X + _Y > _Y, _X * _Y, _Y), T.floor(_X * _Y + _HALF),
    T.reinterpret("float32", (T.Cast("int32", _X) + 127) << 23),
    T.Cast("float32", T.floordiv(_I + _I, 3) >> 2), T.BufferLoad(_B, [_I + 1]) * _X,
], ids=lambda value: type(value).__name__)
def test_let_free_expressions_count_as_tvm_counts_them(value):
    assert expanded_flops(_store(value)) == estimate_tir_flops(_store(value))


def test_a_let_counts_its_value_at_each_use():
    """``let v = x + y in v * v * v`` costs what ``(x+y) * (x+y) * (x+y)`` does: LLVM code
    generation expands it so; TVM's own estimate refuses the ``Let``."""
    v = T.Var("v", "float32")
    bound = T.Let(v, _X + _Y, v * v * v)
    assert expanded_flops(_store(bound)) == estimate_tir_flops(
        _store((_X + _Y) * (_X + _Y) * (_X + _Y))) == 5
    with pytest.raises(tvm.error.InternalError):
        estimate_tir_flops(_store(bound))


def test_nested_lets_multiply():
    v, w = T.Var("v", "float32"), T.Var("w", "float32")
    nested = T.Let(v, _X + _Y, T.Let(w, v * v, w * w))
    assert expanded_flops(_store(nested)) == 7  # w*w: 1 + 2 × (v*v: 1 + 2 × 1)


def test_what_cannot_be_counted_is_infinite():
    vector = T.BufferStore(_B, T.Broadcast(_X, 4) * T.Broadcast(_Y, 4), [T.Ramp(0, 1, 4)])
    assert expanded_flops(vector) == float("inf")


def test_a_load_counts_what_its_inlined_block_costs():
    """A block inlined into its reader costs its flops at each load, a ``Let``'s value at
    each use of its variable: ``let v = A[i] + x in v * v`` with A's block costing 3 is 9."""
    a = T.decl_buffer((8,), "float32", name="A")
    v = T.Var("v", "float32")
    value = T.Let(v, T.BufferLoad(a, [_I]) + _X, v * v)
    assert expanded_flops(_store(value)) == 3
    assert expanded_flops(_store(value), {a: 3.0}) == 9
    assert expanded_flops(_store(value), {_B: 3.0}) == 3
