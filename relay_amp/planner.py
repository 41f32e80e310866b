"""Steps 1, 1b and 2 of the algorithm (stated in :mod:`relay_amp.rewriter`): the decisions,
the kernel-boundary plan and the dtype demand of one function."""

from __future__ import annotations

import enum

import numpy as np
import tvm_ffi
from tvm import relax
from tvm.ir import Call
from tvm.relax import (
    DataflowVar,
    If,
    MatchCast,
    SeqExpr,
    TensorType,
    TupleGetItem,
)

from .calibrate import OutOfRange, out_of_range_reason
from .dtypes import (
    max_finite,
    out_of_range_value,
    smallest_subnormal,
)
from .op_tables import (
    CENTRING_OPS,
    EXACT_OPS,
    FUSION_KINDS,
    LOW_CATEGORIES,
    RANKING_OPS,
    TVM_LIMITATIONS,
    Category,
    FusionKind,
    fuses,
)
from .policy import Decision, Policy
from .reasons import Reason
from .relax_utils import (
    VAR_TYPES,
    DtypeCache,
    GenericConst,
    TupleType,
    is_var,
    leaves_of,
    lowered_type,
    op_name,
    scalar_value,
    tensor_dtype,
    type_leaves,
)
from .targets import KernelSettings

QDQ_OPS = ("quantize", "dequantize")
SCALED_ATTENTION = ("nn.attention", "nn.attention_bias")


class Mode(enum.Enum):
    """How a binding's operands are rewritten (its category says what the policy wants; the
    mode is what the rewrite does, given its operands and consumers)."""

    LOW = "low"  # float32 operands are brought to the low-precision dtype
    ORIGINAL = "original"  # every operand keeps (or gets back) its original dtype
    STORAGE = "storage"  # original, but float32 constants are stored low and widened
    IDENTITY = "identity"  # the binding is its (integer) input, unchanged


#: Kernels that can end with a cast to low precision, written where the kernel stores its result.
STORING_KINDS = (FusionKind.ANCHOR, FusionKind.ELEMWISE, FusionKind.INJECTIVE)
#: Ops whose result holds every value of their one float input (up to sign): a result out of
#: range means that input is out of range too.
ALL_VALUES_OPS = frozenset((
    "reshape", "permute_dims", "expand_dims", "squeeze", "flatten", "nn.batch_flatten",
    "layout_transform", "flip", "broadcast_to", "tile", "repeat", "negative", "abs"))
#: Ops whose result holds only values of their one float input (up to sign) or zeros: a result
#: above the dtype's maximum means that input is above it too.
SOME_VALUES_OPS = ALL_VALUES_OPS | frozenset((
    "strided_slice", "dynamic_strided_slice", "take", "gather_elements", "gather_nd",
    "nn.pixel_shuffle", "tril", "triu", "nn.dropout", "max", "min", "nn.max_pool1d",
    "nn.max_pool2d", "nn.max_pool3d", "sort", "nn.relu"))


class Plan:
    """The decision for one call binding."""

    __slots__ = ("op", "name", "decision", "category", "reasons", "mode", "accumulation",
                 "float_output", "constant_inputs", "mixed", "mode_fixed")

    def __init__(self, op, name: str, decision: Decision):
        self.op = op
        self.name = name
        self.decision = decision
        self.category = decision.category
        self.reasons = list(decision.reasons)
        self.mode = Mode.ORIGINAL
        self.accumulation = None
        self.float_output = True
        self.constant_inputs = False  # every float input is a constant
        self.mixed = False  # one kernel: low-precision I/O, float32 registers (mixed_kernels)
        self.mode_fixed = False  # mode chosen by the kernel-boundary plan, not by demand


class FunctionPlanner:
    """Steps 1 and 2 of the algorithm for one function."""

    def __init__(self, policy: Policy, low: str, target_rule, constant_check, params_low: set,
                 observed=None, margin: float = 1.0, int_inputs=None, dtype_of=None,
                 settings: KernelSettings | None = None, param_problems=None):
        self.policy = policy
        self.param_problems = param_problems or {}  # param handle -> OutOfRange
        self.settings = settings or KernelSettings()
        self.boundaries = self.settings.low_precision_boundaries
        self.uses: dict = {}  # var -> consumers (a call binding's var, or None for other uses)
        self.fused: set = set()  # (value, consumer) edges that stay inside one kernel
        self.group_kind: dict = {}  # var -> FusionKind of the kernel that computes it
        self.stored_low: set = set()  # float32 values stored in low precision between kernels
        self.residuals: set = set()  # float32 values kept float32 between kernels
        self.low_values: set = set()  # float32 values that the rewrite computes in low precision
        self.folded: set = set()  # values computed from constants alone (folded at build time)
        self.absorbed: dict = {}  # residual add -> the centring kernel that computes it
        self.observed = observed  # var -> calibrated max |x| (None: not calibrated)
        self.margin = margin
        self.hot: dict = {}  # var -> why its value cannot be stored in the low dtype
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

    def _is_lowish(self, leaf) -> bool:
        """Can ``leaf`` be had in low precision without losing float32 protection?"""
        if type(leaf) is GenericConst:
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

    # ------------------------------------------------------------------ step 1
    def forward(self, seq: SeqExpr, params=()):
        for param in params:
            param = self.canonical(param)
            self.params.add(param)
            problem = self.param_problems.get(param.__chandle__())
            if problem is not None:
                self.hot[param] = problem
        for binding, var, value in self.bindings(seq):
            self._forward_binding(binding, var, value)

    def _forward_binding(self, binding, var, value):
        self.bound[var] = value
        if self._orig_dtype(var) == self.low:
            self.can_low[var] = True
        if type(binding) is MatchCast:
            return
        self._check_observed(var)
        value_type = type(value)
        op = op_name(value) if value_type is Call else None
        if op is not None:
            self.call_args[var] = [(self.canonical(arg), self.leaves(arg)) for arg in value.args]
            float_leaves = self._float_leaves(var)
            plan = self._plan_call(var, value, op, float_leaves)
            plan.constant_inputs = bool(float_leaves) and all(
                type(leaf) is GenericConst for leaf, _ in float_leaves)
            plan.mixed = (self.settings.mixed_kernels and plan.category == Category.ACCUMULATE
                          and FUSION_KINDS.get(op) == FusionKind.ANCHOR
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
        if op == "quantize":
            identity = self._quantize_identity(call)
            if identity is not None:
                plan.mode, plan.reasons = Mode.IDENTITY, [identity]
                return plan
        limitation = TVM_LIMITATIONS.get(self.low, {}).get(op)
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
                                                      bound=_range_words(bad, self.low)))
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
                                                  bound=_range_words(scalar, self.low)))
        if (category in LOW_CATEGORIES and call.attrs is not None
                and hasattr(call.attrs, "out_dtype")):
            original = str(call.attrs.out_dtype) if call.attrs.out_dtype is not None else ""
            if original not in ("", "void", "float32", self.low):
                return self._keep(plan, Reason.of("foreign_out_dtype", dtype=original))
        return plan

    def _quantize_identity(self, call) -> Reason | None:
        """The reason if ``quantize`` of this call returns its data's integers unchanged."""
        data, out_dtype = call.args[0], str(call.attrs.out_dtype)
        if data in self.int_inputs:
            declared = self.int_inputs[data]
            if declared != out_dtype:
                raise ValueError(
                    f"input {data.name!r} is declared {declared} in input_dtypes, but the "
                    f"quantize that reads it produces {out_dtype}: declare it {out_dtype}")
            return Reason.of("identity_input", input=data.name, dtype=out_dtype)
        producer = self.bound.get(data)
        if (isinstance(producer, Call) and op_name(producer) == "dequantize"
                and tensor_dtype(producer.args[0]) == out_dtype
                and int(producer.attrs.axis) == int(call.attrs.axis)
                and all(tvm_ffi.structural_equal(a, b)
                        for a, b in zip(producer.args[1:3], call.args[1:3]))):
            return Reason.of("identity_requantize")
        return None

    def _keep(self, plan: Plan, reason: Reason) -> Plan:
        plan.category = Category.FP32
        plan.reasons = [reason]
        return plan

    def _call_can_low(self, plan: Plan, float_leaves: list) -> bool:
        category = plan.category
        if self.hot and any(leaf in self.hot for leaf, _ in float_leaves):
            return False
        if plan.op == "dequantize" and category == Category.FOLLOW:
            return True  # out_dtype makes it produce the low-precision dtype directly
        if category in LOW_CATEGORIES:
            return True
        if category == Category.ACCUMULATE:
            return True
        if category == Category.FOLLOW:
            leaves = [leaf for leaf, _ in float_leaves]
            activations = [x for x in leaves if is_var(x) and x not in self.params]
            if not activations:  # constants and parameters: an exact op on them is exact
                return plan.op in EXACT_OPS and (plan.constant_inputs or all(
                    type(leaf) is GenericConst or self._orig_dtype(leaf) == self.low
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

    # ------------------------------------------------------------------ step 1b
    def plan_boundaries(self, seq: SeqExpr, low_results: bool = False):
        """Kernel boundaries (``low_precision_boundaries``): which values stay in one kernel's
        registers, which cross a boundary and are stored in low precision, and the mode of each
        follow op, chosen forward from how its inputs arrive. A value the function returns in
        float32 (unless ``low_results``) is never stored in low precision for another reader:
        that would round the result."""
        items = self.bindings(seq)
        results = set() if low_results else self._result_vars(seq.body)
        uses = self.uses
        for _, var, value in items:
            if type(value) is Call and var in self.call_args:
                for _, leaves in self.call_args[var]:
                    for leaf in leaves:
                        if is_var(leaf):
                            uses.setdefault(leaf, []).append(var)
            else:
                for free in relax.analysis.free_vars(value):
                    uses.setdefault(self.canonical(free), []).append(None)
        for free in relax.analysis.free_vars(seq.body):
            uses.setdefault(self.canonical(free), []).append(None)
        self._plan_absorbed_adds(items)
        for _, var, value in items:
            plan = self.plans.get(var)
            if plan is None:
                continue
            if var in self.absorbed:
                self.group_kind[var] = FusionKind.OPAQUE  # inside its normalization's kernel
            elif all(type(leaf) is GenericConst or leaf in self.folded
                   for _, leaves in self.call_args[var] for leaf in leaves
                   if is_var(leaf) or type(leaf) is GenericConst):
                self.folded.add(var)  # FoldConstant computes it at build time: no kernel
            else:
                self._fuse_inputs(var, plan)
        for _, var, value in items:
            plan = self.plans.get(var)
            if plan is None or var in self.folded or var in self.absorbed:
                continue
            if (plan.category == Category.FOLLOW and plan.mode == Mode.ORIGINAL
                    and plan.op not in QDQ_OPS and plan.float_output
                    and not plan.constant_inputs):
                self._boundary_follow_mode(var, plan)
            if (self.dtype_of(var) == "float32" and self.can_low.get(var, False)
                    and var not in self.hot and var not in results
                    and self.group_kind[var] in STORING_KINDS
                    and any(c is not None and (var, c) not in self.fused and self._reads_stored(c)
                            for c in uses.get(var, ()))
                    and not self._keeps_residual(var, plan)
                    and not self._ranked(var, plan)):
                self.stored_low.add(var)
            if self._computes_low(var, plan):
                self.low_values.add(var)

    def _keeps_residual(self, var, plan: Plan) -> bool:
        """A residual stream keeps float32 between kernels (unless ``low_precision_residuals``):
        a value computed in float32 registers that an elementwise op in another kernel adds to
        in float32, or that a normalization in another kernel centres (:data:`CENTRING_OPS`).
        Stored in low precision it would be rounded once more per block, on the path that
        carries the sum through the network (in a post-norm transformer, the normalization's
        input and result are that path)."""
        if self.settings.low_precision_residuals:
            return False
        for consumer in self.uses.get(var, ()):
            other = self.plans.get(consumer)
            if consumer is None or other is None or (var, consumer) in self.fused:
                continue
            if consumer in self.absorbed and self._is_branch_of(var, consumer):
                continue  # stored low; the sum is formed in float32 in the normalization
            if (other.category == Category.FOLLOW and other.op not in EXACT_OPS
                    and FUSION_KINDS.get(other.op) == FusionKind.ELEMWISE):
                plan.reasons.append(Reason.of("residual_added", consumer=consumer.name))
            elif other.mixed and other.op in CENTRING_OPS and not plan.mixed:
                plan.reasons.append(Reason.of("residual_centred", consumer=consumer.name,
                                              op=other.op))
            else:
                continue
            self.residuals.add(var)
            return True
        return False

    def _ranked(self, var, plan: Plan) -> bool:
        """A value a ranking op (:data:`RANKING_OPS`) reads, directly or through exact follow ops,
        keeps float32 between kernels."""
        seen, stack = {var}, [var]
        while stack:
            for consumer in self.uses.get(stack.pop(), ()):
                other = self.plans.get(consumer)
                if other is None or consumer in seen:
                    continue
                if other.op in RANKING_OPS:
                    plan.reasons.append(Reason.of("ranked", consumer=consumer.name, op=other.op))
                    return True
                if other.category == Category.FOLLOW and other.op in EXACT_OPS:
                    seen.add(consumer)
                    stack.append(consumer)
        return False

    def _result_vars(self, expr) -> set:
        """The vars a function result is made of, through tuples and the vars bound to them."""
        found, stack = set(), [expr]
        while stack:
            item = stack.pop()
            if type(item) is relax.Tuple:
                stack.extend(item.fields)
            elif is_var(item):
                var = self.canonical(item)
                if var not in found:
                    found.add(var)
                    bound = self.bound.get(var)
                    if type(bound) is relax.Tuple or is_var(bound):
                        stack.append(bound)
        return found

    def _plan_absorbed_adds(self, items):
        """A centring normalization computes the residual add that feeds it in its own kernel
        (float32 registers): the sum, which in a post-norm transformer is the residual
        stream, then never crosses a kernel boundary, and the branch result it adds (a dot
        product's) crosses one in low precision."""
        if self.settings.low_precision_residuals:
            return
        for _, var, _ in items:
            plan = self.plans.get(var)
            if plan is None or not plan.mixed or plan.op not in CENTRING_OPS:
                continue
            source = self.call_args[var][0][0]
            producer = self.plans.get(source)
            if (producer is not None and producer.op == "add"
                    and producer.category == Category.FOLLOW and producer.mode == Mode.ORIGINAL
                    and type(source) is DataflowVar and self.uses.get(source) == [var]
                    and self.dtype_of(source) == "float32"
                    and all(is_var(arg) and len(leaves) == 1
                            for arg, leaves in self.call_args[source])):
                self.absorbed[source] = var
                producer.reasons.append(Reason.of("absorbed_add", kernel=var.name, op=plan.op))

    def _is_branch_of(self, var, add) -> bool:
        """Is ``var`` the branch operand of the absorbed residual ``add`` (its other operand
        is the stream: a residual already, or a parameter)?"""
        others = [arg for arg, _ in self.call_args[add] if arg is not var]
        return bool(others) and all(o in self.residuals or o not in self.plans for o in others)

    def _fuse_inputs(self, var, plan: Plan):
        kind = FusionKind.ANCHOR if plan.mixed else FUSION_KINDS.get(plan.op, FusionKind.OPAQUE)
        candidates = []
        for _, leaves in self.call_args[var]:
            for leaf in leaves:
                if (is_var(leaf) and leaf in self.group_kind and self.uses.get(leaf) == [var]
                        and fuses(self.group_kind[leaf], kind)):
                    candidates.append((leaf, self.group_kind[leaf]))
        # FuseOps puts at most one anchor kernel in a group: the first one reached
        anchor = next((leaf for leaf, k in candidates if k == FusionKind.ANCHOR), None)
        group = kind
        for leaf, producer in candidates:
            if anchor is not None and (producer == FusionKind.INJECTIVE or (
                    producer == FusionKind.ANCHOR and leaf is not anchor)):
                continue
            self.fused.add((leaf, var))
            if kind == FusionKind.ELEMWISE and producer in (FusionKind.ANCHOR,
                                                            FusionKind.INJECTIVE):
                group = FusionKind.ANCHOR if anchor is not None else producer
        self.group_kind[var] = group

    def _reads_stored(self, consumer) -> bool:
        """Float32 and unknown ops read the float32 value the policy protects for them, and an
        exact op that only feeds the function's result or explicit casts (which choose their own
        dtype) is no kernel (a view) worth a cast."""
        plan = self.plans.get(consumer)
        if plan is None or plan.category in (None, Category.FP32):
            return False
        return not (plan.op in EXACT_OPS and all(
            u is None or getattr(self.plans.get(u), "op", None) == "astype"
            for u in self.uses.get(consumer, ())))

    def arrives_low(self, value, consumer) -> bool:
        """Does ``consumer`` read ``value`` in low precision across a kernel boundary?"""
        if (value, consumer) in self.fused:
            return value in self.low_values or self._orig_dtype(value) == self.low
        return (value in self.stored_low or value in self.low_values
                or self._orig_dtype(value) == self.low)

    def _boundary_follow_mode(self, var, plan: Plan):
        plan.mode_fixed = True
        activations = [leaf for leaf, _ in self._float_leaves(var)
                       if is_var(leaf) and leaf not in self.folded]
        if plan.op in EXACT_OPS:
            if activations and self.can_low.get(var, False) and all(
                    self.arrives_low(leaf, var) for leaf in activations):
                plan.mode = Mode.LOW
                plan.reasons.append(Reason.of("exact_arrives_low", dtype=self.low))
            else:
                plan.reasons.append(Reason.of("in_float32_registers"))
            return
        absorbed = [leaf for leaf in activations if self._widening_absorbed(leaf, var)]
        if absorbed and self.can_low.get(var, False):
            plan.mode = Mode.LOW
            plan.reasons.append(Reason.of("arrives_low", dtype=self.low, input=absorbed[0].name))
            return
        self.stored_low.difference_update(absorbed)
        plan.reasons.append(Reason.of("widened_in_kernel"))

    def _widening_absorbed(self, value, consumer) -> bool:
        """A value read only by ``consumer`` across a kernel boundary: a float32 copy made
        for the consumer would join the producer's kernel (FuseOps extends a kernel through a
        chain of single-use casts), so the consumer must read the stored copy as it is."""
        return value in self.stored_low and self.uses.get(value) == [consumer] and (
            value, consumer) not in self.fused

    def _computes_low(self, var, plan: Plan) -> bool:
        """Will the rewrite compute this float32 value in low precision?"""
        if self.dtype_of(var) != "float32":
            return False
        if plan.mixed:
            return var in self.stored_low
        if plan.category == Category.LOW_PRECISION:
            return True
        if plan.category == Category.LOW_PRECISION_FP32_ACCUMULATE:
            return plan.decision.accumulation_dtype != "float32"
        return plan.mode == Mode.LOW

    def boundary_read(self, value, consumer) -> bool:
        """Does ``consumer`` read the low-precision copy of ``value`` that is stored between
        kernels (widening it in its own kernel where it computes float32)?"""
        return (value in self.stored_low and (value, consumer) not in self.fused
                and self._reads_stored(consumer))

    def read_in_float32(self, param) -> bool:
        """With kernel boundaries: does every reader of ``param`` compute float32 from it, in
        a call this pass plans (so none reads it in low precision)?"""
        uses = self.uses.get(self.canonical(param))
        if not uses or None in uses:
            return False
        for var in set(uses):
            plan = self.plans.get(var)
            if (plan is None or plan.category is None or plan.mode != Mode.ORIGINAL
                    or plan.mixed or plan.op in QDQ_OPS or self.dtype_of(var) != "float32"):
                return False
        return True

    # ------------------------------------------------------------------ step 2
    def want(self, expr, dtypes):
        """Record that the var leaves of ``expr`` are wanted in ``dtypes``."""
        for leaf in self.leaves(expr):
            if is_var(leaf):
                wanted = self.demand.get(leaf)
                if wanted is None:
                    wanted = self.demand[leaf] = set()
                wanted.update(dtypes)

    def want_original(self, expr):
        for leaf in self.leaves(expr):
            if is_var(leaf):
                dtype = self._orig_dtype(leaf)
                wanted = self.demand.get(leaf)
                if wanted is None:
                    wanted = self.demand[leaf] = set()
                wanted.add(dtype if dtype is not None else "original")

    def backward(self, seq: SeqExpr, result_dtypes_low: bool, result_type=None):
        """Step 2 over ``seq``; ``result_type`` (a low-precision signature with some leaves kept
        float32) says which dtype each leaf of the result is wanted in."""
        if result_type is not None:
            self.want_result(seq.body, result_type)
        elif result_dtypes_low:
            self.want(seq.body, {self.low})
        else:
            self.want_original(seq.body)
        for binding, var, value in reversed(self.bindings(seq)):
            self._backward_binding(binding, var, value)

    def _backward_binding(self, binding, var, value):
        demand = self.demand.get(var, set())
        if type(binding) is MatchCast:
            self.want_original(value)
            return
        value_type = type(value)
        if value_type is Call:
            plan = self.plans.get(var)
            if plan is None:  # a call of a function, closure or extern: keeps its signature
                for arg in value.args:
                    self.want_original(arg)
                return
            self._choose_mode(plan, var, demand)
            if plan.mode == Mode.IDENTITY:
                return
            low_operands = {self.low}
            for index, (_, arg_leaves) in enumerate(self.call_args[var]):
                if plan.op in QDQ_OPS and (plan.mode != Mode.LOW or index > 0):
                    continue  # integers, scales and zero points keep their dtypes
                for leaf in arg_leaves:
                    if not is_var(leaf):
                        continue
                    if self.boundaries and (
                            self.boundary_read(leaf, var) or (
                                leaf in self.low_values and (leaf, var) not in self.fused
                                and self._reads_stored(var))):
                        self.want(leaf, low_operands)  # widened in this kernel if need be
                    elif plan.mode == Mode.LOW and self._orig_dtype(leaf) in ("float32", self.low):
                        self.want(leaf, low_operands)
                    elif plan.mixed and self.low in self.demand.get(leaf, ()):
                        self.want(leaf, low_operands)  # the kernel widens it in registers
                    else:
                        self.want_original(leaf)
        elif value_type is If:
            self.backward(value.true_branch, False)
            self.backward(value.false_branch, False)
        elif value_type is relax.Tuple:
            for index, field in enumerate(value.fields):
                wanted = demand | self.item_demand.get((var, index), set())
                self._want_field(field, wanted)
        elif is_var(value):
            self.want(value, demand)
        elif value_type is TupleGetItem:
            source = self.canonical(value.tuple_value)
            self.item_demand.setdefault((source, value.index), set()).update(demand)
            self.want(source, demand)

    def want_result(self, expr, ty):
        """Record that the result ``expr`` is wanted in the dtypes of the type ``ty``."""
        if isinstance(ty, TensorType):
            self.want(expr, {str(ty.dtype)})
            return
        if not isinstance(ty, TupleType):
            self.want_original(expr)
            return
        if type(expr) is relax.Tuple:  # noqa: E721
            for field, field_ty in zip(expr.fields, ty.fields):
                self.want_result(field, field_ty)
            return
        if not is_var(expr):
            return
        var = self.canonical(expr)
        dtypes = {str(t.dtype) for t in type_leaves(ty)}
        if len(dtypes) == 1:
            self.want(var, dtypes)
            return
        for index, field_ty in enumerate(ty.fields):
            field_dtypes = {str(t.dtype) for t in type_leaves(field_ty)}
            self.item_demand.setdefault((var, index), set()).update(
                field_dtypes if len(field_dtypes) == 1 else {"original"})

    # ------------------------------------------------------------------ the signature
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
        var = self.canonical(expr)
        found = [] if path else [var]
        value = self.bound.get(var)
        if value is None:
            return found
        value_type = type(value)
        if value_type is If:
            return (found + self._values(value.true_branch.body, path, depth + 1)
                    + self._values(value.false_branch.body, path, depth + 1))
        if value_type is Call:
            plan = self.plans.get(var)
            if not path and plan is not None and plan.op in ALL_VALUES_OPS:
                leaves = self._float_leaves(var)
                if len(leaves) == 1:
                    found += self._values(leaves[0][0], (), depth + 1)
            return found
        return found + self._values(value, path, depth + 1)

    def _unholdable(self, expr) -> OutOfRange | None:
        """Why the value of ``expr`` (a var or constant) cannot be stored in the low dtype."""
        if type(expr) is GenericConst:
            if self.dtype_of(expr) != "float32":
                return None
            bad = self.constant_check(expr)
            if bad is None:
                return None
            overflow = abs(bad) > max_finite(self.low)
            return OutOfRange(f"constant {bad:.4g} {_range_words(bad, self.low)}", abs(bad),
                              max_finite(self.low) if overflow else smallest_subnormal(self.low))
        return self.hot.get(expr) if is_var(expr) else None

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

    def tuple_want(self, var, value: relax.Tuple):
        """The type a tuple binding is built in: a field in low precision where it is wanted so."""
        fields = []
        for index, field in enumerate(value.fields):
            wanted = self.demand.get(var, set()) | self.item_demand.get((var, index), set())
            fields.append(lowered_type(field.ty, self.low) if self.low in wanted else field.ty)
        return TupleType(fields)

    def _want_field(self, field, wanted: set):
        """Demand on one field of a tuple: "original" means the field's own original dtype."""
        if type(field) is relax.Tuple:
            for inner in field.fields:
                self._want_field(inner, wanted)
        elif is_var(field):
            field = self.canonical(field)
            original = self._orig_dtype(field)
            resolved = {original if d == "original" and original else d for d in wanted}
            self.demand.setdefault(field, set()).update(resolved)

    def _choose_mode(self, plan: Plan, var, demand: set):
        category = plan.category
        if plan.mode == Mode.IDENTITY or plan.mode_fixed:
            return
        if plan.op == "dequantize" and category == Category.FOLLOW:
            if self.low in demand and "float32" not in demand:
                plan.mode = Mode.LOW
                plan.reasons.append(Reason.of("dequantize_low", dtype=self.low))
            elif demand:
                plan.reasons.append(Reason.of("dequantize_float32"))
            else:
                plan.reasons.append(Reason.of("unread"))
            return
        if plan.op == "quantize" and category == Category.FOLLOW:
            producer = self.bound.get(self.bound[var].args[0])
            from_dequantize = isinstance(producer, Call) and op_name(producer) == "dequantize"
            if self.can_low.get(var, False) and (
                    not self.f32_ready.get(var, False) or from_dequantize):
                plan.mode = Mode.LOW
                plan.reasons.append(Reason.of("quantize_reads_low", dtype=self.low))
            else:
                plan.reasons.append(Reason.of("quantize_reads_float32"))
            return
        if category in LOW_CATEGORIES:
            plan.mode = Mode.LOW
            plan.accumulation = (
                plan.decision.accumulation_dtype
                if category == Category.LOW_PRECISION_FP32_ACCUMULATE else self.low)
        elif category == Category.FOLLOW:
            can_low = self.can_low.get(var, False)
            f32_ready = self.f32_ready.get(var, False)
            exact = plan.op in EXACT_OPS
            if not plan.float_output:
                if can_low and not f32_ready:
                    plan.mode = Mode.LOW
                    plan.reasons.append(Reason.of("inputs_only_low", dtype=self.low))
                else:
                    plan.reasons.append(Reason.of("inputs_float32"))
            elif f32_ready and (not exact or "float32" in demand):
                plan.reasons.append(Reason.of("float32_wanted" if exact else "rounds_once"))
            elif can_low and self.low in demand and plan.constant_inputs:
                plan.mode = Mode.LOW
                plan.reasons.append(Reason.of("constant_copy", dtype=self.low))
            elif can_low and self.low in demand:
                plan.mode = Mode.LOW
                plan.reasons.append(Reason.of("low_wanted", dtype=self.low))
            elif self.low in demand:
                plan.reasons.append(Reason.of("float32_activation"))
            else:
                plan.reasons.append(Reason.of("nothing_wants_low"))
        elif category == Category.STORAGE:
            plan.mode = Mode.STORAGE
        elif category == Category.ACCUMULATE:
            plan.accumulation = "float32"


def _range_words(value: float, low: str) -> str:
    from .dtypes import max_finite  # pylint: disable=import-outside-toplevel

    if abs(value) > max_finite(low):
        return f"exceeds {low} max {max_finite(low):.6g}"
    return f"underflows to zero in {low}"

