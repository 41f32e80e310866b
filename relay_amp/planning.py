"""Steps 1, 1b and 2 of the algorithm (stated in :mod:`relay_amp.transform`) for one function,
in the order they run, each handing its output to the next: :func:`plan_function` returns the
frozen :class:`~relay_amp.plan.FunctionPlan` that step 3 carries out."""

from __future__ import annotations

from .decide import Decider
from .demand import DemandPlanner, result_signature
from .kernel_plan import KernelPlanner
from .plan import FunctionPlan, Scope
from .reasons import Reason
from .relax_utils import is_var
from .signature import FP32_BOUNDARY
from .targets import KernelSettings


def plan_function(func, scope: Scope, policy, target_rule, constant_check, signature_low: bool,
                  observed=None, margin: float = 1.0, settings: KernelSettings | None = None,
                  param_problems=None, callee_kinds=None):
    """Plan the conversion of ``func``.

    Parameters
    ----------
    func : relax.Function
        The function as it is (its parameters are the original ones).
    scope : Scope
        Its bindings as the stages read them (fresh; this reads ``func.body`` into it).
    policy, target_rule, constant_check, observed, margin, settings, param_problems
        As :class:`relay_amp.decide.Decider` takes them.
    signature_low : bool
        The signature's float32 results become low precision.
    callee_kinds : dict
        PrimFunc name -> the FusionKind of a ``call_tir`` of it.

    Returns
    -------
    (FunctionPlan, result type or None, kept)
        The plan; the result type where a low-precision signature keeps some leaves float32
        (else None); those leaves as ``(path, expr, reason)``.
    """
    settings = settings or KernelSettings()
    scope.read(func.body)
    decisions = Decider(scope, policy, target_rule, constant_check, observed, margin, settings,
                        param_problems).decide(func.body, func.params)
    result_type, kept = None, []
    if signature_low:
        kept_type, kept = result_signature(scope, decisions, constant_check, func.body.body,
                                           func.ret_ty)
        for path, expr, problem in kept:
            plan = decisions.plans.get(expr) if is_var(expr) else None
            if plan is not None:
                where = "result" + "".join(f"[{i}]" for i in path)
                plan.reasons.append(Reason.of(FP32_BOUNDARY, where=where, why=str(problem)))
        if kept:
            result_type = kept_type
    kernels = None
    if settings.low_precision_boundaries:
        kernels = KernelPlanner(scope, decisions, settings, callee_kinds).plan(
            func.body, low_results=signature_low and result_type is None)
    demand = DemandPlanner(scope, decisions, kernels).plan(func.body, signature_low, result_type)
    plan = FunctionPlan.freeze(scope, decisions.plans, demand.demand, demand.item_demand,
                               kernels, decisions.can_low, decisions.f32_ready)
    return plan, result_type, kept
