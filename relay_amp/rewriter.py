# The algorithm, per Relax function (If branches and nested functions are scopes of their own):
#
# 1. Decide. Forward over the bindings, the policy gives each call a category and a rule; operand
#    checks (constants or scalars the low-precision dtype cannot hold, dtypes other than float32,
#    calibrated ranges that would overflow) can overrule it, and quantize(x) of values that are
#    already those integers becomes the identity. From the categories follows `can_low`: whether
#    a value can exist in low precision without losing what float32 protected (dot products,
#    accumulate ops, and follow ops whose float activation inputs can all be low; constants and
#    parameters adapt).
# 1b. Kernel boundaries (low_precision_boundaries and mixed_kernels, on for GPUs). Which values
#    FuseOps keeps in one kernel's registers and which cross a kernel boundary; a crossing value
#    is stored in low precision and widened in the kernel that reads it, unless it is a residual
#    stream (an elementwise op in another kernel adds to it, or a centring normalization reads
#    it), which keeps float32 (low_precision_residuals off). An accumulate op is one kernel that
#    reads what arrives, computes in float32 registers and writes what its consumers want; a
#    centring normalization also forms the residual add that feeds it, so the sum is never
#    stored.
# 2. Demand. Backward over the bindings, each binding records the dtypes its operands must have:
#    low-precision ops want low precision; float32, unknown and accumulate ops want each operand's
#    original dtype; a follow op runs in low precision only if it can and one of its consumers
#    wants low precision. The function result wants its original dtypes (keep_io_dtypes).
#    Where the signature is made low precision (keep_io_dtypes=False, low_precision_inputs), a
#    parameter or result leaf that holds a value the low dtype cannot (calibrated range, or a
#    constant) keeps float32 there, with a note and the reason code fp32_boundary, or the
#    conversion raises (strict_io_dtypes).
# 3. Rewrite. Forward again with a PyExprMutator: every operand is cast to the dtype its consumer
#    computes in through one cast cache per scope. The cache stores both directions, so a cast
#    back to the original dtype returns the original value (never a fp32 -> fp16 -> fp32 round
#    trip); float32 constants are converted once, at conversion time; dot products accumulate in
#    float32 through out_dtype and emit the low-precision copy of their result only if some
#    consumer demanded it; a binding whose operands and attributes come out unchanged is kept
#    as it is. Each binding's decision lands in the report with its rule.
"""The rewriter behind :class:`relay_amp.ToMixedPrecision`: step 3 of the algorithm above;
steps 1, 1b and 2 are :mod:`relay_amp.planner`."""

from __future__ import annotations

import numpy as np
import tvm
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
    TupleGetItem,
    Var,
    VarBinding,
    expr_functor,
)

from .calibrate import OutOfRange, out_of_range_reason
from .dtypes import (
    converted_tensor,
    max_finite,
    numpy_dtype,
    out_of_range_value,
)
from .op_tables import (
    PASSTHROUGH_OPS,
    Category,
)
from .planner import QDQ_OPS, SCALED_ATTENTION, SOME_VALUES_OPS, FunctionPlanner, Mode, Plan
from .policy import Policy
from .reasons import Reason
from .relax_utils import (
    VAR_TYPES,
    BuiltBlock,
    DtypeCache,
    GenericConst,
    TupleType,
    as_tuple,
    is_var,
    leaves_of,
    lowered_type,
    op_name,
    replace_attrs,
    same_dtypes,
    tensor_dtype,
)
from .report import FP32_BOUNDARY, BindingRecord, BoundaryRecord, estimate_macs
from .report import short_dtype as _short
from .targets import KernelSettings


@expr_functor.mutator
class MixedPrecisionRewriter(PyExprMutator):
    """Step 3 of the algorithm: rewrites functions of one module and records the report rows."""

    def __init__(self, mod, policy: Policy, low: str, calibration=None):
        super().__init__(mod)
        self.policy = policy
        self.calibration = calibration
        self.low = low
        self.records: list[BindingRecord] = []
        self._cache_stack: list[dict] = []
        self._layer_kinds: list[bool] = []  # parallel to _cache_stack: is it a dataflow block's
        self._kernel_copies: set = set()  # handles of low-precision copies a kernel writes
        self._absorbed: dict = {}  # absorbed add -> (its call, plan, operands as rewritten)
        self._constants: dict = {}  # handle -> [constant, its numpy value, out of range, low copy]
        self._planner: FunctionPlanner | None = None
        self._function_name = ""
        self._casts = 0  # astype bindings emitted for the binding being rewritten
        self.total_casts = 0
        self.constants_converted = 0
        self.notes: list[str] = []
        self._int_params: dict = {}
        self._prologue: list = []
        self.dtype_of = DtypeCache()
        self.batch_norm_float32 = [0, 0]  # batch_norm ops, bytes of their float32 parameters
        self._batch_norm_seen: set = set()
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
        outer = (self._planner, self._function_name, self._int_params, self._prologue)
        int_inputs, normalization = int_inputs or {}, normalization or {}
        new_params, params_low = [], set()
        int_params, prologue = {}, []
        observed, margin = None, 1.0
        if self.calibration is not None:
            calibration = self.calibration
            observed = lambda var: calibration.observed_max(name, var.name)  # noqa: E731
            margin = calibration.margin
        params = list(func.params)
        param_problems = self._parameter_problems(func, params, observed, margin)
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
        planner = FunctionPlanner(self.policy, self.low, target_rule, self.constant_out_of_range,
                                  params_low, observed, margin,
                                  {p: int_inputs[p.name] for p in int_params}, self.dtype_of,
                                  settings, param_problems)
        planner.forward(func.body, params)
        want = lowered_type(func.ret_ty, self.low) if signature_low else func.ret_ty
        result_type = None
        if signature_low:
            kept_type, kept = planner.boundary_result_type(func.body.body, func.ret_ty)
            for path, expr, problem in kept:
                where = "result" + "".join(f"[{i}]" for i in path)
                value = expr.name if is_var(expr) else "constant"
                self._keep_at_boundary(name, "result", where, value, problem, False)
                plan = planner.plans.get(expr) if is_var(expr) else None
                if plan is not None:
                    plan.reasons.append(Reason.of(FP32_BOUNDARY, where=where, why=str(problem)))
            if kept:
                want = result_type = kept_type
        if planner.boundaries:
            planner.plan_boundaries(func.body, low_results=signature_low and not (
                result_type is not None))
        planner.backward(func.body, signature_low, result_type)
        self._planner, self._function_name = planner, name
        self._int_params = int_params
        self._prologue = [entry for entry in prologue if planner.demand.get(entry[0])]
        self.builder_.begin_scope(new_params)
        body = self.rewrite_seq(func.body, want)
        self.builder_.end_scope()
        self._planner, self._function_name, self._int_params, self._prologue = outer
        new_func = Function(new_params, body, want, func.is_pure, func.attrs, func.span)
        return self.builder_.normalize(new_func)

    def _parameter_problems(self, func: Function, params, observed, margin: float) -> dict:
        """Float32 parameters whose calibrated values the low dtype cannot hold: measured
        directly, or (a calibration without parameters) through a consumer whose result holds
        only their values. Keyed by the parameter's handle."""
        if observed is None:
            return {}
        problems = {}
        floats = {p.__chandle__(): p for p in params if tensor_dtype(p) == "float32"}
        for param in floats.values():
            largest = observed(param)
            problem = None if largest is None else out_of_range_reason(largest, self.low, margin)
            if problem is not None:
                problems[param.__chandle__()] = problem
        if not isinstance(func.body, SeqExpr) or len(problems) == len(floats):
            return problems
        for block in func.body.blocks:
            for binding in block.bindings:
                value = binding.value
                op = op_name(value) if type(value) is Call else None
                if op not in SOME_VALUES_OPS or tensor_dtype(binding.var) != "float32":
                    continue
                leaves = [leaf for arg in value.args for leaf in leaves_of(arg)
                          if (tensor_dtype(leaf) or "").startswith(("float", "bfloat"))]
                if len(leaves) != 1 or leaves[0].__chandle__() not in floats:
                    continue
                param = floats[leaves[0].__chandle__()]
                largest = observed(binding.var)
                if param.__chandle__() in problems or largest is None or (
                        largest * margin <= max_finite(self.low)):
                    continue
                problem = out_of_range_reason(largest, self.low, margin)
                problems[param.__chandle__()] = OutOfRange(
                    f"its consumer {binding.var.name} ({op}, whose values are {param.name}'s) "
                    f"has {problem}", problem.magnitude, problem.bound)
        return problems

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

    def _push_layer(self, is_dataflow: bool):
        self._cache_stack.append({})
        self._layer_kinds.append(is_dataflow)

    def _pop_layer(self):
        self._cache_stack.pop()
        self._layer_kinds.pop()

    def rewrite_seq(self, seq: SeqExpr, want_type) -> SeqExpr:
        self._push_layer(False)
        blocks = []
        if self._prologue:
            with BuiltBlock(self.builder_) as prologue:
                for param, int_param, normalization in self._prologue:
                    self.remap(param, self._integer_input(param, int_param, normalization))
                self._prologue = []
            blocks.append(prologue.block)
        for block in seq.blocks:
            is_dataflow = type(block) is DataflowBlock
            with BuiltBlock(self.builder_, is_dataflow) as built:
                if is_dataflow:
                    self._push_layer(True)
                for binding in block.bindings:
                    self.visit_binding(binding)
                if is_dataflow:
                    self._pop_layer()
            if built.block.bindings:
                blocks.append(built.block)
        with BuiltBlock(self.builder_) as tail:
            result = self.cast_to_type(self.visit_expr(seq.body), want_type)
        if tail.block.bindings:
            blocks.append(tail.block)
        self._pop_layer()
        return SeqExpr(blocks, result)

    def _integer_input(self, param, int_param, normalization):
        """Cast an integer input once, straight to the low-precision dtype, folding in its
        normalization: one kernel reads the integers, applies ``x * scale + offset`` in float32
        registers and writes the low-precision dtype, so the value is rounded once and no
        float32 tensor of the input exists. Where every reader computes float32 the kernel
        writes float32 instead (with kernel boundaries, FuseOps puts those readers in its
        kernel)."""
        from tvm import topi  # pylint: disable=import-outside-toplevel

        ndim = param.ty.ndim
        # Readers that all compute float32 (an inference batch_norm on the input, decomposed)
        # get float32: a low-precision copy would round the input twice.
        low = "float32" if self._planner.read_in_float32(param) else self.low
        note = f"{param.name}: fed as {int_param.ty.dtype}, cast once to {low}"
        self.total_casts += 1
        if not normalization:
            if low == "float32":
                note += f"; float32, not {self.low}: every reader computes float32 (one rounding)"
            self.notes.append(note)
            return self.builder_.emit(relax.op.astype(int_param, low),
                                      f"{param.name}_{_short(low)}")
        if "scale" in normalization:
            scale = np.float32(normalization["scale"])
            offset = np.float32(normalization["offset"])
            note += f" with x * {normalization['scale']:g} + {normalization['offset']:g} folded in"
        else:
            axis = normalization["axis"] % ndim
            channels = int(param.ty.shape.values[axis])
            if len(normalization["mean"]) != channels:
                raise ValueError(
                    f"input_normalization[{param.name!r}] has {len(normalization['mean'])} "
                    f"values, but axis {normalization['axis']} of {param.name} has {channels} "
                    "channels")
            shape = [1] * ndim
            shape[axis] = channels
            mean = np.asarray(normalization["mean"], np.float64).reshape(shape)
            std = np.asarray(normalization["std"], np.float64).reshape(shape)
            scale, offset = (1.0 / std).astype(np.float32), (-mean / std).astype(np.float32)
            note += " with (x - mean) / std per channel folded in"
        if low == "float32":
            note += f"; float32, not {self.low}: every reader computes float32 (one rounding)"
        self.notes.append(note)

        def normalize(data, scale_t, offset_t):
            widened = topi.cast(data, "float32")
            return topi.cast(topi.add(topi.multiply(widened, scale_t), offset_t), low)

        return self.builder_.emit_te(normalize, int_param, relax.const(scale, "float32"),
                                     relax.const(offset, "float32"),
                                     primfunc_name_hint=f"relay_amp_input_{param.name}",
                                     name_hint=f"{param.name}_{_short(low)}")

    # ------------------------------------------------------------------ casts
    def _constant(self, const) -> list:
        """[const, numpy value, value out of the low dtype's range, low-precision copy]."""
        key = const.__chandle__()
        entry = self._constants.get(key)
        if entry is None:
            value = const.value
            try:  # a read-only view of the constant's memory, no copy
                array = np.from_dlpack(value)
            except (TypeError, BufferError, RuntimeError):
                array = value.numpy()
            entry = self._constants[key] = [const, array, out_of_range_value(array, self.low),
                                            None]
        return entry

    def constant_out_of_range(self, const) -> float | None:
        return self._constant(const)[2]

    def low_constant(self, const):
        """The low-precision copy of a float32 constant, converted once, at conversion time."""
        entry = self._constant(const)
        if entry[3] is None:
            entry[3] = relax.const(converted_tensor(entry[1], self.low))
            entry[1] = None  # the float32 copy is not needed any more
            self.constants_converted += 1
        return entry[3]

    def _lookup(self, key, dtype):
        for layer in reversed(self._cache_stack):
            hit = layer.get((key, dtype))
            if hit is not None:
                return hit
        return None

    def _emit(self, expr, name: str, output: bool):
        if output and self.builder_.current_block_is_dataflow():
            return self.builder_.emit_output(expr, name)
        return self.builder_.emit(expr, name)

    def cast(self, expr, dtype: str, output: bool = False):
        """``expr`` as ``dtype`` (a float32 <-> low-precision tensor cast), through the cache."""
        source = self.dtype_of(expr)
        if source == dtype or source is None or {source, dtype} != {"float32", self.low}:
            return expr
        key = expr.__chandle__()
        hit = self._lookup(key, dtype)
        if hit is not None:
            return hit
        if type(expr) is GenericConst and self.policy.cast_params_offline:
            if dtype == self.low:
                new = self.low_constant(expr)
            else:
                new = relax.const(expr.value.numpy().astype(numpy_dtype(dtype)), dtype)
                self.constants_converted += 1
        else:
            name = (expr.name if is_var(expr) else "const") + "_" + _short(dtype)
            new = self._emit(relax.op.astype(expr, dtype), name, output)
            self._casts += 1
            self.total_casts += 1
        layer = self._cache_layer(new)
        layer[(key, dtype)] = new
        layer[(new.__chandle__(), source)] = expr
        self.dtype_of(new)  # keeps ``new`` alive while its handle is a cache key
        return new

    def _written_low(self, value) -> bool:
        """Did the kernel that computes ``value`` also write its low-precision copy?"""
        copy = self._lookup(value.__chandle__(), self.low)
        return copy is not None and copy.__chandle__() in self._kernel_copies

    def _cache_layer(self, value) -> dict:
        """The innermost cache layer in which ``value`` stays visible: a dataflow block's layer
        holds only its dataflow vars; output vars and constants outlive the block."""
        if type(value) is DataflowVar:
            return self._cache_stack[-1]
        for layer, is_dataflow in zip(reversed(self._cache_stack), reversed(self._layer_kinds)):
            if not is_dataflow:
                return layer
        return self._cache_stack[0]

    def cast_to_type(self, expr, want):
        """``expr`` with each float tensor leaf cast to the dtype of the same leaf of ``want``."""
        if want is None:
            return expr
        want_type = type(want)
        if want_type is TensorType:
            return self.cast(expr, str(want.dtype.dtype))
        if want_type is TupleType and type(expr.ty) is TupleType:
            if type(expr) is relax.Tuple:
                fields = [self.cast_to_type(f, w) for f, w in zip(expr.fields, want.fields)]
                if all(a.same_as(b) for a, b in zip(fields, expr.fields)):
                    return expr
                return relax.Tuple(fields)
            if same_dtypes(expr.ty, want):
                return expr
            fields = []
            for i, field_want in enumerate(want.fields):
                item = self.builder_.emit(TupleGetItem(expr, i), "item")
                fields.append(self.cast_to_type(item, field_want))
            return self.builder_.emit(relax.Tuple(fields), "tuple")
        return expr

    def storage_constant(self, const):
        """A float32 constant stored in the low-precision dtype and widened where it is used."""
        if self.constant_out_of_range(const) is not None:
            return const
        key = const.__chandle__()
        hit = self._lookup(key, "storage")
        if hit is not None:
            return hit
        widened = self.builder_.emit(relax.op.astype(self.low_constant(const), "float32"),
                                     "weight_f32")
        self._casts += 1
        self.total_casts += 1
        self._cache_layer(widened)[(key, "storage")] = widened
        return widened

    # ------------------------------------------------------------------ bindings
    def visit_var_binding_(self, binding: VarBinding) -> None:
        var, value = binding.var, binding.value
        self._casts = 0
        output = type(var) is not DataflowVar
        plan = None
        if self._planner:
            var = self._planner.canonical(var)
            plan = self._planner.plans.get(var)
        value_type = type(value)
        if plan is not None and var in self._planner.absorbed:
            self._absorbed[var] = (value, plan, self._absorbed_operands(var))
            return  # emitted inside its normalization's kernel
        if plan is not None:
            new_var = self._rewrite_call(var, value, plan, output, binding)
        elif value_type is Call:
            args = [self.cast_to_type(self.visit_expr(a), a.ty) for a in value.args]
            new_call = Call(self.visit_expr(value.op), args, value.attrs, value.ty_args,
                            value.span)
            new_var = self._emit(new_call, var.name, output)
        elif value_type is If:
            new_if = If(self.visit_expr(value.cond),
                        self.rewrite_seq(value.true_branch, value.true_branch.body.ty),
                        self.rewrite_seq(value.false_branch, value.false_branch.body.ty),
                        value.span)
            new_var = self._emit(new_if, var.name, output)
        elif value_type is relax.Tuple:
            new_var = self._emit(self.cast_to_type(self.visit_expr(value),
                                                   self._planner.tuple_want(var, value)),
                                 var.name, output)
        elif isinstance(value, Function):
            inner = self.rewrite_function(f"{self._function_name}.{var.name}", value,
                                          None, False)
            new_var = self._emit(inner, var.name, output)
        else:
            new_var = self._emit(self.visit_expr(value), var.name, output)
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
        value = self.cast_to_type(self.visit_expr(binding.value), binding.value.ty)
        new_var = self.builder_.match_cast(value, binding.ty, binding.var.name)
        self.remap(binding.var, new_var)

    def _eager_casts(self, var, new_var, output: bool):
        demand = self._planner.demand.get(var, ()) if self._planner else ()
        for dtype in sorted(d for d in demand if d in ("float32", self.low)):
            self.cast(new_var, dtype, output)

    def _rewrite_call(self, var, call: Call, plan: Plan, output: bool, binding=None):
        low = self.low
        if plan.op == "nn.batch_norm":
            self._count_batch_norm(var)
        if plan.mode == Mode.IDENTITY:  # quantize of values that are already those integers
            data = call.args[0]
            if data in self._int_params:
                source = self._int_params[data]
            else:  # quantize(dequantize(q)) with the same parameters
                source = self.visit_expr(self._planner.bound[data].args[0])
            new_var = self._emit(source, var.name, output)
            self._record(var, call, new_var, [a for a, _ in self._planner.call_args[var]], plan)
            return new_var
        new_args, narrowed = [], []
        for index, (arg, _) in enumerate(self._planner.call_args[var]):
            visited = self.visit_leaf(arg)
            lowered = plan.mode == Mode.LOW and not (
                plan.op in QDQ_OPS and (plan.op == "dequantize" or index))
            if type(arg) is relax.Tuple:
                new_args.append(self.cast_to_type(
                    visited, lowered_type(arg.ty, low) if lowered else arg.ty))
                continue
            dtype = self.dtype_of(arg)
            if dtype is None:  # shapes, scalars, ...: nothing to cast
                new_args.append(visited)
            elif plan.mixed:  # the kernel widens its operands in registers
                keep_low = self.low in self._planner.demand.get(arg, ())
                new_args.append(self.cast(visited, low) if keep_low else visited)
            elif self._planner.boundaries and is_var(arg) and self._planner.boundary_read(
                    arg, var):
                stored = self.cast(visited, low)
                new_args.append(stored if lowered or dtype != "float32" else self._widen(stored))
            elif (self._planner.boundaries and not lowered and dtype == "float32"
                  and self.dtype_of(visited) == low and plan.category not in (None, Category.FP32)):
                new_args.append(self._widen(visited))
            elif (lowered and arg in self._planner.residuals
                  and plan.category == Category.LOW_PRECISION_FP32_ACCUMULATE
                  and self.dtype_of(visited) == "float32"
                  and not self._written_low(visited)):
                narrowed.append(index)  # rounded inside the dot product's own kernel
                new_args.append(visited)
            elif lowered:
                new_args.append(self.cast(visited, low if dtype == "float32" else dtype))
            elif plan.mode == Mode.STORAGE and type(arg) is GenericConst and dtype == "float32":
                new_args.append(self.storage_constant(arg))
            else:
                new_args.append(self.cast(visited, dtype))
        attrs = call.attrs
        if (plan.mode == Mode.LOW and attrs is not None and hasattr(attrs, "out_dtype")
                and plan.op != "quantize"):  # quantize's out_dtype is its integer result
            attrs = replace_attrs(attrs, out_dtype=plan.accumulation or low)
        elif binding is not None and all(
                new is old for new, (old, _) in zip(new_args, self._planner.call_args[var])):
            # nothing changed: the original binding (and its var) carries over as it is
            self.builder_.emit_normalized(binding)
            if plan.op == "astype":
                self._adopt_cast(new_args[0], var)
            self._record(var, call, var, new_args, plan)
            return var
        if narrowed:
            kernel = self._emit_narrowing_kernel(plan.op, call, attrs, new_args, narrowed,
                                                 var.name, output)
            if kernel is not None:
                plan.reasons.append(Reason.of(
                    "narrowing_kernel", inputs=", ".join(new_args[i].name for i in narrowed),
                    dtype=low))
                self._record(var, call, kernel, new_args, plan)
                return kernel
            new_args = [self.cast(a, low) if i in narrowed else a for i, a in enumerate(new_args)]
        if plan.mixed and self._planner.call_args[var][0][0] in self._absorbed:
            absorbed = self._planner.call_args[var][0][0]
            add_call, add_plan, operands = self._absorbed.pop(absorbed)
            out_dtype = self._mixed_out_dtype(var, output)
            kernel = self._emit_absorbing_kernel(plan.op, call, new_args, operands, out_dtype,
                                                 var.name, output)
            plan.reasons.append(Reason.of(
                "absorbing_kernel", operands=" + ".join(o.name for o in operands),
                writes=" and ".join(as_tuple(out_dtype))))
            self._record(absorbed, add_call, kernel, operands, add_plan)
            self._record(var, call, kernel, new_args[1:], plan)
            return kernel
        if plan.mixed:
            out_dtype = self._mixed_out_dtype(var, output)
            mixed = self._emit_mixed_kernel(plan.op, call, new_args, out_dtype, var.name, output)
            if mixed is not None:
                read = sorted({self.dtype_of(a) for a in new_args if self.dtype_of(a)})
                plan.reasons.append(Reason.of("mixed_kernel", reads="/".join(read),
                                              writes=" and ".join(as_tuple(out_dtype))))
                self._record(var, call, mixed, new_args, plan)
                return mixed
            plan.mixed = False
            new_args = [self.cast(a, self.dtype_of(old)) if self.dtype_of(old) else a
                        for a, (old, _) in zip(new_args, self._planner.call_args[var])]
        new_call = Call(call.op, new_args, attrs, call.ty_args, call.span)
        try:
            normalized = self.builder_.normalize(new_call)
        except Exception as err:  # TVM rejects the op in this dtype: keep it as it was
            message = str(err).strip().splitlines()[-1][:160]
            plan.mode, plan.category = Mode.ORIGINAL, Category.FP32
            plan.reasons = [Reason.of("rejected_by_tvm", op=plan.op, dtype=low, message=message)]
            new_args = [self.cast_to_type(self.visit_expr(a), a.ty) for a in call.args]
            normalized = Call(call.op, new_args, call.attrs, call.ty_args, call.span)
        new_var = self._emit(normalized, var.name, output)
        if plan.op == "astype":
            self._adopt_cast(normalized.args[0], new_var)
        if (plan.mode == Mode.LOW and plan.op in SCALED_ATTENTION
                and getattr(normalized.attrs, "scale", None) is not None):
            # TVM 0.27 legalizes attention with an explicit scale by multiplying the scores with
            # a float32 constant, so its result becomes float32 whatever the inputs; the cast
            # (a no-op at this level) brings the legalized result back to the declared dtype.
            plan.reasons.append(Reason.of("attention_pinned", dtype=low))
            self._record(var, call, new_var, new_args, plan)
            pinned = self._emit(relax.op.astype(new_var, low), f"{var.name}_{_short(low)}", output)
            self._casts += 1
            self.total_casts += 1
            return pinned
        self._record(var, call, new_var, new_args, plan)
        return new_var

    def _widen(self, value):
        """A float32 copy of a low-precision value for one consumer: not shared, so the cast
        stays inside that consumer's kernel."""
        self._casts += 1
        self.total_casts += 1
        name = (value.name if is_var(value) else "const") + "_f32"
        return self.builder_.emit(relax.op.astype(value, "float32"), name)

    def _emit_mixed_kernel(self, op: str, call, args, out_dtype: str, name: str, output: bool):
        """``op`` as one TensorIR kernel that widens its float operands to float32, computes
        with TVM's own legalization of ``op`` and writes ``out_dtype``; None if the legalization
        is not a single TE computation."""
        low = self.low
        return self._emit_legalized(
            op, call, args, lambda index, tensor: "float32" if str(tensor.dtype) == low else None,
            name, output, out_dtype)

    def _mixed_out_dtype(self, var, output: bool):
        """What a mixed kernel writes: the low dtype, float32, or both (a residual stream
        that dot products also read, as a post-norm transformer's layer_norm result)."""
        low, demand = self.low, self._planner.demand.get(var, ())
        if var in self._planner.low_values or (low in demand and "float32" not in demand):
            return low
        if low in demand and not output and var in self._planner.residuals:
            return ("float32", low)
        return "float32"

    def _split_pair(self, pair, name: str):
        """The float32 result of a kernel that writes ``(float32, low)``; the low-precision
        copy joins the cast cache."""
        result = self.builder_.emit(relax.TupleGetItem(pair, 0), name)
        copy = self.builder_.emit(relax.TupleGetItem(pair, 1), f"{name}_{_short(self.low)}")
        self._adopt_cast(result, copy)
        self._kernel_copies.add(copy.__chandle__())
        self.dtype_of(copy)  # keeps ``copy`` alive while its handle is a set member
        return result

    def _absorbed_operands(self, add):
        """The operands of an absorbed residual add as its normalization's kernel reads them:
        a value stored in low precision between kernels as that copy, the rest as they are."""
        operands = []
        for arg, _ in self._planner.call_args[add]:
            visited = self.visit_leaf(arg)
            if self._planner.boundary_read(arg, add):
                visited = self.cast(visited, self.low)
            operands.append(visited)
        return operands

    def _emit_absorbing_kernel(self, op: str, call, args, operands, out_dtype, name: str,
                               output: bool):
        """``op`` on the sum of ``operands`` (the absorbed add), formed in float32 in the same
        kernel; ``args`` are the op's other operands (``args[0]`` is the add)."""
        from tvm import topi  # pylint: disable=import-outside-toplevel

        def widened_sum(*tensors):
            total = topi.cast(tensors[0], "float32")
            for tensor in tensors[1:]:
                total = topi.add(total, topi.cast(tensor, "float32"))
            return total

        low = self.low
        kernel = self._emit_legalized(
            op, call, args, lambda index, tensor: "float32" if str(tensor.dtype) == low else None,
            name, output, out_dtype, prologue=(0, widened_sum, operands))
        if kernel is None:  # the add as its own kernel, then the op
            total = self._emit(relax.op.add(*[self.cast(o, "float32") for o in operands]),
                               f"{name}_sum", False)
            return self._emit_mixed_kernel(op, call, [total, *args[1:]], out_dtype, name, output)
        return kernel

    def _emit_narrowing_kernel(self, op: str, call, attrs, args, narrowed, name: str,
                               output: bool):
        """``op`` as one TensorIR kernel that rounds its float32 operands at ``narrowed`` to the
        low dtype itself (a residual stream that crosses the kernel boundary in float32), then
        computes as TVM's legalization of ``op`` does with low-precision operands; None if that
        legalization is not a single TE computation."""
        low = self.low
        stand_ins = [relax.Var(f"narrowed{i}", TensorType(a.ty.shape, low)) if i in narrowed
                     else a for i, a in enumerate(args)]
        return self._emit_legalized(
            op, Call(call.op, stand_ins, attrs, call.ty_args, call.span), args,
            lambda index, tensor: low if index in narrowed else None, name, output)

    def _emit_legalized(self, op: str, legal_call, args, operand_dtype, name: str, output: bool,
                        out_dtype=None, prologue=None):
        """TVM's legalization of ``legal_call`` (one ``call_te``, recorded) re-emitted on
        ``args``, the operands of ``legal_call`` position for position, as one kernel that casts
        operand ``i`` to ``operand_dtype(i, tensor)`` (None: as it is) and its result to
        ``out_dtype`` (a tuple of dtypes: one result in each, the first returned and the
        second a cached low-precision copy). ``prologue``, ``(i, compute, exprs)``: operand
        ``i`` is ``compute`` of the tensors of ``exprs``, in the same kernel. None if the
        legalization is anything but one ``call_te``."""
        recorder = _TeRecorder()
        legalize = tvm.ir.Op.get("relax." + op).get_attr("FLegalize")
        try:
            legalize(recorder, legal_call)
        except Exception:  # any builder use beyond call_te: keep the op as it is
            return None
        if len(recorder.calls) != 1:
            return None
        te_func, te_args, te_kwargs = recorder.calls[0]
        # A TE function may use the builder it was legalized with (matmul's infers its output
        # shape with it); the recorder cannot cross the FFI, so it gets the real builder.
        for cell in getattr(te_func, "__closure__", None) or ():
            if cell.cell_contents is recorder:
                cell.cell_contents = self.builder_
        te_kwargs = dict(te_kwargs)
        hint = te_kwargs.pop("primfunc_name_hint", op.split(".")[-1])
        positions = {arg.__chandle__(): i for i, arg in enumerate(legal_call.args)}
        keys = list(te_kwargs)
        values, indices = [], []
        computed, prologue_compute, extra = (prologue[0], prologue[1], list(prologue[2])) if (
            prologue) else (None, None, [])
        for value in list(te_args) + [te_kwargs[k] for k in keys]:
            index = positions.get(value.__chandle__()) if isinstance(value, relax.Expr) else None
            if isinstance(value, relax.Expr) and index is None:
                return None
            if index is not None and index == computed:
                values.append(None)  # formed in the kernel from the prologue's tensors
            else:
                values.append(args[index] if index is not None else value)
            indices.append(index)
        if computed is not None and computed not in indices:
            return None
        count = len(te_args)
        main = [v for v in values[:count] if v is not None]

        def kernel(*tensors, **kwargs):
            from tvm import te, topi  # pylint: disable=import-outside-toplevel

            positional = iter(tensors[:len(main)])
            formed = prologue_compute(*tensors[len(main):]) if prologue_compute else None
            given = [formed if index == computed and index is not None else (
                next(positional) if i < count else kwargs[keys[i - count]])
                for i, index in enumerate(indices)]
            operands = []
            for tensor, index in zip(given, indices):
                dtype = (operand_dtype(index, tensor) if isinstance(tensor, te.Tensor)
                         and index != computed else None)
                operands.append(topi.cast(tensor, dtype) if dtype else tensor)
            result = te_func(*operands[:count], **dict(zip(keys, operands[count:])))
            if isinstance(out_dtype, tuple):  # one result per dtype, written by one kernel
                return [topi.cast(result, d) if str(result.dtype) != d else result
                        for d in out_dtype]
            if out_dtype is not None and str(result.dtype) != out_dtype:
                return topi.cast(result, out_dtype)
            return result

        if isinstance(out_dtype, tuple):
            pair = self._emit_te(kernel, main + extra, dict(zip(keys, values[count:])), hint,
                                 f"{name}_pair", False)
            return None if pair is None else self._split_pair(pair, name)
        return self._emit_te(kernel, main + extra, dict(zip(keys, values[count:])), hint,
                             name, output)

    def _emit_te(self, compute, args, kwargs, hint: str, name: str, output: bool):
        """``compute`` as one PrimFunc named after the op; None if TE rejects it."""
        try:
            value = self.builder_.normalize(self.builder_.call_te(
                compute, *args, primfunc_name_hint=f"relay_amp_{hint}", **kwargs))
        except Exception:  # TE rejects these dtypes: keep the op as it is
            return None
        return self._emit(value, name, output)

    def _count_batch_norm(self, var):
        parameters = [arg for arg, _ in self._planner.call_args[var][1:]
                      if type(arg) is GenericConst and self.dtype_of(arg) == "float32"]
        if parameters:
            self.batch_norm_float32[0] += 1
            for arg in parameters:
                if arg.__chandle__() not in self._batch_norm_seen:  # dtype_of keeps arg alive
                    self._batch_norm_seen.add(arg.__chandle__())
                    self.batch_norm_float32[1] += 4 * int(np.prod(
                        [int(d) for d in arg.value.shape]))

    def _adopt_cast(self, source, result):
        """A float32 <-> low-precision cast already in the program joins the cast cache, so a
        later cast back returns its source instead of casting twice."""
        source_dtype, result_dtype = self.dtype_of(source), self.dtype_of(result)
        if {source_dtype, result_dtype} == {"float32", self.low}:
            layer = self._cache_layer(result)
            layer.setdefault((source.__chandle__(), result_dtype), result)
            layer.setdefault((result.__chandle__(), source_dtype), source)

    def _record(self, var, call, new_var, new_args, plan: Plan):
        in_dtypes = []
        for arg in new_args:
            for leaf in leaves_of(arg):
                dtype = self.dtype_of(leaf)
                if dtype is not None:
                    in_dtypes.append(dtype)
        out_dtype = self.dtype_of(new_var)
        demand = self._planner.demand.get(var, set())
        stored = [out_dtype] if out_dtype else []
        if out_dtype in ("float32", self.low):
            stored += sorted(d for d in demand if d in ("float32", self.low) and d != out_dtype)
        if plan.mode == Mode.LOW:
            compute = self.low
        elif plan.mixed:
            compute = "float32"
        elif plan.mode == Mode.IDENTITY:
            compute = "-"
        elif out_dtype and out_dtype.startswith(("float", "bfloat")):
            compute = out_dtype
        else:
            compute = next((d for d in in_dtypes if d.startswith(("float", "bfloat"))), "-")
        self.records.append(BindingRecord(
            function=self._function_name, name=plan.name, op=plan.op,
            category=plan.category.value if plan.category else (
                "passthrough" if plan.op in PASSTHROUGH_OPS else "unknown"),
            input_dtypes=tuple(in_dtypes), compute_dtype=compute,
            accumulation_dtype=plan.accumulation or compute,
            output_dtype="+".join(stored) if stored else "-",
            casts_added=self._casts + max(0, len(stored) - 1),
            macs=estimate_macs(plan.op, call), reasons=tuple(plan.reasons)))


class _TeRecorder:
    """Stands in for the BlockBuilder of an op's legalization and records its ``call_te``."""

    def __init__(self):
        self.calls = []

    def call_te(self, func, *args, **kwargs):
        self.calls.append((func, args, kwargs))
        return None

