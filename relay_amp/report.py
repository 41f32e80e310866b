"""The conversion report: one row per call binding, with the rule that decided it."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields, replace

import numpy as np

from .dtypes import short_dtype
from .op_registry import estimate_macs
from .reasons import FP32_BOUNDARY, Reason, render


@dataclass(frozen=True)
class BindingRecord:
    """What the pass did with one call binding.

    ``output_dtype`` lists every dtype the result is stored in, the computed one first
    (``float32+float16``: computed in float32, and a float16 copy exists for low-precision
    consumers). ``casts_added`` counts the run-time casts this binding needed. ``reasons`` are
    the decision as data (:class:`relay_amp.reasons.Reason`, the deciding one first); ``rule``
    is their text (:func:`relay_amp.reasons.render`).
    """

    function: str
    name: str
    op: str
    category: str
    input_dtypes: tuple
    compute_dtype: str
    accumulation_dtype: str
    output_dtype: str
    casts_added: int
    reasons: tuple = ()
    #: The multiply-accumulates, or the call they are counted from when first read.
    mac_source: object = field(default=0, repr=False, compare=False)

    @property
    def macs(self) -> int:
        """Multiply-accumulates of the call (:func:`estimate_macs`), counted when first read."""
        if type(self.mac_source) is not int:  # noqa: E721
            object.__setattr__(self, "mac_source", estimate_macs(self.op, self.mac_source))
        return self.mac_source

    @property
    def rule(self) -> str:
        """The reasons as text, rendered when asked for (:func:`relay_amp.reasons.render`)."""
        return render(self.reasons)

    @property
    def code(self) -> str | None:
        """The code of the deciding reason."""
        return self.reasons[0].code if self.reasons else None

    @property
    def codes(self) -> tuple:
        """Every reason's code, in order."""
        return tuple(reason.code for reason in self.reasons)

    def reason(self, code: str) -> Reason:
        """This row's reason with ``code``."""
        for reason in self.reasons:
            if reason.code == code:
                return reason
        raise KeyError(f"{self.name} has no reason {code!r} (its codes: {self.codes})")

    def to_dict(self) -> dict:
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "mac_source"}
        return {**data, "macs": self.macs, "input_dtypes": list(self.input_dtypes),
                "rule": self.rule,
                "reasons": [reason.as_dict() for reason in self.reasons]}

    @classmethod
    def from_dict(cls, data: dict) -> "BindingRecord":
        """A row from :meth:`to_dict` (a report.json row)."""
        reasons = tuple(Reason(r["code"], tuple(r["params"].items()))
                        for r in data.get("reasons", ()))
        known = {f.name for f in fields(cls)}
        return cls(**{**{k: v for k, v in data.items() if k in known},
                      "input_dtypes": tuple(data["input_dtypes"]), "reasons": reasons,
                      "mac_source": int(data.get("macs", 0))})


@dataclass(frozen=True)
class BoundaryRecord:
    """A function parameter or result kept float32 at the signature, and why.

    ``where`` is the parameter's name, or ``result`` / ``result[1]`` / ``result[1][0]`` for
    (a field of) the function's result; ``value`` names what holds it (a binding, parameter or
    ``constant``). ``magnitude`` is the largest (or, for an underflow, the only) magnitude seen,
    ``bound`` the limit of the low-precision dtype it violates.
    """

    function: str
    kind: str  # "parameter" or "result"
    where: str
    value: str
    magnitude: float
    bound: float
    reason: str
    code: str = FP32_BOUNDARY

    def note(self, low: str) -> str:
        """The report note: ``main: result (gv) kept float32, not float16 [fp32_boundary]: ...``."""
        what = self.where if self.kind == "parameter" and self.where == self.value else (
            f"{self.where} ({self.value})")
        kind = "parameter " if self.kind == "parameter" else ""
        return f"{self.function}: {kind}{what} kept float32, not {low} [{self.code}]: {self.reason}"


@dataclass
class Report:
    """The explanation of one conversion.

    Attributes
    ----------
    dtype : str
        The low-precision dtype the conversion targeted.
    rows : list of BindingRecord
        One row per call binding, in program order.
    casts : int
        Run-time cast bindings the pass added.
    constants_converted : int
        Constants converted at conversion time (no run-time cast).
    notes : list of str
        Module-level remarks (functions left alone, targets used, values kept float32 at a
        function's signature).
    boundary : list of BoundaryRecord
        Parameters and results kept float32 although the signature asked for the low-precision
        dtype (reason code :data:`relay_amp.reasons.FP32_BOUNDARY`); each also has a note.
    """

    dtype: str
    rows: list = field(default_factory=list)
    casts: int = 0
    constants_converted: int = 0
    notes: list = field(default_factory=list)
    boundary: list = field(default_factory=list)
    search: object = None  # a relay_amp.fallback.SearchResult, after auto_mixed_precision

    @property
    def ops(self) -> list:
        """The rows of real computations (casts and dtype-fixing ops left out)."""
        return [r for r in self.rows if r.category != "passthrough"]

    @property
    def converted(self) -> list:
        """The rows computed in the low-precision dtype."""
        return [r for r in self.ops if r.compute_dtype == self.dtype]

    @property
    def unknown_ops(self) -> list:
        """Sorted names of ops no policy layer knew; they kept their dtypes."""
        return sorted({r.op for r in self.rows if r.code == "unknown_op"})

    def low_precision_mac_fraction(self) -> float | None:
        total = sum(r.macs for r in self.ops)
        if total == 0:
            return None
        return sum(r.macs for r in self.converted) / total

    def summary(self) -> str:
        """One line, e.g. ``converted 52/60 ops (97.3% of MACs) to float16 using 14 casts``."""
        fraction = self.low_precision_mac_fraction()
        macs = f" ({100 * fraction:.1f}% of MACs)" if fraction is not None else ""
        text = (f"converted {len(self.converted)}/{len(self.ops)} ops{macs} to {self.dtype} "
                f"using {self.casts} casts")
        if self.constants_converted:
            text += f" ({self.constants_converted} constants converted offline)"
        if self.unknown_ops:
            text += f"; unknown ops kept as they were: {', '.join(self.unknown_ops)}"
        storage = [r for r in self.ops if r.code == "target_storage_only"]
        if storage:
            target = storage[0].reason("target_storage_only").values["target"]
            text += (f"; {len(storage)} ops compute in float32 because target {target} has no "
                     f"fast {self.dtype} arithmetic (a target that has it converts them)")
        return text

    def find(self, name: str, function: str | None = None) -> BindingRecord:
        """The row of the binding called ``name`` (in ``function``, if given)."""
        for row in self.rows:
            if row.name == name and (function is None or row.function == function):
                return row
        raise KeyError(f"no binding named {name!r} in the report")

    def table(self, max_rows: int | None = None) -> str:
        """The rows as an aligned text table."""
        header = ("function", "binding", "op", "inputs", "compute", "acc", "output", "casts",
                  "rule")
        rows = self.rows if max_rows is None else self.rows[:max_rows]
        body = [(r.function, r.name, r.op, ",".join(short_dtype(d) for d in r.input_dtypes),
                 r.compute_dtype, r.accumulation_dtype, r.output_dtype, str(r.casts_added),
                 r.rule) for r in rows]
        widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h)
                  for i, h in enumerate(header[:-1])]
        lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths)) + "  rule"]
        for b in body:
            lines.append("  ".join(c.ljust(w) for c, w in zip(b, widths)) + "  " + b[-1])
        if max_rows is not None and len(self.rows) > max_rows:
            lines.append(f"... {len(self.rows) - max_rows} more rows")
        return "\n".join(lines)

    def __str__(self) -> str:
        return "\n".join([self.summary(), *self.notes, self.table()])

    def to_dict(self) -> dict:
        return {
            "dtype": self.dtype, "summary": self.summary(), "casts": self.casts,
            "constants_converted": self.constants_converted, "notes": list(self.notes),
            "low_precision_mac_fraction": self.low_precision_mac_fraction(),
            "unknown_ops": self.unknown_ops,
            "boundary": [asdict(b) for b in self.boundary],
            "search": self.search.to_dict() if self.search is not None else None,
            "rows": [r.to_dict() for r in self.rows],
        }

    def to_json(self, **kwargs) -> str:
        return json.dumps(self.to_dict(), **{"indent": 2, **kwargs})


class ReportBuilder:
    """One conversion's :class:`Report` as ``convert`` and the rewrite make it: the rows, the
    notes, the signature's kept boundaries and the count of float32 parameters.

    Parameters
    ----------
    low : str
        The low-precision dtype.
    """

    def __init__(self, low: str):
        self.report = Report(low)
        self._rewrite_notes: list = []  # after convert's own notes, as the report lists them
        self._float32_parameters = [0, 0]  # ops, bytes of their float32 constant parameters
        self._seen: set = set()
        self._casts = 0
        self._binding_casts = 0  # run-time casts emitted for the binding being rewritten

    def note(self, text: str):
        """A module-level note from ``convert``."""
        self.report.notes.append(text)

    def rewrite_note(self, text: str):
        """A note from a function's rewrite (an integer input's cast)."""
        self._rewrite_notes.append(text)

    def binding(self):
        """The rewrite starts a binding: the casts counted from here on are its own."""
        self._binding_casts = 0

    def cast(self):
        """A run-time cast the rewrite emitted, for the binding being rewritten."""
        self._casts += 1
        self._binding_casts += 1

    def row(self, record: BindingRecord):
        """A binding's row; its ``casts_added`` counts the casts emitted for the binding too."""
        if self._binding_casts:
            record = replace(record, casts_added=record.casts_added + self._binding_casts)
        self.report.rows.append(record)

    def kept(self, function: str, kept):
        """A parameter or result kept float32 at the signature
        (:class:`relay_amp.signature.KeptBoundary`): a :class:`BoundaryRecord` and its note."""
        record = BoundaryRecord(function, kept.kind, kept.where, kept.value,
                                kept.problem.magnitude, kept.problem.bound, str(kept.problem))
        self.report.boundary.append(record)
        self._rewrite_notes.append(record.note(self.report.dtype))

    def float32_parameters(self, constants):
        """An op that keeps the float32 ``constants`` (a batch_norm's parameters)."""
        if not constants:
            return
        self._float32_parameters[0] += 1
        for const in constants:
            if const.__chandle__() not in self._seen:  # the module holds const: handle stays
                self._seen.add(const.__chandle__())
                self._float32_parameters[1] += 4 * int(np.prod(
                    [int(d) for d in const.value.shape]))

    def finish(self, constants_converted: int) -> Report:
        """The report, with the rewrite's notes and the cast counts."""
        report = self.report
        report.notes.extend(self._rewrite_notes)
        count, nbytes = self._float32_parameters
        if count:
            report.notes.append(
                f"{count} batch_norm ops keep {nbytes / 1e6:.3g} MB of float32 parameters "
                "(batch_norm computes in float32); relax.transform.FoldBatchnormToConv2D() before "
                "conversion folds them into the convolution weights, which are stored in low "
                "precision")
        report.casts, report.constants_converted = self._casts, constants_converted
        return report
