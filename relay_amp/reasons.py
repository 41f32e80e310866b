"""Reason codes: why a binding computes where it does, as data.

Every decision of the pass is a sequence of :class:`Reason` values: the policy's (which layer
decided, and what it said), then what the planner and rewriter added (where the value is
stored, which kernel computes it). A reason is a code and its parameters; :data:`TEXT` holds
the one template per code, and :func:`render` turns reasons into the report's rule text, the
only place that text is made. Code that needs to know *why* (``Report.unknown_ops``,
``Policy.describe``, tests) reads codes and parameters, never the text.
"""

from __future__ import annotations

from typing import NamedTuple

#: Reason code of a function parameter or result kept float32 although the signature asked for
#: the low-precision dtype (``keep_io_dtypes=False``, ``low_precision_inputs``): calibration, or a
#: constant, shows a value that dtype cannot hold. ``Policy(strict_io_dtypes=True)`` raises instead.
FP32_BOUNDARY = "fp32_boundary"


#: code -> (prefix, text): the prefix (a category, a dtype, ``kept``, ``identity``) opens a
#: decision; reasons without one are clauses added to it. Both are ``str.format`` templates
#: of the reason's parameters.
TEXT = {
    # the policy's layers (relay_amp.policy.Policy.decide)
    "excluded_by_name": ("fp32", "excluded by name {name!r}"),
    "excluded_by_pattern": ("fp32", "excluded by pattern {pattern!r}"),
    "included_by_name": ("{dtype}", "included by name {name!r}"),
    "included_by_pattern": ("{dtype}", "included by pattern {pattern!r}"),
    "user_condition": ("fp32", "conditional rule {condition}"),
    "user_category": ("{category}", "{op} is in the user's {table}"),
    "builtin_condition": ("fp32", "{condition} ({why})"),
    "builtin_category": ("{category}", "{op} is in the built-in {category} list ({why})"),
    "own_dtype": ("kept", "{op} fixes its own dtype"),
    "unknown_op": ("kept", "unknown op {op}, its dtypes are left as they are"),
    "selects_inputs": (None, "its kernel {callee} only selects among its inputs and constants "
                             "(max, min, select): its float32 result may be stored in {dtype} "
                             "wherever they are"),
    # the target's defaults (relay_amp.targets)
    "target_fast": (None, "target {target} has {dtype} arithmetic (what TVM's build makes of "
                          "it: the table in relay_amp.targets)"),
    "target_float32_accumulation": (None, "accumulates in float32, the accurate default: "
                                          "the target's float16 FMA ({instruction}) would sum "
                                          "in float16, faster and less accurate; "
                                          "Policy.set_accumulation_dtype({op!r}, 'float16') "
                                          "chooses it"),
    "target_storage_only": ("storage", "target {target} has no fast {dtype} arithmetic, so "
                                       "{op} computes in float32 with its weights stored in "
                                       "{dtype}"),
    # what the operands and ranges overrule (planner)
    "identity_input": ("identity", "input {input} already holds {dtype} values: quantize "
                                   "passes them through"),
    "identity_requantize": ("identity", "quantize(dequantize(q)) with the same scale and zero "
                                        "point returns q"),
    "tvm_limitation": ("fp32", "{limitation}"),
    "foreign_dtypes": ("kept", "{op} has {dtypes} inputs, which relay_amp does not convert"),
    "no_float32": ("kept", "{op} has no float32 tensor to convert"),
    "constant_out_of_range": ("fp32", "constant {value:.4g} {bound}"),
    "input_out_of_range": ("fp32", "input {input} {why}"),
    "out_of_range": ("fp32", "{why}"),
    "result_kept_float32": (None, "result kept float32: {why}"),
    "scalar_out_of_range": ("fp32", "scalar argument {value:.4g} {bound}"),
    "foreign_out_dtype": ("kept", "out_dtype {dtype} is not float32"),
    "decides_discrete": ("fp32", "it decides {consumer}'s discrete result ({op}'s scale, zero "
                                 "point or threshold): computed in float32 from its inputs as "
                                 "they are, since one rounding flips an integer or a selection"),
    "fp32_boundary": (None, "stays float32 as the function's {where} [fp32_boundary]: {why}"),
    # where values live between kernels (planner, low_precision_boundaries)
    "residual_added": (None, "stored float32 between kernels: {consumer} adds to it in float32, "
                             "a residual stream (low_precision_residuals off, or a "
                             "normalization centres the sum)"),
    "residual_low": (None, "a residual stream stored {dtype} between kernels: {consumer} adds to "
                           "it in float32 registers and no normalization centres the sum "
                           "(low_precision_residuals)"),
    "residual_centred": (None, "stored float32 between kernels: {consumer} ({op}) subtracts its "
                               "mean, which cancels the leading digits (low_precision_residuals "
                               "off)"),
    "ranked": (None, "stored float32 between kernels: {consumer} ({op}) orders it, and rounding "
                     "swaps values that differ in their last digits"),
    "feeds_result": (None, "stored float32 between kernels: it feeds a function result through "
                           "elementwise and data-movement ops, and a {dtype} copy would save "
                           "{saving} bytes, {share:.2%} of the function's at kernel boundaries "
                           "(the results' share is {budget:.1%}; low_precision_boundaries)"),
    "absorbed_add": (None, "computed in float32 inside {kernel}'s kernel ({op}), so the sum is "
                           "never stored"),
    "exact_arrives_low": (None, "runs {dtype}: its inputs arrive in {dtype} and it is exact "
                                "(low_precision_boundaries)"),
    "in_float32_registers": (None, "runs float32: an input is in float32 registers"),
    "arrives_low": (None, "runs {dtype}: {input} reaches it from another kernel, stored in "
                          "{dtype} (low_precision_boundaries)"),
    "widened_in_kernel": (None, "computes float32 in registers, inputs widened there "
                                "(low_precision_boundaries)"),
    "reads_stored_low": (None, "reads {input} as it is stored between kernels, in {dtype}, "
                               "widened to float32 inside its own kernel "
                               "(low_precision_boundaries)"),
    # which dtype a follow op runs in (planner, demand)
    "dequantize_low": (None, "produces {dtype} directly (out_dtype): its consumers want it"),
    "dequantize_float32": (None, "produces float32: a consumer wants float32"),
    "unread": (None, "no consumer reads it any more"),
    "quantize_reads_low": (None, "reads its input in {dtype}"),
    "quantize_reads_float32": (None, "reads its input in float32"),
    "inputs_only_low": (None, "runs {dtype}: its inputs exist only in {dtype}"),
    "inputs_float32": (None, "runs float32: its inputs exist in float32"),
    "rounds_once": (None, "runs float32: its inputs exist in float32, so it rounds once, when "
                          "a consumer needs low precision"),
    "float32_wanted": (None, "runs float32: its inputs exist in float32 and a consumer needs "
                             "float32"),
    "constant_copy": (None, "runs {dtype} on the {dtype} copy of its constant input made at "
                            "conversion time (exact): a consumer wants it"),
    "low_wanted": (None, "runs {dtype}: inputs are {dtype} and a consumer wants it"),
    "float32_activation": (None, "runs float32: an input is a float32 activation"),
    "nothing_wants_low": (None, "runs float32: no consumer wants low precision"),
    # the kernels the rewriter emits
    "narrowing_kernel": (None, "reads {inputs} in float32 and rounds it to {dtype} in its own "
                               "kernel"),
    "absorbing_kernel": (None, "one kernel (mixed_kernels): adds {operands} in float32 "
                               "registers, computes float32, writes {writes}"),
    "absorbing_not_emitted": (None, "no absorbing kernel: {why}, so {add} is a float32 kernel "
                                    "of its own"),
    "add_not_absorbed": (None, "computed in float32 as a kernel of its own: the normalization's "
                               "kernel cannot form it ({why})"),
    "mixed_kernel": (None, "one kernel (mixed_kernels): reads {reads}, computes float32, "
                           "writes {writes}"),
    "rejected_by_tvm": ("kept", "{op} rejects {dtype} operands ({message})"),
    "kernel_not_emitted": (None, "no {kernel} kernel: {why}, so {op} computes as TVM "
                                 "legalizes it, its operands cast"),
    "blocked_accumulation": (None, "sums its products in {dtype} {block} at a time and adds the "
                                   "{blocks} blocks in float32 (Policy.set_accumulation_block)"),
    "blocked_accumulation_refused": (None, "blocks of {block} asked, not made: {why}; it "
                                           "accumulates in float32"),
    "attention_pinned": (None, "result pinned to {dtype} (TVM's legalization of a scaled "
                               "attention returns float32)"),
    # the accuracy-driven search (relay_amp.fallback)
    "search_fallback": ("fp32", "auto_mixed_precision fallback ({measure} {error:.3g}, "
                                "rank {rank})"),
}


class Reason(NamedTuple):
    """One reason: a code of :data:`TEXT` and its parameters (``(name, value)`` pairs)."""

    code: str
    params: tuple = ()

    @classmethod
    def of(cls, code: str, **params) -> "Reason":
        if code not in TEXT:
            raise KeyError(f"unknown reason code {code!r}")
        return cls(code, tuple(params.items()))

    @property
    def values(self) -> dict:
        return dict(self.params)

    @property
    def prefix(self) -> str | None:
        template = TEXT[self.code][0]
        return template.format(**self.values) if template else None

    def detail(self) -> str:
        """The text without its prefix (``Policy.describe`` lists ops under their category)."""
        return TEXT[self.code][1].format(**self.values)

    def text(self) -> str:
        prefix = self.prefix
        return f"{prefix}: {self.detail()}" if prefix else self.detail()

    def as_dict(self) -> dict:
        return {"code": self.code, "params": {k: _plain(v) for k, v in self.params}}


def render(reasons) -> str:
    """The rule text of a sequence of reasons: each one's text, joined by ``"; "``."""
    return "; ".join(reason.text() for reason in reasons)


def _plain(value):
    return value if isinstance(value, (str, int, float, bool)) or value is None else str(value)
