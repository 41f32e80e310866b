"""What the user types, checked: targets, input specs, normalization, model formats; the
errors every ``relay-amp`` command reports as one line."""

from __future__ import annotations

import difflib
import json
import math
import os
import re
import shlex
import sys
from dataclasses import dataclass

#: Model formats: name -> (file extension, what it is).
FORMATS = {"onnx": (".onnx", "an ONNX file"), "tflite": (".tflite", "a TFLite file"),
           "pt2": (".pt2", "a torch.export program")}
FORMATS_TEXT = "an ONNX file (.onnx), a TFLite file (.tflite) or a torch.export program (.pt2)"


NORMALIZE_HELP = "imagenet, none, or MEAN,STD (one value each, or three each: R,G,B)"
#: ImageNet's per-channel mean and standard deviation of pixels scaled to [0, 1].
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
#: The CUDA arch used when the target names none and this machine has no GPU to read it from.
DEFAULT_CUDA_ARCH = "sm_90"


class CommandError(Exception):
    """An error a ``relay-amp`` command reports as one line and exits with ``exit_code``."""

    exit_code = 1


class UsageError(CommandError):
    """A bad argument: its message is one line that says what to do; the command exits 2."""

    exit_code = 2


class ConvertFailure(CommandError):
    """The arguments were fine but a step failed (import, compile, tolerance): exit 1."""


class Interrupted(CommandError):
    """The user stopped the command (Ctrl-C): exit 130, as a shell reports SIGINT."""

    exit_code = 130


def error_exit(command: str, error: CommandError) -> int:
    """Print ``error`` as ``relay-amp COMMAND: message`` on stderr; the exit code to return.

    Every error exit of the ``relay-amp`` commands goes through here."""
    print(f"relay-amp {command}: {error}", file=sys.stderr)
    return error.exit_code


#: What TVM's frontends raise for a model they cannot import, as the ONNX backend suite's
#: cases show (docs/CONFORMANCE.md's skips): TVM's own errors (RuntimeError subclasses such as
#: OpNotImplemented), ValueError and TypeError through the FFI, and the frontends' Python
#: asserts, attribute lookups and NotImplementedError.
IMPORT_ERRORS = (RuntimeError, ValueError, TypeError, AssertionError, AttributeError,
                 NotImplementedError)


def one_line(error: BaseException) -> str:
    """The last non-empty line of an error's message (TVM errors carry a traceback first)."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    return lines[-1] if lines else type(error).__name__


@dataclass(frozen=True)
class SymbolicDim:
    """A named dimension in ``--input`` (``batch``, ``seq=1..512``): kept symbolic, one
    ``tir.Var`` per name, with the sizes it may take (``None``: no bound given)."""

    name: str
    lower: int | None = None
    upper: int | None = None

    def __str__(self) -> str:
        if self.lower is None:
            return self.name
        return f"{self.name}={self.lower}..{self.upper}"


@dataclass(frozen=True)
class InputSpec:
    """``--input NAME:SHAPE[:DTYPE]``; the shape holds ints and :class:`SymbolicDim`."""

    name: str
    shape: tuple
    dtype: str | None = None


_DTYPES = ("float32", "float16", "bfloat16", "float64", "int64", "int32", "int16", "int8",
           "uint8", "uint16", "bool")
_DIM_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_EXAMPLE = ("--input NAME:SHAPE[:DTYPE], e.g. --input images:1,3,224,224, ids:1,128:int64 or "
            "images:batch,3,320,320 (a named dimension stays symbolic; seq=1..512 bounds it)")


def _parse_dims(shape_text: str, text: str) -> tuple:
    """The dimensions of ``--input``'s SHAPE: all numbers (``1,3,8,8`` or ``1x3x8x8``), or
    numbers and names separated by commas only."""
    bad = (f"bad shape {shape_text!r} in --input {text!r}: give positive integers or names "
           f"(batch, seq=1..512) separated by commas ({_EXAMPLE})")
    parts = [part.strip() for part in shape_text.split(",")] if shape_text.strip() else []
    if parts and all(re.fullmatch(r"[0-9]+(x[0-9]+)*", part) for part in parts):
        numbers = [int(d) for part in parts for d in part.split("x")]
        if any(d < 1 for d in numbers):
            raise UsageError(bad)
        return tuple(numbers)
    dims, ranges = [], {}
    for part in parts:
        if re.fullmatch(r"[0-9]+", part) and int(part) >= 1:
            dims.append(int(part))
            continue
        match = re.fullmatch(rf"({_DIM_NAME})(?:=([0-9]+)\.\.([0-9]+))?", part)
        if match is None:
            if re.fullmatch(r"[0-9]+(x[0-9]+)+", part):
                raise UsageError(f"bad shape {shape_text!r} in --input {text!r}: with a named "
                                 "dimension, separate the dimensions with commas only")
            raise UsageError(bad)
        name, lower, upper = match.group(1), match.group(2), match.group(3)
        if lower is not None:
            lower, upper = int(lower), int(upper)
            if not 1 <= lower <= upper:
                raise UsageError(f"bad range {part!r} in --input {text!r}: give LOW..HIGH with "
                                 "1 <= LOW <= HIGH, e.g. seq=1..512")
            if ranges.setdefault(name, (lower, upper)) != (lower, upper):
                raise UsageError(f"--input {text!r} gives {name} two ranges")
        dims.append(SymbolicDim(name, lower, upper))
    if not dims:
        raise UsageError(bad)
    return tuple(SymbolicDim(d.name, *ranges[d.name]) if isinstance(d, SymbolicDim)
                 and d.name in ranges else d for d in dims)


def parse_input(text: str) -> InputSpec:
    """``images:1,3,320,320``, ``ids:1x128:int64`` or ``ids:1,seq=1..512`` as an
    :class:`InputSpec`.

    The shape and the optional dtype are split off from the right, so a name may hold colons
    (TensorFlow's ``serving_default_input_2:0:1,43844,1``): the last field is the dtype only if
    it is one (``float32``, ``int64``, ...), the field before it the shape. A dimension given
    as a name (``batch``) stays symbolic; ``NAME=LOW..HIGH`` bounds its sizes.
    """
    rest, _, last = text.rpartition(":")
    dtype = None
    if last in _DTYPES:
        dtype = last
        rest, _, last = rest.rpartition(":")
    elif ":" in rest and (re.fullmatch(r"(u?int|b?float|bool)[0-9]*", last)
                          or difflib.get_close_matches(last, _DTYPES, n=1, cutoff=0.8)):
        close = difflib.get_close_matches(last, _DTYPES, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else f" (one of {', '.join(_DTYPES)})"
        raise UsageError(f"unknown dtype {last!r} in --input {text!r}{hint}")
    name, shape_text = rest, last
    if not name:
        raise UsageError(f"bad --input {text!r}: use {_EXAMPLE}")
    return InputSpec(name, _parse_dims(shape_text, text), dtype)


def symbolic_ranges(specs) -> dict:
    """Name -> ``(lower, upper)`` (or ``(None, None)``) of the named dimensions over all
    ``--input`` specs; a name given two different ranges is a usage error."""
    ranges: dict = {}
    for spec in specs:
        for dim in spec.shape:
            if not isinstance(dim, SymbolicDim):
                continue
            bound = (dim.lower, dim.upper)
            known = ranges.setdefault(dim.name, bound)
            if bound[0] is not None and known[0] is not None and known != bound:
                raise UsageError(f"dimension {dim.name} has two ranges in --input "
                                 f"({known[0]}..{known[1]} and {bound[0]}..{bound[1]}); give "
                                 "one (or give it once)")
            if known[0] is None:
                ranges[dim.name] = bound
    return ranges


def parse_normalize(text: str | None):
    """``--normalize``: None (not given), ``"none"``, or ``(mean, std)`` per channel in units of
    pixels scaled to [0, 1]."""
    if text is None:
        return None
    if text == "imagenet":
        return tuple(IMAGENET_MEAN), tuple(IMAGENET_STD)
    if text == "none":
        return "none"
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        values = []
    if len(values) not in (2, 6) or not all(math.isfinite(v) for v in values):
        raise UsageError(f"bad --normalize {text!r}: use {NORMALIZE_HELP}")
    half = len(values) // 2
    mean, std = tuple(values[:half]), tuple(values[half:])
    if any(s == 0 for s in std):
        raise UsageError(f"bad --normalize {text!r}: a standard deviation of 0 divides by zero")
    return mean, std


def split_list(values) -> list[str]:
    """Repeated and comma-separated option values as one list."""
    return [item.strip() for value in values or [] for item in value.split(",") if item.strip()]


def _plain(value):
    """TVM containers (Map, Array, String, IntImm) as JSON-ready Python values."""
    if hasattr(value, "items"):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (str, bool, int, float)) or value is None:
        return value
    if hasattr(value, "__len__") and not isinstance(value, (bytes,)):
        return [_plain(v) for v in value]
    if hasattr(value, "value"):
        return value.value
    return str(value)


def _local_cuda_arch() -> str | None:
    import tvm

    from ..relax_utils import TVM_ERRORS

    try:
        device = tvm.cuda(0)
        if device.exist:
            return "sm_" + device.compute_version.replace(".", "")
    except TVM_ERRORS:  # no CUDA runtime in this TVM
        return None
    return None


def _flag_value(kind: str, key: str, value: str, type_name: str, text: str):
    if type_name == "int":
        try:
            return int(value)
        except ValueError:
            raise UsageError(f"target {text!r}: -{key} takes an integer; got {value!r}") from None
    if type_name == "bool":
        if value.lower() in ("1", "true", "yes", "on"):
            return True
        if value.lower() in ("0", "false", "no", "off"):
            return False
        raise UsageError(f"target {text!r}: -{key} takes true or false; got {value!r}")
    if type_name.startswith("Array"):
        return [item for item in value.split(",") if item]
    if type_name == "str":
        return value
    raise UsageError(f"target {text!r}: -{key} ({type_name}) cannot be given in the short form; "
                     f"use the JSON form, e.g. '{{\"kind\": \"{kind}\", \"{key}\": ...}}'")


def parse_target(text: str) -> tuple[dict, list]:
    """A target as TVM's dict form, and notes on what was filled in.

    Takes the JSON dict form, ``host`` (this machine's CPU), a TVM target tag
    (``nvidia/nvidia-h100``), or the short form users type: a kind and ``-key=value`` flags
    (``cuda -arch=sm_90``, ``llvm -mtriple=aarch64-linux-gnu -mattr=+fullfp16``). TVM 0.27 no
    longer parses the short form itself, so the flags are checked here against the kind's options.
    """
    import tvm

    from ..execution import host_target
    from ..relax_utils import TVM_ERRORS

    notes: list = []
    text = (text or "").strip()
    examples = ("'cuda -arch=sm_90', 'llvm -mtriple=aarch64-linux-gnu -mattr=+fullfp16', 'host' "
                "or a JSON dict such as '{\"kind\": \"cuda\", \"arch\": \"sm_90\"}'")
    if not text:
        raise UsageError(f"--target is empty: give one, e.g. {examples}")
    if text == "host":
        config = _plain(host_target().export())
        return {k: v for k, v in config.items() if k in ("kind", "mcpu", "mtriple")}, notes
    if text.startswith("{"):
        try:
            config = json.loads(text)
        except json.JSONDecodeError as err:
            raise UsageError(f"--target {text!r} is not valid JSON ({err.msg} at character "
                             f"{err.pos}); use e.g. {examples}") from None
        if not isinstance(config, dict) or "kind" not in config:
            raise UsageError(f"--target {text!r}: a JSON target is a dict with a \"kind\"; "
                             f"use e.g. {examples}")
    else:
        try:
            tokens = shlex.split(text)
        except ValueError as err:
            raise UsageError(f"--target {text!r}: {err}; use e.g. {examples}") from None
        kind, flags = tokens[0], tokens[1:]
        if "/" in kind and not flags:  # a target tag
            try:
                return _plain(tvm.target.Target(kind).export()), notes
            except TVM_ERRORS:  # an unknown tag
                raise UsageError(f"--target {text!r}: TVM knows no target tag {kind!r}") from None
        try:
            options = dict(tvm.target.TargetKind.options_from_name(kind))
        except TVM_ERRORS:  # an unknown kind
            kinds = ["cuda", "llvm", "rocm", "vulkan", "metal", "opencl", "webgpu", "c"]
            close = difflib.get_close_matches(kind, kinds, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise UsageError(f"--target {text!r}: unknown target kind {kind!r}; {hint}"
                             f"use e.g. {examples}") from None
        config = {"kind": kind}
        settable = sorted(k for k, t in options.items() if k != "kind" and t != "target.Target")
        i = 0
        while i < len(flags):
            flag = flags[i]
            match = re.fullmatch(r"--?([A-Za-z][A-Za-z0-9_-]*)(?:=(.*))?", flag)
            if match is None:
                raise UsageError(f"--target {text!r}: cannot parse {flag!r}; flags are "
                                 f"-key=value, e.g. {examples}")
            key, value = match.group(1), match.group(2)
            if value is None:  # "-arch sm_90"
                if i + 1 >= len(flags) or flags[i + 1].startswith("-"):
                    raise UsageError(f"--target {text!r}: -{key} needs a value (-{key}=VALUE)")
                value, i = flags[i + 1], i + 1
            if key not in options or key == "kind":
                close = difflib.get_close_matches(key, settable, n=1, cutoff=0.5)
                hint = (f"did you mean -{close[0]}? " if close else "")
                raise UsageError(f"--target {text!r}: {kind} has no option -{key}; {hint}its "
                                 f"options are {', '.join('-' + k for k in settable)}")
            config[key] = _flag_value(kind, key, value, options[key], text)
            i += 1
    if config.get("kind") == "cuda" and "arch" not in config and "tag" not in config:
        arch = _local_cuda_arch()
        if arch is None:
            arch = DEFAULT_CUDA_ARCH
            notes.append(f"target cuda names no arch and this machine has no GPU to read it "
                         f"from: compiled for {arch} (add -arch=sm_XY for another GPU)")
        else:
            notes.append(f"target cuda: arch {arch} read from this machine's GPU")
        config["arch"] = arch
    try:
        tvm.target.Target(config)
    except TVM_ERRORS as err:  # a bad target
        raise UsageError(f"--target {text!r} is not a target TVM accepts: {one_line(err)}") \
            from None
    return config, notes


def detect_format(path: str) -> str:
    """The model format of ``path``, from its first bytes and its extension."""
    if not os.path.exists(path):
        raise UsageError(f"model file {path!r} does not exist; give {FORMATS_TEXT}")
    if os.path.isdir(path):
        raise UsageError(f"{path!r} is a folder; give the model file itself ({FORMATS_TEXT})")
    with open(path, "rb") as handle:
        head = handle.read(8)
    extension = os.path.splitext(path)[1].lower()
    by_content = ("tflite" if head[4:8] == b"TFL3" else
                  "pt2" if head[:4] == b"PK\x03\x04" else None)
    by_extension = next((name for name, (ext, _) in FORMATS.items() if ext == extension), None)
    if by_content is not None:
        return by_content
    if by_extension in ("tflite", "pt2"):
        expected = "a TFL3 identifier" if by_extension == "tflite" else "a zip archive"
        raise UsageError(f"{path!r} does not look like {FORMATS[by_extension][1]} (no "
                         f"{expected} at its start); is it the right file?")
    if by_extension == "onnx":
        return "onnx"
    raise UsageError(f"cannot tell the format of {path!r}: relay-amp convert takes "
                     f"{FORMATS_TEXT}")
