"""The ONNX backend test suite (shipped in the onnx wheel) through relay_amp, in several modes.

Each case: import with ``tvm.relax.frontend.onnx``; compile and run in float32 against the
case's reference outputs (a case TVM cannot import or run in float32 is a *skip*, with its
reason). Then, per mode (:data:`MODES`) and low-precision dtype, convert, compile, run and compare
twice at the dtype's tolerance: with the float32 module run on the same inputs (the *conversion*
error) and with ONNX's reference (*end to end*). Where the mode rounds the inputs to the low
dtype, a case that fails end to end but not against float32 fails because of that rounding.
TVM's built-in ``ToMixedPrecision`` (float16 only) runs the same way, after ``ConvertToDataflow``
as its documentation asks, so the two are side by side.

The harness reads the test data of whatever onnx version is installed: suites are the folders
of its data directory that hold cases, a case is a folder with an ``.onnx`` model and
``test_data_set_*`` folders, and tensors are read with ``onnx.numpy_helper.to_array`` (inputs and
outputs that are sequences, maps or optionals make the case a skip).
"""

from __future__ import annotations

import glob
import json
import multiprocessing
import os
import re
import threading
import time
import traceback
from collections import Counter
from dataclasses import dataclass

import numpy as np

#: |out - ref| <= TOLERANCE * (1 + max |ref|) for float outputs (low precision), float32: 1e-3
TOLERANCE = {"float32": 1e-3, "float16": 2e-2, "bfloat16": 8e-2}
DTYPES = ("float16", "bfloat16")
#: The CUDA modes' target: relay_amp's GPU rules and kernels (mixed kernels, low-precision
#: boundaries), converted on any machine.
CUDA_TARGET = {"kind": "cuda", "arch": "sm_90"}
#: Failure causes: what made a (mode, dtype) run differ from ONNX's reference.
CAUSES = ("conversion", "input rounding", "TVM", "relay_amp")


@dataclass(frozen=True)
class Mode:
    """How a case is converted and fed.

    Attributes
    ----------
    name : str
    low_io : bool
        ``keep_io_dtypes=False``: float32 inputs and results become the low dtype, so the inputs
        are rounded to it before the run (parameters the pass keeps float32 get the originals).
    all_low : bool
        Every op of the built-in tables computes in the low dtype (dot products with float32
        accumulation), whatever its table says; what TVM cannot compile in that dtype
        (``TVM_LIMITATIONS``) and calibrated ranges still keep float32.
    calibrate : bool
        Convert with :func:`relay_amp.calibrate` run on the case's float32 inputs.
    builtin : str or None
        The built-in pass's counterpart: ``"float32_io"``, ``"float16_inputs"`` (its
        ``fp16_input_names`` set to every float32 parameter), or None (no counterpart).
    description : str
    target : dict or None
        The target relay_amp converts for (its rules and kernels); the converted module is
        still compiled for and run on the host CPU, so a CUDA target needs no GPU.
    build_only : bool
        Build the conversion for ``target`` (:func:`relay_amp.eval.cuda_builds.build_outcome`)
        instead of running it on the CPU; dtype ``float32`` builds the imported module as is.
    """

    name: str
    low_io: bool
    all_low: bool
    calibrate: bool
    builtin: str | None
    description: str
    target: dict | None = None
    build_only: bool = False


MODES = {
    "default": Mode("default", False, False, False, "float32_io",
                    "default policy, float32 inputs and outputs"),
    "low_io": Mode("low_io", True, False, True, "float16_inputs",
                   "default policy, low-precision inputs and outputs (keep_io_dtypes=False), "
                   "calibrated"),
    "all_low": Mode("all_low", False, True, True, None,
                    "every table op in low precision, float32 inputs and outputs, calibrated"),
    "all_low_io": Mode("all_low_io", True, True, True, None,
                       "every table op in low precision, low-precision inputs and outputs, "
                       "calibrated"),
    "cuda": Mode("cuda", False, False, False, None,
                 "default policy converted for CUDA sm_90, float32 inputs and outputs",
                 CUDA_TARGET),
    "cuda_low_io": Mode("cuda_low_io", True, False, True, None,
                        "default policy converted for CUDA sm_90, low-precision inputs and "
                        "outputs, calibrated", CUDA_TARGET),
}
LOW_PRECISION_MODES = ("low_io", "all_low", "all_low_io", "cuda_low_io")
#: Modes that build instead of run (``scripts/cuda_build_sweep.py``), outside :data:`MODES` so
#: that the conformance doc's runs and tables stay as they are.
BUILD_MODES = {
    "cuda_build": Mode("cuda_build", False, False, False, None,
                       "default policy converted and built for CUDA sm_90 (CUDA source, no "
                       "GPU needed)", CUDA_TARGET, build_only=True),
}
ALL_MODES = {**MODES, **BUILD_MODES}


# --------------------------------------------------------------------------- the test data
def data_root() -> str:
    """The backend test data folder of the installed onnx (``RELAY_AMP_ONNX_DATA`` overrides)."""
    override = os.environ.get("RELAY_AMP_ONNX_DATA")
    if override:
        return override
    try:
        from onnx.backend.test import loader

        root = getattr(loader, "DATA_DIR", None)
        if root and os.path.isdir(root):
            return root
    except ImportError:  # an onnx build without the backend tests' loader
        pass
    import onnx

    return os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data")


def _model_file(folder: str) -> str | None:
    path = os.path.join(folder, "model.onnx")
    if os.path.exists(path):
        return path
    models = sorted(glob.glob(os.path.join(folder, "*.onnx")))
    return models[0] if len(models) == 1 else None


def _is_case(folder: str) -> bool:
    return (os.path.isdir(folder) and _model_file(folder) is not None
            and bool(glob.glob(os.path.join(folder, "test_data_set_*"))))


def suites(root: str | None = None) -> list[str]:
    """The suites (folders of the data directory that hold at least one case), sorted."""
    root = root or data_root()
    found = []
    for name in sorted(os.listdir(root)):
        folder = os.path.join(root, name)
        if os.path.isdir(folder) and any(_is_case(os.path.join(folder, c))
                                         for c in os.listdir(folder)):
            found.append(name)
    return found


def case_dirs(suite_names=None, root: str | None = None) -> list[str]:
    """Every case folder of ``suite_names`` (default: every suite the data directory has)."""
    root = root or data_root()
    dirs = []
    for suite in suite_names or suites(root):
        folder = os.path.join(root, suite)
        if os.path.isdir(folder):
            dirs += sorted(os.path.join(folder, c) for c in os.listdir(folder)
                           if _is_case(os.path.join(folder, c)))
    return dirs


def case_name(path: str) -> str:
    return f"{os.path.basename(os.path.dirname(path))}/{os.path.basename(path)}"


def _value_kinds(values) -> list[str]:
    """The kind of each graph input or output: tensor, sequence, map, optional, sparse."""
    kinds = []
    for value in values:
        kind = value.type.WhichOneof("value") if value.HasField("type") else None
        kinds.append({"tensor_type": "tensor", "sequence_type": "sequence", "map_type": "map",
                      "optional_type": "optional", "sparse_tensor_type": "sparse"}.get(
                          kind, "tensor"))
    return kinds


def _load_tensors(folder: str, prefix: str, kinds=None) -> list:
    """The ``{prefix}_N.pb`` tensors of a test data set, in order, as numpy arrays."""
    import onnx
    from onnx import numpy_helper

    paths = sorted(glob.glob(os.path.join(folder, f"{prefix}_*.pb")),
                   key=lambda p: int(re.findall(r"\d+", os.path.basename(p))[-1]))
    arrays = []
    for index, path in enumerate(paths):
        kind = kinds[index] if kinds is not None and index < len(kinds) else "tensor"
        if kind != "tensor":
            raise ValueError(f"{prefix} {index} is a {kind}, not a tensor")
        tensor = onnx.TensorProto()
        with open(path, "rb") as handle:
            tensor.ParseFromString(handle.read())
        if not tensor.name and tensor.data_type == 0:
            raise ValueError("not a plain tensor (sequence or optional)")
        arrays.append(np.asarray(numpy_helper.to_array(tensor)))
    return arrays


def load_case(path: str):
    """``(model, input names, inputs, reference outputs)`` of a case's first test data set."""
    import onnx

    model = onnx.load(_model_file(path))
    folder = sorted(glob.glob(os.path.join(path, "test_data_set_*")))[0]
    initializers = {t.name for t in model.graph.initializer}
    graph_inputs = [i for i in model.graph.input if i.name not in initializers]
    inputs = _load_tensors(folder, "input", _value_kinds(graph_inputs))
    reference = _load_tensors(folder, "output", _value_kinds(model.graph.output))
    names = [i.name for i in graph_inputs]
    if len(names) != len(inputs):
        raise ValueError(f"{len(inputs)} input files for {len(names)} graph inputs")
    return model, names, inputs, reference


# --------------------------------------------------------------------------- comparing
def _compare(reference, outputs, dtype: str) -> str | None:
    if len(reference) != len(outputs):
        return f"{len(outputs)} outputs, expected {len(reference)}"
    tolerance = TOLERANCE[dtype]
    for i, (ref, out) in enumerate(zip(reference, outputs)):
        ref = np.asarray(ref)
        out = np.asarray(out)
        if ref.shape != out.shape:
            return f"output {i} shape {out.shape}, expected {ref.shape}"
        if ref.dtype.kind in "fcV" or "float" in str(ref.dtype):
            ref64, out64 = ref.astype(np.float64), out.astype(np.float64)
            both_nan = np.isnan(ref64) & np.isnan(out64)
            same_inf = np.isinf(ref64) & (ref64 == out64)
            ok = both_nan | same_inf
            finite = np.isfinite(ref64)
            scale = 1.0 + (np.max(np.abs(ref64[finite])) if finite.any() else 0.0)
            close = np.abs(out64 - ref64) <= tolerance * scale
            if not np.all(ok | close):
                worst = float(np.nanmax(np.where(ok, 0, np.abs(out64 - ref64))))
                return f"output {i} differs by {worst:.3g} (allowed {tolerance * scale:.3g})"
        elif not np.array_equal(ref, out.astype(ref.dtype)):
            return f"output {i} differs ({int(np.sum(ref != out))} of {ref.size} elements)"
    return None


def _message(err) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[-1] if text else ''}"[:200]


def low_precision_ops(mod, low: str) -> int:
    """Calls in ``mod`` (casts left out) that read or write a ``low`` tensor: the ops that run
    in low precision, counted the same way for relay_amp and the built-in pass."""
    import tvm
    from tvm import relax

    def dtypes(ty):
        if isinstance(ty, relax.TensorType):
            yield str(ty.dtype)
        elif isinstance(ty, tvm.ir.type.TupleType):
            for field in ty.fields:
                yield from dtypes(field)

    count = [0]

    def visit(expr):
        if not isinstance(expr, relax.Call):
            return
        op = expr.op
        if isinstance(op, tvm.ir.Op) and op.name == "relax.astype":
            return
        if not isinstance(op, tvm.ir.Op) and not (isinstance(op, tvm.ir.GlobalVar)):
            return
        seen = [d for arg in expr.args for d in dtypes(arg.ty)] + list(dtypes(expr.ty))
        if low in seen:
            count[0] += 1

    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return count[0]


# --------------------------------------------------------------------------- one case
def all_low_policy(dtype: str, **kwargs):
    """A policy that puts every op of the built-in tables into low precision (dot products keep
    float32 accumulation)."""
    from relay_amp import Policy
    from relay_amp.op_registry import (
        GROUP_OPS,
        LOW_CATEGORIES,
        Category,
    )
    from relay_amp.policy import known_op_names

    known = set(known_op_names())
    policy = Policy(dtype, **kwargs)
    ops = sorted({op for group, names in GROUP_OPS.items() if group.category not in LOW_CATEGORIES
                  for op in names if op in known})
    return policy.set_category(ops, Category.LOW_PRECISION)


def _round(array: np.ndarray, dtype: str) -> np.ndarray:
    from relay_amp.dtypes import numpy_dtype

    return np.asarray(array).astype(numpy_dtype(dtype))


def builtin_convert(mod, fp16_inputs=None):
    """TVM's ``relax.transform.ToMixedPrecision`` as its users run it: ``ConvertToDataflow``
    first (the pass converts only inside dataflow blocks), float32 accumulation."""
    from tvm import relax

    mod = relax.transform.ConvertToDataflow()(mod)
    return relax.transform.ToMixedPrecision(out_dtype="float32",
                                            fp16_input_names=fp16_inputs)(mod)


class _Case:
    """A case imported, run in float32 and ready for its units (one mode and dtype each)."""

    def __init__(self, path: str, stage):
        from tvm.relax.frontend.onnx import from_onnx

        from relay_amp.builds.pipeline import compile_module
        from relay_amp.execution import run

        self.stage = stage
        self.skip = None
        self._run, self._compile = run, compile_module
        self._references: dict = {}
        self.calibration_outcome = None
        self._compiled: dict = {}  # structural hash of a module -> its VM
        try:
            stage("import")
            model, names, inputs, self.reference = load_case(path)
            shapes = {n: list(a.shape) for n, a in zip(names, inputs)}
            self.mod = from_onnx(model, shape_dict=shapes)
        except Exception as err:  # many importer error types
            self.skip = f"import: {_message(err)}"
            return
        try:  # the importer may bake constant inputs in: feed the parameters that remain
            params = self.mod["main"].params
            feed = [inputs[names.index(p.name)] if p.name in names else None for p in params]
            if any(f is None for f in feed) and len(params) == len(inputs):
                feed = list(inputs)  # the importer renamed inputs ("0" -> "input_0")
            if any(f is None for f in feed):
                raise ValueError("a function parameter is not a graph input")
            self.params = [p.name for p in params]
            self.param_dtypes = [str(p.ty.dtype) if hasattr(p.ty, "dtype") else None
                                 for p in params]
            self.feed = feed
            stage("float32 compile")
            self.vm32 = compile_module(self.mod)
            self._compiled[_structural_hash(self.mod)] = (self.mod, self.vm32)
            stage("float32 run")
            self.outputs32 = run(self.vm32, feed)
        except Exception as err:
            self.skip = f"float32 compile/run: {_message(err)}"
            return
        mismatch = _compare(self.reference, self.outputs32, "float32")
        if mismatch:
            self.skip = f"float32 result: {mismatch}"

    def compiled(self, mod):
        """The VM of ``mod``, compiled once per distinct module (modes often agree)."""
        import tvm_ffi

        key = _structural_hash(mod)
        hit = self._compiled.get(key)
        if hit is not None and tvm_ffi.structural_equal(hit[0], mod):
            return hit[1]
        vm = self._compile(mod)
        self._compiled[key] = (mod, vm)
        return vm

    def float_params(self) -> list[str]:
        return [n for n, d in zip(self.params, self.param_dtypes) if d == "float32"]

    def calibration(self):
        """Calibrated ranges on the case's float32 inputs (None where calibration fails)."""
        import relay_amp

        if self.calibration_outcome is None:
            try:
                self.stage("calibrate")
                self.calibration_outcome = relay_amp.calibrate(self.mod, [self.feed])
            except Exception as err:  # a graph the instrumented copy cannot build
                self.calibration_outcome = _message(err)
        return self.calibration_outcome if not isinstance(self.calibration_outcome, str) else None

    def fed(self, converted, low: str):
        """What the converted module takes: float32 inputs it declares ``low`` rounded to it."""
        from tvm import relax

        feed, rounded = [], []
        for array, param, before in zip(self.feed, converted["main"].params, self.param_dtypes):
            ty = param.ty
            if before == "float32" and isinstance(ty, relax.TensorType) and str(ty.dtype) == low:
                feed.append(_round(array, low))
                rounded.append(True)
            else:
                feed.append(array)
                rounded.append(False)
        return feed, tuple(rounded)

    def float32_outputs(self, feed, rounded) -> list:
        """The float32 module's outputs on ``feed`` (the rounded inputs widened back)."""
        if not any(rounded):
            return self.outputs32
        key = (tuple(str(a.dtype) for a in feed), rounded)
        if key not in self._references:
            widened = [np.asarray(a).astype(np.float32) if r else a for a, r in zip(feed, rounded)]
            self.stage("float32 run on rounded inputs")
            self._references[key] = self._run(self.vm32, widened)
        return self._references[key]

    def evaluate(self, converted, low: str, compare_dtype: str) -> dict:
        """Compile and run ``converted``; compare with float32 on the same inputs and with the
        reference; attribute a failure."""
        result = {"low_ops": low_precision_ops(converted, low)}
        feed, rounded = self.fed(converted, low)
        result["rounded_inputs"] = sum(rounded)
        try:
            self.stage("compile")
            vm = self.compiled(converted)
            self.stage("run")
            outputs = self._run(vm, feed)
        except Exception as err:
            from tvm import relax

            try:
                relax.analysis.well_formed(converted)
                cause = "TVM"
            except Exception:  # an ill-formed module is the converter's fault
                cause = "relay_amp"
            result.update(outcome="fail", cause=cause, reason=f"compile/run: {_message(err)}")
            return result
        conversion = _compare(self.float32_outputs(feed, rounded), outputs, compare_dtype)
        end_to_end = _compare(self.reference, outputs, compare_dtype)
        result["conversion"] = conversion or "ok"
        result["end_to_end"] = end_to_end or "ok"
        result.update(attribute(conversion, end_to_end, any(rounded)))
        return result


def attribute(conversion: str | None, end_to_end: str | None, rounded: bool) -> dict:
    """The outcome of a run from its two comparisons (None: within tolerance): against the
    float32 module on the same inputs (``conversion``) and against ONNX's reference
    (``end_to_end``); ``rounded``: some inputs were rounded to the low dtype."""
    if conversion:
        return {"outcome": "fail", "cause": "conversion",
                "reason": f"vs float32 on the same inputs: {conversion}"}
    if end_to_end and rounded:
        return {"outcome": "fail", "cause": "input rounding",
                "reason": f"vs ONNX reference: {end_to_end} (float32 on the rounded inputs "
                          "matches the conversion)"}
    if end_to_end:  # float32 matched the reference within 1e-3, the conversion within tol
        return {"outcome": "fail", "cause": "conversion", "reason": f"vs ONNX reference: "
                f"{end_to_end}"}
    return {"outcome": "pass"}


def _structural_hash(mod) -> int:
    import tvm_ffi

    return tvm_ffi.structural_hash(mod)


def _relay_amp_unit(case: _Case, mode: Mode, dtype: str) -> dict:
    import relay_amp

    kwargs = {"keep_io_dtypes": not mode.low_io}
    calibration = case.calibration() if mode.calibrate else None
    policy = all_low_policy(dtype, **kwargs) if mode.all_low else relay_amp.Policy(dtype,
                                                                                   **kwargs)
    try:
        case.stage("convert")
        converted, report = relay_amp.convert(case.mod, dtype, policy=policy,
                                              calibration=calibration, target=mode.target)
    except Exception as err:
        return {"outcome": "crash", "cause": "relay_amp", "reason": f"convert: {_message(err)}",
                "traceback": traceback.format_exc()[-1500:]}
    result = case.evaluate(converted, dtype, dtype)
    result["report_low_ops"] = len(report.converted)
    if mode.calibrate and calibration is None:
        result["calibration"] = f"failed: {case.calibration_outcome}"
    if report.boundary:
        result["boundary"] = [
            f"parameter {b.where}: {b.reason}" if b.kind == "parameter" else
            f"{b.where} ({b.value}): {b.reason}" for b in report.boundary]
    return result


def _build_unit(case: _Case, mode: Mode, dtype: str) -> dict:
    """Convert for ``mode.target`` (float32: the imported module as is) and build for it
    (:func:`relay_amp.eval.cuda_builds.build_model`)."""
    from .cuda_builds import build_model

    case.stage("convert and build")
    return build_model(case.mod, dtype, mode.target)


def _builtin_unit(case: _Case, variant: str) -> dict:
    fp16_inputs = case.float_params() if variant == "float16_inputs" else None
    try:
        case.stage("convert")
        converted = builtin_convert(case.mod, fp16_inputs)
    except Exception as err:
        return {"outcome": "crash", "cause": "TVM", "reason": f"convert: {_message(err)}"}
    return case.evaluate(converted, "float16", "float16")


def units(modes=tuple(MODES), dtypes=DTYPES) -> list[str]:
    """The unit names of a case: ``mode/dtype`` for relay_amp, ``builtin/variant`` for TVM."""
    names = [f"{m}/{d}" for m in modes for d in dtypes]
    builtin = []
    for m in modes:
        variant = ALL_MODES[m].builtin
        if variant and f"builtin/{variant}" not in builtin:
            builtin.append(f"builtin/{variant}")
    return names + builtin


def run_case(path: str, modes=tuple(MODES), dtypes=DTYPES, done=(), emit=None,
             stage=None) -> dict:
    """Run one case in ``modes``; never raises (an exception becomes the unit's outcome).

    Returns the case's row (see :func:`assemble`); ``emit(unit, result)`` is called after each
    unit and ``stage(unit, what)`` before each step that may crash the process."""
    name = case_name(path)
    results = {}
    current = ["base"]

    def mark(what):
        if stage is not None:
            stage(current[0], what)

    def finish(unit, result):
        results[unit] = result
        if emit is not None:
            emit(unit, result)

    case = _Case(path, mark)
    if case.skip:
        finish("base", {"outcome": "skip", "reason": case.skip})
        return assemble(name, results)
    if "base" not in done:
        finish("base", {"outcome": "ok"})
    for unit in units(modes, dtypes):
        if unit in done:
            continue
        current[0] = unit
        first, second = unit.split("/")
        if first == "builtin":
            result = _builtin_unit(case, second)
        elif ALL_MODES[first].build_only:
            result = _build_unit(case, ALL_MODES[first], second)
        else:
            result = _relay_amp_unit(case, MODES[first], second)
        finish(unit, result)
    return assemble(name, results)


def assemble(name: str, results: dict) -> dict:
    """A case's row from its unit results: per mode, the outcome over both dtypes (a crash
    beats a fail beats a pass), the low-precision ops, and the built-in counterpart."""
    base = results.get("base", {})
    row = {"case": name}
    if base.get("outcome") == "skip":
        row.update(outcome="skip", reason=base["reason"])
        return row
    row["outcome"] = "ok"
    row["units"] = {u: {k: v for k, v in r.items() if k not in ("case", "unit")}
                    for u, r in results.items() if u != "base"}
    return row


def mode_outcome(row: dict, mode: str, dtypes=DTYPES) -> tuple[str, dict]:
    """``(outcome, {dtype: unit result})`` of one mode of a row: skip, crash, fail or pass."""
    if row["outcome"] == "skip":
        return "skip", {}
    found = {d: row["units"].get(f"{mode}/{d}") for d in dtypes}
    if any(r is None for r in found.values()):
        return "missing", found
    outcomes = {r["outcome"] for r in found.values()}
    for outcome in ("crash", "fail"):
        if outcome in outcomes:
            return outcome, found
    return "pass", found


# --------------------------------------------------------------------------- the suite
def _worker(paths, out_path, modes, dtypes):
    done = _done_units(read_records(out_path))
    with open(out_path, "a", encoding="utf-8") as out:
        def write(record):
            out.write(json.dumps(record, default=str) + "\n")
            out.flush()

        for path in paths:
            name = case_name(path)
            finished = done.get(name, {})
            if _case_finished(finished, modes, dtypes):
                continue
            run_case(path, modes, dtypes, done=set(finished),
                     emit=lambda unit, result, name=name: write(
                         {"case": name, "unit": unit, **result}),
                     stage=lambda unit, what, name=name: write(
                         {"start": name, "unit": unit, "stage": what}))


def _done_units(records) -> dict:
    done: dict = {}
    for record in records:
        if "case" in record and "unit" in record:
            done.setdefault(record["case"], {})[record["unit"]] = record
    return done


def _case_finished(finished: dict, modes, dtypes) -> bool:
    return finished.get("base", {}).get("outcome") == "skip" or all(
        u in finished for u in ["base", *units(modes, dtypes)])


def _died(unit: str, stage: str, why: str) -> dict:
    """The result of a unit whose process died (or hung) in ``stage``."""
    if unit == "base":
        where = "import" if stage == "import" else "float32 compile/run"
        return {"outcome": "skip", "reason": f"{where}: {why}"}
    if unit.startswith("builtin/"):
        return {"outcome": "crash" if stage == "convert" else "fail", "cause": "TVM",
                "reason": why}
    if stage in ("convert", "calibrate"):
        return {"outcome": "crash", "cause": "relay_amp", "reason": why}
    return {"outcome": "fail", "cause": "TVM", "reason": why}


class _Tail:
    """Follows a JSON-lines file as a worker appends to it: the last record, and how many cases
    have finished."""

    def __init__(self, path: str, last_unit: str):
        self.path, self.last_unit = path, last_unit
        self.offset, self.last, self.finished = 0, None, 0

    def poll(self):
        if not os.path.exists(self.path):
            return
        with open(self.path, "rb") as handle:
            handle.seek(self.offset)
            data = handle.read()
        end = data.rfind(b"\n") + 1
        self.offset += end
        for line in data[:end].decode("utf-8").splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            self.last = record
            if "case" in record and (record.get("unit") == self.last_unit or (
                    record.get("unit") == "base" and record.get("outcome") == "skip")):
                self.finished += 1


def _supervise(paths, out_path, modes, dtypes, timeout_s, tail: _Tail, on_poll):
    """Run ``paths`` in a worker process, restarting it after a crash or hang; the unit that
    was running gets the result :func:`_died` gives it."""
    context = multiprocessing.get_context("spawn")
    names = {case_name(p): p for p in paths}

    def remaining():
        done = _done_units(read_records(out_path))
        return [p for n, p in names.items() if not _case_finished(done.get(n, {}), modes, dtypes)]

    todo = remaining()
    while todo:
        process = context.Process(target=_worker, args=(todo, out_path, modes, dtypes))
        process.start()
        last, started, hung = None, time.time(), False
        while process.is_alive():
            process.join(1.0)
            tail.poll()
            current = tail.last if tail.last and "start" in tail.last else None
            key = json.dumps(current, sort_keys=True) if current else None
            if key != last:
                last, started = key, time.time()
            elif current and time.time() - started > timeout_s:
                hung = True
                process.kill()
                process.join()
            on_poll()
        tail.poll()
        record = tail.last
        if record and "start" in record:
            why = (f"timeout after {timeout_s:.0f} s in {record['stage']}" if hung else
                   f"process died (exit code {process.exitcode}) in {record['stage']}")
            with open(out_path, "a", encoding="utf-8") as out:
                out.write(json.dumps({"case": record["start"], "unit": record["unit"],
                                      **_died(record["unit"], record["stage"], why)}) + "\n")
        todo = remaining()


def run_suite(paths, out_path: str, progress=None, timeout_s: float = 120.0, workers: int = 1,
              modes=tuple(MODES), dtypes=DTYPES) -> list[dict]:
    """Run ``paths`` in ``workers`` processes (each restarted after a crash). Results go to
    ``out_path``, one JSON line per unit (a case in one mode and dtype); a run resumes from the
    units already there. Returns the case rows (:func:`assemble`)."""
    workers = max(1, int(workers))
    earlier = [r for r in read_records(out_path) if "case" in r]
    shards = [f"{out_path}.{i}" for i in range(workers)]
    for shard in shards:
        if not os.path.exists(shard):
            with open(shard, "w", encoding="utf-8") as handle:
                handle.writelines(json.dumps(r) + "\n" for r in earlier)
    last_unit = units(modes, dtypes)[-1]
    tails = [_Tail(shard, last_unit) for shard in shards]
    lock = threading.Lock()

    def on_poll():
        if progress:
            with lock:
                progress(sum(t.finished for t in tails))

    threads = [threading.Thread(target=_supervise, args=(
        paths[i::workers], shard, modes, dtypes, timeout_s, tails[i], on_poll))
        for i, shard in enumerate(shards)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    merged = _done_units(earlier + [r for shard in shards for r in read_records(shard)])
    with open(out_path, "w", encoding="utf-8") as handle:
        for name in sorted(merged):
            for record in merged[name].values():
                handle.write(json.dumps(record, default=str) + "\n")
    for shard in shards:
        os.remove(shard)
    return rows_from_records(read_records(out_path), [case_name(p) for p in paths])


def rows_from_records(records, order=None) -> list[dict]:
    """The case rows of unit records (the JSON lines :func:`run_suite` writes)."""
    done = _done_units(records)
    order = order or list(done)
    return [assemble(name, done[name]) for name in order if name in done]


def read_records(path):
    if not os.path.exists(path):
        return []
    records = []
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError:  # a line cut short by a killed process
                    continue
    return records


# --------------------------------------------------------------------------- the report
def mode_summary(rows: list[dict], mode: str, dtypes=DTYPES) -> dict:
    """Counts for one mode: outcomes, cases with a low-precision op, causes of failures."""
    outcomes, causes = Counter(), Counter()
    with_low = ops = 0
    for row in rows:
        outcome, found = mode_outcome(row, mode, dtypes)
        outcomes[outcome] += 1
        if outcome == "pass" and any(r.get("low_ops", 0) for r in found.values()):
            with_low += 1
        ops += sum(r.get("low_ops", 0) for r in found.values() if r)
        for result in found.values():
            if result and result["outcome"] in ("fail", "crash"):
                causes[result["cause"]] += 1
    return {"outcomes": outcomes, "passing_with_low_ops": with_low, "low_ops": ops,
            "causes": causes}


def builtin_summary(rows: list[dict], variant: str) -> dict:
    outcomes = Counter()
    with_low = ops = 0
    for row in rows:
        if row["outcome"] == "skip":
            outcomes["skip"] += 1
            continue
        result = row["units"].get(f"builtin/{variant}")
        if result is None:
            outcomes["missing"] += 1
            continue
        outcomes[result["outcome"]] += 1
        ops += result.get("low_ops", 0)
        if result["outcome"] == "pass" and result.get("low_ops", 0):
            with_low += 1
    return {"outcomes": outcomes, "passing_with_low_ops": with_low, "low_ops": ops}


def _outcome_cells(outcomes: Counter) -> str:
    return " | ".join(str(outcomes.get(k, 0)) for k in ("pass", "fail", "crash", "skip"))


def summary_markdown(rows: list[dict], command: str, machine: str, date: str,
                     modes=tuple(MODES), dtypes=DTYPES, duration_s: float | None = None,
                     versions: str = "", notes: str = "") -> str:
    skips = Counter(re.sub(r"\d+", "N", r["reason"])[:110] for r in rows
                    if r["outcome"] == "skip")
    lines = [
        "# ONNX backend conformance", "",
        f"Command: `{command}`  ", f"Date: {date}  ", f"Machine: {machine}  ",
        f"Versions: {versions}  " if versions else "",
        f"Wall time: {duration_s / 60:.1f} min" if duration_s else "", "",
        "Every case of the ONNX backend test suite shipped in the installed onnx wheel is "
        "imported with `tvm.relax.frontend.onnx` and run in float32 against its reference "
        "outputs (a case TVM cannot import or run in float32 is a *skip*). Then, per mode and "
        "dtype, relay_amp converts it, and the converted module is compiled for the host CPU, "
        "run, and compared at the dtype's tolerance (|out - ref| <= tol * (1 + max|ref|), "
        "tol = 2e-2 for float16 and 8e-2 for bfloat16; integer and boolean outputs exact) "
        "twice: with the float32 module run on the same (rounded) inputs — the conversion "
        "error — and with ONNX's reference — end to end.", "",
        "A case passes a mode when both dtypes pass. A *fail* is attributed to **conversion** "
        "(the converted module differs from float32 on the same inputs), **input rounding** "
        "(it matches float32 on the rounded inputs, but rounding the inputs to the low dtype "
        "moves the result away from ONNX's reference), or **TVM** (TVM cannot compile or run "
        "the converted, well-formed module); a *crash* is relay_amp raising or dying while "
        "converting (cause **relay_amp**), or, for the built-in pass, TVM's pass raising.", "",
        "## Modes", "",
        "| mode | what | calibrated | built-in counterpart |", "|---|---|---|---|",
        *[f"| `{m}` | {MODES[m].description} | {'yes' if MODES[m].calibrate else 'no'} | "
          f"{MODES[m].builtin or 'none'} |" for m in modes], "",
        "`all_low` puts every op of relay_amp's built-in tables into the `low_precision` "
        "category (dot products keep `low_precision_fp32_accumulate`), the float32-only ops "
        "(`exp`, `sum`, `log`, ...) included; ops TVM cannot build in the dtype "
        "(`TVM_LIMITATIONS`) and calibrated out-of-range values still keep float32. "
        "Calibration runs on the case's own float32 inputs. The built-in pass converts to "
        "float16 only; `float16_inputs` sets its `fp16_input_names` to every float32 "
        "parameter.", "",
        "## Results per mode (cases; both dtypes must pass)", "",
        "| mode | pass | fail | crash | skip | passing cases with >= 1 low-precision op | "
        "low-precision ops run | failures by cause (unit = case x dtype) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for mode in modes:
        summary = mode_summary(rows, mode, dtypes)
        causes = ", ".join(f"{c}: {n}" for c, n in sorted(summary["causes"].items())) or "-"
        lines.append(f"| `{mode}` | {_outcome_cells(summary['outcomes'])} | "
                     f"{summary['passing_with_low_ops']} | {summary['low_ops']} | {causes} |")
    lines += ["", "## float16: relay_amp and TVM's built-in pass side by side", "",
              "Per case, float16 only (the built-in pass has no bfloat16). Low-precision ops "
              "are counted the same way for both: calls (casts left out) that read or write a "
              "float16 tensor.", "",
              "| mode | converter | pass | fail | crash | skip | passing cases with >= 1 "
              "float16 op | float16 ops run |", "|---|---|---|---|---|---|---|---|"]
    for mode in modes:
        summary = mode_summary(rows, mode, ("float16",))
        lines.append(f"| `{mode}` | relay_amp | {_outcome_cells(summary['outcomes'])} | "
                     f"{summary['passing_with_low_ops']} | {summary['low_ops']} |")
        variant = MODES[mode].builtin
        if variant:
            builtin = builtin_summary(rows, variant)
            lines.append(f"| `{mode}` | built-in ({variant}) | "
                         f"{_outcome_cells(builtin['outcomes'])} | "
                         f"{builtin['passing_with_low_ops']} | {builtin['low_ops']} |")
    if notes:
        lines += ["", notes.strip()]
    lines += ["", "## Skips by reason (TVM cannot import or run the case in float32)", "",
              "| reason (numbers shown as N) | cases |", "|---|---|",
              *[f"| {k.replace('|', '/')} | {v} |" for k, v in skips.most_common(25)],
              f"| other reasons | "
              f"{sum(skips.values()) - sum(v for _, v in skips.most_common(25))} |", ""]
    lines += ["## relay_amp failures and crashes, with their cause", ""]
    bad = []
    for row in rows:
        if row["outcome"] == "skip":
            continue
        for unit, result in sorted(row["units"].items()):
            if not unit.startswith("builtin/") and result["outcome"] in ("fail", "crash"):
                bad.append(f"- `{row['case']}` {unit}: {result['outcome']}, "
                           f"**{result['cause']}**: {result['reason']}")
    lines += bad or ["None."]
    lines += ["", "## TVM's built-in pass: failures and crashes", ""]
    builtin_bad = []
    for row in rows:
        if row["outcome"] == "skip":
            continue
        for unit, result in sorted(row["units"].items()):
            if unit.startswith("builtin/") and result["outcome"] in ("fail", "crash"):
                builtin_bad.append(f"- `{row['case']}` {unit}: {result['outcome']}: "
                                   f"{result['reason']}")
    lines += builtin_bad or ["None."]
    return "\n".join(line for line in lines if line is not None) + "\n"
