"""Step 1 of the algorithm (stated in :mod:`relay_amp.rewriter`): the decisions of one
function; with steps 1b (:mod:`relay_amp.boundaries`) and 2 (:mod:`relay_amp.demand`), the
plan the rewriter carries out."""

from __future__ import annotations

import numpy as np
from tvm import relax
from tvm.ir import Call
from tvm.relax import (
    If,
    MatchCast,
    SeqExpr,
    TupleGetItem,
)
from tvm.tirx import IntImm

from .boundaries import BoundaryPlanner
from .calibrate import out_of_range_reason
from .demand import DemandPlanner
from .dtypes import (
    out_of_range_value,
)
from .kinds import LOW_CATEGORIES, Category, FusionKind, Mode
from .op_hooks import OpSite
from .op_registry import op_info
from .plan import Plan, range_words
from .policy import Decision, Policy
from .reasons import Reason
from .relax_utils import (
    VAR_TYPES,
    DtypeCache,
    GenericConst,
    is_var,
    leaves_of,
    op_name,
    scalar_value,
    tensor_dtype,
    type_leaves,
)
from .targets import KernelSettings


def _tests_infinity(call) -> bool:
    """Does ``call`` compare with an infinite or NaN constant (``equal(x, -inf)``)? Rounding a
    value the low dtype holds cannot flip that test."""
    for arg in call.args:
        value = scalar_value(arg)
        if value is None and type(arg) is GenericConst and arg.value.numpy().size == 1:
            value = float(arg.value.numpy().reshape(()))
        if value is not None and not np.isfinite(value):
            return True
    return False


def _governs_many(operand, result) -> bool:
    """Does one element of ``operand`` decide many of ``result`` (a scalar, or a value broadcast
    against a larger one)? An elementwise test flips one element where its operand rounds, the
    error rounding the value itself makes; a rounded scale or threshold moves every output."""
    operand_elements, result_elements = _elements(operand), _elements(result)
    return operand_elements is not None and (
        operand_elements <= 1 or (result_elements is not None
                                  and operand_elements < result_elements))


def _elements(var) -> int | None:
    """Elements of a static-shape tensor var, else None."""
    shape = getattr(getattr(var.ty, "shape", None), "values", None)
    if shape is None or not all(isinstance(d, IntImm) for d in shape):
        return None
    return int(np.prod([int(d) for d in shape])) if shape else 1


class FunctionPlanner(BoundaryPlanner, DemandPlanner):
    """Steps 1 and 2 of the algorithm for one function."""

    def __init__(self, policy: Policy, low: str, target_rule, constant_check, params_low: set,
                 observed=None, margin: float = 1.0, int_inputs=None, dtype_of=None,
                 settings: KernelSettings | None = None, param_problems=None,
                 callee_kinds=None):
        self.policy = policy
        self.callee_kinds = callee_kinds or {}  # PrimFunc name -> FusionKind of its call_tir
        self.param_problems = param_problems or {}  # param handle -> OutOfRange
        self.settings = settings or KernelSettings()
        self.boundaries = self.settings.low_precision_boundaries
        self.uses: dict = {}  # var -> consumers (a call binding's var, or None for other uses)
        self.tuple_items: dict = {}  # tuple var -> the vars bound to its items
        self.fused: set = set()  # (value, consumer) edges that stay inside one kernel
        self.group_kind: dict = {}  # var -> FusionKind of the kernel that computes it
        self.kernel_root: dict = {}  # var -> a later binding of its kernel (itself: the last)
        self.stored_low: set = set()  # float32 values stored in low precision between kernels
        self.residuals: set = set()  # float32 values kept float32 between kernels
        self.uncentred_streams: dict = {}  # residual stream stored low -> an op that adds to it
        self.low_values: set = set()  # float32 values that the rewrite computes in low precision
        self.folded: set = set()  # values computed from constants alone (folded at build time)
        self.absorbed: dict = {}  # residual add -> the centring kernel that computes it
        self.observed = observed  # var -> calibrated max |x| (None: not calibrated)
        self.margin = margin
        self.hot: dict = {}  # var -> why its value cannot be stored in the low dtype
        self.deciding: dict = {}  # var -> (consumer, its op): the value decides a discrete result
        self.low = low
        self.target_rule = target_rule
        self.constant_check = constant_check
        self.dtype_of = dtype_of or DtypeCache()
        self.params = set()
        self.params_low = params_low
        self.int_inputs = int_inputs or {}  # original float32 param -> integer dtype it is fed in
        self.bound: dict = {}  # var -> the value bound to it (for pattern checks)
        self.can_low: dict = {}
        self.f32_ready: dict = {}  # var -> its float32 value exists without a cast
        self.demand: dict = {}
        self.item_demand: dict = {}  # (tuple var, index) -> dtypes wanted of that field
        self.plans: dict = {}
        self.call_args: dict = {}  # call binding var -> [(argument, its leaves)]
        # Each FFI access returns a new Python wrapper, and a dict lookup with a wrapper that is
        # not the stored key falls back to a Python __eq__; every var is therefore looked up
        # through one canonical wrapper per object, so the lookups hit by identity.
        self._canonical: dict = {}
        self._sequences: dict = {}
        self._decisions: dict = {}  # op -> its decision, where the op alone decides

    # ------------------------------------------------------------------ helpers
    def canonical(self, var):
        """The one wrapper this planner uses for ``var`` (a Var; anything else is returned)."""
        if type(var) not in VAR_TYPES:
            return var
        return self._canonical.setdefault(var.__chandle__(), var)

    def leaves(self, arg) -> list:
        """``leaves_of(arg)`` with canonical vars."""
        return [self.canonical(leaf) for leaf in leaves_of(arg)]

    def bindings(self, seq: SeqExpr) -> list:
        """(binding, canonical var, value) of ``seq``, extracted once."""
        key = seq.__chandle__()
        entry = self._sequences.get(key)
        if entry is None:
            items = [(binding, self.canonical(binding.var), binding.value)
                     for block in seq.blocks for binding in block.bindings]
            entry = self._sequences[key] = (seq, items)
        return entry[1]

    def _orig_dtype(self, var) -> str | None:
        if var in self.params_low:
            return self.low
        return self.dtype_of(var)

    def _is_f32_ready(self, leaf) -> bool:
        if type(leaf) is GenericConst:
            return True
        if is_var(leaf):
            ready = self.f32_ready.get(leaf)
            if ready is not None:
                return ready
            return self._orig_dtype(leaf) == "float32"  # parameters and free vars
        return True

    def _is_constant(self, leaf) -> bool:
        """A constant, or a value computed from constants alone (TFLite's float16 weights
        behind an ``astype`` to float32): FoldConstant makes it a constant at build time."""
        return type(leaf) is GenericConst or leaf in self.folded

    def _is_lowish(self, leaf) -> bool:
        """Can ``leaf`` be had in low precision without losing float32 protection?"""
        if self._is_constant(leaf):
            return True
        if is_var(leaf):
            return leaf in self.params or self.can_low.get(leaf, False) or (
                self._orig_dtype(leaf) == self.low)
        return True

    def _float_leaves(self, var) -> list:
        """(leaf, dtype) of the float tensor leaves of the arguments of ``var``'s call."""
        found = []
        for _, arg_leaves in self.call_args[var]:
            for leaf in arg_leaves:
                dtype = self.dtype_of(leaf)
                if dtype is not None and dtype.startswith(("float", "bfloat")):
                    found.append((leaf, dtype))
        return found

    def site(self, var, call, demand=frozenset()) -> OpSite:
        """The view of ``var``'s call that an op hook gets."""
        plan = self.plans.get(var)
        return OpSite(call, self.low, plan.mode if plan is not None else Mode.ORIGINAL,
                      frozenset(demand), self.can_low.get(var, False),
                      self.f32_ready.get(var, False),
                      lambda expr: self.bound.get(self.canonical(expr)),
                      lambda expr: self.int_inputs.get(self.canonical(expr)))

    # ------------------------------------------------------------------ step 1
    def forward(self, seq: SeqExpr, params=()):
        for param in params:
            param = self.canonical(param)
            self.params.add(param)
            problem = self.param_problems.get(param.__chandle__())
            if problem is not None:
                self.hot[param] = problem
        self._mark_deciding(seq)
        for binding, var, value in self.bindings(seq):
            self._forward_binding(binding, var, value)

    def _mark_deciding(self, seq: SeqExpr):
        """The values that decide a discrete result, and the chain of calls that computes each,
        back to values with more elements than it has (the tensor a scale is measured on is
        read, not rounded): the operands an op declares (:attr:`OpHooks.decision_operands`: a
        quantization's scale and zero point), and the float operands of any other call whose
        result is integers or booleans (a comparison, a cast to an integer) where one element
        of the operand decides many of the result (:func:`_governs_many`)."""
        items = self.bindings(seq)
        producers = {var: value for _, var, value in items if type(value) is Call}
        for _, var, value in reversed(items):
            op = op_name(value) if type(value) is Call else None
            record = op_info(op)
            operands = record.decision_operands
            if (op and not operands and not record.integer_side and self._discrete(var)
                    and not _tests_infinity(value)):
                operands = tuple(i for i, arg in enumerate(value.args)
                                 if (tensor_dtype(arg) or "").startswith(("float", "bfloat"))
                                 and _governs_many(arg, var))
            for index in operands if op else ():
                if index >= len(value.args) or not is_var(value.args[index]):
                    continue
                operand = self.canonical(value.args[index])
                limit = _elements(operand)
                stack = [operand] if limit is not None else []
                while stack:
                    item = stack.pop()
                    producer = producers.get(item)
                    elements = _elements(item)
                    if (item in self.deciding or producer is None or elements is None
                            or elements > limit):  # the measured tensor is read, not rounded
                        continue
                    self.deciding[item] = (var, op)
                    stack.extend(self.canonical(leaf) for arg in producer.args
                                 for leaf in leaves_of(arg) if is_var(leaf))

    @staticmethod
    def _discrete(var) -> bool:
        """Is ``var`` a tensor (or tuple of tensors) of integers or booleans?"""
        dtypes = [str(t.dtype) for t in type_leaves(var.ty)]
        return bool(dtypes) and not any(d.startswith(("float", "bfloat")) for d in dtypes)

    def _forward_binding(self, binding, var, value):
        self.bound[var] = value
        if self._orig_dtype(var) == self.low:
            self.can_low[var] = True
        if type(binding) is MatchCast:
            return
        self._check_observed(var)
        value_type = type(value)
        if value_type is GenericConst or (is_var(value) and self.canonical(value) in self.folded):
            self.folded.add(var)  # a var bound to a constant is one
        op = op_name(value) if value_type is Call else None
        if op is not None:
            self.call_args[var] = [(self.canonical(arg), self.leaves(arg)) for arg in value.args]
            float_leaves = self._float_leaves(var)
            if all(type(leaf) is GenericConst or leaf in self.folded
                   for _, leaves in self.call_args[var] for leaf in leaves
                   if is_var(leaf) or type(leaf) is GenericConst):
                self.folded.add(var)  # FoldConstant computes it at build time: no kernel
            plan = self._plan_call(var, value, op, float_leaves)
            plan.constant_inputs = bool(float_leaves) and all(
                self._is_constant(leaf) for leaf, _ in float_leaves)
            plan.mixed = (self.settings.mixed_kernels and plan.category == Category.ACCUMULATE
                          and op_info(op).fusion == FusionKind.ANCHOR
                          and self.dtype_of(var) == "float32")
            self.plans[var] = plan
            self.can_low[var] = var not in self.hot and (
                self.can_low.get(var, False) or self._call_can_low(plan, float_leaves))
            self.f32_ready[var] = self._call_f32_ready(plan, var, float_leaves)
        elif value_type is If:
            self.forward(value.true_branch)
            self.forward(value.false_branch)
        elif is_var(value):
            value = self.canonical(value)
            self.can_low[var] = self.can_low.get(var, False) or self.can_low.get(value, False)
            self.f32_ready[var] = self._is_f32_ready(value)
        elif value_type is relax.Tuple:
            leaves = [leaf for leaf in self.leaves(value) if is_var(leaf)]
            self.can_low[var] = bool(leaves) and all(self._is_lowish(x) for x in leaves) and any(
                self.can_low.get(x, False) for x in leaves)
            self.f32_ready[var] = all(self._is_f32_ready(x) for x in leaves)
        elif value_type is TupleGetItem and is_var(value.tuple_value):
            source = self.canonical(value.tuple_value)
            self.can_low[var] = self.can_low.get(var, False) or self.can_low.get(source, False)
            self.f32_ready[var] = self._is_f32_ready(source)

    def _check_observed(self, var):
        if self.observed is None or self.dtype_of(var) != "float32":
            return
        largest = self.observed(var)
        if largest is None:
            return
        problem = out_of_range_reason(largest, self.low, self.margin)
        if problem is not None:
            self.hot[var] = problem

    def _decide(self, op: str, name: str, call) -> Decision:
        decision = self._decisions.get(op)
        if decision is None:
            decision = self.policy.decide(op, name, call.attrs, self.target_rule)
            if self.policy.depends_only_on_op(op):
                self._decisions[op] = decision
        return decision

    def _plan_call(self, var, call, op: str, float_leaves: list) -> Plan:
        name = var.name
        plan = Plan(op, name, self._decide(op, name, call))
        category = plan.category
        if category is None or category == Category.FP32:
            return plan
        var_dtype = self.dtype_of(var)
        out_dtypes = {var_dtype} if var_dtype else {tensor_dtype(t) for t in type_leaves(var.ty)}
        plan.float_output = any(d.startswith(("float", "bfloat")) for d in out_dtypes)
        if var in self.deciding:
            consumer, consumer_op = self.deciding[var]
            return self._keep(plan, Reason.of("decides_discrete", consumer=consumer.name,
                                              op=consumer_op))
        record = op_info(op)
        if record.identity is not None:
            identity = record.identity(self.site(var, call))
            if identity is not None:
                plan.mode, (reason, plan.source) = Mode.IDENTITY, identity
                plan.reasons = [reason]
                return plan
        limitation = record.limitations.get(self.low)
        if limitation and category in LOW_CATEGORIES + (Category.FOLLOW,):
            return self._keep(plan, Reason.of("tvm_limitation", limitation=limitation))
        foreign = sorted({d for _, d in float_leaves} - {"float32", self.low})
        if foreign:
            return self._keep(plan, Reason.of("foreign_dtypes", op=op, dtypes=", ".join(foreign)))
        if not any(d == "float32" for _, d in float_leaves) and "float32" not in out_dtypes:
            return self._keep(plan, Reason.of("no_float32", op=op))
        for leaf, dtype in float_leaves:
            if type(leaf) is GenericConst and dtype == "float32":
                bad = self.constant_check(leaf)
                if bad is not None and category != Category.STORAGE:
                    return self._keep(plan, Reason.of("constant_out_of_range", value=bad,
                                                      bound=range_words(bad, self.low)))
        if category in LOW_CATEGORIES + (Category.STORAGE,):
            for leaf, _ in float_leaves:
                if leaf in self.hot:
                    return self._keep(plan, Reason.of("input_out_of_range", input=leaf.name,
                                                      why=str(self.hot[leaf])))
        if var in self.hot:
            if category == Category.LOW_PRECISION_FP32_ACCUMULATE and (
                    plan.decision.accumulation_dtype == "float32"):
                plan.reasons.append(Reason.of("result_kept_float32", why=str(self.hot[var])))
            else:
                return self._keep(plan, Reason.of("out_of_range", why=str(self.hot[var])))
        for arg, _ in self.call_args[var]:
            scalar = scalar_value(arg)
            if scalar is not None and out_of_range_value(np.array(scalar), self.low) is not None:
                return self._keep(plan, Reason.of("scalar_out_of_range", value=scalar,
                                                  bound=range_words(scalar, self.low)))
        if (category in LOW_CATEGORIES and call.attrs is not None
                and hasattr(call.attrs, "out_dtype")):
            original = str(call.attrs.out_dtype) if call.attrs.out_dtype is not None else ""
            if original not in ("", "void", "float32", self.low):
                return self._keep(plan, Reason.of("foreign_out_dtype", dtype=original))
        return plan

    def _keep(self, plan: Plan, reason: Reason) -> Plan:
        plan.category = Category.FP32
        plan.reasons = [reason]
        return plan

    def _call_can_low(self, plan: Plan, float_leaves: list) -> bool:
        category = plan.category
        if self.hot and any(leaf in self.hot for leaf, _ in float_leaves):
            return False
        if category == Category.FOLLOW and op_info(plan.op).writes_low:
            return True
        if category in LOW_CATEGORIES:
            return True
        if category == Category.ACCUMULATE:
            return True
        if category == Category.FOLLOW:
            leaves = [leaf for leaf, _ in float_leaves]
            activations = [x for x in leaves if is_var(x) and x not in self.params
                           and x not in self.folded]
            if not activations:  # constants and parameters: an exact op on them is exact
                return op_info(plan.op).exact and (plan.constant_inputs or all(
                    self._is_constant(leaf) or self._orig_dtype(leaf) == self.low
                    for leaf in leaves))
            return all(self._is_lowish(x) for x in leaves) and any(
                self.can_low.get(x, False) or self._orig_dtype(x) == self.low for x in activations)
        return False

    def _call_f32_ready(self, plan: Plan, var, float_leaves: list) -> bool:
        """Will the float32 value of this binding exist without a cast?"""
        if self._orig_dtype(var) == self.low:
            return False
        category = plan.category
        if category == Category.LOW_PRECISION_FP32_ACCUMULATE:
            return plan.decision.accumulation_dtype == "float32"
        if category == Category.LOW_PRECISION:
            return False
        if category == Category.FOLLOW:
            return all(self._is_f32_ready(leaf) for leaf, _ in float_leaves)
        return True
