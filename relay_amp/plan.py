"""The plan of one call binding (its :class:`Mode` and :class:`Plan`) and the op sets the
planner reads: what steps 1, 1b and 2 of the algorithm (stated in :mod:`relay_amp.rewriter`)
share."""

from __future__ import annotations

import enum

from .dtypes import max_finite
from .op_tables import FusionKind
from .policy import Decision


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


def range_words(value: float, low: str) -> str:
    """How ``value`` misses the range of ``low``, for a reason's text."""
    if abs(value) > max_finite(low):
        return f"exceeds {low} max {max_finite(low):.6g}"
    return f"underflows to zero in {low}"
