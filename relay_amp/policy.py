"""The conversion policy: which dtype every binding computes in, and why.

Precedence, lowest to highest (a higher layer overrides a lower one for the bindings it names):

1. built-in defaults: :data:`relay_amp.op_registry.GROUP_OPS`, grouped by numeric reason;
2. target defaults: what the hardware computes fast (:mod:`relay_amp.targets`);
3. user op lists: :meth:`Policy.set_category` and its shorthands, MXNet's ``target_dtype_ops``,
   ``fp32_ops``, ``widest_dtype_ops``;
4. conditional rules: ``(op, attribute, values)``; a matching call computes in float32;
5. per-binding rules: :meth:`Policy.include` / :meth:`Policy.exclude` by name or regex
   (an exclusion beats an inclusion).

How a dot product accumulates (:meth:`Policy.set_accumulation_dtype`, or in blocks:
:meth:`Policy.set_accumulation_block`; for one op the later call wins) goes with its op's
decision at every layer.

Numeric safety sits above every layer: a constant or scalar argument that the low-precision dtype
cannot hold keeps its binding in float32, whatever the policy says.
"""

from __future__ import annotations

import contextlib
import difflib
import json
import re
import threading
from dataclasses import dataclass
from typing import Iterable, Iterator, Sequence

import tvm

from .dtypes import LOW_PRECISION_DTYPES, check_low_precision_dtype, is_floating
from .op_registry import (
    BUILTIN_CONDITIONS,
    LOW_CATEGORIES,
    PASSTHROUGH_OPS,
    Category,
    builtin_table,
)
from .reasons import Reason, render

_USER_LIST_KEYWORDS = {
    "target_dtype_ops": Category.LOW_PRECISION_FP32_ACCUMULATE,
    "fp32_ops": Category.FP32,
    "widest_dtype_ops": Category.FOLLOW,
    "accumulate_ops": Category.ACCUMULATE,
    "low_precision_ops": Category.LOW_PRECISION,
    "storage_ops": Category.STORAGE,
}
_FALLBACKS = (None, "storage")
#: Policy settings whose None means "the target's default" (see relay_amp.targets.KernelSettings).
KERNEL_SETTINGS = ("decompose_batch_norm", "mixed_kernels", "low_precision_boundaries",
                   "low_precision_residuals")
#: The share of a function's float32 bytes at kernel boundaries that the values feeding its
#: results may keep in float32 (reason ``feeds_result``) when the policy's ``result_budget`` is
#: None: a result's error is the error of what feeds it, and a few hundred bytes of a model
#: that moves megabytes save no time. Below the 0.005 of float32's bytes that a cost table
#: reports to three decimals.
DEFAULT_RESULT_BUDGET = 0.004


def known_op_names() -> list[str]:
    """Every registered Relax op name, without the ``relax.`` prefix."""
    return sorted(n[len("relax."):] for n in tvm.ir.Op.list_op_names() if n.startswith("relax."))


def _attr_fields_by_type_key() -> dict[str, list[str]]:
    from tvm.relax.op import op_attrs

    fields = {}
    for value in vars(op_attrs).values():
        info = getattr(value, "__tvm_ffi_type_info__", None)
        if info is not None and info.type_key.startswith("relax.attrs."):
            fields[info.type_key] = [f.name for f in info.fields]
    return fields


_KNOWN_OPS: list[str] | None = None
_ATTR_FIELDS: dict[str, list[str]] | None = None


def _normalize_op_name(name, where: str) -> str:
    global _KNOWN_OPS  # noqa: PLW0603 - filled once, on first use
    if not isinstance(name, str):
        raise TypeError(f"op names in {where} must be strings; got {name!r}")
    short = name[len("relax."):] if name.startswith("relax.") else name
    if _KNOWN_OPS is None:
        _KNOWN_OPS = known_op_names()
    if short not in _KNOWN_OPS:
        close = difflib.get_close_matches(short, _KNOWN_OPS, n=3, cutoff=0.6)
        hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
        raise ValueError(f"unknown op {name!r} in {where}{hint}")
    return short


def _op_attribute_names(op: str) -> list[str]:
    """The attribute names of ``op``; many TVM 0.27 ops do not register their attrs type, so
    those are matched by name (``matmul`` -> ``relax.attrs.MatmulAttrs``)."""
    global _ATTR_FIELDS  # noqa: PLW0603 - filled once, on first use
    if _ATTR_FIELDS is None:
        _ATTR_FIELDS = _attr_fields_by_type_key()
    type_key = str(tvm.ir.Op.get("relax." + op).attrs_type_key)
    if not type_key:
        by_name = {key.lower(): key for key in _ATTR_FIELDS}
        guess = "relax.attrs." + op.split(".")[-1].replace("_", "") + "attrs"
        type_key = by_name.get(guess, "")
    return _ATTR_FIELDS.get(type_key, [])


@dataclass(frozen=True)
class Condition:
    """A conditional fp32 rule: ``op`` computes in float32 when ``attribute`` is in ``values``."""

    op: str
    attribute: str
    values: tuple
    reason: str = ""

    def matches(self, attrs) -> bool:
        if attrs is None or not hasattr(attrs, self.attribute):
            return False
        value = _plain(getattr(attrs, self.attribute))
        return any(value == _plain(v) for v in self.values)

    def describe(self) -> str:
        return f"{self.op} {self.attribute} in {list(self.values)}"


def _plain(value):
    """Attribute values as plain Python values, so that they compare with user input."""
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    if hasattr(value, "value"):  # IntImm, FloatImm, StringImm
        return value.value
    if isinstance(value, (list, tuple)) or type(value).__name__ == "Array":
        return tuple(_plain(v) for v in value)
    return str(value)


@dataclass(frozen=True)
class Decision:
    """What the policy says about one binding before the pass looks at its operands."""

    category: Category | None  # None: the op is unknown to every layer
    reasons: tuple  # of relay_amp.reasons.Reason, the deciding layer's first
    accumulation_dtype: str = "float32"
    accumulation_from_user: bool = False  # set by set_accumulation_dtype: targets keep it
    #: Products summed in the low dtype per block before each block is added in float32
    #: (``Policy.set_accumulation_block``); None: one float32 sum.
    accumulation_block: int | None = None

    @property
    def rule(self) -> str:
        """The reasons as text (:func:`relay_amp.reasons.render`)."""
        return render(self.reasons)

    @property
    def code(self) -> str:
        """The code of the deciding reason."""
        return self.reasons[0].code


class Policy:
    """The whole decision table, as data: serializable, composable, and explained in reports.

    Parameters
    ----------
    dtype : str
        The low-precision dtype: ``"float16"`` or ``"bfloat16"``.
    target_dtype_ops, fp32_ops, widest_dtype_ops : sequence of str, optional
        MXNet-compatible op lists: ops that compute in ``dtype`` with float32 accumulation,
        ops kept in float32, and ops that follow the widest dtype among their inputs.
    accumulate_ops, low_precision_ops, storage_ops : sequence of str, optional
        The other categories (see :class:`relay_amp.Category`).
    conditional_fp32_ops : sequence of (op, attribute, values), optional
        MXNet-compatible conditional rules: a call of ``op`` whose ``attribute`` is one of
        ``values`` computes in float32.
    excluded_sym_names : sequence of str, optional
        Binding names (exact) that compute in float32. See :meth:`exclude` for regexes.
    cast_params_offline : bool
        Convert float32 constants (weights) at conversion time rather than casting them at run
        time. Default True.
    keep_io_dtypes : bool
        Keep the function signatures' and results' dtypes. Default True.
    low_precision_inputs : sequence of str, optional
        Function parameters (by name) that take ``dtype`` instead of float32.
    strict_io_dtypes : bool
        What to do when a parameter or result that the signature makes ``dtype``
        (``keep_io_dtypes=False``, ``low_precision_inputs``) holds a value ``dtype`` cannot
        (a calibrated range or a constant beyond its limits): False (default) keeps that
        parameter or result float32 and says so in the report (reason code
        ``fp32_boundary``); True raises ``ValueError`` instead. Left out of :meth:`to_dict`
        while False, so the policies written before it existed keep their JSON.
    fallback : {None, "storage"}
        What to do when the target cannot compute in ``dtype``: None raises, ``"storage"`` keeps
        computation in float32 and stores weights in ``dtype``.
    input_dtypes : dict of str to str, optional
        Function parameters fed as integers (``{"data": "uint8"}``): the converted function takes
        them in that dtype and casts them once, straight to ``dtype``. A parameter whose consumer
        is a ``quantize`` to the same integer type is passed through (the data is already
        quantized).
    input_normalization : dict of str to dict, optional
        Per integer input, ``{"mean": [...], "std": [...], "axis": 1}`` (per channel, in the
        units of the integer values) or ``{"scale": s, "offset": o}``: folded into that first
        cast as ``(x - mean) / std`` or ``x * scale + offset``.
    decompose_batch_norm, mixed_kernels, low_precision_boundaries : bool, optional
        Kernel settings for what a memory-bound GPU pays for (bytes at kernel boundaries and
        launches): inference batch_norm decomposed into elementwise ops before conversion;
        accumulate ops as one kernel that reads and writes ``dtype`` and computes in float32;
        values stored in ``dtype`` wherever they cross a kernel boundary. None (default): on
        for memory-bound targets, off otherwise (:func:`relay_amp.targets.kernel_settings`).
    low_precision_residuals : bool, optional
        With ``low_precision_boundaries``, also store residual streams (a value that an
        elementwise op in another kernel adds to in float32, or that a centring normalization
        reads) in ``dtype``: fewer bytes, one more rounding per block. Off, a residual add that
        feeds layer_norm is formed inside layer_norm's kernel. None (default): off on every
        target.
    result_budget : float, optional
        With ``low_precision_boundaries``: the share (0 to 1) of a function's float32 bytes at
        kernel boundaries that the values feeding its results may keep in float32 (reason
        ``feeds_result``), smallest first. None (default): :data:`DEFAULT_RESULT_BUDGET`;
        0 turns the rule off.

    Examples
    --------
    >>> policy = (Policy("bfloat16").fp32("nn.conv2d_transpose")
    ...           .add_condition("nn.conv2d", "groups", [32]).exclude("lv1[0-9]", regex=True))
    >>> Policy.from_json(policy.to_json()) == policy
    True
    """

    def __init__(
        self,
        dtype: str = "float16",
        *,
        target_dtype_ops: Sequence[str] = (),
        fp32_ops: Sequence[str] = (),
        widest_dtype_ops: Sequence[str] = (),
        accumulate_ops: Sequence[str] = (),
        low_precision_ops: Sequence[str] = (),
        storage_ops: Sequence[str] = (),
        conditional_fp32_ops: Sequence[tuple] = (),
        excluded_sym_names: Sequence[str] = (),
        cast_params_offline: bool = True,
        keep_io_dtypes: bool = True,
        low_precision_inputs: Sequence[str] = (),
        strict_io_dtypes: bool = False,
        fallback: str | None = None,
        input_dtypes: dict | None = None,
        input_normalization: dict | None = None,
        decompose_batch_norm: bool | None = None,
        mixed_kernels: bool | None = None,
        low_precision_boundaries: bool | None = None,
        low_precision_residuals: bool | None = None,
        result_budget: float | None = None,
    ):
        self.dtype = check_low_precision_dtype(dtype)
        self._categories: dict[str, Category] = {}
        self._list_of: dict[str, str] = {}
        self._accumulation: dict[str, str] = {}
        self._blocks: dict[str, int] = {}
        self._conditions: list[Condition] = []
        self._exclude_names: list[str] = []
        self._exclude_patterns: list[str] = []
        self._include_names: list[str] = []
        self._include_patterns: list[str] = []
        lists = {
            "target_dtype_ops": target_dtype_ops, "fp32_ops": fp32_ops,
            "widest_dtype_ops": widest_dtype_ops, "accumulate_ops": accumulate_ops,
            "low_precision_ops": low_precision_ops, "storage_ops": storage_ops,
        }
        for keyword, ops in lists.items():
            self._set(_as_list(ops, keyword), _USER_LIST_KEYWORDS[keyword], keyword)
        for rule in _as_list(conditional_fp32_ops, "conditional_fp32_ops"):
            if not isinstance(rule, (tuple, list)) or len(rule) != 3:
                raise ValueError(
                    "conditional_fp32_ops entries are (op, attribute, values) triples; "
                    f"got {rule!r}"
                )
            self.add_condition(*rule)
        self.exclude(*_as_list(excluded_sym_names, "excluded_sym_names"))
        self.cast_params_offline = _as_bool(cast_params_offline, "cast_params_offline")
        self.keep_io_dtypes = _as_bool(keep_io_dtypes, "keep_io_dtypes")
        self.low_precision_inputs = tuple(_as_list(low_precision_inputs, "low_precision_inputs"))
        self.strict_io_dtypes = _as_bool(strict_io_dtypes, "strict_io_dtypes")
        if fallback not in _FALLBACKS:
            raise ValueError(f"fallback must be one of {_FALLBACKS}; got {fallback!r}")
        self.fallback = fallback
        self.input_dtypes = _check_input_dtypes(input_dtypes or {})
        self.input_normalization = _check_normalization(input_normalization or {},
                                                        self.input_dtypes)
        self.decompose_batch_norm = _as_optional_bool(decompose_batch_norm, "decompose_batch_norm")
        self.mixed_kernels = _as_optional_bool(mixed_kernels, "mixed_kernels")
        self.low_precision_boundaries = _as_optional_bool(low_precision_boundaries,
                                                          "low_precision_boundaries")
        self.low_precision_residuals = _as_optional_bool(low_precision_residuals,
                                                         "low_precision_residuals")
        if result_budget is not None and (isinstance(result_budget, bool) or not isinstance(
                result_budget, (int, float)) or not 0.0 <= result_budget <= 1.0):
            raise ValueError(f"result_budget is a share of the bytes, from 0 to 1, or None; got "
                             f"{result_budget!r}")
        self.result_budget = None if result_budget is None else float(result_budget)

    # ----------------------------------------------------------------- fluent setters
    def _set(self, ops: Iterable[str], category: Category, where: str) -> "Policy":
        for name in ops:
            op = _normalize_op_name(name, where)
            previous = self._list_of.get(op)
            if previous is not None and previous != where and self._categories[op] != category:
                raise ValueError(
                    f"op {op!r} is in both {previous} and {where}; keep it in one list"
                )
            self._categories[op] = category
            self._list_of[op] = where
        return self

    def set_category(self, ops: str | Iterable[str], category: Category | str) -> "Policy":
        """Put ``ops`` in ``category`` (a user op list). Returns the policy."""
        category = _as_category(category)
        ops = [ops] if isinstance(ops, str) else list(ops)
        for op in ops:  # a later explicit setter call overrides an earlier one
            self._list_of.pop(op[len("relax."):] if op.startswith("relax.") else op, None)
        return self._set(ops, category, f"set_category({category.value})")

    def low_precision(self, *ops: str, accumulate_fp32: bool = True) -> "Policy":
        """Compute ``ops`` in the low-precision dtype (accumulating in float32 by default)."""
        category = (Category.LOW_PRECISION_FP32_ACCUMULATE if accumulate_fp32
                    else Category.LOW_PRECISION)
        return self.set_category(ops, category)

    def fp32(self, *ops: str) -> "Policy":
        """Keep ``ops`` in float32."""
        return self.set_category(ops, Category.FP32)

    def follow(self, *ops: str) -> "Policy":
        """Let ``ops`` run in the widest dtype among their inputs."""
        return self.set_category(ops, Category.FOLLOW)

    def accumulate(self, *ops: str) -> "Policy":
        """Let ``ops`` take and return low precision while computing in float32."""
        return self.set_category(ops, Category.ACCUMULATE)

    def set_accumulation_dtype(self, op: str, dtype: str) -> "Policy":
        """Accumulate ``op`` in ``dtype`` (``float32``, or the low-precision dtype itself)."""
        op = _normalize_op_name(op, "set_accumulation_dtype")
        if dtype not in ("float32",) + LOW_PRECISION_DTYPES:
            raise ValueError(
                f"accumulation dtype for {op!r} must be float32, float16 or bfloat16; got {dtype!r}"
            )
        self._accumulation[op] = dtype
        self._blocks.pop(op, None)
        return self

    def set_accumulation_block(self, op: str, block: int) -> "Policy":
        """Sum ``op``'s products in the low dtype ``block`` at a time, each block's sum added
        into a float32 one: the rounding error grows with ``block``, not with the whole
        reduction, while most of the work runs on the low dtype's FMA (``fmla v.8h``).

        The rewrite says it in Relax (the reduction split into blocks, each block a dot product
        with ``out_dtype`` the low dtype, the blocks summed in float32), so every build honours
        it. Ops without a blocked form, and calls whose shapes do not split (a reduction that is
        no multiple of the block, a convolution window larger than it), keep float32
        accumulation, with the reason in the report."""
        op = _normalize_op_name(op, "set_accumulation_block")
        if isinstance(block, bool) or not isinstance(block, int) or block < 1:
            raise ValueError(f"accumulation block for {op!r} must be a positive int; got "
                             f"{block!r}")
        self._accumulation[op] = "float32"
        self._blocks[op] = block
        return self

    def add_condition(self, op: str, attribute: str, values) -> "Policy":
        """Keep calls of ``op`` whose ``attribute`` is one of ``values`` in float32."""
        op = _normalize_op_name(op, "conditional_fp32_ops")
        names = _op_attribute_names(op)
        if attribute not in names:
            close = difflib.get_close_matches(attribute, names, n=3, cutoff=0.5)
            hint = (f"; did you mean {', '.join(map(repr, close))}?" if close
                    else f"; its attributes are {names}" if names else "; it has no attributes")
            raise ValueError(f"op {op!r} has no attribute {attribute!r}{hint}")
        if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
            values = [values]
        self._conditions.append(Condition(op, attribute, tuple(_plain(v) for v in values)))
        return self

    def exclude(self, *names: str, regex: bool = False) -> "Policy":
        """Keep the bindings with these names (or matching these regexes) in float32."""
        target = self._exclude_patterns if regex else self._exclude_names
        target.extend(_check_names(names, regex, "exclude"))
        return self

    def include(self, *names: str, regex: bool = False) -> "Policy":
        """Compute the bindings with these names (or matching these regexes) in low precision."""
        target = self._include_patterns if regex else self._include_names
        target.extend(_check_names(names, regex, "include"))
        return self

    def with_dtype(self, dtype: str) -> "Policy":
        """A copy of this policy for another low-precision dtype."""
        data = self.to_dict()
        data["dtype"] = check_low_precision_dtype(dtype)
        return Policy.from_dict(data)

    # ----------------------------------------------------------------- serialization
    def to_dict(self) -> dict:
        """The policy as JSON-ready data; :meth:`from_dict` reads it back."""
        return {
            "dtype": self.dtype,
            "op_categories": {op: c.value for op, c in sorted(self._categories.items())},
            "accumulation_dtypes": dict(sorted(self._accumulation.items())),
            "accumulation_blocks": dict(sorted(self._blocks.items())),
            "conditional_fp32_ops": [[c.op, c.attribute, list(c.values)] for c in self._conditions],
            "exclude_names": list(self._exclude_names),
            "exclude_patterns": list(self._exclude_patterns),
            "include_names": list(self._include_names),
            "include_patterns": list(self._include_patterns),
            "cast_params_offline": self.cast_params_offline,
            "keep_io_dtypes": self.keep_io_dtypes,
            "low_precision_inputs": list(self.low_precision_inputs),
            "fallback": self.fallback,
            "input_dtypes": dict(self.input_dtypes),
            "input_normalization": {k: dict(v) for k, v in self.input_normalization.items()},
            **{name: getattr(self, name) for name in KERNEL_SETTINGS},
            "result_budget": self.result_budget,
            **({"strict_io_dtypes": True} if self.strict_io_dtypes else {}),
        }

    @classmethod
    def from_dict(cls, data: dict) -> "Policy":
        """Build a policy from :meth:`to_dict`'s output (unknown keys are an error)."""
        if not isinstance(data, dict):
            raise TypeError(f"Policy.from_dict takes a dict; got {type(data).__name__}")
        known = set(cls("float16", strict_io_dtypes=True).to_dict())
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown policy keys {unknown}; known keys are {sorted(known)}")
        policy = cls(
            data.get("dtype", "float16"),
            conditional_fp32_ops=[tuple(c) for c in data.get("conditional_fp32_ops", [])],
            cast_params_offline=data.get("cast_params_offline", True),
            keep_io_dtypes=data.get("keep_io_dtypes", True),
            low_precision_inputs=data.get("low_precision_inputs", ()),
            strict_io_dtypes=data.get("strict_io_dtypes", False),
            fallback=data.get("fallback"),
            input_dtypes=data.get("input_dtypes"),
            input_normalization=data.get("input_normalization"),
            **{name: data.get(name) for name in KERNEL_SETTINGS},
            result_budget=data.get("result_budget"),
        )
        for op, category in data.get("op_categories", {}).items():
            policy.set_category(op, category)
        for op, dtype in data.get("accumulation_dtypes", {}).items():
            policy.set_accumulation_dtype(op, dtype)
        for op, block in data.get("accumulation_blocks", {}).items():
            policy.set_accumulation_block(op, block)
        policy.exclude(*data.get("exclude_names", ()))
        policy.exclude(*data.get("exclude_patterns", ()), regex=True)
        policy.include(*data.get("include_names", ()))
        policy.include(*data.get("include_patterns", ()), regex=True)
        return policy

    def to_json(self, **kwargs) -> str:
        return json.dumps(self.to_dict(), **{"indent": 2, **kwargs})

    @classmethod
    def from_json(cls, text: str) -> "Policy":
        return cls.from_dict(json.loads(text))

    def __eq__(self, other) -> bool:
        return isinstance(other, Policy) and self.to_dict() == other.to_dict()

    def __repr__(self) -> str:
        changes = {k: v for k, v in self.to_dict().items()
                   if v not in ([], {}, None) and k != "dtype"
                   and not (k in ("cast_params_offline", "keep_io_dtypes") and v is True)}
        return f"Policy({self.dtype!r}, {changes})"

    # ----------------------------------------------------------------- decisions
    def decide(self, op: str, name: str, attrs, target_rule=None) -> Decision:
        """The decision for one call binding, by the layers in the module docstring.

        Parameters
        ----------
        op : str
            The op name without ``relax.`` (``"call_tir"``, ``"nn.conv2d"`` ...).
        name : str
            The binding's var name.
        attrs : tvm.ir.Attrs or None
            The call's attributes, for conditional rules.
        target_rule : callable, optional
            ``(op, Decision) -> Decision``: the target-defaults layer.
        """
        for pattern in self._exclude_names:
            if name == pattern:
                return Decision(Category.FP32, (Reason.of("excluded_by_name", name=name),))
        for pattern in self._exclude_patterns:
            if re.fullmatch(pattern, name):
                return Decision(Category.FP32,
                                (Reason.of("excluded_by_pattern", pattern=pattern),))
        accumulation, block = self._accumulation.get(op, "float32"), self._blocks.get(op)
        for pattern in self._include_names:
            if name == pattern:
                return Decision(Category.LOW_PRECISION_FP32_ACCUMULATE,
                                (Reason.of("included_by_name", dtype=self.dtype, name=name),),
                                accumulation, op in self._accumulation, block)
        for pattern in self._include_patterns:
            if re.fullmatch(pattern, name):
                return Decision(Category.LOW_PRECISION_FP32_ACCUMULATE,
                                (Reason.of("included_by_pattern", dtype=self.dtype,
                                           pattern=pattern),), accumulation,
                                op in self._accumulation, block)
        for condition in self._conditions:
            if condition.op == op and condition.matches(attrs):
                return Decision(Category.FP32, (Reason.of("user_condition",
                                                          condition=condition.describe()),))
        if op in self._categories:
            category = self._categories[op]
            return Decision(category, (Reason.of("user_category", category=category.value, op=op,
                                                 table=self._list_of[op]),), accumulation,
                            op in self._accumulation, block)
        for op_name, attribute, values, reason in BUILTIN_CONDITIONS:
            condition = Condition(op_name, attribute, values)
            if op == op_name and condition.matches(attrs):
                return Decision(Category.FP32, (Reason.of(
                    "builtin_condition", condition=condition.describe(), why=reason),))
        group = _BUILTIN.get(op)
        if group is None:
            if op in PASSTHROUGH_OPS:
                return Decision(None, (Reason.of("own_dtype", op=op),))
            return Decision(None, (Reason.of("unknown_op", op=op),))
        decision = Decision(group.category, (Reason.of(
            "builtin_category", category=group.category.value, op=op, why=group.reason),),
                            accumulation, op in self._accumulation, block)
        if target_rule is not None:
            decision = target_rule(op, decision)
        return decision

    def depends_only_on_op(self, op: str) -> bool:
        """Whether :meth:`decide` for ``op`` ignores the binding's name and attributes (so one
        decision per op can serve every binding of a function)."""
        if self._exclude_names or self._exclude_patterns or self._include_names or (
                self._include_patterns):
            return False
        return not any(c.op == op for c in self._conditions) and not any(
            name == op for name, *_ in BUILTIN_CONDITIONS)

    def describe(self) -> str:
        """The effective op table of this policy, one line per op, as text."""
        lines = [f"relay_amp policy: dtype={self.dtype}, keep_io_dtypes={self.keep_io_dtypes}, "
                 f"cast_params_offline={self.cast_params_offline}, fallback={self.fallback}, "
                 + ", ".join(f"{name}={_setting_text(getattr(self, name))}"
                             for name in KERNEL_SETTINGS)]
        rows = {}
        for op in sorted(set(_BUILTIN) | set(self._categories)):
            decision = self.decide(op, "", None)
            accumulation = decision.accumulation_dtype
            if decision.accumulation_block:
                accumulation += f", blocks of {decision.accumulation_block} in {self.dtype}"
            rows[op] = (decision.category.value if decision.category else "kept",
                        accumulation, decision.reasons[0].detail())
        width = max(len(op) for op in rows)
        for category in list(Category) + ["kept"]:
            name = getattr(category, "value", category)
            members = [(op, row) for op, row in rows.items() if row[0] == name]
            if not members:
                continue
            lines.append(f"\n[{name}]")
            for op, (_, accumulation, why) in members:
                acc = f" (accumulate {accumulation})" if name in (
                    Category.LOW_PRECISION_FP32_ACCUMULATE.value, Category.ACCUMULATE.value) else ""
                lines.append(f"  {op:<{width}}{acc}  {why}")
        for title, items in (("conditional fp32 rules", [c.describe() for c in self._conditions]),
                             ("excluded names", self._exclude_names),
                             ("excluded patterns", self._exclude_patterns),
                             ("included names", self._include_names),
                             ("included patterns", self._include_patterns)):
            if items:
                lines.append(f"\n[{title}]")
                lines.extend(f"  {item}" for item in items)
        return "\n".join(lines)


_BUILTIN = builtin_table()


def _as_list(value, where: str) -> list:
    if value is None:
        return []
    if isinstance(value, (str, bytes)):
        raise TypeError(f"{where} must be a list of names, not the string {value!r}")
    try:
        return list(value)
    except TypeError:
        raise TypeError(f"{where} must be a list; got {type(value).__name__}") from None


def _setting_text(value: bool | None) -> str:
    return "target default" if value is None else str(value)


def _as_optional_bool(value, where: str) -> bool | None:
    if value is not None and not isinstance(value, bool):
        raise TypeError(f"{where} must be True, False or None (the target's default); got "
                        f"{value!r}")
    return value


def _as_bool(value, where: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{where} must be True or False; got {value!r}")
    return value


INTEGER_INPUT_DTYPES = ("uint8", "int8", "uint16", "int16")


def _check_input_dtypes(input_dtypes) -> dict:
    if not isinstance(input_dtypes, dict):
        raise TypeError(f"input_dtypes must be a dict of parameter name to dtype; got "
                        f"{type(input_dtypes).__name__}")
    for name, dtype in input_dtypes.items():
        if dtype not in INTEGER_INPUT_DTYPES:
            kind = "a float dtype" if is_floating(dtype) else "not supported"
            raise ValueError(
                f"input_dtypes[{name!r}] = {dtype!r} is {kind}: integer inputs are "
                f"{', '.join(INTEGER_INPUT_DTYPES)} (feed float inputs in the low-precision dtype "
                "with low_precision_inputs)")
    return dict(input_dtypes)


def _check_normalization(normalization, input_dtypes) -> dict:
    if not isinstance(normalization, dict):
        raise TypeError("input_normalization must be a dict of parameter name to "
                        f"{{'mean', 'std', 'axis'}} or {{'scale', 'offset'}}; got "
                        f"{type(normalization).__name__}")
    checked = {}
    for name, spec in normalization.items():
        if name not in input_dtypes:
            raise ValueError(f"input_normalization names {name!r}, which is not in input_dtypes "
                             "(normalization is folded into the cast of an integer input)")
        keys = set(spec)
        if keys <= {"mean", "std", "axis"} and {"mean", "std"} <= keys:
            mean, std = list(map(float, spec["mean"])), list(map(float, spec["std"]))
            if len(mean) != len(std) or not mean:
                raise ValueError(f"input_normalization[{name!r}]: mean has {len(mean)} values "
                                 f"and std {len(std)}; give one per channel")
            if any(s == 0 for s in std):
                raise ValueError(f"input_normalization[{name!r}]: std contains 0")
            checked[name] = {"mean": mean, "std": std, "axis": int(spec.get("axis", 1))}
        elif keys <= {"scale", "offset"} and "scale" in keys:
            checked[name] = {"scale": float(spec["scale"]), "offset": float(spec.get("offset", 0))}
        else:
            raise ValueError(f"input_normalization[{name!r}] must have 'mean' and 'std' (and "
                             f"optionally 'axis'), or 'scale' (and optionally 'offset'); got "
                             f"{sorted(keys)}")
    return checked


def _as_category(category) -> Category:
    try:
        return Category(category)
    except ValueError:
        choices = ", ".join(c.value for c in Category)
        raise ValueError(f"unknown category {category!r}; choose one of {choices}") from None


def _check_names(names, regex: bool, where: str) -> list[str]:
    checked = []
    for name in names:
        if not isinstance(name, str) or not name:
            raise TypeError(f"{where} takes non-empty binding names; got {name!r}")
        if regex:
            try:
                re.compile(name)
            except re.error as err:
                raise ValueError(
                    f"{where} pattern {name!r} is not a valid regular expression: {err}"
                ) from None
        checked.append(name)
    return checked


# --------------------------------------------------------------------- amp_config
# Why a thread-local stack and not tvm.transform.PassContext (TVM 0.27): a PassContext accepts
# only config keys registered in C++ (PassContext::RegisterConfigOption<T>, through
# TVM_REGISTER_PASS_CONFIG_OPTION), and TVM 0.27 exposes no way to register one from Python:
# the FFI registry has transform.PassContext, transform.ListConfigs, Enter/ExitPassContext and
# GetCurrentPassContext, but no registration function, and tvm.ir.transform has none either.
# ``PassContext(config={"relay_amp.policy": policy.to_json()})`` therefore raises
# ``AttributeError: Invalid config option 'relay_amp.policy' candidates are: tirx.UnrollLoop,
# ...`` (a JSON string or a dict alike), and a PassContext object takes no Python attributes
# (``PassContext.current()`` is a fresh wrapper each call). So the stack lives here, in this one
# place: amp_config pushes, current_policy reads (ToMixedPrecision when it is built, convert when
# it is called). tests/pass/test_policy.py::test_pass_context_cannot_carry_the_policy fails once TVM
# lets a package register the key; then move amp_config onto PassContext.
_CONFIG = threading.local()


def current_policy() -> Policy | None:
    """The policy of the innermost :func:`amp_config` block, or None."""
    stack = getattr(_CONFIG, "stack", None)
    return stack[-1] if stack else None


@contextlib.contextmanager
def amp_config(policy: Policy | None = None, **kwargs) -> Iterator[Policy]:
    """Make ``policy`` (or ``Policy(**kwargs)``) the default of ``ToMixedPrecision()`` inside.

    The policy is kept per thread, beside ``tvm.transform.PassContext`` rather than in it: TVM
    0.27 gives a package no way to register a PassContext config key (see the comment above
    ``_CONFIG``). A PassContext entered inside the block leaves the policy in force.

    Examples
    --------
    >>> with amp_config(dtype="bfloat16", fp32_ops=["nn.conv2d"]) as policy:
    ...     policy.dtype
    'bfloat16'
    """
    if policy is not None and kwargs:
        raise TypeError("amp_config takes a Policy or keyword arguments, not both")
    if policy is None:
        policy = Policy(**kwargs)
    elif not isinstance(policy, Policy):
        raise TypeError(f"amp_config takes a relay_amp.Policy; got {type(policy).__name__}")
    stack = getattr(_CONFIG, "stack", None)
    if stack is None:
        stack = _CONFIG.stack = []
    stack.append(policy)
    try:
        yield policy
    finally:
        stack.pop()


__all__ = ["Policy", "Decision", "Condition", "amp_config", "current_policy", "known_op_names",
           "LOW_CATEGORIES"]
