"""Instrumentation: bindings appended after a function's own (or replacing one), the one loop
behind the debug guards (:func:`relay_amp.finish.add_debug_guards`), calibration
(:func:`relay_amp.calibrate`), and the local errors and output effects of the accuracy search
(:func:`relay_amp.fallback.local_errors`, :func:`relay_amp.fallback.output_effects`), and the
per-binding errors of the error dump (:func:`relay_amp.binding_errors.binding_errors`)."""

from __future__ import annotations

from typing import Callable

import tvm
from tvm import relax

#: ``bind(expr, label, visible=False) -> Var``: binds ``expr`` after the current binding; a
#: ``visible`` var is a plain ``Var`` even in a dataflow block (it is read after the block).
Bind = Callable[..., relax.Var]


def instrument(func: relax.Function, probe: Callable, params_probe: Callable | None = None,
               replace: Callable | None = None):
    """``func``'s blocks with ``probe``'s bindings after each binding.

    Parameters
    ----------
    func : relax.Function
        The function to instrument; it is not changed.
    probe : callable
        ``probe(binding, bind) -> list of Var``: binds what it measures of ``binding`` with
        ``bind`` and returns the scalar results (``bind(..., visible=True)``), or nothing.
    params_probe : callable, optional
        ``params_probe(param, bind) -> list of Var``, for each parameter, in a block of its own
        ahead of the function's.
    replace : callable, optional
        ``replace(binding, bind) -> Expr or None``: a new value for the binding's own var
        (every later use reads it), with what it needs bound by ``bind`` ahead of it; None
        keeps the binding.

    Returns
    -------
    blocks : list of relax.BindingBlock
    stats : list of relax.Var
        Every var the probes returned, in order.
    """
    builder = relax.BlockBuilder()
    blocks, stats = [], []

    def binder(bindings: list, dataflow: bool) -> Bind:
        local = relax.DataflowVar if dataflow else relax.Var

        def bind(expr, label: str, visible: bool = False) -> relax.Var:
            value = builder.normalize(expr)
            var = (relax.Var if visible else local)(label, value.ty)
            bindings.append(relax.VarBinding(var, value))
            return var
        return bind

    if params_probe is not None:
        bindings: list = []
        bind = binder(bindings, False)
        for param in func.params:
            stats.extend(params_probe(param, bind) or ())
        if bindings:
            blocks.append(relax.BindingBlock(bindings))
    for block in func.body.blocks:
        dataflow = isinstance(block, relax.DataflowBlock)
        bindings = []
        bind = binder(bindings, dataflow)
        for binding in block.bindings:
            value = replace(binding, bind) if replace is not None else None
            bindings.append(binding if value is None else
                            relax.VarBinding(binding.var, builder.normalize(value)))
            stats.extend(probe(binding, bind) or ())
        blocks.append((relax.DataflowBlock if dataflow else relax.BindingBlock)(bindings))
    return blocks, stats


def returning_stats(func: relax.Function, blocks: list, stats: list) -> relax.Function:
    """``func`` with ``blocks``, returning ``(its result, (stats...))``; each stat a float32
    scalar, or a tensor of its own type (the values the error dump compares)."""
    body = relax.SeqExpr(blocks, relax.Tuple([func.body.body, relax.Tuple(stats)]))
    ret = tvm.ir.type.TupleType([func.ret_ty, tvm.ir.type.TupleType([s.ty for s in stats])])
    return relax.Function(func.params, body, ret, func.is_pure, func.attrs)
