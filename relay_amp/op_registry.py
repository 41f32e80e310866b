"""The op registry: one record per Relax op that relay_amp knows, holding every fact the
conversion uses about it, as TVM keeps per-op attributes with each op.

A record (:class:`OpInfo`) says which built-in group puts the op in a category and why (the
reason the report quotes), whether the op is exact in any dtype, what TVM's FuseOps does with it
(measured on TVM 0.27 with LegalizeOps + AnnotateTIROpPattern; tests/eval/test_gpu_cost.py
re-measures a sample), whether it ranks its inputs, centres them or forms a residual sum, which
values its result holds, how many multiply-accumulates it does, what TVM cannot compile in a
low-precision dtype, and the few hooks (:mod:`relay_amp.op_hooks`) by which it departs from the
generic algorithm. Ops without a record are *unknown*: they keep their original dtypes and the
report lists them as unknown. Every other view (:data:`EXACT_OPS`, :data:`FUSION_KINDS`, the
groups the policy reads ...) is derived from the records, never written beside them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import tvm

from .kinds import LOW_CATEGORIES, Category, FusionKind
from .op_hooks import (
    OpSite,
    attention_pin,
    conv_blocks,
    dequantize_mode,
    inference_batch_norm,
    matmul_blocks,
    quantize_identity,
    quantize_mode,
)

__all__ = ["Category", "FusionKind", "LOW_CATEGORIES", "OpGroup", "OpInfo", "OpSite", "op_info"]


@dataclass(frozen=True)
class OpGroup:
    """A category and the numeric reason that puts a group of ops in it."""

    category: Category
    reason: str


#: The result holds every value of the one float input (up to sign): a result out of range
#: means that input is out of range too.
ALL = "all"
#: The result holds only values of the one float input (up to sign) or zeros: a result above
#: the dtype's maximum means that input is above it too.
SOME = "some"


@dataclass(frozen=True)
class OpInfo:
    """Everything relay_amp knows of one op; the defaults are the generic behaviour.

    Attributes
    ----------
    name : str
        The op name without ``relax.``.
    group : OpGroup, optional
        The built-in category and its reason; None: passthrough, ranking-only or unknown.
    exact : bool
        The result is the same computed before or after rounding to low precision
        (``relu(round(x)) == round(relu(x))``): running it in low precision loses nothing.
    fusion : FusionKind, optional
        What FuseOps does with the legalized op; None: not measured (opaque).
    opaque_when_symbolic : bool
        TVM marks its legalization opaque when an extent is symbolic (a reshape over a
        sequence length): FuseOps puts it in no kernel of another op.
    values : {"all", "some"}, optional
        Which values of its one float input the result holds (:data:`ALL`, :data:`SOME`).
    ranking : bool
        It orders its float inputs (NMS, top-k, sort, argmax): rounding swaps values that
        differ in their last digits, so a value it reads is not stored low between kernels.
    centring : bool
        A normalization that subtracts its input's mean (a residual stream it reads keeps
        float32 unless ``low_precision_residuals``).
    residual_add : bool
        It forms a residual sum that a centring normalization's kernel can compute itself.
    macs : callable, optional
        ``call -> int``: its multiply-accumulates (symbolic dimensions count as 1).
    passthrough : bool
        Its dtype is fixed by an attribute or by its role: never converted, never unknown.
    limitations : dict
        ``{dtype: why}``: TVM 0.27 cannot type-check or compile it in that dtype; it keeps
        float32 with this reason.
    conditions : tuple
        ``(attribute, values, reason)``: a call whose attribute has one of the values keeps
        float32.
    low_operands : tuple of int, optional
        The operands brought to the low dtype when it runs in low precision; None: every float
        operand. The others (integers, scales, zero points) keep their dtypes.
    integer_side : bool
        One side of the op is integers (its input or its result): the kernel-boundary plan does
        not choose its mode, and an integer function input it reads is no float value to widen.
    keeps_out_dtype : bool
        Its ``out_dtype`` is not the dtype it computes in (quantize's is its integers).
    writes_low : bool
        As a follow op it can write the low dtype whatever its inputs (through ``out_dtype``).
    is_cast : bool
        It is a cast: a float32 <-> low-precision one joins the rewrite's cast cache.
    decision_operands : tuple of int
        Operands whose values decide a discrete result (a quantization's scale and zero
        point): they and the arithmetic computing them stay float32 (``decides_discrete``).
    float32_parameters : bool
        It computes in float32 with constant parameters the report counts (with the advice to
        fold them into the convolution before).
    identity, choose_mode, pin_result, decomposes, blocked_sum : callable, optional
        Hooks, each ``(OpSite) -> value`` (:mod:`relay_amp.op_hooks`): step 1, ``(reason,
        source)`` when the call returns its source's values unchanged; step 2, ``(mode,
        reason)`` of a follow decision; step 3, the reason to cast the emitted result back to
        the low dtype; step 0, whether ``decompose_batch_norm`` decomposes the call; step 3,
        ``(expr or None, reason)``: the call with its products summed in blocks
        (``Policy.set_accumulation_block``), None where its shapes do not split.
    """

    name: str
    group: OpGroup | None = None
    exact: bool = False
    fusion: FusionKind | None = None
    opaque_when_symbolic: bool = False
    values: str | None = None
    ranking: bool = False
    centring: bool = False
    residual_add: bool = False
    macs: Callable | None = None
    passthrough: bool = False
    limitations: dict = field(default_factory=dict)
    conditions: tuple = ()
    low_operands: tuple | None = None
    integer_side: bool = False
    keeps_out_dtype: bool = False
    writes_low: bool = False
    is_cast: bool = False
    decision_operands: tuple = ()
    float32_parameters: bool = False
    identity: Callable | None = None
    choose_mode: Callable | None = None
    pin_result: Callable | None = None
    decomposes: Callable | None = None
    blocked_sum: Callable | None = None

    def __hash__(self):
        return hash(self.name)


# ------------------------------------------------------------------ multiply-accumulates
def _static_shape(expr) -> list[int]:
    """The shape of a tensor expression, symbolic dimensions counted as 1."""
    return [int(dim.value) if isinstance(dim, tvm.tirx.IntImm) else 1
            for dim in expr.ty.shape.values]


def _prod(values) -> int:
    out = 1
    for value in values:
        out *= int(value)
    return out


def _conv_macs(call) -> int:
    out, weight = _static_shape(call), _static_shape(call.args[1])
    # O, I/groups, spatial... in OIHW-like layouts; kernel_layout decides which is which
    layout = str(call.attrs.kernel_layout)
    spatial = _prod(d for d, c in zip(weight, layout) if c not in "OI")
    return _prod(out) * weight[layout.index("I")] * spatial


def _conv_transpose_macs(call) -> int:
    data, weight = _static_shape(call.args[0]), _static_shape(call.args[1])
    return _prod(data) * _prod(weight[1:])


def _matmul_macs(call) -> int:
    return _prod(_static_shape(call)) * _static_shape(call.args[0])[-1]


def _attention_macs(call) -> int:
    q, k, v = (_static_shape(a) for a in call.args[:3])
    batch, seq, heads, depth = q
    return batch * heads * seq * k[1] * (depth + v[3])


def _outer_macs(call) -> int:
    return _prod(_static_shape(call))


# ------------------------------------------------------------------ the built-in groups
DOT_PRODUCTS = OpGroup(Category.LOW_PRECISION_FP32_ACCUMULATE,
                       "dot products: fast on low-precision hardware paths, summed in float32")
ATTENTION = OpGroup(Category.LOW_PRECISION,
                    "attention kernels: low-precision tensor-core work with no out_dtype")
OUTER_PRODUCTS = OpGroup(Category.LOW_PRECISION,
                         "products without a reduction: no accumulation error")
GROWS = OpGroup(Category.FP32, "|f(x)| >> |x|: the result leaves the float16 range, and "
                               "bfloat16 keeps too few bits")
UNBOUNDED_REDUCTIONS = OpGroup(Category.FP32, "unbounded reductions: the result grows with the "
                                              "reduced extent")
AMPLIFIES = OpGroup(Category.FP32, "precision: inverse and logarithmic functions amplify input "
                                   "rounding")
POSITIONS = OpGroup(Category.FP32, "values are positions or counts: end and step can exceed what "
                                   "low precision holds exactly")
AVERAGES = OpGroup(Category.ACCUMULATE, "averages and normalisations: the result is bounded by "
                                        "the inputs, the sum needs float32")
BATCH_NORM = OpGroup(Category.ACCUMULATE, "normalisation: (x - mean) / sqrt(var + eps) cancels "
                                          "digits that low precision lacks")
EINSUM = OpGroup(Category.ACCUMULATE, "sum of products with no out_dtype to accumulate in float32")
ERF = OpGroup(Category.ACCUMULATE, "bounded output, but the low-precision polynomial "
                                   "approximation is inaccurate")
ELEMENTWISE = OpGroup(Category.FOLLOW, "elementwise arithmetic and activations")
QUANTIZATION = OpGroup(Category.FOLLOW, "quantization: the float side takes the dtype of its "
                                        "neighbours")
TESTS = OpGroup(Category.FOLLOW, "comparisons and tests: the result is not a float")
EXACT = OpGroup(Category.FOLLOW, "exact in any dtype: data movement, layout, selection and "
                                 "monotonic maps")

ANCHOR, ELEMWISE, INJECTIVE, REDUCE = (FusionKind.ANCHOR, FusionKind.ELEMWISE,
                                       FusionKind.INJECTIVE, FusionKind.REDUCE)


def _op(name: str, group: OpGroup | None = None, **facts) -> OpInfo:
    return OpInfo(name, group, exact=group is EXACT, **facts)


#: Every op relay_amp knows, one record each.
RECORDS: tuple[OpInfo, ...] = (
    # DOT_PRODUCTS
    _op("nn.conv1d", DOT_PRODUCTS, fusion=ANCHOR, macs=_conv_macs, blocked_sum=conv_blocks),
    _op("nn.conv2d", DOT_PRODUCTS, fusion=ANCHOR, macs=_conv_macs, blocked_sum=conv_blocks),
    _op("nn.conv3d", DOT_PRODUCTS, fusion=ANCHOR, macs=_conv_macs, blocked_sum=conv_blocks),
    _op("nn.conv1d_transpose", DOT_PRODUCTS, fusion=ANCHOR, macs=_conv_transpose_macs),
    _op("nn.conv2d_transpose", DOT_PRODUCTS, fusion=ANCHOR, macs=_conv_transpose_macs),
    _op("nn.conv3d_transpose", DOT_PRODUCTS, fusion=ANCHOR, macs=_conv_transpose_macs),
    _op("matmul", DOT_PRODUCTS, fusion=ANCHOR, macs=_matmul_macs, blocked_sum=matmul_blocks),
    # ATTENTION
    _op("nn.attention", ATTENTION, fusion=ANCHOR, macs=_attention_macs, pin_result=attention_pin),
    _op("nn.attention_bias", ATTENTION, fusion=ANCHOR, macs=_attention_macs,
        pin_result=attention_pin),
    _op("nn.attention_var_len", ATTENTION),
    # OUTER_PRODUCTS
    _op("outer", OUTER_PRODUCTS, macs=_outer_macs),
    # GROWS
    _op("exp", GROWS, fusion=ELEMWISE),
    _op("power", GROWS, fusion=ELEMWISE,
        limitations={"bfloat16": "TVM's power accepts only float16/float32/float64 inputs"}),
    _op("square", GROWS, fusion=ELEMWISE),
    _op("sinh", GROWS, fusion=ELEMWISE),
    _op("cosh", GROWS, fusion=ELEMWISE),
    _op("nn.softplus", GROWS, fusion=ELEMWISE),
    # UNBOUNDED_REDUCTIONS
    _op("sum", UNBOUNDED_REDUCTIONS, fusion=REDUCE),
    _op("prod", UNBOUNDED_REDUCTIONS, fusion=REDUCE),
    _op("cumsum", UNBOUNDED_REDUCTIONS),
    _op("cumprod", UNBOUNDED_REDUCTIONS),
    _op("variance", UNBOUNDED_REDUCTIONS, fusion=ANCHOR),
    _op("std", UNBOUNDED_REDUCTIONS, fusion=ANCHOR),
    _op("nn.cross_entropy_with_logits", UNBOUNDED_REDUCTIONS),
    _op("nn.nll_loss", UNBOUNDED_REDUCTIONS),
    _op("collapse_sum_like", UNBOUNDED_REDUCTIONS),
    _op("collapse_sum_to", UNBOUNDED_REDUCTIONS),
    # AMPLIFIES
    _op("log", AMPLIFIES, fusion=ELEMWISE),
    _op("nn.log_softmax", AMPLIFIES, fusion=ANCHOR),
    _op("log_add_exp", AMPLIFIES),
    _op("tan", AMPLIFIES, fusion=ELEMWISE),
    _op("asin", AMPLIFIES, fusion=ELEMWISE),
    _op("acos", AMPLIFIES, fusion=ELEMWISE),
    _op("atan", AMPLIFIES, fusion=ELEMWISE),
    _op("atan2", AMPLIFIES),
    _op("asinh", AMPLIFIES, fusion=ELEMWISE),
    _op("acosh", AMPLIFIES, fusion=ELEMWISE),
    _op("atanh", AMPLIFIES, fusion=ELEMWISE),
    # POSITIONS
    _op("arange", POSITIONS),
    _op("hamming_window", POSITIONS),
    _op("eye", POSITIONS),
    _op("eye_like", POSITIONS),
    # AVERAGES
    _op("mean", AVERAGES, fusion=ANCHOR),
    _op("nn.softmax", AVERAGES, fusion=ANCHOR),
    _op("nn.layer_norm", AVERAGES, fusion=ANCHOR, centring=True,
        limitations={"bfloat16": "TVM's topi layer_norm supports only float32 and float16"}),
    _op("nn.group_norm", AVERAGES, fusion=ANCHOR, centring=True,
        limitations={"bfloat16": "TVM rejects bfloat16 group_norm at type inference"}),
    _op("nn.instance_norm", AVERAGES, fusion=ANCHOR, centring=True,
        limitations={"bfloat16": "TVM's topi instance_norm supports only float32 and float16"}),
    _op("nn.rms_norm", AVERAGES, fusion=ANCHOR),
    _op("nn.avg_pool1d", AVERAGES, fusion=ANCHOR),
    _op("nn.avg_pool2d", AVERAGES, fusion=ANCHOR),
    _op("nn.avg_pool3d", AVERAGES, fusion=ANCHOR),
    _op("nn.adaptive_avg_pool1d", AVERAGES, fusion=ANCHOR),
    _op("nn.adaptive_avg_pool2d", AVERAGES, fusion=ANCHOR),
    _op("nn.adaptive_avg_pool3d", AVERAGES, fusion=ANCHOR),
    # BATCH_NORM
    _op("nn.batch_norm", BATCH_NORM, fusion=ANCHOR, float32_parameters=True,
        decomposes=inference_batch_norm, conditions=(
            ("training", (True,), "training batch norm computes batch statistics, an unbounded "
             "reduction"),)),
    # EINSUM
    _op("einsum", EINSUM, fusion=ANCHOR),
    # ERF
    _op("erf", ERF, fusion=ELEMWISE),
    # ELEMENTWISE
    _op("add", ELEMENTWISE, fusion=ELEMWISE, residual_add=True),
    _op("subtract", ELEMENTWISE, fusion=ELEMWISE),
    _op("multiply", ELEMENTWISE, fusion=ELEMWISE),
    _op("divide", ELEMENTWISE, fusion=ELEMWISE),
    _op("sqrt", ELEMENTWISE, fusion=ELEMWISE),
    _op("rsqrt", ELEMENTWISE, fusion=ELEMWISE),
    _op("floor", ELEMENTWISE, fusion=ELEMWISE),
    _op("ceil", ELEMENTWISE, fusion=ELEMWISE),
    _op("round", ELEMENTWISE, fusion=ELEMWISE),
    _op("trunc", ELEMENTWISE, fusion=ELEMWISE),
    _op("floor_divide", ELEMENTWISE, fusion=ELEMWISE),
    _op("floor_mod", ELEMENTWISE, fusion=ELEMWISE),
    _op("mod", ELEMENTWISE, fusion=ELEMWISE),
    _op("ewise_fma", ELEMENTWISE),
    _op("sigmoid", ELEMENTWISE, fusion=ELEMWISE),
    _op("tanh", ELEMENTWISE, fusion=ELEMWISE),
    _op("sin", ELEMENTWISE, fusion=ELEMWISE),
    _op("cos", ELEMENTWISE, fusion=ELEMWISE),
    _op("nn.leakyrelu", ELEMENTWISE, fusion=ELEMWISE),
    _op("nn.prelu", ELEMENTWISE,
        limitations={"bfloat16": "TVM's prelu accepts only float16/float32/float64 inputs"}),
    _op("nn.gelu", ELEMENTWISE, fusion=ELEMWISE),
    _op("nn.gelu_tanh", ELEMENTWISE, fusion=ELEMWISE),
    _op("nn.silu", ELEMENTWISE, fusion=ELEMWISE),
    _op("nn.selu", ELEMENTWISE, fusion=ELEMWISE),
    _op("image.resize2d", ELEMENTWISE, fusion=INJECTIVE),
    _op("image.resize3d", ELEMENTWISE, fusion=INJECTIVE),
    # QUANTIZATION
    _op("quantize", QUANTIZATION, low_operands=(0,), integer_side=True, keeps_out_dtype=True,
        decision_operands=(1, 2), identity=quantize_identity, choose_mode=quantize_mode,
        limitations={"bfloat16": "TVM's quantize accepts only float16/float32 inputs"}),
    _op("dequantize", QUANTIZATION, low_operands=(), integer_side=True, writes_low=True,
        decision_operands=(1, 2), choose_mode=dequantize_mode,
        limitations={"bfloat16": "TVM's dequantize produces only float16/float32"}),
    # TESTS
    _op("isfinite", TESTS, fusion=ELEMWISE),
    _op("isinf", TESTS, fusion=ELEMWISE),
    _op("isnan", TESTS, fusion=ELEMWISE),
    _op("equal", TESTS, fusion=ELEMWISE),
    _op("not_equal", TESTS, fusion=ELEMWISE),
    _op("greater", TESTS, fusion=ELEMWISE),
    _op("greater_equal", TESTS, fusion=ELEMWISE),
    _op("less", TESTS, fusion=ELEMWISE),
    _op("less_equal", TESTS, fusion=ELEMWISE),
    _op("argmax", TESTS, ranking=True,
        limitations={"bfloat16": "TVM's legalization of argmax fails type checking for bfloat16"}),
    _op("argmin", TESTS, ranking=True,
        limitations={"bfloat16": "TVM's legalization of argmin fails type checking for bfloat16"}),
    _op("argsort", TESTS, ranking=True),
    # EXACT
    _op("nn.relu", EXACT, fusion=ELEMWISE, values=SOME),
    _op("abs", EXACT, fusion=ELEMWISE, values=ALL),
    _op("negative", EXACT, fusion=ELEMWISE, values=ALL),
    _op("sign", EXACT, fusion=ELEMWISE),
    _op("maximum", EXACT, fusion=ELEMWISE),
    _op("minimum", EXACT, fusion=ELEMWISE),
    _op("clip", EXACT, fusion=ELEMWISE),
    _op("where", EXACT, fusion=ELEMWISE),
    _op("reshape", EXACT, fusion=INJECTIVE, opaque_when_symbolic=True, values=ALL),
    _op("permute_dims", EXACT, fusion=INJECTIVE, values=ALL),
    _op("expand_dims", EXACT, fusion=INJECTIVE, values=ALL),
    _op("squeeze", EXACT, fusion=INJECTIVE, values=ALL),
    _op("flatten", EXACT, fusion=INJECTIVE, opaque_when_symbolic=True, values=ALL),
    _op("nn.batch_flatten", EXACT, fusion=INJECTIVE, opaque_when_symbolic=True, values=ALL),
    _op("concat", EXACT, fusion=INJECTIVE),
    _op("split", EXACT, fusion=INJECTIVE),
    _op("stack", EXACT, fusion=INJECTIVE),
    _op("strided_slice", EXACT, fusion=ELEMWISE, values=SOME),
    _op("dynamic_strided_slice", EXACT, values=SOME),
    _op("take", EXACT, values=SOME),
    _op("gather_elements", EXACT, values=SOME),
    _op("gather_nd", EXACT, values=SOME),
    _op("scatter_elements", EXACT),
    _op("scatter_nd", EXACT),
    _op("broadcast_to", EXACT, fusion=ELEMWISE, values=ALL),
    _op("tile", EXACT, fusion=INJECTIVE, values=ALL),
    _op("repeat", EXACT, fusion=INJECTIVE, values=ALL),
    _op("flip", EXACT, fusion=INJECTIVE, values=ALL),
    _op("layout_transform", EXACT, fusion=INJECTIVE, values=ALL),
    _op("nn.pad", EXACT, fusion=INJECTIVE),
    _op("nn.pixel_shuffle", EXACT, fusion=INJECTIVE, values=SOME),
    _op("index_tensor", EXACT),
    _op("index_put", EXACT),
    _op("slice_scatter", EXACT),
    _op("tril", EXACT, values=SOME),
    _op("triu", EXACT, values=SOME),
    _op("zeros_like", EXACT, fusion=ELEMWISE),
    _op("ones_like", EXACT, fusion=ELEMWISE),
    _op("full_like", EXACT, fusion=ELEMWISE),
    _op("nn.dropout", EXACT, fusion=ELEMWISE, values=SOME),
    _op("max", EXACT, fusion=REDUCE, values=SOME),
    _op("min", EXACT, fusion=REDUCE, values=SOME),
    _op("nn.max_pool1d", EXACT, fusion=ANCHOR, values=SOME),
    _op("nn.max_pool2d", EXACT, fusion=ANCHOR, values=SOME),
    _op("nn.max_pool3d", EXACT, fusion=ANCHOR, values=SOME),
    _op("topk", EXACT, ranking=True),
    _op("sort", EXACT, values=SOME, ranking=True),
    # ranking only
    _op("vision.all_class_non_max_suppression", ranking=True),
    _op("vision.get_valid_counts", ranking=True),
    _op("vision.non_max_suppression", ranking=True),
    # passthrough
    _op("assert_op", passthrough=True),
    _op("astype", fusion=ELEMWISE, is_cast=True, passthrough=True),
    _op("full", passthrough=True),
    _op("hint_on_device", passthrough=True),
    _op("null_value", passthrough=True),
    _op("ones", passthrough=True),
    _op("print", passthrough=True),
    _op("shape_of", passthrough=True),
    _op("shape_to_tensor", passthrough=True),
    _op("tensor_to_shape", passthrough=True),
    _op("to_vdevice", passthrough=True),
    _op("wrap_param", passthrough=True),
    _op("zeros", passthrough=True),
)

#: op name (without ``relax.``) -> its record.
REGISTRY: dict[str, OpInfo] = {}
for _record in RECORDS:
    assert _record.name not in REGISTRY, f"{_record.name} has two records"
    REGISTRY[_record.name] = _record
del _record


def op_info(op: str | None) -> OpInfo:
    """The record of ``op``; an op without one gets a record of the generic behaviour."""
    record = REGISTRY.get(op)
    return record if record is not None else OpInfo(op or "")


# ------------------------------------------------------------------ views of the records
#: The built-in groups, in the order the records name them, with their ops.
GROUP_OPS: dict[OpGroup, tuple[str, ...]] = {}
for _record in RECORDS:
    if _record.group is not None:
        GROUP_OPS[_record.group] = (*GROUP_OPS.get(_record.group, ()), _record.name)
del _record

#: Follow ops whose result is the same before or after rounding (see :attr:`OpInfo.exact`).
EXACT_OPS = frozenset(r.name for r in RECORDS if r.exact)
#: Ops whose fusion kind is measured.
FUSION_KINDS: dict[str, FusionKind] = {r.name: r.fusion for r in RECORDS if r.fusion is not None}
#: Ops that order their float inputs (see :attr:`OpInfo.ranking`).
RANKING_OPS = frozenset(r.name for r in RECORDS if r.ranking)
#: Ops whose dtype is fixed by an attribute or their role (see :attr:`OpInfo.passthrough`).
PASSTHROUGH_OPS = frozenset(r.name for r in RECORDS if r.passthrough)
#: ``{dtype: {op: why}}``: what TVM 0.27 cannot compile (see :attr:`OpInfo.limitations`).
TVM_LIMITATIONS: dict[str, dict[str, str]] = {}
for _record in RECORDS:
    for _dtype, _why in _record.limitations.items():
        TVM_LIMITATIONS.setdefault(_dtype, {})[_record.name] = _why
del _record
#: ``(op, attribute, values, reason)``: built-in conditional rules; a match stays float32.
BUILTIN_CONDITIONS: tuple = tuple((r.name, *condition) for r in RECORDS
                                  for condition in r.conditions)


def builtin_table() -> dict[str, OpGroup]:
    """Map each op name (without the ``relax.`` prefix) to its built-in group."""
    return {r.name: r.group for r in RECORDS if r.group is not None}


def estimate_macs(op: str, call) -> int:
    """Multiply-accumulates of a dot-product op (0 for other ops); symbolic dims count as 1."""
    count = op_info(op).macs
    if count is None:
        return 0
    try:
        return count(call)
    except (TypeError, IndexError, ValueError, AttributeError):
        return 0


# ------------------------------------------------------------------ FuseOps
#: TVM's ``OpPatternKind`` values (``AnnotateTIROpPattern``) as fusion kinds.
_PATTERN_KINDS = {0: FusionKind.ELEMWISE, 1: FusionKind.ELEMWISE, 2: FusionKind.INJECTIVE,
                  3: FusionKind.REDUCE, 4: FusionKind.ANCHOR}


def callee_fusion_kinds(mod) -> dict:
    """The fusion kind of each PrimFunc of ``mod`` (by name), as TVM's AnnotateTIROpPattern
    finds it: what FuseOps does with a ``call_tir`` of it (an importer's own kernels)."""
    prim_funcs = {gvar: func for gvar, func in mod.functions_items()
                  if isinstance(func, tvm.tirx.PrimFunc)}
    if not prim_funcs:
        return {}
    annotated = tvm.relax.transform.AnnotateTIROpPattern()(tvm.IRModule(prim_funcs))
    return {gvar.name_hint: _PATTERN_KINDS.get(int(func.attrs["op_pattern"]), FusionKind.OPAQUE)
            for gvar, func in annotated.functions_items()
            if func.attrs is not None and "op_pattern" in func.attrs}


_PRIM = tvm.ir.prim.expr
_FLOAT16_MAX = 65504.0
_SELECTING = (_PRIM.Max, _PRIM.Min)


def _selects(value) -> bool:
    """Is the TIR expression ``value`` one of the values it loads or a constant, whichever its
    conditions pick (``max``, ``min``, ``select``, ``if_then_else``, a load)?"""
    if isinstance(value, (tvm.ir.expr.TensorLoad, _PRIM.IntImm)):
        return True
    if isinstance(value, _PRIM.FloatImm):  # float16's range: bfloat16 holds it too
        return abs(value.value) <= _FLOAT16_MAX or math.isinf(value.value)
    if isinstance(value, _SELECTING):
        return _selects(value.a) and _selects(value.b)
    if isinstance(value, _PRIM.Select):
        return _selects(value.true_value) and _selects(value.false_value)
    if isinstance(value, tvm.ir.expr.Call) and value.op.name.endswith(".if_then_else"):
        return _selects(value.args[1]) and _selects(value.args[2])
    return False


def selecting_callees(mod, kinds: dict) -> frozenset:
    """The names of the PrimFuncs of ``mod`` whose every block stores, elementwise, one of the
    values it loads or a constant (an importer's ``maximum``/``minimum``/``where`` kernels, the
    clips of HardSwish): a ``call_tir`` of one rounds nothing, so its result fits the low
    dtype wherever its inputs and constants do. ``kinds``: :func:`callee_fusion_kinds`."""
    from .relax_utils import prim_func_blocks

    found = set()
    for gvar, func in mod.functions_items():
        if kinds.get(gvar.name_hint) != FusionKind.ELEMWISE:
            continue
        blocks = prim_func_blocks(func)
        if blocks and all(block.init is None and isinstance(block.body, tvm.tirx.BufferStore)
                          and _selects(block.body.value) for block in blocks):
            found.add(gvar.name_hint)
    return frozenset(found)


def selects_among_inputs(op: str, call, selecting: frozenset) -> bool:
    """Is this call of ``op`` a ``call_tir`` of one of the ``selecting`` PrimFuncs
    (:func:`selecting_callees`)?"""
    return op == "call_tir" and call.args[0].name_hint in selecting


def widens_in_own_kernel(op: str, kind: FusionKind) -> bool:
    """Does a call of ``op`` whose kernel is of ``kind`` read a value stored in low precision
    through a widening cast inside that kernel? A ``call_tir`` of an importer's PrimFunc (its
    dtypes fixed) does where FuseOps puts an elementwise producer into it."""
    return op == "call_tir" and fuses(FusionKind.ELEMWISE, kind)


def fusion_kind(op: str, call, callees=None) -> FusionKind:
    """The :class:`FusionKind` FuseOps gives this call of ``op``: its record's, except an
    :attr:`OpInfo.opaque_when_symbolic` op over symbolic shapes, and ``call_tir`` of a
    PrimFunc, whose kind is in ``callees`` (:func:`callee_fusion_kinds`)."""
    if op == "call_tir" and callees:
        return callees.get(call.args[0].name_hint, FusionKind.OPAQUE)
    record = op_info(op)
    if record.opaque_when_symbolic and not all(_static(t) for t in (call.ty, call.args[0].ty)):
        return FusionKind.OPAQUE
    return record.fusion or FusionKind.OPAQUE


def _static(ty) -> bool:
    shape = getattr(ty, "shape", None)
    values = getattr(shape, "values", None)
    return values is not None and all(type(v).__name__ == "IntImm" for v in values)


def fuses(producer: FusionKind, consumer: FusionKind) -> bool:
    """Whether FuseOps puts a consumer in its producer's kernel (the value between them is the
    producer's only use). ``producer`` is the kind of the producer's kernel: an elementwise op
    fused into a convolution's epilogue is ``ANCHOR``. This restates FuseOps' rule
    (``src/relax/transform/fuse_ops.cc``), which TVM exposes to no caller: the kernel plan must
    know before the rewrite what FuseOps will do after it. tests/pass/test_gpu_cost_shapes.py runs
    TVM's own FuseOps on what that plan produces (a BERT layer as torch.export writes it, an NHWC
    residual block, a YOLO head ...) and fails if a planned boundary turns into a standalone
    cast kernel or an extra kernel, which is what a change of FuseOps' rule would do."""
    if consumer == FusionKind.ELEMWISE:
        return producer in (FusionKind.ELEMWISE, FusionKind.INJECTIVE, FusionKind.ANCHOR)
    if consumer == FusionKind.INJECTIVE:
        return producer in (FusionKind.ELEMWISE, FusionKind.INJECTIVE)
    if consumer == FusionKind.REDUCE:
        return producer == FusionKind.ELEMWISE
    return False
