"""Schedule rules that cannot cost the user the library: a rule that raises on a kernel passes
it to the next rule; and what each rule decided, for the build's report.

dlight's ``ApplyDefaultSchedule`` gives each PrimFunc to its rules in order and takes the first
schedule one returns. A rule that raises on a kernel it misjudged fails the whole build: TVM
0.27's GEMV rule asserts on a fused multiply-square-sum whose thread extent stays symbolic
(``'FloorDiv' object has no attribute 'value'``), so one kernel of an audio model cost its CUDA
library, in float32 as well. :func:`apply_rules` wraps each rule: its error is recorded in a
:class:`RuleLog` and the kernel goes on to the next rule (on CUDA down to dlight's
``Fallback``; on a CPU, where nothing follows, TVM's unscheduled loop nest).

A rule explains its choices with :func:`decide` (a tile's shape, an epilogue it left in a loop
of its own, why it passed a kernel on); the log keeps them by kernel
(:attr:`RuleLog.schedules`), and ``relay-amp convert`` writes them into its report.
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass

from ..relax_utils import last_line

_DECISIONS: contextvars.ContextVar = contextvars.ContextVar("relay_amp_decisions", default=None)


def decide(text: str) -> None:
    """Record one decision of the rule now scheduling a kernel under :func:`apply_rules`
    (outside one, nothing is recorded)."""
    decisions = _DECISIONS.get()
    if decisions is not None:
        decisions.append(text)


@dataclass(frozen=True)
class RuleError:
    """A schedule rule that raised on a kernel.

    Attributes
    ----------
    kernel : str
        The kernel (its PrimFunc's name).
    rule : str
        The rule that raised (its class name).
    error : str
        The last line of its error.
    scheduled_by : str or None
        The rule that scheduled the kernel instead; None where none did (it is then built as
        TVM legalized it, or, on CUDA, fails to build for lack of a thread binding).
    """

    kernel: str
    rule: str
    error: str
    scheduled_by: str | None

    def text(self) -> str:
        instead = (f"scheduled by {self.scheduled_by} instead" if self.scheduled_by
                   else "no later rule scheduled it")
        return f"{self.kernel}: schedule rule {self.rule} raised ({self.error}); {instead}"


@dataclass(frozen=True)
class KernelSchedule:
    """How one kernel was scheduled.

    Attributes
    ----------
    kernel : str
        The kernel (its PrimFunc's name).
    rule : str or None
        The rule that scheduled it; None where none did.
    decisions : tuple of str
        What that rule decided, in order (:func:`decide`).
    passed_on : tuple of str
        Why earlier rules that considered the kernel passed it on: ``"Rule: reason"``.
    """

    kernel: str
    rule: str | None
    decisions: tuple
    passed_on: tuple

    def text(self) -> str:
        by = f"scheduled by {self.rule}" if self.rule else "left as TVM legalized it"
        parts = [*self.passed_on, *self.decisions]
        return f"{self.kernel}: {by}" + (f" ({'; '.join(parts)})" if parts else "")


class RuleLog:
    """What the guarded rules of one build saw: which raised, on which kernel, which rule
    scheduled each kernel, and what it decided."""

    def __init__(self):
        self._raised: list = []  # (kernel, rule, error), in order
        self._scheduled: dict = {}  # kernel -> (the rule that scheduled it, what it decided)
        self._passed_on: dict = {}  # kernel -> ["Rule: why", ...] of rules that declined it
        self._names: dict = {}  # a PrimFunc's handle -> its name in the module being scheduled

    def name_kernels(self, mod) -> None:
        """Learn the names of ``mod``'s PrimFuncs: dlight hands a rule the function alone."""
        from tvm import tirx

        self._names = {func.__chandle__(): gvar.name_hint
                       for gvar, func in mod.functions_items() if isinstance(func, tirx.PrimFunc)}

    def kernel_name(self, func) -> str:
        return self._names.get(func.__chandle__(), "<unnamed kernel>")

    def reset(self) -> None:
        """Forget what was recorded (a build that starts again)."""
        self._raised.clear()
        self._scheduled.clear()
        self._passed_on.clear()

    def raised(self, kernel: str, rule: str, error: str) -> None:
        self._raised.append((kernel, rule, error))

    def scheduled(self, kernel: str, rule: str, decisions=()) -> None:
        self._scheduled.setdefault(kernel, (rule, tuple(decisions)))

    def passed_on(self, kernel: str, rule: str, reasons) -> None:
        """``rule`` considered ``kernel`` and returned no schedule, for ``reasons``."""
        if kernel not in self._scheduled:
            self._passed_on.setdefault(kernel, []).extend(f"{rule}: {r}" for r in reasons)

    @property
    def rules(self) -> dict:
        """The rule that scheduled each kernel a guarded rule scheduled, by kernel name."""
        return {kernel: rule for kernel, (rule, _) in self._scheduled.items()}

    @property
    def errors(self) -> list:
        """Every :class:`RuleError`, in the order the rules raised."""
        return [RuleError(kernel, rule, error, self._scheduled.get(kernel, (None,))[0])
                for kernel, rule, error in self._raised]

    @property
    def schedules(self) -> list:
        """A :class:`KernelSchedule` for every kernel a rule scheduled or explained passing
        on, in the order the rules first saw them."""
        kernels = list(dict.fromkeys([*self._passed_on, *self._scheduled]))
        return [KernelSchedule(k, *self._scheduled.get(k, (None, ())),
                               tuple(self._passed_on.get(k, ()))) for k in kernels]


def _check_lowers(space) -> None:
    """Raise where a schedule a rule returned cannot be lowered: dlight's ``Reduction`` gives a
    grouped convolution with an epilogue a cross-thread reduction whose loops are not the
    deepest, which ``LowerCrossThreadReduction`` rejects later, failing the whole build."""
    import tvm
    from tvm import s_tir

    schedules = space if isinstance(space, (list, tuple)) else [space]
    for schedule in schedules:
        mod = schedule.mod if isinstance(schedule, s_tir.Schedule) else schedule
        if not isinstance(mod, tvm.IRModule):
            continue
        try:
            s_tir.transform.LowerCrossThreadReduction()(mod)
        except Exception as err:  # noqa: BLE001 - TVM's check, whatever its type
            lines = [line.strip() for line in str(err).splitlines() if line.strip()]
            raise RuntimeError("its schedule does not lower: "
                               + (lines[0] if lines else type(err).__name__)) from None


def apply_rules(rules, log: RuleLog | None = None):
    """dlight's ``ApplyDefaultSchedule`` with ``rules``, each wrapped so that an exception it
    raises on a kernel is recorded in ``log`` and the kernel is offered to the next rule.

    Parameters
    ----------
    rules : sequence of tvm.s_tir.dlight.ScheduleRule
        In the order dlight tries them.
    log : RuleLog, optional
        Where the errors and the rules that scheduled those kernels instead are recorded.

    Returns
    -------
    tvm.transform.Pass
        The kernels' names learnt, then ``ApplyDefaultSchedule`` with the guarded rules.
    """
    import tvm
    from tvm.s_tir import dlight as dl

    log = log if log is not None else RuleLog()

    @tvm.transform.module_pass(opt_level=0, name="relay_amp.NameKernels")
    def name_kernels(mod, _context):
        log.name_kernels(mod)
        return mod

    class Guarded(dl.ScheduleRule):
        def __init__(self, rule):
            self.rule = rule
            self.name = type(rule).__name__

        def apply(self, func, target, tunable):
            kernel = log.kernel_name(func)
            decisions = []
            token = _DECISIONS.set(decisions)
            try:
                space = self.rule.apply(func, target, tunable)
                if "gpu" in target.keys:  # a CPU schedule binds no threads to reduce across
                    _check_lowers(space)
            except Exception as err:  # noqa: BLE001 - a rule's bug, in whatever form: next rule
                kind, text = type(err).__name__, last_line(err)
                log.raised(kernel, self.name, text if text == kind else f"{kind}: {text}")
                return None
            finally:
                _DECISIONS.reset(token)
            if space is not None:
                log.scheduled(kernel, self.name, decisions)
            elif decisions:
                log.passed_on(kernel, self.name, decisions)
            return space

        def is_target_available(self, target) -> bool:
            return self.rule.is_target_available(target)

    schedule = dl.ApplyDefaultSchedule(*[Guarded(rule) for rule in rules])

    @tvm.transform.module_pass(opt_level=0, name="relay_amp.ApplyRules")
    def apply(mod, _context):
        with unchecked_schedule_calls():
            return schedule(mod)

    return tvm.transform.Sequential([name_kernels, apply])


@contextlib.contextmanager
def unchecked_schedule_calls():
    """TVM's schedule primitives without the Python check of their arguments' types that
    ``tvm.s_tir.schedule._type_checker.type_checked`` wraps each in, while the block runs.

    The check adds 20-80 us to each call: resnet18_v2's kernels make about 1,600 while the
    rules schedule them, and without the checks the Relax stage of its build took 1.11 s
    against 1.24 s (median of 7, the ``znver5`` target built on a ``znver3`` host). It only
    turns a wrongly typed argument into a ``TypeError`` before TVM's own conversion raises; a
    rule's error of any kind passes the kernel on to the next rule (:func:`apply_rules`). A
    primitive that is not so wrapped is left as it is, and so is every primitive if TVM's
    wrapper changes."""
    from tvm.s_tir import Schedule
    from tvm.s_tir.schedule._type_checker import type_checked

    wrapper = type_checked(lambda: None).__code__
    checked = {name: value for name, value in vars(Schedule).items()
               if getattr(value, "__code__", None) is wrapper
               and callable(getattr(value, "__wrapped__", None))}
    try:
        for name, value in checked.items():
            setattr(Schedule, name, value.__wrapped__)
        yield
    finally:
        for name, value in checked.items():
            setattr(Schedule, name, value)


def uses(expr, var) -> bool:
    """Whether the TIR expression ``expr`` mentions the variable ``var``."""
    from tvm.tirx.analysis import undefined_vars

    # an index or a value binds none of its own variables: each one it mentions is free
    return any(free.same_as(var) for free in undefined_vars(expr))


def reverse_inlined(sch, block_rv):
    """A copy of ``sch`` with ``block_rv`` inlined into the block it reads
    (``reverse_compute_inline``; ``sch``'s random variables stay valid in it), or None where
    that fails. On a copy because TVM's own bound check can fail midway, an ``InternalError``
    rather than a ``ScheduleError``, on some broadcasts (se_resnext50_32x4d's
    squeeze-and-excitation scale, llama_smollm_135m's RMSNorm)."""
    import tvm
    from tvm import s_tir

    trial = sch.copy()
    try:
        trial.reverse_compute_inline(block_rv)
    except (s_tir.ScheduleError, tvm.error.InternalError):
        return None
    return trial


def link_llvm(sch, loop, text: str) -> None:
    """Link the LLVM IR ``text`` into the library where ``loop`` runs (TVM's
    ``pragma_import_llvm``), beside what the loop links already: one kernel can call the
    functions of several modules (a tile's and its rounding's)."""
    linked = sch.get(loop).annotations.get("pragma_import_llvm")
    if linked is not None and text in str(linked):
        return
    if linked is not None:  # annotate keeps a key's first value
        sch.unannotate(loop, "pragma_import_llvm")
    sch.annotate(loop, "pragma_import_llvm", text if linked is None else f"{linked}\n{text}")


#: The last PrimFunc :func:`llvm_blocks` normalized, its schedule and blocks: dlight offers one
#: kernel to each rule in turn, and an elementwise kernel passes four CPU rules, each of which
#: started from it (``Schedule`` and ``normalize_prim_func``, 1.6 ms a kernel, against 8 us for
#: a copy of the schedule).
_NORMALIZED: list = [None]  # (func, schedule, blocks), replaced whole


def llvm_blocks(func, target):
    """``(schedule, blocks)``: what a CPU rule starts from, a schedule of ``func`` and its
    blocks as dlight normalizes them (``normalize_prim_func``); None where ``func`` is not a
    PrimFunc, ``target`` not an ``llvm`` one, or the blocks do not normalize. The schedule is
    the rule's own (a copy of the one the last call with ``func`` made)."""
    import tvm
    from tvm import s_tir
    from tvm.s_tir.dlight.analysis import normalize_prim_func

    if not isinstance(func, tvm.tirx.PrimFunc) or target.kind.name != "llvm":
        return None
    cached = _NORMALIZED[0]
    if cached is None or not cached[0].same_as(func):
        sch = s_tir.Schedule(func)
        cached = _NORMALIZED[0] = (func, sch, normalize_prim_func(sch))
    _, sch, blocks = cached
    return None if blocks is None else (sch.copy(), list(blocks))


__all__ = ["KernelSchedule", "RuleError", "RuleLog", "apply_rules", "decide", "link_llvm",
           "llvm_blocks", "reverse_inlined", "unchecked_schedule_calls", "uses"]
