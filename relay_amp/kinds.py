"""The words every stage of the conversion speaks: an op's :class:`Category` (what the policy
wants of it), its :class:`FusionKind` (what TVM's FuseOps does with it) and a binding's
:class:`Mode` (what the rewrite does with its operands)."""

from __future__ import annotations

import enum


class Category(str, enum.Enum):
    """How an op is converted. The values are the names used in policy JSON."""

    #: Inputs in the low-precision dtype, products summed in the accumulation dtype (float32)
    #: through the op's ``out_dtype``; the result is stored in whichever dtype its consumers use.
    LOW_PRECISION_FP32_ACCUMULATE = "low_precision_fp32_accumulate"
    #: Inputs, computation and result all in the low-precision dtype.
    LOW_PRECISION = "low_precision"
    #: Runs in the widest dtype among its float *activation* inputs; constants and function
    #: parameters adapt to it. Low precision only where a consumer wants low precision.
    FOLLOW = "follow"
    #: Takes and returns low precision but computes internally in the accumulation dtype
    #: (float32): the casts fuse into the op's kernel, so memory traffic stays low precision.
    ACCUMULATE = "accumulate"
    #: Computes in float32 and returns float32.
    FP32 = "fp32"
    #: Computes in float32, but float32 weights are stored in the low-precision dtype and
    #: widened where they are used (the default on hardware without fast low-precision math).
    STORAGE = "storage"

    def __str__(self) -> str:
        return self.value


LOW_CATEGORIES = (Category.LOW_PRECISION_FP32_ACCUMULATE, Category.LOW_PRECISION)


class FusionKind(str, enum.Enum):
    """How TVM's FuseOps treats an op once it is legalized (``AnnotateTIROpPattern``): which
    neighbours can share its kernel. The kernel-boundary planning of
    ``Policy.low_precision_boundaries`` reads it; an op of no other kind is ``OPAQUE``."""

    #: Elementwise and broadcast maps: fuse into their consumers and absorb their producers.
    ELEMWISE = "elemwise"
    #: Data movement: fuses with elementwise and injective neighbours, never into an anchor.
    INJECTIVE = "injective"
    #: Reductions: absorb elementwise producers; their result leaves the kernel.
    REDUCE = "reduce"
    #: Out-elementwise-fusable kernels (dot products, norms, pools, softmax): absorb elementwise
    #: consumers as an epilogue, never a producer.
    ANCHOR = "anchor"
    #: Everything else: a kernel of its own.
    OPAQUE = "opaque"


#: Kernels that can end with a cast to low precision, written where the kernel stores its result.
STORING_KINDS = (FusionKind.ANCHOR, FusionKind.ELEMWISE, FusionKind.INJECTIVE)


class Mode(enum.Enum):
    """How a binding's operands are rewritten (its category says what the policy wants; the
    mode is what the rewrite does, given its operands and consumers)."""

    LOW = "low"  # float32 operands are brought to the low-precision dtype
    ORIGINAL = "original"  # every operand keeps (or gets back) its original dtype
    STORAGE = "storage"  # original, but float32 constants are stored low and widened
    IDENTITY = "identity"  # the binding is its (integer) input, unchanged
