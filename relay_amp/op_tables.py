"""The built-in op tables: every Relax op relay_amp knows, grouped by the numeric reason it is
there.

Each group is one category plus the reason that puts its ops there; the reason is what the
conversion report quotes for a binding the group decides. Ops in no group are *unknown*: they keep
their original dtypes and the report lists them as unknown.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


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


@dataclass(frozen=True)
class OpGroup:
    """A set of ops that share a category for one numeric reason."""

    category: Category
    reason: str
    ops: tuple[str, ...]
    #: The result is the same computed before or after rounding to low precision.
    exact: bool = False


BUILTIN_GROUPS: tuple[OpGroup, ...] = (
    OpGroup(
        Category.LOW_PRECISION_FP32_ACCUMULATE,
        "dot products: fast on low-precision hardware paths, summed in float32",
        ("nn.conv1d", "nn.conv2d", "nn.conv3d", "nn.conv1d_transpose", "nn.conv2d_transpose",
         "nn.conv3d_transpose", "matmul"),
    ),
    OpGroup(
        Category.LOW_PRECISION,
        "attention kernels: low-precision tensor-core work with no out_dtype",
        ("nn.attention", "nn.attention_bias", "nn.attention_var_len"),
    ),
    OpGroup(
        Category.LOW_PRECISION,
        "products without a reduction: no accumulation error",
        ("outer",),
    ),
    OpGroup(
        Category.FP32,
        "|f(x)| >> |x|: the result leaves the float16 range, and bfloat16 keeps too few bits",
        ("exp", "power", "square", "sinh", "cosh", "nn.softplus"),
    ),
    OpGroup(
        Category.FP32,
        "unbounded reductions: the result grows with the reduced extent",
        ("sum", "prod", "cumsum", "cumprod", "variance", "std", "nn.cross_entropy_with_logits",
         "nn.nll_loss", "collapse_sum_like", "collapse_sum_to"),
    ),
    OpGroup(
        Category.FP32,
        "precision: inverse and logarithmic functions amplify input rounding",
        ("log", "nn.log_softmax", "log_add_exp", "tan", "asin", "acos", "atan", "atan2", "asinh",
         "acosh", "atanh"),
    ),
    OpGroup(
        Category.FP32,
        "values are positions or counts: end and step can exceed what low precision holds exactly",
        ("arange", "hamming_window", "eye", "eye_like"),
    ),
    OpGroup(
        Category.ACCUMULATE,
        "averages and normalisations: the result is bounded by the inputs, the sum needs float32",
        ("mean", "nn.softmax", "nn.layer_norm", "nn.group_norm", "nn.instance_norm",
         "nn.rms_norm", "nn.avg_pool1d", "nn.avg_pool2d", "nn.avg_pool3d",
         "nn.adaptive_avg_pool1d", "nn.adaptive_avg_pool2d", "nn.adaptive_avg_pool3d"),
    ),
    OpGroup(
        Category.ACCUMULATE,
        "normalisation: (x - mean) / sqrt(var + eps) cancels digits that low precision lacks",
        ("nn.batch_norm",),
    ),
    OpGroup(
        Category.ACCUMULATE,
        "sum of products with no out_dtype to accumulate in float32",
        ("einsum",),
    ),
    OpGroup(
        Category.ACCUMULATE,
        "bounded output, but the low-precision polynomial approximation is inaccurate",
        ("erf",),
    ),
    OpGroup(
        Category.FOLLOW,
        "elementwise arithmetic and activations",
        ("add", "subtract", "multiply", "divide", "sqrt", "rsqrt", "floor", "ceil", "round",
         "trunc", "floor_divide", "floor_mod", "mod", "ewise_fma", "sigmoid", "tanh", "sin", "cos",
         "nn.leakyrelu", "nn.prelu", "nn.gelu", "nn.gelu_tanh", "nn.silu", "nn.selu",
         "image.resize2d", "image.resize3d"),
    ),
    OpGroup(
        Category.FOLLOW,
        "quantization: the float side takes the dtype of its neighbours",
        ("quantize", "dequantize"),
    ),
    OpGroup(
        Category.FOLLOW,
        "comparisons and tests: the result is not a float",
        ("isfinite", "isinf", "isnan", "equal", "not_equal", "greater", "greater_equal", "less",
         "less_equal", "argmax", "argmin", "argsort"),
    ),
    OpGroup(
        Category.FOLLOW,
        "exact in any dtype: data movement, layout, selection and monotonic maps",
        exact=True,
        ops=("nn.relu", "abs", "negative", "sign", "maximum", "minimum", "clip", "where",
             "reshape", "permute_dims", "expand_dims", "squeeze", "flatten", "nn.batch_flatten",
             "concat", "split", "stack", "strided_slice", "dynamic_strided_slice", "take",
             "gather_elements", "gather_nd", "scatter_elements", "scatter_nd", "broadcast_to",
             "tile", "repeat", "flip", "layout_transform", "nn.pad", "nn.pixel_shuffle",
             "index_tensor", "index_put", "slice_scatter", "tril", "triu", "zeros_like",
             "ones_like", "full_like", "nn.dropout", "max", "min", "nn.max_pool1d",
             "nn.max_pool2d", "nn.max_pool3d", "topk", "sort"),
    ),
)

#: Follow ops whose result is the same whether computed before or after rounding to low
#: precision (relu(round(x)) == round(relu(x))): running them in low precision loses nothing.
#: Other follow ops round, so they compute in float32 when their inputs already exist in float32.
EXACT_OPS = frozenset(op for group in BUILTIN_GROUPS if group.exact for op in group.ops)

#: Normalizations that subtract their input's mean: a value they read keeps float32 between
#: kernels by default (``low_precision_residuals`` off). Rounded first, the digits that survive
#: the subtraction are those low precision lacks; in a post-norm transformer that input is the
#: residual stream itself.
CENTRING_OPS = frozenset({"nn.layer_norm", "nn.group_norm", "nn.instance_norm"})

#: The op that forms a residual sum: a centring normalization's kernel can compute it in float32
#: registers (the post-norm transformer's ``layer_norm(x + f(x))``) instead of reading it stored.
RESIDUAL_ADD_OPS = frozenset({"add"})

#: Ops that order their float inputs (which boxes survive NMS, which index ``argmax`` picks,
#: the order ``sort`` returns): rounding swaps values that differ in their last digits, so a
#: float32 value one of them reads, directly or through :data:`EXACT_OPS`, is not stored in low
#: precision between kernels (``low_precision_boundaries``).
RANKING_OPS = frozenset({
    "vision.all_class_non_max_suppression", "vision.non_max_suppression",
    "vision.get_valid_counts", "topk", "sort", "argsort", "argmax", "argmin"})

#: Built-in conditional rules: ``(op, attribute, values, reason)``; a matching call stays fp32.
BUILTIN_CONDITIONS: tuple[tuple[str, str, tuple, str], ...] = (
    ("nn.batch_norm", "training", (True,),
     "training batch norm computes batch statistics, an unbounded reduction"),
)

#: Ops TVM 0.27 cannot type-check or compile in a low-precision dtype (measured on llvm); the pass
#: keeps them in float32 with this reason instead of producing a module that fails to build.
TVM_LIMITATIONS: dict[str, dict[str, str]] = {
    "bfloat16": {
        "argmax": "TVM's legalization of argmax fails type checking for bfloat16",
        "argmin": "TVM's legalization of argmin fails type checking for bfloat16",
        "nn.prelu": "TVM's prelu accepts only float16/float32/float64 inputs",
        "nn.layer_norm": "TVM's topi layer_norm supports only float32 and float16",
        "nn.group_norm": "TVM rejects bfloat16 group_norm at type inference",
        "nn.instance_norm": "TVM's topi instance_norm supports only float32 and float16",
        "power": "TVM's power accepts only float16/float32/float64 inputs",
        "quantize": "TVM's quantize accepts only float16/float32 inputs",
        "dequantize": "TVM's dequantize produces only float16/float32",
    },
}

#: Ops whose dtype is fixed by an attribute or by their role: never converted, never reported
#: as unknown. ``astype`` is the cast op itself.
PASSTHROUGH_OPS = frozenset({
    "astype", "shape_of", "tensor_to_shape", "shape_to_tensor", "zeros", "ones", "full",
    "null_value", "print", "assert_op", "hint_on_device", "to_vdevice", "wrap_param",
})


def builtin_table() -> dict[str, OpGroup]:
    """Map each op name (without the ``relax.`` prefix) to its built-in group."""
    table: dict[str, OpGroup] = {}
    for group in BUILTIN_GROUPS:
        for op in group.ops:
            assert op not in table, f"{op} is in two built-in groups"
            table[op] = group
    return table


class FusionKind(str, enum.Enum):
    """How TVM's FuseOps treats an op once it is legalized (``AnnotateTIROpPattern``): which
    neighbours can share its kernel. The kernel-boundary planning of
    ``Policy.low_precision_boundaries`` reads it; an op in no list is ``OPAQUE``."""

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


#: Measured on TVM 0.27 with LegalizeOps + AnnotateTIROpPattern (tests/test_op_tables.py
#: re-measures a sample of each kind, so a change in TVM shows).
FUSION_KINDS: dict[str, FusionKind] = {
    **dict.fromkeys((
        "add", "subtract", "multiply", "divide", "sqrt", "rsqrt", "floor", "ceil", "round",
        "trunc", "floor_divide", "floor_mod", "mod", "sigmoid", "tanh", "sin", "cos", "tan",
        "nn.leakyrelu", "nn.gelu", "nn.gelu_tanh", "nn.silu", "nn.selu", "nn.relu", "abs",
        "negative", "sign", "maximum", "minimum", "clip", "where", "strided_slice",
        "broadcast_to", "astype", "exp", "log", "power", "erf", "square", "sinh", "cosh",
        "nn.softplus", "isfinite", "isinf", "isnan", "equal", "not_equal", "greater",
        "greater_equal", "less", "less_equal", "zeros_like", "ones_like", "full_like",
        "nn.dropout", "asin", "acos", "atan", "asinh", "acosh", "atanh"), FusionKind.ELEMWISE),
    **dict.fromkeys((
        "reshape", "permute_dims", "expand_dims", "squeeze", "flatten", "nn.batch_flatten",
        "concat", "split", "stack", "tile", "repeat", "flip", "layout_transform", "nn.pad",
        "image.resize2d", "image.resize3d", "nn.pixel_shuffle"), FusionKind.INJECTIVE),
    **dict.fromkeys(("sum", "prod", "max", "min"), FusionKind.REDUCE),
    **dict.fromkeys((
        "nn.conv1d", "nn.conv2d", "nn.conv3d", "nn.conv1d_transpose", "nn.conv2d_transpose",
        "nn.conv3d_transpose", "matmul", "nn.attention", "nn.attention_bias", "nn.softmax",
        "nn.log_softmax", "nn.layer_norm", "nn.rms_norm", "nn.group_norm", "nn.instance_norm",
        "nn.batch_norm", "mean", "variance", "std", "nn.avg_pool1d", "nn.avg_pool2d",
        "nn.avg_pool3d", "nn.adaptive_avg_pool1d", "nn.adaptive_avg_pool2d",
        "nn.adaptive_avg_pool3d", "nn.max_pool1d", "nn.max_pool2d", "nn.max_pool3d", "einsum"),
        FusionKind.ANCHOR),
}


#: Ops whose legalization TVM marks opaque when an extent is symbolic (a reshape over a sequence
#: length): FuseOps puts them in no kernel of another op, and RewriteDataflowReshape makes them
#: views, so a cast before or after one is a kernel of its own.
OPAQUE_WHEN_SYMBOLIC = frozenset(("reshape", "flatten", "nn.batch_flatten"))


#: TVM's ``OpPatternKind`` values (``AnnotateTIROpPattern``) as fusion kinds.
_PATTERN_KINDS = {0: FusionKind.ELEMWISE, 1: FusionKind.ELEMWISE, 2: FusionKind.INJECTIVE,
                  3: FusionKind.REDUCE, 4: FusionKind.ANCHOR}


def callee_fusion_kinds(mod) -> dict:
    """The fusion kind of each PrimFunc of ``mod`` (by name), as TVM's AnnotateTIROpPattern
    finds it: what FuseOps does with a ``call_tir`` of it (an importer's own kernels)."""
    import tvm

    prim_funcs = {gvar: func for gvar, func in mod.functions_items()
                  if isinstance(func, tvm.tirx.PrimFunc)}
    if not prim_funcs:
        return {}
    annotated = tvm.relax.transform.AnnotateTIROpPattern()(tvm.IRModule(prim_funcs))
    return {gvar.name_hint: _PATTERN_KINDS.get(int(func.attrs["op_pattern"]), FusionKind.OPAQUE)
            for gvar, func in annotated.functions_items()
            if func.attrs is not None and "op_pattern" in func.attrs}


def fusion_kind(op: str, call, callees=None) -> FusionKind:
    """The :class:`FusionKind` FuseOps gives this call of ``op`` (:data:`FUSION_KINDS`, except
    :data:`OPAQUE_WHEN_SYMBOLIC` ops over symbolic shapes, and ``call_tir`` of a PrimFunc, whose
    kind is in ``callees``: :func:`callee_fusion_kinds`)."""
    if op == "call_tir" and callees:
        return callees.get(call.args[0].name_hint, FusionKind.OPAQUE)
    kind = FUSION_KINDS.get(op, FusionKind.OPAQUE)
    if op in OPAQUE_WHEN_SYMBOLIC and not all(_static(t) for t in (call.ty, call.args[0].ty)):
        return FusionKind.OPAQUE
    return kind


def _static(ty) -> bool:
    shape = getattr(ty, "shape", None)
    values = getattr(shape, "values", None)
    return values is not None and all(type(v).__name__ == "IntImm" for v in values)


def fuses(producer: FusionKind, consumer: FusionKind) -> bool:
    """Whether FuseOps puts a consumer in its producer's kernel (the value between them is the
    producer's only use). ``producer`` is the kind of the producer's kernel: an elementwise op
    fused into a convolution's epilogue is ``ANCHOR``."""
    if consumer == FusionKind.ELEMWISE:
        return producer in (FusionKind.ELEMWISE, FusionKind.INJECTIVE, FusionKind.ANCHOR)
    if consumer == FusionKind.INJECTIVE:
        return producer in (FusionKind.ELEMWISE, FusionKind.INJECTIVE)
    if consumer == FusionKind.REDUCE:
        return producer == FusionKind.ELEMWISE
    return False
