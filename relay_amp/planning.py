"""Steps 1, 1b and 2 of the algorithm (stated in :mod:`relay_amp.transform`) for one function,
in the order they run, each handing its frozen output to the next: :func:`plan_function`
builds the :class:`~relay_amp.plan.FunctionPlan` that step 3 carries out from the three, with
the plans of the function's nested functions (each with its own signature) in it."""

from __future__ import annotations

from tvm.relax import Function

from .decide import Decider
from .demand import DemandPlanner
from .kernel_plan import KernelPlanner
from .plan import Context, FunctionPlan, NestedFunction, Scope
from .relax_utils import is_var
from .signature import KeptBoundary, Signature, function_signature, refuse_if_strict


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
        leaves float32, and the plan of each nested function (its signature keeps its
        parameters' and results' dtypes; its bindings are planned in ``context``).

    Raises
    ------
    ValueError
        (``strict_io_dtypes``) a result the low dtype cannot hold is to be low precision.
    """
    scope = Scope(context.low, signature.params_low, context.dtype_of,
                  signature.int_inputs).read(func.body)
    decisions = Decider(scope, context, signature).decide(func)
    kept = tuple(refuse_if_strict(signature.name, KeptBoundary(
        "result", "result" + "".join(f"[{i}]" for i in path),
        expr.name if is_var(expr) else "constant", problem), context.low,
        context.policy.strict_io_dtypes) for path, expr, problem in decisions.kept_results)
    kernels = None
    if context.settings.low_precision_boundaries:
        kernels = KernelPlanner(scope, decisions, context.settings, context.callee_kinds).plan(
            func.body, low_results=signature.results_low and decisions.result_type is None)
    demand = DemandPlanner(scope, decisions, kernels).plan(func.body, signature.results_low,
                                                           decisions.result_type)
    nested = {var: _nested(f"{signature.name}.{var.name}", value, context)
              for var, value in scope.bound.items() if isinstance(value, Function)}
    return FunctionPlan.build(scope, decisions, kernels, demand, kept, nested)


def _nested(name: str, func, context: Context) -> NestedFunction:
    signature = function_signature(name, func, context, results_low=False, entry=False)
    return NestedFunction(signature, plan_function(func, signature, context))

