"""Step 0 of the algorithm (stated in :mod:`relay_amp.transform`): resolve. The policy a
conversion uses, and per Relax function the target, its kernel settings and the
:class:`~relay_amp.plan.Context` the function is converted in, each a frozen
:class:`FunctionJob`; inference batch_norm decomposed first where the settings ask for it. The
notes go to the report as they are found."""

from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm import relax

from .builds.tensor_cores import tensor_core_note
from .casts import Constants
from .dtypes import check_low_precision_dtype
from .execution import with_function
from .op_hooks import OpSite
from .op_registry import callee_fusion_kinds, op_info, selecting_callees
from .plan import Context
from .policy import Policy, current_policy
from .relax_utils import DtypeCache, op_name
from .report import ReportBuilder
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


@dataclass(frozen=True)
class FunctionJob:
    """One Relax function of the module and what it is converted with.

    Attributes
    ----------
    gvar : tvm.ir.GlobalVar
        Its name in the module.
    func : relax.Function
        The function (batch_norm decomposed where that applies).
    context : relay_amp.plan.Context
        Its context: the low dtype, policy, target rule, kernel settings and calibration.
    results_low : bool
        Its float32 results become low precision (``keep_io_dtypes=False``, and no other
        function calls it).
    """

    gvar: tvm.ir.GlobalVar
    func: relax.Function
    context: Context
    results_low: bool

    @property
    def name(self) -> str:
        return self.gvar.name_hint


@dataclass(frozen=True)
class Resolved:
    """What step 0 hands on: the module as the later steps read it and one job per function,
    in the order they are converted; ``dtype_of`` and ``constants`` are the conversion's."""

    mod: tvm.IRModule
    jobs: tuple
    dtype_of: DtypeCache
    constants: Constants


def resolve_functions(mod: tvm.IRModule, policy: Policy, target, calibration,
                      report: ReportBuilder) -> Resolved:
    """Step 0 for every Relax function of ``mod``: its target (``target``, else
    ``Target.current()``, else the function's ``target`` attribute), kernel settings and
    context; the notes each brings go to ``report``.

    Raises
    ------
    ValueError
        ``low_precision_inputs`` or ``input_dtypes`` names no parameter of the module.
    """
    low = policy.dtype
    explicit_target = as_target(target) or tvm.target.Target.current(allow_none=True)
    functions = relax_functions(mod)
    _check_named_parameters(policy, functions)
    targets, settings = {}, {}
    for gvar, func in functions:
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
    called = _called_functions(mod)
    dtype_of, constants = DtypeCache(), Constants(low)
    callee_kinds = callee_fusion_kinds(mod)
    selecting = selecting_callees(mod, callee_kinds)
    jobs = []
    for gvar, func in sorted(relax_functions(mod), key=lambda item: item[0].name_hint):
        name, target = gvar.name_hint, targets[gvar.name_hint]
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
        jobs.append(FunctionJob(gvar, func, context,
                                not policy.keep_io_dtypes and name not in called))
    return Resolved(mod, tuple(jobs), dtype_of, constants)


def relax_functions(mod: tvm.IRModule) -> list:
    """``(GlobalVar, relax.Function)`` of each Relax function of ``mod``."""
    return [(gv, f) for gv, f in mod.functions_items() if isinstance(f, relax.Function)]


def _called_functions(mod: tvm.IRModule) -> set:
    """Names of the Relax functions that other functions of ``mod`` call."""
    called = set()
    for gvar, func in mod.functions_items():
        if isinstance(func, relax.Function):
            for used in relax.analysis.all_global_vars(func):
                if used.name_hint != gvar.name_hint and isinstance(mod[used], relax.Function):
                    called.add(used.name_hint)
    return called


def _check_named_parameters(policy: Policy, functions):
    """``low_precision_inputs`` and ``input_dtypes`` name parameters of the module."""
    parameters = {p.name for _, f in functions for p in f.params}
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
