"""Float operations per output of a block's body, with ``Let`` bindings expanded.

TVM's ``estimate_tir_flops`` counts an expression read twice twice, which is what an epilogue
folded into a tile costs to compile: TVM's LLVM code generation binds each ``Let`` in its
``arith::Analyzer``, which substitutes the bound value at every use. It refuses a ``Let``,
though, and ``relay_amp.builds.fast_math`` writes its ``exp`` with ``Let`` so that TVM's TIR
passes see each temporary once. :func:`expanded_flops` counts as ``estimate_tir_flops`` does
(arithmetic 1 each, comparisons and loads 0, shifts, casts and calls what they read) and a
``Let``-bound variable as the operations of its value, at each use.
"""

from __future__ import annotations

import tvm

_ARITHMETIC = tuple(getattr(tvm.tirx, name) for name in (
    "Add", "Sub", "Mul", "Div", "Mod", "FloorDiv", "FloorMod", "Min", "Max"))
#: Counted 0 with what they read, as ``estimate_tir_flops`` does.
_FREE = tuple(getattr(tvm.tirx, name) for name in (
    "EQ", "NE", "LT", "LE", "GT", "GE", "And", "Or", "Not", "IntImm", "FloatImm"))


def expanded_flops(stmt, loads: dict | None = None) -> float:
    """Float operations of ``stmt``, a block's body, as ``estimate_tir_flops`` counts them, a
    ``Let``'s value counted at each use of its variable; infinite where neither can count them
    (a vector expression, a statement other than a store). ``loads`` maps a buffer to what
    each load of it counts (0 where it is absent): the body's cost once that buffer's block
    is inlined into it."""
    if not isinstance(stmt, tvm.tirx.BufferStore):
        from tvm.s_tir.analysis import estimate_tir_flops

        try:
            return float(estimate_tir_flops(stmt))
        except tvm.error.InternalError:
            return float("inf")
    try:
        bound = {buffer.__chandle__(): flops for buffer, flops in (loads or {}).items()}
        return _count(stmt.value, bound, {})
    except TypeError:
        return float("inf")


def _count(expr, bound: dict, memo: dict) -> float:
    key = expr.__chandle__()
    if key in memo:
        return memo[key]
    tirx = tvm.tirx
    if isinstance(expr, _ARITHMETIC):
        flops = 1.0 + _count(expr.a, bound, memo) + _count(expr.b, bound, memo)
    elif isinstance(expr, tvm.ir.expr.TensorLoad):
        flops = bound.get(expr.source.__chandle__(), 0.0)
    elif isinstance(expr, _FREE):
        flops = 0.0
    elif isinstance(expr, tirx.Var):
        flops = bound.get(key, 0.0)
    elif isinstance(expr, tirx.Let):
        bound[expr.var.__chandle__()] = _count(expr.value, bound, memo)
        flops = _count(expr.body, bound, memo)
    elif isinstance(expr, tvm.ir.prim.expr.BinaryOpExpr):  # shifts and bitwise: 0 each
        flops = _count(expr.a, bound, memo) + _count(expr.b, bound, memo)
    elif isinstance(expr, tirx.Select):
        flops = _count(expr.true_value, bound, memo) + _count(expr.false_value, bound, memo)
    elif isinstance(expr, tirx.Cast):
        flops = _count(expr.value, bound, memo)
    elif isinstance(expr, tvm.ir.expr.Call):
        flops = sum(_count(arg, bound, memo) for arg in expr.args)
    else:
        raise TypeError(type(expr).__name__)
    memo[key] = flops
    return flops


__all__ = ["expanded_flops"]
