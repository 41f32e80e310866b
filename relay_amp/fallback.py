"""Accuracy-driven fallback: the smallest float32 set that meets a tolerance.

relay_amp's method measures each low-precision binding's *effect on the outputs*: one compile
of the float32 function with a selector, under which exactly one binding computes in low
precision on float32 surroundings, then one run per binding (:func:`output_effects`). A
binding's local error would mislead: the rounding that hurts is often harmless where it
happens and amplified a few ops later (a log, a normalisation), and a large local error can be
hidden downstream. Bindings are ranked by effect; an exponential and then a binary search over
the ranking finds the shortest prefix that, kept in float32, meets the tolerance.
:func:`local_errors` (one paired run, each op's own error) remains for diagnostics.
:func:`bisect_fallback` is the baseline users know (ONNX's auto-mixed-precision bisects node
segments), implemented in the same harness so that the evaluation counts compare.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Callable

import numpy as np
import tvm
from tvm import relax

from .builds.pipeline import compile_module
from .calibrate import Calibration, calibrate
from .dtypes import numpy_dtype
from .execution import agreement, as_batches, check_batch, contiguous, with_function
from .instrument import instrument, returning_stats
from .op_registry import op_info
from .policy import Policy
from .reasons import Reason
from .relax_utils import TVM_ERRORS, op_name
from .report import Report
from .resolve import resolve_policy
from .rewriter import replace_attrs
from .transform import convert

METRICS = ("relative_l2", "max_abs")
#: Input batches the ranking measures on (the search's evaluations use them all): each is one
#: run of the model per candidate binding, and a ranking needs no more.
RANKING_BATCHES = 2


@dataclasses.dataclass
class SearchResult:
    """What a fallback search did: the float32 set it chose and what that cost."""

    method: str
    tolerance: float
    metric_value: float
    met: bool
    evaluations: int
    fp32_bindings: list
    low_bindings: int
    seconds: float
    history: list  # (number of float32 bindings, metric value) per evaluation
    #: Multiply-accumulates the chosen float32 bindings keep in float32, and the module's.
    fp32_macs: int = 0
    total_macs: int = 0
    #: The bindings whose rounding moves the outputs most: ``(name, output error when it
    #: alone computes low)``, largest first (:func:`output_effects`).
    contributors: list = dataclasses.field(default_factory=list)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def explain(self) -> str:
        """One line: what stayed float32, its share of the MACs, and why."""
        if not self.fp32_bindings:
            return (f"search: tolerance {self.tolerance:g} met ({self.metric_value:.3g}) with "
                    "no binding kept in float32")
        share = self.fp32_macs / self.total_macs if self.total_macs else 0.0
        top = ", ".join(f"{name} ({effect:.2g})" for name, effect in self.contributors[:3])
        return (f"search: {len(self.fp32_bindings)} binding(s) kept in float32 "
                f"({100 * share:.1f}% of MACs) to meet {self.tolerance:g} "
                f"({self.metric_value:.3g}); largest output error of one binding alone in low "
                f"precision: {top}")


class _Harness:
    """Converts with a set of float32 bindings, compiles, runs, and scores against float32."""

    def __init__(self, mod, batches, metric, dtype, policy, target, calibration, run_target,
                 on_evaluation=None):
        self.mod, self.batches, self.dtype = mod, batches, dtype
        self.on_evaluation = on_evaluation
        self.policy, self.target, self.calibration = policy, target, calibration
        self.run_target = run_target
        self.metric = _metric(metric)
        vm = compile_module(mod, run_target)
        from .execution import run

        self.run = run
        self.reference = [out for batch in batches for out in run(vm, batch)]
        self.evaluations = 0
        self.history = []

    def convert(self, fp32: list) -> tuple:
        policy = self.policy.with_dtype(self.dtype)
        if fp32:
            policy.exclude(*fp32)
        return convert(self.mod, self.dtype, policy=policy, target=self.target,
                       calibration=self.calibration)

    def score(self, fp32: list) -> float:
        converted, _ = self.convert(fp32)
        vm = compile_module(converted, self.run_target)
        outputs = [out for batch in self.batches for out in self.run(vm, batch)]
        value = float(self.metric(self.reference, outputs))
        self.evaluations += 1
        self.history.append((len(fp32), value))
        if self.on_evaluation is not None:
            self.on_evaluation(list(fp32), value)
        return value


def _metric(metric) -> Callable:
    if callable(metric):
        return metric
    if metric == "relative_l2":
        return lambda ref, out: agreement(ref, out).relative_l2
    if metric == "max_abs":
        return lambda ref, out: agreement(ref, out).max_abs
    raise ValueError(f"metric must be one of {METRICS} or a callable(reference, outputs); "
                     f"got {metric!r}")


def _check(mod, inputs, tolerance, max_evaluations):
    if not isinstance(mod, tvm.IRModule):
        raise TypeError(f"expected a tvm.IRModule; got {type(mod).__name__}")
    if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or not (
            math.isfinite(tolerance) and tolerance > 0):
        raise ValueError(f"tolerance must be a positive finite number; got {tolerance!r}")
    if not isinstance(max_evaluations, int) or max_evaluations < 1:
        raise ValueError(f"max_evaluations must be a positive integer; got {max_evaluations!r}")
    batches = as_batches(inputs)
    if not batches:
        raise ValueError("auto_mixed_precision needs at least one batch of inputs")
    return [check_batch(mod["main"], batch, i) for i, batch in enumerate(batches)]


def _low_bindings(report: Report) -> list:
    return [r.name for r in report.rows if r.compute_dtype == report.dtype and r.function == "main"]


def _low_precision_shadow(binding, dtype: str, bind):
    """``binding``'s op computed in ``dtype`` on its float32 operands, widened back to
    float32 (what the binding gives when it alone is converted), bound with ``bind``; None
    where there is nothing to compute (not an op call, or an op that takes no low-precision
    operands)."""
    value = binding.value
    if not isinstance(value, tvm.ir.Call) or not isinstance(value.op, tvm.ir.Op):
        return None
    if not isinstance(binding.var.ty, relax.TensorType):
        return None
    args = []
    for arg in value.args:
        if isinstance(arg.ty, relax.TensorType) and str(arg.ty.dtype) == "float32":
            if isinstance(arg, type(relax.const(0.0))):
                low = arg.value.numpy().astype(numpy_dtype(dtype))
                args.append(relax.const(low, dtype))
            else:
                args.append(bind(relax.op.astype(arg, dtype), "pair_in"))
        else:
            args.append(arg)
    attrs = value.attrs
    if (attrs is not None and hasattr(attrs, "out_dtype")
            and not op_info(op_name(value)).keeps_out_dtype):
        attrs = replace_attrs(attrs, out_dtype="float32")
    try:
        shadow = bind(tvm.ir.Call(value.op, args, attrs, value.ty_args), "pair_low")
    except TVM_ERRORS:  # the op does not take low-precision operands: nothing to measure
        return None
    return bind(relax.op.astype(shadow, "float32"), "pair_wide")


# ------------------------------------------------------------------------------ paired run
def local_errors(mod: tvm.IRModule, batches, names, dtype: str, run_target=None) -> dict:
    """Each named binding's local relative L2 error in ``dtype``, from one paired run.

    The float32 function is extended, for each named call binding, with the same op computed in
    ``dtype`` on its (exact, float32) operands; its squared error and norm come back as extra
    outputs, summed over all batches.
    """
    func = mod["main"]
    wanted, measured = set(names), []

    def pair(binding, bind):
        if binding.var.name not in wanted:
            return []
        wide = _low_precision_shadow(binding, dtype, bind)
        if wide is None:
            return []
        diff = bind(relax.op.subtract(wide, binding.var), "pair_diff")
        squared = bind(relax.op.multiply(diff, diff), "pair_sq")
        err = bind(relax.op.sum(squared), "pair_err", visible=True)
        magnitude = bind(relax.op.multiply(binding.var, binding.var), "pair_n2")
        norm = bind(relax.op.sum(magnitude), "pair_norm", visible=True)
        measured.append(binding.var.name)
        return [err, norm]

    blocks, stats = instrument(func, pair)
    paired = returning_stats(func, blocks, stats)
    probe = with_function(mod, "main", paired)
    vm = compile_module(relax.transform.Normalize()(probe), run_target)
    totals = np.zeros(len(stats), np.float64)
    for batch in batches:
        result = vm["main"](*[tvm.runtime.tensor(contiguous(x)) for x in batch])
        totals += [float(result[1][i].numpy()) for i in range(len(stats))]
    return {name: float(np.sqrt(totals[2 * i] / totals[2 * i + 1])) if totals[2 * i + 1] > 0
            else float(np.sqrt(totals[2 * i])) for i, name in enumerate(measured)}


def output_effects(mod: tvm.IRModule, batches, names, dtype: str, run_target=None,
                   on_run: Callable | None = None) -> dict:
    """Each named binding's effect on the outputs: their relative L2 error against float32 when
    that binding alone computes in ``dtype`` and everything else in float32.

    A binding's local error says little about what its rounding does downstream (a log or a
    normalisation a few ops later amplifies it; a ReLU or a pooling hides it), so this measures
    the outputs themselves. The float32 function gets one more parameter, a selector, and each
    named binding becomes ``where(selector == i, its dtype shadow, itself)`` (the binding's own
    var holds the selection, so every later use reads it): one compile, then one run per
    binding and batch.

    Parameters
    ----------
    mod : tvm.IRModule
        The float32 module (function ``main``).
    batches : list of batches
        Its inputs, as :func:`relay_amp.calibrate` takes them.
    names : list of str
        The bindings of ``main`` to measure.
    dtype : str
        The low-precision dtype.
    run_target : tvm.target.Target, optional
        Where to run (default: this machine's CPU).
    on_run : callable, optional
        ``on_run(done, total)`` after each run (progress; ``total`` is the runs to make).

    Returns
    -------
    dict
        Binding name → relative L2 of all outputs over all ``batches``; only the bindings
        whose op can be computed in ``dtype``.
    """
    func = mod["main"]
    wanted, measured = set(names), []
    selector = relax.Var("relay_amp_effect_selector", relax.TensorType((), "int32"))

    def select(binding, bind):
        if binding.var.name not in wanted or not isinstance(binding, relax.VarBinding):
            return None
        exact = bind(binding.value, f"{binding.var.name}_exact")
        wide = _low_precision_shadow(relax.VarBinding(exact, binding.value), dtype, bind)
        if wide is None:
            return exact
        chosen = bind(relax.op.equal(selector, relax.const(len(measured), "int32")),
                      f"{binding.var.name}_chosen")
        measured.append(binding.var.name)
        return relax.op.where(chosen, wide, exact)

    blocks, _ = instrument(func, lambda binding, bind: [], replace=select)
    if not measured:
        return {}
    body = relax.SeqExpr(blocks, func.body.body)
    probe = relax.Function([*func.params, selector], body, func.ret_ty, func.is_pure,
                           func.attrs)
    vm = compile_module(relax.transform.Normalize()(with_function(mod, "main", probe)),
                        run_target)
    from .execution import run

    squared = np.zeros(len(measured), np.float64)
    norm, runs = 0.0, iter(range(1, len(batches) * (len(measured) + 1) + 1))

    def ran():
        if on_run is not None:
            on_run(next(runs), len(batches) * (len(measured) + 1))

    for batch in batches:
        inputs = list(batch.values()) if isinstance(batch, dict) else list(batch)
        reference = run(vm, [*inputs, np.array(-1, "int32")])
        norm += sum(float(np.sum(np.square(r.astype(np.float64)))) for r in reference)
        ran()
        for i in range(len(measured)):
            outputs = run(vm, [*inputs, np.array(i, "int32")])
            squared[i] += sum(float(np.sum(np.square(o.astype(np.float64)
                                                     - r.astype(np.float64))))
                              for o, r in zip(outputs, reference))
            ran()
    scale = norm if norm > 0 else 1.0
    effects = np.sqrt(squared / scale)
    # an overflow (Inf/NaN in the outputs) is the largest effect there is
    effects[~np.isfinite(effects)] = np.inf
    return {name: float(effects[i]) for i, name in enumerate(measured)}


# ------------------------------------------------------------------------------ the searches
def _prepare(mod, inputs, tolerance, metric, dtype, target, max_evaluations, policy, calibrated,
             run_target, on_evaluation=None):
    """Check the arguments; return the harness, the low-precision candidates, the batches and
    the report of the conversion without float32 bindings."""
    batches = _check(mod, inputs, tolerance, max_evaluations)
    policy = resolve_policy(dtype, policy)
    if isinstance(calibrated, Calibration):
        calibration = calibrated
    else:
        calibration = calibrate(mod, batches) if calibrated else None
    harness = _Harness(mod, batches, metric, dtype, policy, target, calibration, run_target,
                       on_evaluation)
    _, first = harness.convert([])
    return harness, _low_bindings(first), batches, first


def _costs(mod: tvm.IRModule, report: Report) -> dict:
    """What keeping each binding of ``main`` in float32 costs: its multiply-accumulates plus
    its output's elements (so that, between ops without MACs, the smaller is cheaper)."""
    macs = {r.name: r.macs for r in report.ops if r.function == "main"}
    costs = {}
    for block in mod["main"].body.blocks:
        for binding in block.bindings:
            ty = binding.var.ty
            elements = 1
            if isinstance(ty, relax.TensorType) and ty.shape is not None:
                for dim in ty.shape.values:
                    elements *= int(dim) if isinstance(dim, tvm.tirx.IntImm) else 1
            costs[binding.var.name] = macs.get(binding.var.name, 0) + elements
    return costs


def auto_mixed_precision(mod: tvm.IRModule, inputs, tolerance: float, metric="relative_l2",
                         dtype: str = "float16", target=None, max_evaluations: int = 16,
                         policy: Policy | None = None, calibrated: bool | Calibration = True,
                         run_target=None, on_evaluation=None,
                         output_policy: Policy | None = None,
                         ranking: str = "effect") -> tuple[tvm.IRModule, Report]:
    """Convert ``mod`` so that it meets ``tolerance`` on ``inputs`` with few float32 ops.

    Parameters
    ----------
    mod : tvm.IRModule
        The float32 module (function ``main``).
    inputs : list of batches, or one batch
        Calibration inputs: arrays in parameter order, or dicts by parameter name.
    tolerance : float
        The largest acceptable ``metric`` between float32 and converted outputs.
    metric : {"relative_l2", "max_abs"} or callable
        ``callable(reference_outputs, outputs) -> float`` for a task metric.
    dtype, target, policy
        As for :func:`relay_amp.convert`; the policy is the starting point.
    max_evaluations : int
        Full conversion + compile + run cycles allowed (the paired run is not one of them).
    calibrated : bool or Calibration
        Start from calibrated ranges (:func:`relay_amp.calibrate`, one more float32 run), or
        from the given :class:`Calibration` (no extra run).
    run_target : tvm.target.Target, optional
        Where the evaluations run (default: this machine's CPU).
    on_evaluation : callable, optional
        Called as ``on_evaluation(fp32_bindings, value)`` after each evaluation (progress).
    output_policy : Policy, optional
        The policy the returned module is converted with, the bindings the search keeps in
        float32 excluded on top: the search's own policy plus what its inputs cannot exercise
        (``input_dtypes`` a model is fed in production, say). Default: ``policy``.
    ranking : {"effect", "local"}
        What orders the candidates: each binding's effect on the outputs
        (:func:`output_effects`, the default) or its local error (:func:`local_errors`, the
        earlier method, kept for comparison).

    Returns
    -------
    (tvm.IRModule, Report)
        The module and its report; ``report.search`` is the :class:`SearchResult`.

    Raises
    ------
    ValueError
        Bad tolerance, metric or max_evaluations, no inputs, or inputs that do not fit.
    RuntimeError
        The tolerance was not met within ``max_evaluations``.
    """
    start = time.perf_counter()
    rankings = {"effect": output_effects, "local": local_errors}
    if ranking not in rankings:
        raise ValueError(f"ranking must be one of {sorted(rankings)}; got {ranking!r}")
    harness, candidates, batches, first = _prepare(mod, inputs, tolerance, metric, dtype, target,
                                            max_evaluations, policy, calibrated, run_target,
                                            on_evaluation)

    def finish(fp32, value):
        if output_policy is None:
            converted, report = harness.convert(fp32)
        else:
            final = output_policy.with_dtype(dtype).exclude(*fp32)
            converted, report = convert(mod, dtype, policy=final, target=harness.target,
                                        calibration=harness.calibration)
        rows = []
        for row in report.rows:
            if row.name in fp32 and row.function == "main":
                reason = Reason.of("search_fallback", measure=measures[ranking],
                                   error=effects.get(row.name, float("nan")),
                                   rank=fp32.index(row.name) + 1)
                row = dataclasses.replace(row, reasons=(reason,))
            rows.append(row)
        report.rows = rows
        main_ops = [r for r in report.ops if r.function == "main"]
        report.search = SearchResult(
            {"effect": "output effect", "local": "local error"}[ranking], float(tolerance),
            value, value <= tolerance, harness.evaluations,
            list(fp32), len(_low_bindings(report)), time.perf_counter() - start,
            harness.history, fp32_macs=sum(r.macs for r in main_ops if r.name in fp32),
            total_macs=sum(r.macs for r in main_ops),
            contributors=sorted(((n, effects[n]) for n in ranked if ranking == "effect"),
                                key=lambda item: -item[1])[:5])
        return converted, report

    measures = {"effect": f"output error with it alone in {dtype}",
                "local": f"local {dtype} error"}

    effects: dict = {}
    ranked: list = []
    value = harness.score([])
    if value <= tolerance:
        return finish([], value)
    effects = rankings[ranking](mod, batches[:RANKING_BATCHES], candidates, dtype, run_target)
    # output errors of independent roundings add in quadrature: each binding kept float32
    # removes about its effect squared, for its cost in MACs (a greedy knapsack order)
    costs = _costs(mod, first) if ranking == "effect" else {}
    ranked = sorted((n for n in effects if effects[n] > 0),
                    key=lambda n: (-effects[n] ** 2 / max(costs.get(n, 1), 1), n))
    # exponential search for a prefix that meets the tolerance, then binary search below it
    good, bad = None, 0
    k = 1
    while harness.evaluations < max_evaluations:
        k = min(k, len(ranked))
        value_k = harness.score(ranked[:k])
        if value_k <= tolerance:
            good = (k, value_k)
            break
        bad = k
        if k == len(ranked):
            break
        k *= 2
    if good is None:
        raise RuntimeError(f"tolerance {tolerance:g} not met within {harness.evaluations} "
                           f"evaluations (best {min(v for _, v in harness.history):.3g})")
    low_k, (high_k, best) = bad, good
    while high_k - low_k > 1 and harness.evaluations < max_evaluations:
        middle = (low_k + high_k) // 2
        value_m = harness.score(ranked[:middle])
        if value_m <= tolerance:
            high_k, best = middle, value_m
        else:
            low_k = middle
    return finish(ranked[:high_k], best)


def bisect_fallback(mod: tvm.IRModule, inputs, tolerance: float, metric="relative_l2",
                    dtype: str = "float16", target=None, max_evaluations: int = 1000,
                    policy: Policy | None = None, calibrated: bool = True,
                    run_target=None) -> SearchResult:
    """Segment bisection (the ONNX auto-mixed-precision strategy), as the baseline.

    Converts the whole candidate list; if the result misses the tolerance, splits it in halves
    and recurses, each trial a full conversion + compile + run. Returns the search result.
    """
    start = time.perf_counter()
    harness, candidates, _, _ = _prepare(mod, inputs, tolerance, metric, dtype, target,
                                      max_evaluations, policy, calibrated, run_target)

    def trial(low: list) -> bool:
        if harness.evaluations >= max_evaluations:
            return False
        fp32 = [n for n in candidates if n not in set(low)]
        return harness.score(fp32) <= tolerance

    def search(segment: list, fixed: list) -> list:
        if not segment:
            return []
        if trial(fixed + segment):
            return list(segment)
        if len(segment) == 1:
            return []
        half = len(segment) // 2
        left = search(segment[:half], fixed)
        return left + search(segment[half:], fixed + left)

    low = search(candidates, [])
    fp32 = [n for n in candidates if n not in set(low)]
    value = min((v for n, v in harness.history if n == len(fp32)), default=float("inf"))
    if harness.history and not any(n == len(fp32) for n, _ in harness.history):
        value = harness.score(fp32)
    return SearchResult("bisection", float(tolerance), value, value <= tolerance,
                        harness.evaluations, fp32, len(low), time.perf_counter() - start,
                        harness.history)
