"""Steps 1, 1b and 2 of the algorithm (stated in :mod:`relay_amp.transform`) for one function,
in the order they run, each handing its output to the next: :func:`plan_function` returns the
frozen :class:`~relay_amp.plan.FunctionPlan` that step 3 carries out."""

from __future__ import annotations

from .decide import Decider
from .demand import DemandPlanner, result_signature
from .kernel_plan import KernelPlanner
from .plan import Context, FunctionPlan, Scope
from .reasons import Reason
from .relax_utils import is_var
from .signature import FP32_BOUNDARY, KeptBoundary, Signature, refuse_if_strict


def plan_function(func, signature: Signature, context: Context) -> FunctionPlan:
    """Plan the conversion of ``func``.

    Parameters
    ----------
    func : relax.Function
        The function as it is (its parameters are the original ones).
    signature : relay_amp.signature.Signature
        Its signature as the conversion makes it.
    context : relay_amp.plan.Context
        What it is converted with.

    Returns
    -------
    FunctionPlan
        The plan, with the result type where a low-precision signature keeps some result
        leaves float32.

    Raises
    ------
    ValueError
        (``strict_io_dtypes``) a result the low dtype cannot hold is to be low precision.
    """
    scope = Scope(context.low, signature.params_low, context.dtype_of,
                  signature.int_inputs).read(func.body)
    settings = context.settings
    decisions = Decider(scope, context.policy, context.target_rule, context.constant_check,
                        signature.observed, signature.margin, settings,
                        signature.problems).decide(func.body, func.params)
    result_type, kept = None, []
    if signature.results_low:
        kept_type, found = result_signature(scope, decisions, context.constant_check,
                                            func.body.body, func.ret_ty)
        for path, expr, problem in found:
            where = "result" + "".join(f"[{i}]" for i in path)
            value = expr.name if is_var(expr) else "constant"
            kept.append(refuse_if_strict(signature.name, KeptBoundary(
                "result", where, value, problem), context.low, context.policy.strict_io_dtypes))
            plan = decisions.plans.get(expr) if is_var(expr) else None
            if plan is not None:
                plan.reasons.append(Reason.of(FP32_BOUNDARY, where=where, why=str(problem)))
        if found:
            result_type = kept_type
    kernels = None
    if settings.low_precision_boundaries:
        kernels = KernelPlanner(scope, decisions, settings, context.callee_kinds).plan(
            func.body, low_results=signature.results_low and result_type is None)
    demand = DemandPlanner(scope, decisions, kernels).plan(func.body, signature.results_low,
                                                           result_type)
    return FunctionPlan.freeze(scope, decisions.plans, demand.demand, demand.item_demand,
                               kernels, decisions.can_low, decisions.f32_ready, result_type,
                               kept)
