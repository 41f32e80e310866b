"""What a stage test needs to run one stage on ``main`` of a TVMScript module: its context,
signature and scope, made as :func:`relay_amp.convert` makes them (no harness)."""


from relay_amp.casts import Constants
from relay_amp.decide import Decider
from relay_amp.demand import DemandPlanner
from relay_amp.kernel_plan import KernelPlanner
from relay_amp.op_registry import callee_fusion_kinds, selecting_callees
from relay_amp.plan import Context, Scope
from relay_amp.policy import Policy
from relay_amp.relax_utils import DtypeCache
from relay_amp.signature import function_signature
from relay_amp.targets import as_target, kernel_settings, target_rule

CUDA = {"kind": "cuda", "arch": "sm_90"}
DTYPES = ("float16", "bfloat16")


class Stages:
    """Steps 1, 1b and 2 of ``main`` of ``mod``, each run on demand and kept."""

    def __init__(self, mod, dtype, target=None, calibration=None, **policy_kwargs):
        policy = Policy(dtype, **policy_kwargs)
        target = as_target(target)
        kinds = callee_fusion_kinds(mod)
        self.context = Context(dtype, policy, target_rule(target, dtype, policy.fallback),
                               kernel_settings(policy, target), calibration, kinds,
                               DtypeCache(), Constants(dtype), selecting_callees(mod, kinds))
        self.func = mod["main"]
        self.signature = function_signature("main", self.func, self.context,
                                            not policy.keep_io_dtypes)
        self.scope = Scope(dtype, self.signature.params_low, self.context.dtype_of,
                           self.signature.int_inputs).read(self.func.body)
        self._vars = {var.name: var for _, var, _ in self.scope.bindings(self.func.body)}
        self._vars.update({p.name: self.scope.canonical(p) for p in self.func.params})

    def var(self, name):
        """The canonical var named ``name`` (a binding or parameter of ``main``)."""
        return self._vars[name]

    def decide(self):
        return Decider(self.scope, self.context, self.signature).decide(self.func)

    def kernels(self, decisions=None):
        decisions = decisions or self.decide()
        return KernelPlanner(self.scope, decisions, self.context.settings,
                             self.context.callee_kinds).plan(
            self.func.body, low_results=self.signature.results_low
            and decisions.result_type is None)

    def demand(self, decisions=None, kernels=()):
        decisions = decisions or self.decide()
        if kernels == ():
            kernels = (self.kernels(decisions)
                       if self.context.settings.low_precision_boundaries else None)
        return DemandPlanner(self.scope, decisions, kernels).plan(
            self.func.body, self.signature.results_low, decisions.result_type)
