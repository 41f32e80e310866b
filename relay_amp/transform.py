"""The public entry points, :func:`convert` and the :class:`ToMixedPrecision` module pass, and
the algorithm they run, in the order :func:`convert` runs it.

0. Resolve (:mod:`relay_amp.resolve`, a frozen ``FunctionJob`` per function). The policy
   (argument, else the active :func:`relay_amp.amp_config`, else the default) and, per Relax
   function, the target (argument, else ``Target.current()``, else the
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
to the next, and returns a frozen :class:`~relay_amp.plan.FunctionPlan`; a nested function is
planned there too, with its own signature, in the enclosing function's context, and its plan
is part of the enclosing one's. Step 3 carries the plan out, nested functions included, and
hands each binding's row to the one :class:`~relay_amp.report.ReportBuilder`:

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

4. Finish (:mod:`relay_amp.finish`). Where ``low_precision_boundaries`` holds, dataflow
   outputs that no other block and not the result reads become internal (so FuseOps fuses the
   signature's cast into the kernel that computes the value) and casts nothing reads are
   dropped; with ``verify``, the output is checked with ``well_formed``; with ``debug_guard``,
   a NaN/Inf check follows every low-precision result (:mod:`relay_amp.instrument`); the
   report gets its rows, notes and cast count.
"""

from __future__ import annotations

import contextlib
import gc

import tvm
from tvm import relax

from .calibrate import Calibration
from .dtypes import check_low_precision_dtype
from .finish import finish
from .planning import plan_function
from .policy import Policy, current_policy
from .report import Report, ReportBuilder
from .resolve import FunctionJob, relax_functions, resolve_functions, resolve_policy
from .rewriter import MixedPrecisionRewriter
from .signature import function_signature
from .targets import as_target


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
    """:func:`convert`, with its arguments as it takes them: resolve, each function's job,
    finish."""
    if not isinstance(mod, tvm.IRModule):
        raise TypeError(f"convert() takes a tvm.IRModule; got {type(mod).__name__}"
                        + (" (wrap a relax.Function with tvm.IRModule({'main': func}))"
                           if isinstance(mod, relax.Function) else ""))
    policy = resolve_policy(dtype, policy, **policy_kwargs)
    if calibration is not None and not isinstance(calibration, Calibration):
        raise TypeError("calibration must be a relay_amp.Calibration from relay_amp.calibrate(); "
                        f"got {type(calibration).__name__}")
    report = ReportBuilder(policy.dtype)
    if not relax_functions(mod):
        report.note("the module has no Relax function: nothing was converted")
        return mod, report.finish(0)
    resolved = resolve_functions(mod, policy, target, calibration, report)  # 0
    rewriter = MixedPrecisionRewriter(resolved.mod, policy.dtype, resolved.dtype_of,
                                      resolved.constants, policy.cast_params_offline, report)
    for job in resolved.jobs:  # 1-3
        rewriter.builder_.update_func(job.gvar, _convert_function(job, rewriter, report))
    return finish(resolved.mod, rewriter.builder_.get(), resolved.jobs, report,  # 4
                  resolved.constants.converted, verify, debug_guard)


def _convert_function(job: FunctionJob, rewriter: MixedPrecisionRewriter,
                      report: ReportBuilder) -> relax.Function:
    """Steps 1-3 for one function: its signature, its plan (nested functions' included), the
    rewrite by that plan (the rows going to ``report``)."""
    signature = function_signature(job.name, job.func, job.context, job.results_low)
    plan = plan_function(job.func, signature, job.context)
    for name, kept in plan.kept_boundaries(signature):
        report.kept(name, kept)
    return rewriter.rewrite_function(job.func, signature, plan)


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
