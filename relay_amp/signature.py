"""The function signature, the first step of each function's conversion (the algorithm is
stated in :mod:`relay_amp.transform`): which parameters become low precision or integer inputs,
which float32 parameters the low dtype cannot hold (calibration) and so keep float32, and the
one cast of an integer input at the top of the function."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from tvm import relax
from tvm.ir import Call
from tvm.relax import (
    Function,
    If,
    SeqExpr,
    TensorType,
    TupleGetItem,
    Var,
)

from .dtypes import OutOfRange, is_floating, max_finite, out_of_range_reason, smallest_subnormal
from .dtypes import short_dtype as _short
from .op_registry import ALL, op_info
from .plan import range_words
from .relax_utils import (
    GenericConst,
    TupleType,
    is_var,
    leaves_of,
    lowered_type,
    op_name,
    tensor_dtype,
)

#: Reason code of a function parameter or result kept float32 although the signature asked for
#: the low-precision dtype (``keep_io_dtypes=False``, ``low_precision_inputs``): calibration, or a
#: constant, shows a value that dtype cannot hold. ``Policy(strict_io_dtypes=True)`` raises instead.
FP32_BOUNDARY = "fp32_boundary"


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


class _ResultValues:
    """What the values of a function result may be, and whether the low dtype holds them."""

    def __init__(self, scope, decisions, constant_check):
        self.scope, self.decisions = scope, decisions
        self.low = scope.low
        self.constant_check = constant_check

    def _values(self, expr, path=(), depth=0) -> list:
        """The expressions whose value (field ``path`` of) ``expr`` may be: itself, and what it
        is bound to through vars, tuples, tuple items, If branches and ops that pass the values
        of their one float input through."""
        if depth > 64:
            return []
        kind = type(expr)
        if kind is relax.Tuple:
            return self._values(expr.fields[path[0]], path[1:], depth + 1) if path else []
        if kind is TupleGetItem:
            return self._values(expr.tuple_value, (expr.index, *path), depth + 1)
        if kind is GenericConst:
            return [] if path else [expr]
        if not is_var(expr):
            return []
        var = self.scope.canonical(expr)
        found = [] if path else [var]
        value = self.scope.bound.get(var)
        if value is None:
            return found
        value_type = type(value)
        if value_type is If:
            return (found + self._values(value.true_branch.body, path, depth + 1)
                    + self._values(value.false_branch.body, path, depth + 1))
        if value_type is Call:
            plan = self.decisions.plans.get(var)
            if not path and plan is not None and op_info(plan.op).values == ALL:
                leaves = self.scope.float_leaves(var)
                if len(leaves) == 1:
                    found += self._values(leaves[0][0], (), depth + 1)
            return found
        return found + self._values(value, path, depth + 1)

    def _unholdable(self, expr) -> OutOfRange | None:
        """Why the value of ``expr`` (a var or constant) cannot be stored in the low dtype."""
        if type(expr) is GenericConst:
            if self.scope.dtype_of(expr) != "float32":
                return None
            bad = self.constant_check(expr)
            if bad is None:
                return None
            overflow = abs(bad) > max_finite(self.low)
            return OutOfRange(f"constant {bad:.4g} {range_words(bad, self.low)}", abs(bad),
                              max_finite(self.low) if overflow else smallest_subnormal(self.low))
        return self.decisions.hot.get(expr) if is_var(expr) else None

    def boundary_result_type(self, result, ret_ty):
        """The low-precision signature's result type: ``ret_ty`` with every float32 tensor leaf
        in the low dtype, except the leaves whose value the low dtype cannot hold; and those
        leaves as ``(path, expr, reason)``."""
        kept = []

        def walk(ty, path):
            if isinstance(ty, TensorType):
                if str(ty.dtype) != "float32":
                    return ty
                values = self._values(result, path)
                for expr in values:
                    problem = self._unholdable(expr)
                    if problem is not None:  # named after the var nearest the result
                        kept.append((path, next((v for v in values if is_var(v)), expr),
                                     problem))
                        return ty
                return lowered_type(ty, self.low)
            if isinstance(ty, TupleType):
                return TupleType([walk(f, (*path, i)) for i, f in enumerate(ty.fields)])
            return ty

        return walk(ret_ty, ()), kept


def result_signature(scope, decisions, constant_check, result, ret_ty):
    """The low-precision signature's result type: ``ret_ty`` with every float32 tensor leaf in
    the low dtype, except the leaves whose value the low dtype cannot hold; and those leaves as
    ``(path, expr, reason)``. ``decisions`` is what step 1 found (its ``plans`` and ``hot``)."""
    return _ResultValues(scope, decisions, constant_check).boundary_result_type(result, ret_ty)
