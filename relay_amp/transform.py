"""The public entry points, :func:`convert` and the :class:`ToMixedPrecision` module pass, and
the algorithm they run, in the order :func:`convert` runs it.

0. Resolve. The policy (argument, else the active :func:`relay_amp.amp_config`, else the
   default) and, per Relax function, the target (argument, else ``Target.current()``, else the
   function's ``target`` attribute) and its kernel settings (:func:`relay_amp.targets.
   kernel_settings`: ``decompose_batch_norm``, ``mixed_kernels``, ``low_precision_boundaries``,
   ``low_precision_residuals``). Where ``decompose_batch_norm`` holds, inference batch_norm
   becomes elementwise ops first (``DecomposeOpsForInference``).

Then per Relax function, in :func:`convert`, with the function's
:class:`~relay_amp.plan.Context` (the low dtype, policy, target rule, kernel settings,
calibration): the signature first (:func:`relay_amp.signature.function_signature`): a float32
parameter whose calibrated range the low dtype cannot hold keeps float32, an integer input
(``input_dtypes``) gets its own parameter. Then :func:`relay_amp.planning.plan_function`
(function, signature, context) runs steps 1-2 over a :class:`~relay_amp.plan.Scope` (the
bindings, If branches included, one canonical wrapper per var), each step handing its output
to the next, and returns a frozen :class:`~relay_amp.plan.FunctionPlan`; step 3 carries it
out and hands each binding's row to the one :class:`~relay_amp.report.ReportBuilder`. A
nested function goes through the same steps in the enclosing function's context:

1. Decide (:mod:`relay_amp.decide`, ``Decider`` -> ``Decisions``). Forward over the bindings,
   the policy gives each call a category and a rule; operand checks (constants or scalars the
   low-precision dtype cannot hold, dtypes other than float32, calibrated ranges that would
   overflow) can overrule it, and an op's ``identity`` hook (quantize(x) of values that are
   already those integers) makes the binding its source. A value that decides a discrete result
   (an op's ``decision_operands``, a scalar or broadcast operand of a comparison or of a cast to
   integers) and the calls computing it stay float32 (reason ``decides_discrete``). From the
   categories follows ``can_low``: whether a value can exist in low precision without losing
   what float32 protected. Where the signature is made low precision, a result leaf that holds
   a value the low dtype cannot keeps float32 (``result_signature``, reason ``fp32_boundary``)
   or the conversion raises (``strict_io_dtypes``).
1b. Kernel boundaries (:mod:`relay_amp.kernel_plan`, ``KernelPlanner`` -> ``KernelPlan``, with
   ``low_precision_boundaries``). Which values FuseOps keeps in one kernel's registers (the
   fusion kinds of the op registry) and which cross a kernel boundary; a crossing value is
   stored in low precision and widened in the kernel that reads it, unless a ranking op (NMS,
   top-k, sort, argmax) reads it, directly or through exact ops, or it is a residual stream whose
   sum a normalization centres (``low_precision_residuals``: other streams are stored low, each
   add computed in float32 registers inside the kernel that reads them). An accumulate op
   (``mixed_kernels``) is one kernel that reads what arrives, computes in float32 registers and
   writes what its consumers want; a centring normalization also forms the residual add that
   feeds it, so the sum is never stored. A follow op's mode follows from how its inputs arrive.
2. Demand (:mod:`relay_amp.demand`, ``DemandPlanner`` -> ``Demand``). Backward over the
   bindings, each binding records the dtypes its operands must have: low-precision ops want low
   precision; float32, unknown and accumulate ops want each operand's original dtype; a follow
   op runs in low precision only if it can and one of its consumers wants low precision (an
   op's ``choose_mode`` hook decides quantize and dequantize). The function result wants its
   original dtypes (``keep_io_dtypes``).
3. Rewrite (:mod:`relay_amp.rewriter`). Forward again, reading the frozen plan: every operand
   is cast to the dtype its consumer computes in, through one cast cache per scope
   (:mod:`relay_amp.casts`); the kernels the plan asks for that TVM's legalization does not give
   (mixed, absorbing, narrowing) are emitted from that legalization (:mod:`relay_amp.kernels`);
   an integer input becomes the compute dtype, normalized, inside the first dataflow block; each
   binding's decision lands in the report with its rule.

4. Finish. Where ``low_precision_boundaries`` holds, dataflow outputs that no other block and
   not the result reads become internal (so FuseOps fuses the signature's cast into the kernel
   that computes the value) and casts nothing reads are dropped; with ``verify``, the output
   is checked with ``well_formed``; with ``debug_guard``, a NaN/Inf check follows every
   low-precision result (:mod:`relay_amp.instrument`); the report gets its rows, notes and
   cast count.
"""

from __future__ import annotations

import contextlib
import gc

import tvm
from tvm import relax

from .builds.tensor_cores import tensor_core_note
from .calibrate import Calibration
from .casts import Constants
from .dtypes import check_low_precision_dtype, is_floating
from .execution import with_function
from .instrument import instrument
from .op_hooks import OpSite
from .op_registry import callee_fusion_kinds, op_info, selecting_callees
from .plan import Context
from .planning import plan_function
from .policy import Policy, current_policy
from .relax_utils import TVM_ERRORS, DtypeCache, op_name
from .report import Report, ReportBuilder
from .rewriter import MixedPrecisionRewriter
from .signature import function_signature
from .targets import as_target, kernel_settings, target_caps, target_rule


def resolve_policy(dtype=None, policy=None, **policy_kwargs) -> Policy:
    """The policy a conversion uses: ``policy``, else the active :func:`amp_config`, else the
    defaults; ``dtype`` (if given) overrides the policy's dtype; MXNet-style keywords build one."""
    if dtype is not None:
        check_low_precision_dtype(dtype)
    if policy is not None and not isinstance(policy, Policy):
        raise TypeError(f"policy must be a relay_amp.Policy; got {type(policy).__name__}")
    if policy_kwargs:
        if policy is not None:
            raise TypeError("pass either a Policy or policy keywords "
                            f"({', '.join(sorted(policy_kwargs))}), not both")
        return Policy(dtype or "float16", **policy_kwargs)
    if policy is None:
        policy = current_policy() or Policy(dtype or "float16")
    if dtype is not None and dtype != policy.dtype:
        policy = policy.with_dtype(dtype)
    return policy


def _well_formed_problem(mod: tvm.IRModule) -> str | None:
    try:
        relax.analysis.well_formed(mod)
    except TVM_ERRORS as err:  # TVM raises InternalError/ValueError with the reason
        lines = str(err).strip().splitlines()
        return lines[-1][:200] if lines else type(err).__name__
    return None


def _called_functions(mod: tvm.IRModule) -> set:
    """Names of the Relax functions that other functions of ``mod`` call."""
    called = set()
    for gvar, func in mod.functions_items():
        if isinstance(func, relax.Function):
            for used in relax.analysis.all_global_vars(func):
                if used.name_hint != gvar.name_hint and isinstance(mod[used], relax.Function):
                    called.add(used.name_hint)
    return called


def convert(mod, dtype: str | None = None, policy: Policy | None = None, target=None,
            calibration=None, debug_guard: bool = False, verify: bool = False,
            **policy_kwargs) -> tuple[tvm.IRModule, Report]:
    """Convert the Relax functions of ``mod`` to mixed precision.

    Parameters
    ----------
    mod : tvm.IRModule
        The module; it is not modified.
    dtype : {"float16", "bfloat16"}, optional
        The low-precision dtype. Default: the policy's, which defaults to float16.
    policy : relay_amp.Policy, optional
        The decision table. Default: the active :func:`relay_amp.amp_config`, else ``Policy()``.
    target : tvm.target.Target or dict, optional
        Sets the target defaults. Default: ``Target.current()``, else each function's
        ``target`` attribute, else none (the built-in defaults alone).
    calibration : relay_amp.Calibration, optional
        Observed value ranges from :func:`relay_amp.calibrate`: values that would overflow (or
        underflow) the low-precision dtype stay float32, and so do the ops that would read them
        in low precision. So does a parameter or result that the signature would make low
        precision (``keep_io_dtypes=False``, ``low_precision_inputs``): it keeps float32 with a
        note and a :class:`relay_amp.report.BoundaryRecord` in ``report.boundary`` (a constant
        result out of range does the same without calibration), or, with
        ``strict_io_dtypes=True``, the conversion raises.
    debug_guard : bool
        Check every low-precision result for NaN/Inf at run time; the first binding that
        produces one stops the run with an error that names it. Off by default (no cost).
    verify : bool
        Check the output with ``relax.analysis.well_formed`` and raise if relay_amp made a
        well-formed module ill-formed (an input that is already ill-formed gets a note). Off by
        default: the check costs more than the conversion on convolution-heavy graphs, and the
        test suite and fuzzer verify every conversion they make.
    **policy_kwargs
        MXNet-compatible keywords (``target_dtype_ops``, ``fp32_ops``, ``widest_dtype_ops``,
        ``conditional_fp32_ops``, ``excluded_sym_names``, ``cast_params_offline``,
        ``keep_io_dtypes`` ...), forwarded to :class:`relay_amp.Policy`.

    Returns
    -------
    (tvm.IRModule, Report)
        The converted module and the explanation of every decision.

    Raises
    ------
    TypeError
        ``mod`` is not an IRModule, or a policy argument has the wrong type.
    ValueError
        An unsupported dtype, an unknown op name, a bad regex, an invalid target, or (with
        ``strict_io_dtypes``) a low-precision parameter or result the dtype cannot hold.
    """
    with _cyclic_gc_paused():
        return _convert(mod, dtype, policy, target, calibration, debug_guard, verify,
                        policy_kwargs)


@contextlib.contextmanager
def _cyclic_gc_paused():
    """Python's cyclic garbage collector off while a conversion runs, back as it was after.

    A conversion allocates a few objects per binding and keeps them all until it ends, so the
    collector's passes find almost nothing to free while each young-generation pass walks
    the new objects again: on a 5,100-binding graph they took a quarter of the conversion's
    time (scripts/bench_convert_time.py). Cycles made meanwhile are collected afterwards."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _convert(mod, dtype, policy, target, calibration, debug_guard, verify, policy_kwargs):
    """:func:`convert`, with its arguments as it takes them."""
    if not isinstance(mod, tvm.IRModule):
        raise TypeError(f"convert() takes a tvm.IRModule; got {type(mod).__name__}"
                        + (" (wrap a relax.Function with tvm.IRModule({'main': func}))"
                           if isinstance(mod, relax.Function) else ""))
    policy = resolve_policy(dtype, policy, **policy_kwargs)
    low = policy.dtype
    explicit_target = as_target(target) or tvm.target.Target.current(allow_none=True)
    if calibration is not None and not isinstance(calibration, Calibration):
        raise TypeError("calibration must be a relay_amp.Calibration from relay_amp.calibrate(); "
                        f"got {type(calibration).__name__}")
    report = ReportBuilder(low)
    relax_functions = _relax_functions(mod)
    if not relax_functions:
        report.note("the module has no Relax function: nothing was converted")
        return mod, report.finish(0, 0)
    _check_named_parameters(policy, relax_functions)

    # 0. Resolve each function's target and kernel settings; decompose batch_norm first.
    targets, settings = {}, {}
    for gvar, func in relax_functions:
        name = gvar.name_hint
        targets[name] = explicit_target
        if explicit_target is None and func.attrs is not None and "target" in func.attrs:
            targets[name] = func.attrs["target"]
        settings[name] = kernel_settings(policy, targets[name])
        if settings[name].decompose_batch_norm and _decomposes(func, low):
            mod = _decompose_batch_norm(mod, name)
            report.note(f"{name}: inference batch_norm decomposed into elementwise ops before "
                        "conversion (decompose_batch_norm), so it computes in float32 inside "
                        "the convolution's kernel")
    relax_functions = _relax_functions(mod)
    called = _called_functions(mod)
    dtype_of, constants = DtypeCache(), Constants(low)
    callee_kinds = callee_fusion_kinds(mod)
    selecting = selecting_callees(mod, callee_kinds)
    rewriter = MixedPrecisionRewriter(mod, low, dtype_of, constants, policy.cast_params_offline,
                                      report)

    for gvar, func in sorted(relax_functions, key=lambda item: item[0].name_hint):
        name = gvar.name_hint
        target = targets[name]
        if any(value for _, value, _ in settings[name].reasons):
            report.note(f"{name}: kernel settings: {settings[name].describe()}")
        if target is not None:
            caps = target_caps(target)
            report.note(f"{name}: target {caps.name} "
                        f"({'computes' if caps.computes(low) else 'only stores'} {low})")
            tensor_cores = tensor_core_note(target, low) if caps.computes(low) else None
            if tensor_cores is not None:
                report.note(f"{name}: {tensor_cores}")
        if not policy.keep_io_dtypes and name in called:
            report.note(f"{name}: signature kept, other functions call it")
        context = Context(low, policy, target_rule(target, low, policy.fallback), settings[name],
                          calibration, callee_kinds, dtype_of, constants, selecting)
        results_low = not policy.keep_io_dtypes and name not in called
        rewriter.builder_.update_func(gvar, _convert_function(name, func, context, results_low,
                                                              rewriter, report))

    # 4. Finish.
    new_mod = rewriter.builder_.get()
    for name, chosen in settings.items():
        if chosen.low_precision_boundaries:
            new_mod = with_function(new_mod, name, internalize_dataflow_outputs(new_mod[name]))
    output_problem = _well_formed_problem(new_mod) if verify else None
    if output_problem is not None:
        input_problem = _well_formed_problem(mod)
        if input_problem is None:  # relay_amp never makes a well-formed module ill-formed
            relax.analysis.well_formed(new_mod)
        report.note(f"the input module is not well-formed ({input_problem}); the output has "
                    "the same problem")
    if debug_guard:
        new_mod = add_debug_guards(new_mod, report.report)
        relax.analysis.well_formed(new_mod)
        report.note("debug_guard: every low-precision result is checked for NaN/Inf")
    return new_mod, report.finish(rewriter.casts.total_casts, constants.converted)


def _convert_function(name: str, func, context: Context, results_low: bool, rewriter,
                      report: ReportBuilder, entry: bool = True):
    """Steps 1-3 for one function: its signature, its plan, the rewrite by that plan (the rows
    going to ``report``); a nested function comes back here with the same ``context``."""
    signature = function_signature(name, func, context, results_low, entry)
    plan = plan_function(func, signature, context)
    for kept in signature.kept + plan.kept:
        report.kept(name, kept)
    return rewriter.rewrite_function(
        func, signature, plan, nested=lambda inner_name, inner: _convert_function(
            inner_name, inner, context, False, rewriter, report, entry=False))


def _relax_functions(mod: tvm.IRModule) -> list:
    return [(gv, f) for gv, f in mod.functions_items() if isinstance(f, relax.Function)]


def _check_named_parameters(policy: Policy, relax_functions):
    """``low_precision_inputs`` and ``input_dtypes`` name parameters of the module."""
    parameters = {p.name for _, f in relax_functions for p in f.params}
    for what, names in (("low_precision_inputs", set(policy.low_precision_inputs)),
                        ("input_dtypes", set(policy.input_dtypes))):
        missing = set(names) - parameters
        if missing:
            raise ValueError(f"{what} names {sorted(missing)}, which are not parameters of any "
                             f"Relax function (parameters: {sorted(parameters)})")


def _decompose_batch_norm(mod: tvm.IRModule, name: str) -> tvm.IRModule:
    """``mod`` with the inference batch_norm of function ``name`` as elementwise ops."""
    mod = relax.transform.DecomposeOpsForInference(name)(mod)
    mod = relax.transform.CanonicalizeBindings()(mod)  # bn[0] of the new tuple: its field
    return with_function(mod, name, relax.analysis.remove_all_unused(mod[name]))


@relax.expr_functor.mutator
class _Internalize(relax.PyExprMutator):
    """Turns the dataflow outputs in ``internal`` into DataflowVars, names unchanged, and drops
    the bindings in ``dead``."""

    def __init__(self, internal, dead):
        super().__init__()
        self.internal, self.dead = internal, dead

    def visit_var_binding_(self, binding):
        var = binding.var
        if var.__chandle__() in self.dead:
            return
        value = self.visit_expr(binding.value)
        if var.__chandle__() in self.internal:
            new = relax.DataflowVar(var.name, value.ty)
            self.set_var_remap(var, new)
            var = new
        self.builder_.emit_normalized(relax.VarBinding(var, value))


def internalize_dataflow_outputs(func: relax.Function) -> relax.Function:
    """``func`` with every dataflow-block output that no other block and not the result reads
    made a DataflowVar (names kept), and every cast that nothing reads dropped. A float32 result
    that left its block only to be cast for the signature then stays inside it, and FuseOps
    fuses the cast into the kernel that computes it; a low-precision copy planned for a kernel
    boundary that its reader did not take (it computes in float32 after all) costs no kernel."""
    body = func.body
    if not isinstance(body, relax.SeqExpr):
        return func
    readers: dict = {}  # var handle -> the blocks (or -1, the result) that read it

    def reads(expr, where):
        relax.analysis.post_order_visit(expr, lambda e: readers.setdefault(
            e.__chandle__(), set()).add(where) if isinstance(e, relax.Var) else None)

    for index, block in enumerate(body.blocks):
        for binding in block.bindings:
            reads(binding.value, index)
    reads(body.body, -1)
    internal, dead = set(), set()
    for index, block in enumerate(body.blocks):
        if not isinstance(block, relax.DataflowBlock):
            continue
        for binding in block.bindings:
            var, value = binding.var, binding.value
            read_by = readers.get(var.__chandle__(), set())
            if (not read_by and type(binding) is relax.VarBinding
                    and isinstance(value, tvm.ir.Call) and op_info(op_name(value)).is_cast):
                dead.add(var.__chandle__())
            elif type(binding) is relax.VarBinding and type(var) is relax.Var and (
                    read_by <= {index}):
                internal.add(var.__chandle__())
    return _Internalize(internal, dead).visit_expr(func) if internal or dead else func


def _decomposes(func, low: str) -> bool:
    """Does ``func`` call an op that ``DecomposeOpsForInference`` decomposes
    (:attr:`OpInfo.decomposes`: inference batch_norm)?"""
    found = []

    def visit(expr):
        if isinstance(expr, tvm.ir.Call) and isinstance(expr.op, tvm.ir.Op):
            decomposes = op_info(op_name(expr)).decomposes
            if decomposes is not None and decomposes(OpSite(expr, low)):
                found.append(expr)

    relax.analysis.post_order_visit(func, visit)
    return bool(found)


def add_debug_guards(mod: tvm.IRModule, report: Report) -> tvm.IRModule:
    """After each low-precision binding, assert that its value is finite.

    The guarded functions become non-dataflow and impure (``assert_op`` has an effect); the
    assertion message names the binding, its op and dtype.
    """
    guarded = {(r.function, r.name): r for r in report.rows if r.compute_dtype == report.dtype}
    mod = relax.transform.ToNonDataflow()(mod)
    updated = {}
    for gvar, func in mod.functions_items():
        if not isinstance(func, relax.Function):
            continue
        name = gvar.name_hint

        def guard(binding, bind, name=name):
            row = guarded.get((name, binding.var.name))
            ty = binding.var.ty
            value = binding.value
            stored = (isinstance(value, tvm.ir.Call) and op_info(op_name(value)).is_cast
                      and isinstance(ty, relax.TensorType)
                      and str(ty.dtype) == report.dtype and isinstance(value.args[0], relax.Var))
            if not (row or stored) or not isinstance(ty, relax.TensorType) or not is_floating(
                    ty.dtype):
                return []
            if row is not None:
                what = f"binding {binding.var.name} ({row.op}, computed in {row.compute_dtype})"
            else:
                what = f"the {report.dtype} copy of {value.args[0].name}"
            finite_each = bind(relax.op.isfinite(binding.var), "guard_finite")
            bad = bind(relax.op.logical_not(finite_each), "guard_bad")
            flags = bind(relax.op.astype(bad, "int32"), "guard_int")
            count = bind(relax.op.max(flags), "guard_any")
            finite = bind(relax.op.equal(count, relax.const(0, "int32")), "guard_ok")
            message = f"relay_amp debug_guard: {what} in {name} produced NaN or Inf"
            bind(relax.op.assert_op(finite, [], message), "guard")
            return []

        blocks, _ = instrument(func, guard)
        body = relax.SeqExpr(blocks, func.body.body)
        updated[gvar] = relax.Function(func.params, body, func.ret_ty, False, func.attrs)
    for gvar, func in updated.items():
        mod = with_function(mod, gvar.name_hint, func)
    return relax.transform.Normalize()(mod)


@tvm.transform.module_pass(opt_level=0, name="relay_amp.ToMixedPrecision")
class ToMixedPrecision:
    """Convert a Relax module to mixed precision; drops into ``tvm.transform.Sequential``.

    Parameters
    ----------
    dtype : {"float16", "bfloat16"}, optional
        The low-precision dtype (default: the policy's, float16 unless configured).
    policy : relay_amp.Policy, optional
        The decision table. Default: the :func:`relay_amp.amp_config` active when the pass is
        created or, failing that, when it runs; else ``Policy()``.
    target : tvm.target.Target or dict, optional
        The target whose defaults apply (default: ``Target.current()`` or each function's
        ``target`` attribute).
    calibration : relay_amp.Calibration, optional
        Observed ranges from :func:`relay_amp.calibrate`.
    debug_guard, verify : bool
        As for :func:`relay_amp.convert`.
    on_report : callable, optional
        Called with the :class:`relay_amp.Report` of each run (``reports.append``); the pass
        itself keeps no state between runs.
    **policy_kwargs
        MXNet-compatible policy keywords, as for :func:`relay_amp.convert`.

    Examples
    --------
    >>> reports = []
    >>> seq = tvm.transform.Sequential([relay_amp.ToMixedPrecision("bfloat16",
    ...                                                           on_report=reports.append)])
    >>> mod = seq(mod)  # doctest: +SKIP
    """

    def __init__(self, dtype: str | None = None, policy: Policy | None = None, target=None,
                 calibration=None, debug_guard: bool = False, verify: bool = False,
                 on_report=None, **policy_kwargs):
        if on_report is not None and not callable(on_report):
            raise TypeError("on_report must be a callable that takes the relay_amp.Report (e.g. "
                            f"a list's append); got {type(on_report).__name__}")
        self.dtype = None if dtype is None else check_low_precision_dtype(dtype)
        configured = policy or current_policy()
        # without a policy now, the one active when the pass runs applies (see transform_module)
        self.policy = (resolve_policy(dtype, configured, **policy_kwargs)
                       if configured is not None or policy_kwargs else None)
        self.target = as_target(target)
        self.calibration = calibration
        self.debug_guard = debug_guard
        self.verify = verify
        self.on_report = on_report

    def transform_module(self, mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
        new_mod, report = convert(mod, self.dtype, self.policy, self.target, self.calibration,
                                  self.debug_guard, self.verify)
        if self.on_report is not None:
            self.on_report(report)
        return new_mod
