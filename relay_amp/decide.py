"""Step 1 of the algorithm (stated in :mod:`relay_amp.transform`): decide. Forward over the
bindings of one function, each call gets its category and reasons, and a low-precision
signature's result leaves the low dtype cannot hold keep float32 (:class:`Decisions`, frozen),
which step 1b (:mod:`relay_amp.kernel_plan`) and step 2 (:mod:`relay_amp.demand`) read."""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

import numpy as np
from tvm import relax
from tvm.ir import Call
from tvm.relax import (
    If,
    MatchCast,
    SeqExpr,
    TupleGetItem,
)

from .dtypes import is_floating, out_of_range_reason, out_of_range_value
from .kinds import LOW_CATEGORIES, Category, FusionKind, Mode
from .op_hooks import OpSite
from .op_registry import op_info, selects_among_inputs
from .plan import BindingPlan, Context, Scope, range_words
from .policy import Decision
from .reasons import FP32_BOUNDARY, Reason
from .relax_utils import (
    GenericConst,
    element_count,
    is_var,
    leaves_of,
    scalar_value,
    tensor_dtype,
    type_leaves,
)
from .result_values import result_signature
from .signature import Signature


@dataclass(frozen=True)
class Decisions:
    """What step 1 hands on: the decision of each call binding and what it found of each value;
    no later step writes into it.

    Attributes
    ----------
    scope : Scope
        The function's bindings.
    plans : Mapping
        Call binding var -> its :class:`~relay_amp.plan.BindingPlan` as step 1 decides it
        (mode ``ORIGINAL``, or ``IDENTITY``; steps 1b and 2 choose the others).
    can_low : Mapping
        Var -> whether its value can exist in low precision without losing float32 protection.
    f32_ready : Mapping
        Var -> whether its float32 value exists without a cast.
    folded : frozenset
        Values computed from constants alone (FoldConstant makes them constants).
    hot : Mapping
        Var -> why its value cannot be stored in the low dtype (calibration).
    params : frozenset
        The function's parameters.
    result_type : relax.Type, optional
        The result type where a low-precision signature keeps some result leaves float32.
    kept_results : tuple
        Those leaves, as ``(path, expr, reason)``.
    """

    scope: Scope
    plans: MappingProxyType
    can_low: MappingProxyType
    f32_ready: MappingProxyType
    folded: frozenset
    hot: MappingProxyType
    params: frozenset
    result_type: object = None
    kept_results: tuple = ()

    def is_constant(self, leaf) -> bool:
        """A constant, or a value computed from constants alone (TFLite's float16 weights
        behind an ``astype`` to float32): FoldConstant makes it a constant at build time."""
        return type(leaf) is GenericConst or leaf in self.folded

    def site(self, var, call, demand=frozenset()) -> OpSite:
        """The view of ``var``'s call that an op hook gets in steps 1b and 2."""
        plan = self.plans.get(var)
        return self.scope.site(call, plan.mode if plan is not None else Mode.ORIGINAL, demand,
                               self.can_low.get(var, False), self.f32_ready.get(var, False))


class _Draft:
    """One call binding's decision while step 1 makes it."""

    __slots__ = ("op", "name", "decision", "category", "reasons", "mode", "float_output",
                 "constant_inputs", "mixed", "source")

    def __init__(self, op, name: str, decision: Decision):
        self.op = op
        self.name = name
        self.decision = decision
        self.category = decision.category
        self.reasons = list(decision.reasons)
        self.mode = Mode.ORIGINAL
        self.float_output = True
        self.constant_inputs = False  # every float input is a constant
        self.mixed = False  # one kernel: low-precision I/O, float32 registers (mixed_kernels)
        self.source = None  # an identity binding's source (Mode.IDENTITY)

    def frozen(self) -> BindingPlan:
        return BindingPlan(self.op, self.name, self.decision, self.category, tuple(self.reasons),
                           self.mode, None, self.mixed, self.source, self.float_output,
                           self.constant_inputs)


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
    return element_count(var.ty)


class Decider:
    """Step 1 for one function: :meth:`decide` returns its :class:`Decisions`.

    Parameters
    ----------
    scope : Scope
        The function's bindings (:meth:`Scope.read` done).
    context : relay_amp.plan.Context
        Reads its policy, target rule, constant check and ``mixed_kernels``.
    signature : relay_amp.signature.Signature
        Reads its calibrated ranges (``observed``, ``margin``, ``problems``) and whether the
        results become low precision.
    """

    def __init__(self, scope: Scope, context: Context, signature: Signature):
        self.scope = scope
        self.low = scope.low
        self.policy = context.policy
        self.target_rule = context.target_rule
        self.constant_check = context.constant_check
        self.mixed_kernels = context.settings.mixed_kernels
        self.selecting = context.selecting_callees
        self.signature = signature
        self.observed, self.margin = signature.observed, signature.margin
        self.params: set = set()
        self.plans: dict = {}
        self.can_low: dict = {}
        self.f32_ready: dict = {}
        self.folded: set = set()
        self.hot: dict = {}
        self.deciding: dict = {}  # var -> (consumer, its op): the value decides a discrete result
        self._decisions: dict = {}  # op -> its decision, where the op alone decides

    def decide(self, func) -> Decisions:
        """Step 1 over ``func``: each call's decision, and (a low-precision signature) the
        result leaves the low dtype cannot hold, which keep float32."""
        self.forward(func.body, func.params)
        result_type, kept = None, ()
        if self.signature.results_low:
            kept_type, kept = result_signature(self.scope, self.plans, self.hot,
                                               self.constant_check, func.body.body, func.ret_ty)
            for path, expr, problem in kept:
                plan = self.plans.get(expr) if is_var(expr) else None
                if plan is not None:
                    where = "result" + "".join(f"[{i}]" for i in path)
                    plan.reasons.append(Reason.of(FP32_BOUNDARY, where=where, why=str(problem)))
            if kept:
                result_type = kept_type
        return Decisions(
            self.scope, MappingProxyType({var: plan.frozen() for var, plan in self.plans.items()}),
            MappingProxyType(self.can_low), MappingProxyType(self.f32_ready),
            frozenset(self.folded), MappingProxyType(self.hot), frozenset(self.params),
            result_type, tuple(kept))

    def _is_constant(self, leaf) -> bool:
        return type(leaf) is GenericConst or leaf in self.folded

    def _is_f32_ready(self, leaf) -> bool:
        if type(leaf) is GenericConst:
            return True
        if is_var(leaf):
            ready = self.f32_ready.get(leaf)
            if ready is not None:
                return ready
            return self.scope.orig_dtype(leaf) == "float32"  # parameters and free vars
        return True

    def _is_lowish(self, leaf) -> bool:
        """Can ``leaf`` be had in low precision without losing float32 protection?"""
        if self._is_constant(leaf):
            return True
        if is_var(leaf):
            return leaf in self.params or self.can_low.get(leaf, False) or (
                self.scope.orig_dtype(leaf) == self.low)
        return True

    # ------------------------------------------------------------------ step 1
    def forward(self, seq: SeqExpr, params=()):
        for param in params:
            param = self.scope.canonical(param)
            self.params.add(param)
            problem = self.signature.problems.get(param.__chandle__())
            if problem is not None:
                self.hot[param] = problem
        self._mark_deciding(seq)
        for binding, var, value in self.scope.bindings(seq):
            self._forward_binding(binding, var, value)

    def _mark_deciding(self, seq: SeqExpr):
        """The values that decide a discrete result, and the chain of calls that computes each,
        back to values with more elements than it has (the tensor a scale is measured on is
        read, not rounded): the operands an op declares (:attr:`OpHooks.decision_operands`: a
        quantization's scale and zero point), and the float operands of any other call whose
        result is integers or booleans (a comparison, a cast to an integer) where one element
        of the operand decides many of the result (:func:`_governs_many`)."""
        items = self.scope.bindings(seq)
        call_args = self.scope.call_args
        producers = {var: value for _, var, value in items if type(value) is Call}
        for _, var, value in reversed(items):
            args = call_args.get(var)  # an op call's arguments, canonical (Scope.read)
            if args is None:
                continue
            op = self.scope.ops[var]
            record = op_info(op)
            operands = record.decision_operands
            if (not operands and not record.integer_side and self._discrete(var)
                    and not _tests_infinity(value)):
                operands = tuple(i for i, (arg, _) in enumerate(args)
                                 if is_floating(tensor_dtype(arg))
                                 and _governs_many(arg, var))
            for index in operands:
                if index >= len(args) or not is_var(args[index][0]):
                    continue
                operand = args[index][0]
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
                    stack.extend(self.scope.canonical(leaf) for arg in producer.args
                                 for leaf in leaves_of(arg) if is_var(leaf))

    def _discrete(self, var) -> bool:
        """Is ``var`` a tensor (or tuple of tensors) of integers or booleans?"""
        dtype = self.scope.dtype_of(var)  # cached; None for a tuple
        if dtype is not None:
            return not is_floating(dtype)
        dtypes = [str(t.dtype) for t in type_leaves(var.ty)]
        return bool(dtypes) and not any(is_floating(d) for d in dtypes)

    def _forward_binding(self, binding, var, value):
        if self.scope.orig_dtype(var) == self.low:
            self.can_low[var] = True
        if type(binding) is MatchCast:
            return
        self._check_observed(var)
        value_type = type(value)
        if value_type is GenericConst or (
                is_var(value) and self.scope.canonical(value) in self.folded):
            self.folded.add(var)  # a var bound to a constant is one
        op = self.scope.ops.get(var) if value_type is Call else None
        if op is not None:
            float_leaves = self.scope.float_leaves(var)
            if all(type(leaf) is GenericConst or leaf in self.folded
                   for _, leaves in self.scope.call_args[var] for leaf in leaves
                   if is_var(leaf) or type(leaf) is GenericConst):
                self.folded.add(var)  # FoldConstant computes it at build time: no kernel
            plan = self._plan_call(var, value, op, float_leaves)
            plan.constant_inputs = bool(float_leaves) and all(
                self._is_constant(leaf) for leaf, _ in float_leaves)
            plan.mixed = (self.mixed_kernels and plan.category == Category.ACCUMULATE
                          and op_info(op).fusion == FusionKind.ANCHOR
                          and self.scope.dtype_of(var) == "float32")
            self.plans[var] = plan
            self.can_low[var] = var not in self.hot and (
                self.can_low.get(var, False) or self._call_can_low(plan, value, float_leaves))
            if plan.category is None and self.can_low[var] and selects_among_inputs(
                    op, value, self.selecting):
                plan.reasons.append(Reason.of("selects_inputs", callee=value.args[0].name_hint,
                                              dtype=self.low))
            self.f32_ready[var] = self._call_f32_ready(plan, var, float_leaves)
        elif value_type is If:
            self.forward(value.true_branch)
            self.forward(value.false_branch)
        elif is_var(value):
            value = self.scope.canonical(value)
            self.can_low[var] = self.can_low.get(var, False) or self.can_low.get(value, False)
            self.f32_ready[var] = self._is_f32_ready(value)
        elif value_type is relax.Tuple:
            leaves = [leaf for leaf in self.scope.leaves(value) if is_var(leaf)]
            self.can_low[var] = bool(leaves) and all(self._is_lowish(x) for x in leaves) and any(
                self.can_low.get(x, False) for x in leaves)
            self.f32_ready[var] = all(self._is_f32_ready(x) for x in leaves)
        elif value_type is TupleGetItem and is_var(value.tuple_value):
            source = self.scope.canonical(value.tuple_value)
            self.can_low[var] = self.can_low.get(var, False) or self.can_low.get(source, False)
            self.f32_ready[var] = self._is_f32_ready(source)

    def _check_observed(self, var):
        if self.observed is None or self.scope.dtype_of(var) != "float32":
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

    def _plan_call(self, var, call, op: str, float_leaves: list) -> _Draft:
        name = var.name
        plan = _Draft(op, name, self._decide(op, name, call))
        category = plan.category
        if category is None or category == Category.FP32:
            return plan
        var_dtype = self.scope.dtype_of(var)
        out_dtypes = {var_dtype} if var_dtype else {tensor_dtype(t) for t in type_leaves(var.ty)}
        plan.float_output = any(is_floating(d) for d in out_dtypes)
        if var in self.deciding:
            consumer, consumer_op = self.deciding[var]
            return self._keep(plan, Reason.of("decides_discrete", consumer=consumer.name,
                                              op=consumer_op))
        record = op_info(op)
        if record.identity is not None:
            identity = record.identity(self.scope.site(
                call, Mode.ORIGINAL, frozenset(), self.can_low.get(var, False),
                self.f32_ready.get(var, False)))
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
        for arg, _ in self.scope.call_args[var]:
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

    def _keep(self, plan: _Draft, reason: Reason) -> _Draft:
        plan.category = Category.FP32
        plan.reasons = [reason]
        return plan

    def _call_can_low(self, plan: _Draft, call, float_leaves: list) -> bool:
        category = plan.category
        if self.hot and any(leaf in self.hot for leaf, _ in float_leaves):
            return False
        if category is None and selects_among_inputs(plan.op, call, self.selecting):
            leaves = [leaf for leaf, _ in float_leaves]
            return all(self._is_lowish(x) and (type(x) is not GenericConst
                                               or self.constant_check(x) is None)
                       for x in leaves) and any(self.can_low.get(x, False) for x in leaves)
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
                    self._is_constant(leaf) or self.scope.orig_dtype(leaf) == self.low
                    for leaf in leaves))
            return all(self._is_lowish(x) for x in leaves) and any(
                self.can_low.get(x, False) or self.scope.orig_dtype(x) == self.low
                for x in activations)
        return False

    def _call_f32_ready(self, plan: _Draft, var, float_leaves: list) -> bool:
        """Will the float32 value of this binding exist without a cast?"""
        if self.scope.orig_dtype(var) == self.low:
            return False
        category = plan.category
        if category == Category.LOW_PRECISION_FP32_ACCUMULATE:
            return plan.decision.accumulation_dtype == "float32"
        if category == Category.LOW_PRECISION:
            return False
        if category == Category.FOLLOW:
            return all(self._is_f32_ready(leaf) for leaf, _ in float_leaves)
        return True
