"""The plan of one call binding (its :class:`Mode` and :class:`Plan`) and the op sets the
planner reads: what steps 1, 1b and 2 of the algorithm (stated in :mod:`relay_amp.rewriter`)
share."""

from __future__ import annotations

from .dtypes import max_finite
from .kinds import Mode
from .policy import Decision


class Plan:
    """The decision for one call binding."""

    __slots__ = ("op", "name", "decision", "category", "reasons", "mode", "accumulation",
                 "float_output", "constant_inputs", "mixed", "mode_fixed", "source")

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
        self.source = None  # an identity binding's source (Mode.IDENTITY)


def range_words(value: float, low: str) -> str:
    """How ``value`` misses the range of ``low``, for a reason's text."""
    if abs(value) > max_finite(low):
        return f"exceeds {low} max {max_finite(low):.6g}"
    return f"underflows to zero in {low}"
