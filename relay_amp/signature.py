"""The function signature, the first step of each function's conversion (the algorithm is
stated in :mod:`relay_amp.transform`): which parameters become low precision or integer inputs,
and which float32 parameters the low dtype cannot hold (calibration) and so keep float32. The
integer input's cast is a kernel of step 3 (:func:`relay_amp.kernels.integer_input`); the
result leaves a low-precision signature keeps float32 are step 1's
(:mod:`relay_amp.result_values`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from tvm.ir import Call
from tvm.relax import Function, SeqExpr, TensorType, Var

from .dtypes import OutOfRange, is_floating, max_finite, out_of_range_reason
from .op_registry import op_info
from .relax_utils import leaves_of, lowered_type, op_name, tensor_dtype


class KeptBoundary(NamedTuple):
    """A parameter or result the signature would make low precision that keeps float32.

    ``where`` is the parameter's name or ``result``, ``result[1]`` ...; ``value`` what holds it
    (a binding, parameter or ``constant``); ``named``: the user named it in
    ``low_precision_inputs``."""

    kind: str
    where: str
    value: str
    problem: OutOfRange
    named: bool = False


def refuse_if_strict(function: str, kept: KeptBoundary, low: str, strict: bool) -> KeptBoundary:
    """``kept``, or (``strict_io_dtypes``) a ValueError that says why it cannot be ``low``."""
    if strict:
        undo = f"leave it off to keep this {kept.kind} float32" + (
            f", or take {kept.where} out of low_precision_inputs" if kept.named else "")
        subject = kept.where if kept.where == kept.value else f"{kept.where} ({kept.value})"
        raise ValueError(f"{function}: {kept.kind} {subject} cannot be {low}: {kept.problem}; "
                         f"strict_io_dtypes is set ({undo})")
    return kept


@dataclass(frozen=True)
class Signature:
    """One function's signature as the conversion makes it.

    Attributes
    ----------
    name : str
        The function's name (``main``, or ``main.inner`` for a nested function).
    params : tuple
        The new parameters, in order.
    params_low : frozenset
        The original parameters made low precision or fed as integers.
    lowered : dict
        Original parameter -> its low-precision replacement.
    int_inputs : dict
        Original parameter -> the integer dtype it is fed in (``input_dtypes``).
    int_params : dict
        Original parameter -> the integer parameter that replaces it.
    prologue : tuple
        ``(parameter, integer parameter, normalization)`` of each integer input.
    problems : dict
        Parameter handle -> why the low dtype cannot hold it (calibration).
    results_low : bool
        The float32 results become low precision (where the low dtype holds them).
    observed : callable, optional
        ``var -> float | None``: the calibrated max ``|x|`` in this function.
    margin : float
        The calibration's safety margin.
    kept : tuple of KeptBoundary
        The parameters kept float32 although the signature asked for low precision.
    """

    name: str
    params: tuple
    params_low: frozenset
    lowered: dict
    int_inputs: dict
    int_params: dict
    prologue: tuple
    problems: dict
    results_low: bool
    observed: object = None
    margin: float = 1.0
    kept: tuple = ()


def function_signature(name: str, func: Function, context, results_low: bool,
                       entry: bool = True) -> Signature:
    """The signature of ``func``: with ``results_low`` its float32 results become low
    precision; an ``entry`` function (one of the module's, not a nested one) also takes the
    policy's ``low_precision_inputs``, ``input_dtypes`` and ``input_normalization``.

    Raises
    ------
    ValueError
        ``input_dtypes`` names a parameter that is not float32, or (``strict_io_dtypes``) a
        parameter the low dtype cannot hold is to be low precision.
    """
    policy, low = context.policy, context.low
    low_inputs = set(policy.low_precision_inputs) if entry else set()
    int_inputs = dict(policy.input_dtypes) if entry else {}
    normalization = dict(policy.input_normalization or {}) if entry else {}
    observed, margin = None, 1.0
    calibration = context.calibration
    if calibration is not None:
        observed = lambda var: calibration.observed_max(name, var.name)  # noqa: E731
        margin = calibration.margin
    params = list(func.params)
    problems = parameter_problems(func, params, observed, margin, low)
    new_params, params_low, lowered, ints, int_params = [], set(), {}, {}, {}
    prologue, kept = [], []
    for param in params:
        dtype = tensor_dtype(param)
        wanted_low = (results_low or param.name in low_inputs) and dtype == "float32"
        if param.name in int_inputs and dtype == int_inputs[param.name]:
            new_params.append(param)  # converted before: the input is already integer
        elif param.name in int_inputs:
            if dtype != "float32":
                raise ValueError(f"input_dtypes names {param.name!r}, a "
                                 f"{dtype or 'non-tensor'} parameter; only "
                                 "float32 tensor inputs can be fed as integers")
            params_low.add(param)
            new_param = Var(param.name, TensorType(param.ty.shape, int_inputs[param.name]))
            new_params.append(new_param)
            ints[param], int_params[param] = int_inputs[param.name], new_param
            prologue.append((param, new_param, normalization.get(param.name)))
        elif wanted_low and param.__chandle__() in problems:
            kept.append(refuse_if_strict(name, KeptBoundary(
                "parameter", param.name, param.name, problems[param.__chandle__()],
                param.name in low_inputs), low, policy.strict_io_dtypes))
            new_params.append(param)
        elif wanted_low:
            params_low.add(param)
            lowered[param] = Var(param.name, lowered_type(param.ty, low))
            new_params.append(lowered[param])
        else:
            new_params.append(param)
    return Signature(name, tuple(new_params), frozenset(params_low), lowered, ints, int_params,
                     tuple(prologue), problems, results_low, observed, margin, tuple(kept))


def parameter_problems(func: Function, params, observed, margin: float, low: str) -> dict:
    """Float32 parameters whose calibrated values the low dtype cannot hold: measured
    directly, or (a calibration without parameters) through a consumer whose result holds
    only their values. Keyed by the parameter's handle."""
    if observed is None:
        return {}
    problems = {}
    floats = {p.__chandle__(): p for p in params if tensor_dtype(p) == "float32"}
    for param in floats.values():
        largest = observed(param)
        problem = None if largest is None else out_of_range_reason(largest, low, margin)
        if problem is not None:
            problems[param.__chandle__()] = problem
    if not isinstance(func.body, SeqExpr) or len(problems) == len(floats):
        return problems
    for block in func.body.blocks:
        for binding in block.bindings:
            value = binding.value
            op = op_name(value) if type(value) is Call else None
            if op_info(op).values is None or tensor_dtype(binding.var) != "float32":
                continue
            leaves = [leaf for arg in value.args for leaf in leaves_of(arg)
                      if is_floating(tensor_dtype(leaf))]
            if len(leaves) != 1 or leaves[0].__chandle__() not in floats:
                continue
            param = floats[leaves[0].__chandle__()]
            largest = observed(binding.var)
            if param.__chandle__() in problems or largest is None or (
                    largest * margin <= max_finite(low)):
                continue
            problem = out_of_range_reason(largest, low, margin)
            problems[param.__chandle__()] = OutOfRange(
                f"its consumer {binding.var.name} ({op}, whose values are {param.name}'s) "
                f"has {problem}", problem.magnitude, problem.bound)
    return problems
