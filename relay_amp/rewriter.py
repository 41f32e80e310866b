"""Step 3 of the algorithm (stated in :mod:`relay_amp.transform`): the rewrite.

:meth:`MixedPrecisionRewriter.rewrite_function` makes a function's signature, gets its frozen
:class:`~relay_amp.plan.FunctionPlan` from :func:`relay_amp.planning.plan_function` and carries
it out, forward, with a PyExprMutator: every operand is cast to the dtype its consumer
computes in through one cast cache per scope. The cache stores both directions, so a cast back
to the original dtype returns the original value (never a fp32 -> fp16 -> fp32 round trip);
float32 constants are converted once, at conversion time; dot products accumulate in float32
through out_dtype and emit the low-precision copy of their result only if some consumer demanded
it; a binding whose operands and attributes come out unchanged is kept as it is. Each binding's
decision lands in the report with its rule. Its casts and constants are a
:class:`~relay_amp.casts.CastCache`, the kernels it emits itself a
:class:`~relay_amp.kernels.KernelEmitter`; what an op does differently is in its record of
:mod:`relay_amp.op_registry`.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from tvm import relax
from tvm.ir import Call
from tvm.relax import (
    DataflowBlock,
    DataflowVar,
    Function,
    If,
    MatchCast,
    PyExprMutator,
    SeqExpr,
    TensorType,
    Var,
    VarBinding,
    expr_functor,
)

from .casts import CastCache
from .dtypes import OutOfRange, is_floating, short_dtype
from .kernels import KernelEmitter
from .kinds import Category, Mode
from .op_registry import callee_fusion_kinds, op_info
from .plan import BindingPlan, FunctionPlan, Scope
from .planning import plan_function
from .policy import Policy
from .reasons import Reason
from .relax_utils import (
    TVM_ERRORS,
    VAR_TYPES,
    BuiltBlock,
    DtypeCache,
    GenericConst,
    as_tuple,
    is_var,
    leaves_of,
    lowered_type,
    replace_attrs,
    tensor_dtype,
)
from .report import BindingRecord, BoundaryRecord
from .signature import integer_input, parameter_problems
from .targets import KernelSettings


@expr_functor.mutator
class MixedPrecisionRewriter(PyExprMutator):
    """Step 3 of the algorithm: rewrites functions of one module and records the report rows."""

    def __init__(self, mod, policy: Policy, low: str, calibration=None):
        super().__init__(mod)
        self.policy = policy
        self.callee_kinds = callee_fusion_kinds(mod)
        self.calibration = calibration
        self.low = low
        self.records: list[BindingRecord] = []
        self._absorbed: dict = {}  # absorbed add -> (its call, plan, operands as rewritten)
        self.plan: FunctionPlan | None = None  # of the function being rewritten
        self._function_name = ""
        self.notes: list[str] = []
        self.int_params: dict = {}
        self._prologue: list = []
        self.dtype_of = DtypeCache()
        self.casts = CastCache(self.builder_, low, self.dtype_of, policy.cast_params_offline)
        self.emitter = KernelEmitter(self.builder_, self.casts, low)
        self.batch_norm_float32 = [0, 0]  # batch_norm ops, bytes of their float32 parameters
        self.batch_norm_seen: set = set()
        self._remap: dict = {}  # original var handle -> (original var, its rewritten value)
        self.boundary: list[BoundaryRecord] = []

    # ------------------------------------------------------------------ entry
    def rewrite_function(self, name: str, func: Function, target_rule, signature_low: bool,
                         low_inputs=(), int_inputs=None, normalization=None,
                         settings: KernelSettings | None = None) -> Function:
        """Convert one Relax function; ``signature_low`` converts its float32 inputs and results.

        ``int_inputs`` maps parameter names to the integer dtype they are fed in; they are cast
        once, at the top of the function, straight to the low-precision dtype (with
        ``normalization`` folded in)."""
        outer = (self.plan, self._function_name, self.int_params, self._prologue)
        int_inputs, normalization = int_inputs or {}, normalization or {}
        new_params, params_low = [], set()
        int_params, prologue = {}, []
        observed, margin = None, 1.0
        if self.calibration is not None:
            calibration = self.calibration
            observed = lambda var: calibration.observed_max(name, var.name)  # noqa: E731
            margin = calibration.margin
        params = list(func.params)
        param_problems = parameter_problems(func, params, observed, margin, self.low)
        for param in params:
            if param.name in int_inputs and tensor_dtype(param) == int_inputs[param.name]:
                new_params.append(param)  # converted before: the input is already integer
            elif param.name in int_inputs:
                if tensor_dtype(param) != "float32":
                    raise ValueError(f"input_dtypes names {param.name!r}, a "
                                     f"{tensor_dtype(param) or 'non-tensor'} parameter; only "
                                     "float32 tensor inputs can be fed as integers")
                params_low.add(param)
                new_param = Var(param.name, TensorType(param.ty.shape, int_inputs[param.name]))
                new_params.append(new_param)
                int_params[param] = new_param
                prologue.append((param, new_param, normalization.get(param.name)))
            elif ((signature_low or param.name in low_inputs) and tensor_dtype(param) == "float32"
                  and param.__chandle__() in param_problems):
                self._keep_at_boundary(name, "parameter", param.name, param.name,
                                       param_problems[param.__chandle__()],
                                       param.name in low_inputs)
                new_params.append(param)
            elif (signature_low or param.name in low_inputs) and tensor_dtype(param) == "float32":
                params_low.add(param)
                new_param = Var(param.name, lowered_type(param.ty, self.low))
                new_params.append(new_param)
                self.remap(param, new_param)
            else:
                new_params.append(param)
        scope = Scope(self.low, params_low, self.dtype_of,
                      {p: int_inputs[p.name] for p in int_params})
        plan, result_type, kept = plan_function(
            func, scope, self.policy, target_rule, self.casts.constant_out_of_range, signature_low,
            observed, margin, settings, param_problems, self.callee_kinds)
        for path, expr, problem in kept:
            where = "result" + "".join(f"[{i}]" for i in path)
            value = expr.name if is_var(expr) else "constant"
            self._keep_at_boundary(name, "result", where, value, problem, False)
        want = lowered_type(func.ret_ty, self.low) if signature_low else func.ret_ty
        if result_type is not None:
            want = result_type
        self.plan, self._function_name = plan, name
        self.int_params = int_params
        self._prologue = [entry for entry in prologue if plan.demand.get(entry[0])]
        self.builder_.begin_scope(new_params)
        body = self.rewrite_seq(func.body, want)
        self.builder_.end_scope()
        self.plan, self._function_name, self.int_params, self._prologue = outer
        new_func = Function(new_params, body, want, func.is_pure, func.attrs, func.span)
        return self.builder_.normalize(new_func)

    def rewrite_seq(self, seq: SeqExpr, want_type) -> SeqExpr:
        self.casts.push_layer(False)
        blocks = []
        if self._prologue and not (seq.blocks and type(seq.blocks[0]) is DataflowBlock):
            with BuiltBlock(self.builder_) as prologue:
                self._emit_prologue(())
            blocks.append(prologue.block)
        read_later = set()
        if self._prologue:
            for later in list(seq.blocks[1:]) + [seq.body]:
                read_later.update(v.__chandle__() for v in relax.analysis.free_vars(
                    later if isinstance(later, relax.Expr) else SeqExpr([later], seq.body)))
        for block in seq.blocks:
            is_dataflow = type(block) is DataflowBlock
            with BuiltBlock(self.builder_, is_dataflow) as built:
                if is_dataflow:
                    self.casts.push_layer(True)
                self._emit_prologue(read_later)  # in the dataflow block, where FuseOps fuses it
                for binding in block.bindings:
                    self.visit_binding(binding)
                if is_dataflow:
                    self.casts.pop_layer()
            if built.block.bindings:
                blocks.append(built.block)
        with BuiltBlock(self.builder_) as tail:
            result = self.casts.cast_to_type(self.visit_expr(seq.body), want_type)
        if tail.block.bindings:
            blocks.append(tail.block)
        self.casts.pop_layer()
        return SeqExpr(blocks, result)

    def _emit_prologue(self, read_later):
        """The casts of the integer inputs, at the top of the function's first block (a
        dataflow output there where a later block reads it; ``read_later``: the handles of
        the parameters a later block or the result reads)."""
        for param, int_param, normalization in self._prologue:
            value, name, note = integer_input(self.builder_, param, int_param, normalization,
                                              self.low, self.plan.read_in_float32(param))
            self.notes.append(note)
            self.casts.total_casts += 1
            self.remap(param, self.casts.emit_named(value, name, param.__chandle__() in read_later))
        self._prologue = []

    # ------------------------------------------------------------------ bindings
    def visit_var_binding_(self, binding: VarBinding) -> None:
        var, value = binding.var, binding.value
        self.casts.binding_casts = 0
        output = type(var) is not DataflowVar
        plan = None
        if self.plan:
            var = self.plan.canonical(var)
            plan = self.plan.plans.get(var)
        value_type = type(value)
        if plan is not None and var in self.plan.absorbed:
            self._absorbed[var] = (value, plan, self._absorbed_operands(var))
            return  # emitted inside its normalization's kernel
        if plan is not None:
            new_var = self._rewrite_call(var, value, plan, output, binding)
        elif value_type is Call:
            args = [self.casts.cast_to_type(self.visit_expr(a), a.ty) for a in value.args]
            new_call = Call(self.visit_expr(value.op), args, value.attrs, value.ty_args,
                            value.span)
            new_var = self.casts.emit_named(new_call, var.name, output)
        elif value_type is If:
            new_if = If(self.visit_expr(value.cond),
                        self.rewrite_seq(value.true_branch, value.true_branch.body.ty),
                        self.rewrite_seq(value.false_branch, value.false_branch.body.ty),
                        value.span)
            new_var = self.casts.emit_named(new_if, var.name, output)
        elif value_type is relax.Tuple:
            new_var = self.casts.emit_named(self.casts.cast_to_type(self.visit_expr(value),
                                                   self.plan.tuple_want(var, value)),
                                 var.name, output)
        elif isinstance(value, Function):
            inner = self.rewrite_function(f"{self._function_name}.{var.name}", value,
                                          None, False)
            new_var = self.casts.emit_named(inner, var.name, output)
        else:
            new_var = self.casts.emit_named(self.visit_expr(value), var.name, output)
        self.remap(var, new_var)
        self._eager_casts(var, new_var, output)

    def remap(self, var, new):
        """Uses of ``var`` become ``new`` (for the C++ visitor and for :meth:`visit_leaf`)."""
        self.set_var_remap(var, new)
        self._remap[var.__chandle__()] = (var, new)

    def visit_leaf(self, expr):
        """``visit_expr`` without the FFI round trip for vars and constants."""
        kind = type(expr)
        if kind in VAR_TYPES:
            entry = self._remap.get(expr.__chandle__())
            if entry is not None:
                return entry[1]
        elif kind is GenericConst:
            return expr
        return self.visit_expr(expr)

    def visit_match_cast_(self, binding: MatchCast) -> None:
        value = self.casts.cast_to_type(self.visit_expr(binding.value), binding.value.ty)
        new_var = self.builder_.match_cast(value, binding.ty, binding.var.name)
        self.remap(binding.var, new_var)

    def _eager_casts(self, var, new_var, output: bool):
        demand = self.plan.demand.get(var, ()) if self.plan else ()
        for dtype in sorted(d for d in demand if d in ("float32", self.low)):
            self.casts.cast(new_var, dtype, output)

    def _rewrite_call(self, var, call: Call, plan: BindingPlan, output: bool, binding=None):
        low = self.low
        hooks = op_info(plan.op)
        if hooks.float32_parameters:
            self._count_float32_parameters(var)
        if plan.mode == Mode.IDENTITY:
            source = self.int_params.get(plan.source)
            if source is None:
                source = self.visit_leaf(plan.source)
            new_var = self.casts.emit_named(source, var.name, output)
            self._record(var, call, new_var, [a for a, _ in self.plan.call_args[var]], plan)
            return new_var
        new_args, narrowed = [], []
        for index, (arg, _) in enumerate(self.plan.call_args[var]):
            lowered = plan.mode == Mode.LOW and (
                hooks.low_operands is None or index in hooks.low_operands)
            operand, narrow = self._operand(arg, self.visit_leaf(arg), var, plan, lowered)
            if narrow:
                narrowed.append(index)  # rounded inside the dot product's own kernel
            new_args.append(operand)
        attrs = call.attrs
        if (plan.mode == Mode.LOW and attrs is not None and hasattr(attrs, "out_dtype")
                and not hooks.keeps_out_dtype):
            attrs = replace_attrs(attrs, out_dtype=plan.accumulation or low)
        elif binding is not None and all(
                new is old for new, (old, _) in zip(new_args, self.plan.call_args[var])):
            # nothing changed: the original binding (and its var) carries over as it is
            self.builder_.emit_normalized(binding)
            if hooks.is_cast:
                self.casts.adopt_cast(new_args[0], var)
            self._record(var, call, var, new_args, plan)
            return var
        if narrowed:
            kernel = self.emitter.emit_narrowing(plan.op, call, attrs, new_args, narrowed,
                                                 var.name, output)
            if kernel is not None:
                plan = plan.adding(Reason.of(
                    "narrowing_kernel", inputs=", ".join(new_args[i].name for i in narrowed),
                    dtype=low))
                self._record(var, call, kernel, new_args, plan)
                return kernel
            new_args = [self.casts.cast(a, low) if i in narrowed else a
                        for i, a in enumerate(new_args)]
        if plan.mixed and self.plan.call_args[var][0][0] in self._absorbed:
            absorbed = self.plan.call_args[var][0][0]
            add_call, add_plan, operands = self._absorbed.pop(absorbed)
            out_dtype = self._mixed_out_dtype(var, output)
            kernel = self.emitter.emit_absorbing(plan.op, call, new_args, operands, out_dtype,
                                                 var.name, output)
            plan = plan.adding(Reason.of(
                "absorbing_kernel", operands=" + ".join(o.name for o in operands),
                writes=" and ".join(as_tuple(out_dtype))))
            self._record(absorbed, add_call, kernel, operands, add_plan)
            self._record(var, call, kernel, new_args[1:], plan)
            return kernel
        if plan.mixed:
            out_dtype = self._mixed_out_dtype(var, output)
            mixed = self.emitter.emit_mixed(plan.op, call, new_args, out_dtype, var.name, output)
            if mixed is not None:
                read = sorted({self.dtype_of(a) for a in new_args if self.dtype_of(a)})
                plan = plan.adding(Reason.of("mixed_kernel", reads="/".join(read),
                                             writes=" and ".join(as_tuple(out_dtype))))
                self._record(var, call, mixed, new_args, plan)
                return mixed
            plan = dataclasses.replace(plan, mixed=False)
            new_args = [self.casts.cast(a, self.dtype_of(old)) if self.dtype_of(old) else a
                        for a, (old, _) in zip(new_args, self.plan.call_args[var])]
        new_call = Call(call.op, new_args, attrs, call.ty_args, call.span)
        try:
            normalized = self.builder_.normalize(new_call)
        except TVM_ERRORS as err:  # TVM rejects the op in this dtype: keep it as it was
            message = str(err).strip().splitlines()[-1][:160]
            plan = dataclasses.replace(plan, mode=Mode.ORIGINAL, category=Category.FP32, reasons=(
                Reason.of("rejected_by_tvm", op=plan.op, dtype=low, message=message),))
            new_args = [self.casts.cast_to_type(self.visit_expr(a), a.ty) for a in call.args]
            normalized = Call(call.op, new_args, call.attrs, call.ty_args, call.span)
        new_var = self.casts.emit_named(normalized, var.name, output)
        if hooks.is_cast:
            self.casts.adopt_cast(normalized.args[0], new_var)
        result = new_var
        pinned = hooks.pin_result and hooks.pin_result(self.plan.site(var, normalized, plan.mode))
        if pinned:
            plan = plan.adding(pinned)
            result = self.casts.count_cast(self.casts.emit_named(relax.op.astype(new_var, low),
                                                     f"{var.name}_{short_dtype(low)}", output))
        self._record(var, call, new_var, new_args, plan)
        return result

    def _count_float32_parameters(self, var):
        """The report's count of ops that keep float32 constant parameters (batch norms) and
        the bytes of those parameters."""
        parameters = [arg for arg, _ in self.plan.call_args[var][1:]
                      if type(arg) is GenericConst and self.dtype_of(arg) == "float32"]
        if parameters:
            self.batch_norm_float32[0] += 1
            for arg in parameters:
                if arg.__chandle__() not in self.batch_norm_seen:  # dtype_of keeps arg alive
                    self.batch_norm_seen.add(arg.__chandle__())
                    self.batch_norm_float32[1] += 4 * int(np.prod(
                        [int(d) for d in arg.value.shape]))

    def _operand(self, arg, visited, var, plan: BindingPlan, lowered: bool):
        """One operand of ``var``'s call as the plan reads it: ``(expr, narrow)``, ``narrow``
        when the dot product rounds this float32 operand in its own kernel. The fields of a
        tuple operand (``concat``) are read as single operands are."""
        low = self.low
        if type(arg) is relax.Tuple:
            fields = [self._operand(field, self.visit_leaf(field), var, plan, lowered)[0]
                      for field in arg.fields]
            if all(new.same_as(old) for new, old in zip(fields, visited.fields)):
                return visited, False
            return relax.Tuple(fields), False
        dtype = self.dtype_of(arg)
        if dtype is None:  # shapes, scalars, ...: nothing to cast
            return visited, False
        if plan.mixed:  # the kernel widens its operands in registers
            keep_low = self.low in self.plan.demand.get(arg, ())
            return (self.casts.cast(visited, low) if keep_low else visited), False
        if self.plan.boundaries and is_var(arg) and self.plan.boundary_read(arg, var):
            stored = self.casts.cast(visited, low)
            return (stored if lowered or dtype != "float32" else self.casts.widen(stored)), False
        if (self.plan.boundaries and not lowered and dtype == "float32"
                and self.dtype_of(visited) == low and plan.category not in (None, Category.FP32)):
            return self.casts.widen(visited), False
        if (lowered and plan.category == Category.LOW_PRECISION_FP32_ACCUMULATE
                and self.dtype_of(visited) == "float32" and is_var(arg)
                and not self.casts.written_low(visited) and self.plan.rounds_in_reader(arg, var)):
            return visited, True
        if lowered:
            return self.casts.cast(visited, low if dtype == "float32" else dtype), False
        if plan.mode == Mode.STORAGE and type(arg) is GenericConst and dtype == "float32":
            return self.casts.storage_constant(arg), False
        return self.casts.cast(visited, dtype), False

    def _record(self, var, call, new_var, new_args, plan: BindingPlan):
        in_dtypes = []
        for arg in new_args:
            for leaf in leaves_of(arg):
                dtype = self.dtype_of(leaf)
                if dtype is not None:
                    in_dtypes.append(dtype)
        out_dtype = self.dtype_of(new_var)
        demand = self.plan.demand.get(var, set())
        stored = [out_dtype] if out_dtype else []
        if out_dtype in ("float32", self.low):
            stored += sorted(d for d in demand if d in ("float32", self.low) and d != out_dtype)
        if plan.mode == Mode.LOW:
            compute = self.low
        elif plan.mixed:
            compute = "float32"
        elif plan.mode == Mode.IDENTITY:
            compute = "-"
        elif is_floating(out_dtype):
            compute = out_dtype
        else:
            compute = next((d for d in in_dtypes if is_floating(d)), "-")
        self.records.append(BindingRecord(
            function=self._function_name, name=plan.name, op=plan.op,
            category=plan.category.value if plan.category else (
                "passthrough" if op_info(plan.op).passthrough else "unknown"),
            input_dtypes=tuple(in_dtypes), compute_dtype=compute,
            accumulation_dtype=plan.accumulation or compute,
            output_dtype="+".join(stored) if stored else "-",
            casts_added=self.casts.binding_casts + max(0, len(stored) - 1),
            reasons=tuple(plan.reasons),
            mac_source=call if op_info(plan.op).macs else 0))

    def _keep_at_boundary(self, function: str, kind: str, where: str, value: str,
                          problem: OutOfRange, named: bool):
        """Record a parameter or result kept float32 at the signature, or raise if the policy
        asks for strict I/O dtypes."""
        if self.policy.strict_io_dtypes:
            undo = f"leave it off to keep this {kind} float32" + (
                f", or take {where} out of low_precision_inputs" if named else "")
            subject = where if where == value else f"{where} ({value})"
            raise ValueError(f"{function}: {kind} {subject} cannot be {self.low}: {problem}; "
                             f"strict_io_dtypes is set ({undo})")
        record = BoundaryRecord(function, kind, where, value, problem.magnitude, problem.bound,
                                str(problem))
        self.boundary.append(record)
        self.notes.append(record.note(self.low))

    def _mixed_out_dtype(self, var, output: bool):
        """What a mixed kernel writes: the low dtype, float32, or both (a residual stream
        that dot products also read, as a post-norm transformer's layer_norm result)."""
        low, demand = self.low, self.plan.demand.get(var, ())
        if var in self.plan.low_values or (low in demand and "float32" not in demand):
            return low
        if low in demand and not output and var in self.plan.residuals:
            return ("float32", low)
        return "float32"

    def _absorbed_operands(self, add):
        """The operands of an absorbed residual add as its normalization's kernel reads them:
        a value stored in low precision between kernels as that copy, the rest as they are."""
        operands = []
        for arg, _ in self.plan.call_args[add]:
            visited = self.visit_leaf(arg)
            if self.plan.boundary_read(arg, add):
                visited = self.casts.cast(visited, self.low)
            operands.append(visited)
        return operands
