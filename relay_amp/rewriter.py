"""Step 3 of the algorithm (stated in :mod:`relay_amp.transform`): the rewrite.

:meth:`MixedPrecisionRewriter.rewrite_function` takes a function, its
:class:`~relay_amp.signature.Signature` and its frozen :class:`~relay_amp.plan.FunctionPlan`
and carries the plan out, forward, with a PyExprMutator: every operand is cast to the dtype its
consumer computes in through one cast cache per scope. The cache stores both directions, so a
cast back to the original dtype returns the original value (never a fp32 -> fp16 -> fp32 round
trip); float32 constants are converted once, at conversion time; dot products accumulate in
float32 through out_dtype and emit the low-precision copy of their result only if some consumer
demanded it; a binding whose operands and attributes come out unchanged is kept as it is. Each
binding's decision lands in the report with its rule, and each cast it emits is counted there.
A nested function is rewritten by its own plan, which the enclosing function's plan holds
(planned in the same context, :func:`relay_amp.planning.plan_function`). Its casts are a
:class:`~relay_amp.casts.CastCache`, the kernels it emits itself a
:class:`~relay_amp.kernels.KernelEmitter`; what an op does differently is in its record of
:mod:`relay_amp.op_registry`.
"""

from __future__ import annotations

import dataclasses

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
    VarBinding,
    expr_functor,
)

from .casts import CastCache
from .dtypes import is_floating, short_dtype
from .kernels import KernelEmitter, integer_input
from .kinds import Category, Mode
from .op_registry import op_info
from .plan import BindingPlan, FunctionPlan
from .reasons import Reason
from .relax_utils import (
    TVM_ERRORS,
    VAR_TYPES,
    BuiltBlock,
    GenericConst,
    as_tuple,
    is_var,
    leaves_of,
    lowered_type,
    new_call,
    replace_attrs,
)
from .report import BindingRecord, ReportBuilder
from .signature import Signature


@expr_functor.mutator
class MixedPrecisionRewriter(PyExprMutator):
    """Step 3 of the algorithm: rewrites functions of one module, each by its frozen plan, and
    hands each binding's row to the report.

    Parameters
    ----------
    mod : tvm.IRModule
        The module (batch_norm already decomposed where that applies).
    low : str
        The low-precision dtype.
    dtype_of : relay_amp.relax_utils.DtypeCache
        The conversion's dtype cache (the stages read it too).
    constants : relay_amp.casts.Constants
        The conversion's float32 constants.
    cast_params_offline : bool
        Float32 constants are converted at conversion time.
    report : relay_amp.report.ReportBuilder
        Where the rows and the rewrite's notes go.
    """

    def __init__(self, mod, low: str, dtype_of, constants, cast_params_offline: bool,
                 report: ReportBuilder):
        super().__init__(mod)
        self.low = low
        self.report = report
        self._absorbed: dict = {}  # absorbed add -> (its call, plan, operands as rewritten)
        self._functions: list[_Rewriting] = []  # the function being rewritten, innermost last
        self.dtype_of = dtype_of
        self.casts = CastCache(self.builder_, low, dtype_of, constants, cast_params_offline,
                               report.cast)
        self.emitter = KernelEmitter(self.builder_, self.casts, low)
        self._remap: dict = {}  # original var handle -> (original var, its rewritten value)

    # ------------------------------------------------------------------ entry
    def rewrite_function(self, func: Function, signature: Signature,
                         plan: FunctionPlan) -> Function:
        """``func`` with ``signature`` (its new parameters), carried out by ``plan``; a nested
        function is rewritten here too, by its plan in ``plan.nested``."""
        for param, new_param in signature.lowered.items():
            self.remap(param, new_param)
        want = plan.result_type
        if want is None:
            want = lowered_type(func.ret_ty, self.low) if signature.results_low else func.ret_ty
        self._functions.append(_Rewriting(signature, plan))
        try:
            self.builder_.begin_scope(list(signature.params))
            body = self.rewrite_seq(func.body, want)
            self.builder_.end_scope()
        finally:
            self._functions.pop()
        new_func = Function(list(signature.params), body, want, func.is_pure, func.attrs,
                            func.span)
        return self.builder_.normalize(new_func)

    @property
    def plan(self) -> FunctionPlan:
        """The plan of the function being rewritten."""
        return self._functions[-1].plan

    def rewrite_seq(self, seq: SeqExpr, want_type) -> SeqExpr:
        self.casts.push_layer(False)
        blocks, prologue_left = [], self._functions[-1].prologue
        if prologue_left and not (seq.blocks and type(seq.blocks[0]) is DataflowBlock):
            with BuiltBlock(self.builder_) as prologue:
                self._emit_prologue(())
            blocks.append(prologue.block)
        read_later = set()
        if prologue_left:
            for later in list(seq.blocks[1:]) + [seq.body]:
                read_later.update(v.__chandle__() for v in relax.analysis.free_vars(
                    later if isinstance(later, relax.Expr) else SeqExpr([later], seq.body)))
        for block in seq.blocks:
            is_dataflow = type(block) is DataflowBlock
            with BuiltBlock(self.builder_, is_dataflow) as built:
                if is_dataflow:
                    self.casts.push_layer(True)
                self._emit_prologue(read_later)  # in the dataflow block, where FuseOps fuses it
                for binding, var, value in self.plan.scope.block_bindings(block):
                    if type(binding) is MatchCast:
                        self.visit_match_cast_(binding)
                    else:
                        self._rewrite_binding(binding, var, value)
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
        for param, int_param, normalization in self._functions[-1].prologue:
            value, name, note = integer_input(self.builder_, param, int_param, normalization,
                                              self.low, self.plan.read_in_float32(param))
            self.report.rewrite_note(note)
            self.report.cast()
            self.remap(param, self.casts.emit_named(value, name, param.__chandle__() in read_later))
        self._functions[-1].prologue.clear()

    # ------------------------------------------------------------------ bindings
    def visit_var_binding_(self, binding: VarBinding) -> None:
        self._rewrite_binding(binding, self.plan.canonical(binding.var), binding.value)

    def _rewrite_binding(self, binding: VarBinding, var, value) -> None:
        """One binding (``var``: its canonical var, ``value``: its value), by the plan."""
        self.report.binding()
        output = type(var) is not DataflowVar
        plan = self.plan.plans.get(var)
        value_type = type(value)
        if plan is not None and var in self.plan.absorbed:
            self._absorbed[var] = (value, plan, self._absorbed_operands(var))
            return  # emitted inside its normalization's kernel
        if plan is not None:
            new_var = self._rewrite_call(var, value, plan, output, binding)
        elif value_type is Call:
            args = [self.casts.cast_to_type(self.visit_expr(a), a.ty) for a in value.args]
            rebuilt = new_call(self.visit_expr(value.op), args, value.attrs, value.ty_args,
                               value.span)
            new_var = self.casts.emit_named(rebuilt, var.name, output)
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
            inner = self.plan.nested[var]
            inner = self.rewrite_function(value, inner.signature, inner.plan)
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
        demand = self.plan.demand.get(var)
        if demand:
            for dtype in sorted(d for d in demand if d in ("float32", self.low)):
                self.casts.cast(new_var, dtype, output)

    def _rewrite_call(self, var, call: Call, plan: BindingPlan, output: bool, binding=None):
        low, call_args = self.low, self.plan.call_args[var]
        hooks = op_info(plan.op)
        if hooks.float32_parameters:
            self.report.float32_parameters([
                arg for arg, _ in call_args[1:]
                if type(arg) is GenericConst and self.dtype_of(arg) == "float32"])
        if plan.mode == Mode.IDENTITY:
            source = self._functions[-1].signature.int_params.get(plan.source)
            if source is None:
                source = self.visit_leaf(plan.source)
            new_var = self.casts.emit_named(source, var.name, output)
            self._record(var, call, new_var, [a for a, _ in call_args], plan)
            return new_var
        new_args, narrowed = [], []
        for index, (arg, _) in enumerate(call_args):
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
                new is old for new, (old, _) in zip(new_args, call_args)):
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
            plan = plan.adding(self.emitter.not_emitted)
            new_args = [self.casts.cast(a, low) if i in narrowed else a
                        for i, a in enumerate(new_args)]
        if plan.mixed and call_args[0][0] in self._absorbed:
            absorbed = call_args[0][0]
            add_call, add_plan, operands = self._absorbed.pop(absorbed)
            out_dtype = self._mixed_out_dtype(var, output)
            kernel = self.emitter.emit_absorbing(plan.op, call, new_args, operands, out_dtype,
                                                 var.name, output, add_op=add_plan.op)
            if kernel is not None:
                plan = plan.adding(Reason.of(
                    "absorbing_kernel", operands=" + ".join(o.name for o in operands),
                    writes=" and ".join(as_tuple(out_dtype))))
                self._record(absorbed, add_call, kernel, operands, add_plan)
                self._record(var, call, kernel, new_args[1:], plan)
                return kernel
            why = self.emitter.not_emitted.values["why"]
            plan = plan.adding(Reason.of("absorbing_not_emitted", add=absorbed.name, why=why))
            new_args = [self._own_add_kernel(absorbed, add_call, add_plan, operands, why),
                        *new_args[1:]]
        if plan.mixed:
            out_dtype = self._mixed_out_dtype(var, output)
            mixed = self.emitter.emit_mixed(plan.op, call, new_args, out_dtype, var.name, output)
            if mixed is not None:
                read = sorted({self.dtype_of(a) for a in new_args if self.dtype_of(a)})
                plan = plan.adding(Reason.of("mixed_kernel", reads="/".join(read),
                                             writes=" and ".join(as_tuple(out_dtype))))
                self._record(var, call, mixed, new_args, plan)
                return mixed
            plan = dataclasses.replace(plan.adding(self.emitter.not_emitted), mixed=False)
            new_args = [self.casts.cast(a, self.dtype_of(old)) if self.dtype_of(old) else a
                        for a, (old, _) in zip(new_args, call_args)]
        try:
            normalized = self.builder_.normalize(
                new_call(call.op, new_args, attrs, call.ty_args, call.span))
        except TVM_ERRORS as err:  # TVM rejects the op in this dtype: keep it as it was
            message = str(err).strip().splitlines()[-1][:160]
            plan = dataclasses.replace(plan, mode=Mode.ORIGINAL, category=Category.FP32, reasons=(
                Reason.of("rejected_by_tvm", op=plan.op, dtype=low, message=message),))
            new_args = [self.casts.cast_to_type(self.visit_expr(a), a.ty) for a in call.args]
            normalized = new_call(call.op, new_args, call.attrs, call.ty_args, call.span)
        if (plan.decision.accumulation_block and plan.mode == Mode.LOW
                and plan.accumulation == "float32"):
            blocked, reason = self.emitter.emit_blocked(
                plan.op, normalized, plan.decision.accumulation_block, var.name, output)
            plan = plan.adding(reason)
            if blocked is not None:
                self._record(var, call, blocked, new_args, plan)
                return blocked
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
                and not plan.decision.accumulation_block and self.dtype_of(visited) == "float32"
                and is_var(arg) and not self.casts.written_low(visited)
                and self.plan.rounds_in_reader(arg, var)):
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
        demand = self.plan.demand.get(var, ())
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
        info = op_info(plan.op)
        self.report.row(BindingRecord(
            function=self._functions[-1].signature.name, name=plan.name, op=plan.op,
            category=plan.category.value if plan.category else (
                "passthrough" if info.passthrough else "unknown"),
            input_dtypes=tuple(in_dtypes), compute_dtype=compute,
            accumulation_dtype=plan.accumulation or compute,
            output_dtype="+".join(stored) if stored else "-",
            casts_added=max(0, len(stored) - 1),
            reasons=tuple(plan.reasons),
            mac_source=call if info.macs else 0))

    def _mixed_out_dtype(self, var, output: bool):
        """What a mixed kernel writes: the low dtype, float32, or both (a residual stream
        that dot products also read, as a post-norm transformer's layer_norm result)."""
        low, demand = self.low, self.plan.demand.get(var, ())
        if var in self.plan.low_values or (low in demand and "float32" not in demand):
            return low
        if low in demand and not output and var in self.plan.residuals:
            return ("float32", low)
        return "float32"

    def _own_add_kernel(self, add, call, plan: BindingPlan, operands, why: str):
        """The absorbed residual ``add`` as a float32 kernel of its own, when the kernel that
        was to form it is refused; its report row says so instead of naming that kernel."""
        widened = [self.casts.cast(o, "float32") for o in operands]
        total = self.casts.emit_named(
            new_call(call.op, widened, call.attrs, call.ty_args, call.span), add.name, False)
        kept = tuple(r for r in plan.reasons if r.code != "absorbed_add")
        plan = dataclasses.replace(plan, reasons=(*kept, Reason.of("add_not_absorbed", why=why)))
        self._record(add, call, total, operands, plan)
        return total

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


class _Rewriting:
    """The function being rewritten: its signature, its plan, and the integer inputs' casts
    still to emit (at the top of its first block)."""

    __slots__ = ("signature", "plan", "prologue")

    def __init__(self, signature: Signature, plan: FunctionPlan):
        self.signature, self.plan = signature, plan
        self.prologue = [entry for entry in signature.prologue if plan.demand.get(entry[0])]
