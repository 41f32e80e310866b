"""Each binding of a converted module against its float32 value, by name: the per-layer error
dump's measurement (``relay-amp convert --dump-errors``). Both modules are instrumented by the
one loop of :mod:`relay_amp.instrument` to return every compared value beside their result."""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Callable

import numpy as np
import tvm
from tvm import relax

from .builds.pipeline import compile_module
from .execution import as_batches, check_batch, contiguous, with_function
from .instrument import instrument, returning_stats


@dataclasses.dataclass(frozen=True)
class BindingError:
    """How far one binding's value in a converted module is from its float32 value, over all
    batches (:func:`binding_errors`)."""

    relative_l2: float
    max_abs: float
    #: Values that are NaN/Inf in the converted module and finite in float32 (then the error
    #: is infinite).
    nonfinite: int


_FLOAT_DTYPES = ("float32", "float16", "bfloat16", "float64")


def _returning_values(func: relax.Function, wanted: set):
    """``func`` also returning, widened to float32, the value of every float tensor binding
    whose name is in ``wanted``; and those names, in order."""
    names: list = []

    def probe(binding, bind):
        ty = binding.var.ty
        if (binding.var.name not in wanted or not isinstance(ty, relax.TensorType)
                or str(ty.dtype) not in _FLOAT_DTYPES):
            return []
        names.append(binding.var.name)
        return [bind(relax.op.astype(binding.var, "float32"), "dump_value", visible=True)]

    blocks, stats = instrument(func, probe)
    return returning_stats(func, blocks, stats), names


def _top_level_names(func: relax.Function) -> list:
    return [binding.var.name for block in func.body.blocks for binding in block.bindings]


def binding_errors(reference: tvm.IRModule, converted: tvm.IRModule, batches,
                   converted_batches=None, names=None, run_target=None,
                   on_batch: Callable | None = None) -> tuple[dict, dict]:
    """Each binding's error in ``converted`` against ``reference``, with everything before it
    converted as ``converted`` converts it: the value of the binding of the same name in each
    ``main``, compared over all batches.

    Both functions are instrumented (:func:`relay_amp.instrument.instrument`) to return every
    compared value as well as their result, widened to float32; each batch is one run of each.
    A binding is matched by name alone: one that the converter renamed, split or removed, or
    whose name is bound more than once, is not compared but listed with the reason.

    Parameters
    ----------
    reference : tvm.IRModule
        The float32 module.
    converted : tvm.IRModule
        Its conversion (:func:`relay_amp.convert`).
    batches : list of batches
        The reference's inputs (arrays in parameter order, or dicts by parameter name).
    converted_batches : list of batches, optional
        The converted module's inputs, where its parameters differ (an input fed as uint8);
        default ``batches``.
    names : list of str, optional
        The bindings to compare; default every top-level binding of the reference's ``main``.
    run_target : tvm.target.Target, optional
        Where both run (default: this machine's CPU).
    on_batch : callable, optional
        ``on_batch(done, total)`` after each batch (progress).

    Returns
    -------
    errors : dict
        Binding name → :class:`BindingError`, in the reference's execution order.
    unmatched : dict
        Binding name → why it was not compared (not a float tensor, not in the converted
        module, bound twice, a shape that differs).
    """
    batches = as_batches(batches)
    converted_batches = batches if converted_batches is None else as_batches(converted_batches)
    if len(converted_batches) != len(batches):
        raise ValueError(f"{len(batches)} reference batches but {len(converted_batches)} "
                         "converted ones")
    ref_func, conv_func = reference["main"], converted["main"]
    ordered = _top_level_names(ref_func)
    picked = None if names is None else set(names)
    wanted = [n for n in ordered if picked is None or n in picked]
    ref_counts, conv_counts = Counter(ordered), Counter(_top_level_names(conv_func))
    twice = {n for n, count in ref_counts.items() if count > 1 or conv_counts[n] > 1}
    conv_names = set(conv_counts)
    unmatched = {}
    for name in wanted:
        if name in twice:
            unmatched[name] = "bound more than once: not matched by name"
        elif name not in conv_names:
            unmatched[name] = ("not in the converted module: the converter renamed, split or "
                               "removed it")
    compared = {n for n in wanted if n not in unmatched}
    ref_probe, ref_order = _returning_values(ref_func, compared)
    conv_probe, conv_order = _returning_values(conv_func, compared)
    for name in wanted:
        if name in compared and name not in ref_order:
            unmatched[name] = "not a float tensor"
        elif name in compared and name not in conv_order:
            unmatched[name] = "not a float tensor in the converted module"
    in_converted = set(conv_order)
    both = [n for n in ref_order if n in in_converted]
    ref_vm = compile_module(relax.transform.Normalize()(
        with_function(reference, "main", ref_probe)), run_target)
    conv_vm = compile_module(relax.transform.Normalize()(
        with_function(converted, "main", conv_probe)), run_target)
    sums = {n: [0.0, 0.0, 0.0, 0] for n in both}  # squared error, squared norm, max abs, bad
    for index, (ref_batch, conv_batch) in enumerate(zip(batches, converted_batches)):
        ref_values = _values(ref_vm, check_batch(ref_func, ref_batch, index), ref_order)
        conv_values = _values(conv_vm, check_batch(conv_func, conv_batch, index), conv_order)
        for name in both:
            ref, out = ref_values[name], conv_values[name]
            if ref.shape != out.shape:
                unmatched[name] = (f"shape {tuple(out.shape)} in the converted module, "
                                   f"{tuple(ref.shape)} in float32")
                continue
            ref64, out64 = ref.astype(np.float64), out.astype(np.float64)
            keep = np.isfinite(ref64) & np.isfinite(out64)
            diff = ref64[keep] - out64[keep]
            total = sums[name]
            total[0] += float(np.sum(diff * diff))
            total[1] += float(np.sum(ref64[keep] ** 2))
            total[2] = max(total[2], float(np.max(np.abs(diff)))) if diff.size else total[2]
            total[3] += int(np.count_nonzero(~np.isfinite(out64) & np.isfinite(ref64)))
        if on_batch is not None:
            on_batch(index + 1, len(batches))
    errors = {}
    for name in both:
        if name in unmatched:
            continue
        num, den, largest, bad = sums[name]
        if bad:
            errors[name] = BindingError(float("inf"), float("inf"), bad)
        else:
            errors[name] = BindingError(float(np.sqrt(num / den)) if den > 0
                                        else float(np.sqrt(num)), largest, 0)
    return errors, {n: unmatched[n] for n in wanted if n in unmatched}


def _values(vm, batch: list, names: list) -> dict:
    result = vm["main"](*[tvm.runtime.tensor(contiguous(x)) for x in batch])
    return {name: result[1][i].numpy() for i, name in enumerate(names)}
