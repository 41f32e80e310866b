"""relay_amp.planning.plan_function on its own: which stage's word wins for a binding, and in
what order the reasons of the three stages come in its plan."""

import pytest
from cases import Chain, PostNorm
from stages import CUDA, DTYPES, Stages

from relay_amp.kinds import Mode
from relay_amp.planning import plan_function


def _plan(mod, dtype, target=None, **policy):
    stages = Stages(mod, dtype, target, **policy)
    return stages, plan_function(stages.func, stages.signature, stages.context)


@pytest.mark.parametrize("dtype", DTYPES)
def test_without_a_target_there_is_no_kernel_plan_and_demand_has_the_last_word(dtype):
    stages, plan = _plan(Chain, dtype)
    assert plan.kernels is None  # low_precision_boundaries is off without a target
    demand = stages.demand()
    decisions = stages.decide()
    for var, decided in decisions.plans.items():
        planned = plan.plans[var]
        assert planned.mode == (demand.modes.get(var) or decided.mode)
        assert planned.reasons[:len(decided.reasons)] == decided.reasons  # the policy's first
        assert planned.reasons[len(decided.reasons):] == demand.reasons.get(var, ())


@pytest.mark.parametrize("dtype", DTYPES)
def test_with_a_kernel_plan_its_reasons_come_before_demands(dtype):
    """Step 1's reasons, then step 1b's (kernel boundaries), then step 2's (demand); a mode
    demand set wins over the kernel plan's, which wins over step 1's."""
    stages, plan = _plan(PostNorm, dtype, CUDA)
    decisions = stages.decide()
    kernels = stages.kernels(decisions)
    demand = stages.demand(decisions, kernels)
    assert plan.kernels is not None
    seen_kernel_reason = False
    for var, decided in decisions.plans.items():
        planned = plan.plans[var]
        added = kernels.reasons.get(var, ())
        assert planned.reasons == decided.reasons + tuple(added) + demand.reasons.get(var, ())
        assert planned.mode == (demand.modes.get(var) or kernels.modes.get(var)
                                or decided.mode)
        seen_kernel_reason |= bool(added)
    assert seen_kernel_reason  # the absorbed adds at least
    assert "absorbed_add" in [r.code for r in plan.plans[stages.var("s")].reasons]


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_plan_is_frozen_and_reads_what_the_stages_made(dtype):
    stages, plan = _plan(PostNorm, dtype, CUDA)
    with pytest.raises(TypeError):
        plan.plans[stages.var("s")] = None  # a mapping proxy: step 3 reads, never writes
    assert plan.absorbed == dict(stages.kernels().absorbed)
    assert all(isinstance(p.mode, Mode) for p in plan.plans.values())
