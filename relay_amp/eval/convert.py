"""``relay-amp convert``: a model file in, a compiled library and its report out.

One call does what a user would otherwise script from the README: import an ONNX, TFLite or
``torch.export`` (``.pt2``) file, convert it with :func:`relay_amp.convert` (optionally with
calibrated ranges and :func:`relay_amp.auto_mixed_precision`), compile it for the target and write::

    OUT/
      model.so        the library (``export_library``); for CUDA it holds the CUDA source that
                      TVM's CUDA loader compiles on the GPU host (this TVM has no CUDA compiler)
      report.md       the conversion explained, for people
      report.json     the same for tools (``relay-amp report OUT/report.json`` prints it)
      policy.json     the effective policy: ``--policy OUT/policy.json`` converts the same way
      accuracy.json   with calibration data: float32 vs the converted model on that data

Every bad argument is a :class:`UsageError`: one line that says what to do (exit code 2). All files
are written into a temporary folder next to OUT and renamed into place at the end, so a failed run
leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import difflib
import json
import math
import os
import re
import shlex
import shutil
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field

import numpy as np

#: Model formats: name -> (file extension, what it is).
FORMATS = {"onnx": (".onnx", "an ONNX file"), "tflite": (".tflite", "a TFLite file"),
           "pt2": (".pt2", "a torch.export program")}
FORMATS_TEXT = "an ONNX file (.onnx), a TFLite file (.tflite) or a torch.export program (.pt2)"
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm",
                    ".pgm")
#: The files a convert run writes; a folder holding only these (and report.json) is replaced.
OUTPUT_FILES = ("model.so", "model.tar", "report.md", "report.json", "policy.json",
                "accuracy.json")
NORMALIZE_HELP = "imagenet, none, or MEAN,STD (one value each, or three each: R,G,B)"
#: The CUDA arch used when the target names none and this machine has no GPU to read it from.
DEFAULT_CUDA_ARCH = "sm_90"
REPORT_FORMAT = 1


class UsageError(Exception):
    """A bad argument: its message is one line that says what to do; the command exits 2."""


class ConvertFailure(Exception):
    """The arguments were fine but a step failed (import, compile, tolerance): exit 1."""


def one_line(error: BaseException) -> str:
    """The last non-empty line of an error's message (TVM errors carry a traceback first)."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    return lines[-1] if lines else type(error).__name__


# ------------------------------------------------------------------------------ arguments
@dataclass(frozen=True)
class InputSpec:
    """``--input NAME:SHAPE[:DTYPE]``."""

    name: str
    shape: tuple
    dtype: str | None = None


_DTYPES = ("float32", "float16", "bfloat16", "float64", "int64", "int32", "int16", "int8",
           "uint8", "uint16", "bool")


def parse_input(text: str) -> InputSpec:
    """``images:1,3,320,320`` or ``ids:1x128:int64`` as an :class:`InputSpec`."""
    example = "--input NAME:SHAPE[:DTYPE], e.g. --input images:1,3,224,224 or ids:1,128:int64"
    parts = text.rsplit(":", 2) if text.count(":") >= 2 else text.split(":")
    if len(parts) == 3 and not re.fullmatch(r"[0-9x,\s]+", parts[1]):
        parts = [parts[0] + ":" + parts[1], parts[2]]  # a name with a colon, no dtype
    if len(parts) < 2 or not parts[0]:
        raise UsageError(f"bad --input {text!r}: use {example}")
    name, shape_text = parts[0], parts[1]
    dtype = parts[2] if len(parts) == 3 else None
    dims = [d.strip() for d in re.split(r"[,x]", shape_text.strip())] if shape_text.strip() else []
    if not dims or not all(re.fullmatch(r"[0-9]+", d) for d in dims) or any(
            int(d) < 1 for d in dims):
        raise UsageError(f"bad shape {shape_text!r} in --input {text!r}: give positive integers "
                         f"separated by commas ({example})")
    if dtype is not None and dtype not in _DTYPES:
        close = difflib.get_close_matches(dtype, _DTYPES, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else f" (one of {', '.join(_DTYPES)})"
        raise UsageError(f"unknown dtype {dtype!r} in --input {text!r}{hint}")
    return InputSpec(name, tuple(int(d) for d in dims), dtype)


def parse_normalize(text: str | None):
    """``--normalize``: None (not given), ``"none"``, or ``(mean, std)`` per channel in units of
    pixels scaled to [0, 1]."""
    if text is None:
        return None
    from .data import IMAGENET_MEAN, IMAGENET_STD  # pylint: disable=import-outside-toplevel

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
    import tvm  # pylint: disable=import-outside-toplevel

    try:
        device = tvm.cuda(0)
        if device.exist:
            return "sm_" + device.compute_version.replace(".", "")
    except Exception:  # pylint: disable=broad-except  # no CUDA runtime in this TVM
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
    import tvm  # pylint: disable=import-outside-toplevel

    from ..execution import host_target  # pylint: disable=import-outside-toplevel

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
            except Exception:  # pylint: disable=broad-except
                raise UsageError(f"--target {text!r}: TVM knows no target tag {kind!r}") from None
        try:
            options = dict(tvm.target.TargetKind.options_from_name(kind))
        except Exception:  # pylint: disable=broad-except
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
    except Exception as err:  # pylint: disable=broad-except
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


# ------------------------------------------------------------------------------ import
@dataclass
class ModelInput:
    """One data input of the imported model."""

    name: str  # the Relax parameter's name
    source: str  # the name in the model file
    shape: tuple
    dtype: str


@dataclass
class Imported:
    mod: object
    inputs: list
    notes: list = field(default_factory=list)


def _resolve_specs(specs: dict, declared: list, path: str) -> dict:
    """``--input`` specs by file input name; unknown names are an error."""
    names = [name for name, _, _ in declared]
    resolved = {}
    for name, spec in specs.items():
        if name not in names:
            close = difflib.get_close_matches(name, names, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise UsageError(f"--input names {name!r}, which is not an input of {path}; {hint}"
                             f"its inputs are {', '.join(names)}")
        resolved[name] = spec
    return resolved


def _input_shapes(declared: list, specs: dict, path: str) -> dict:
    """Concrete shapes per input: the declared ones, with ``--input`` filling symbolic dims."""
    shapes = {}
    for name, dims, _ in declared:
        spec = specs.get(name)
        if spec is None:
            if any(not isinstance(d, int) or d < 1 for d in dims):
                shown = ",".join(str(d) if isinstance(d, int) and d > 0 else "?" for d in dims)
                raise UsageError(f"input {name!r} of {os.path.basename(path)} has a symbolic "
                                 f"shape [{shown}]: give it with --input {name}:"
                                 + ",".join(str(d) if isinstance(d, int) and d > 0 else "N"
                                            for d in dims))
            shapes[name] = tuple(dims)
            continue
        if len(spec.shape) != len(dims):
            raise UsageError(f"--input {name}: shape {list(spec.shape)} has {len(spec.shape)} "
                             f"dimensions but the model's input has {len(dims)} "
                             f"({[d if isinstance(d, int) and d > 0 else '?' for d in dims]})")
        for given, declared_dim in zip(spec.shape, dims):
            if isinstance(declared_dim, int) and declared_dim > 0 and given != declared_dim:
                raise UsageError(f"--input {name}: shape {list(spec.shape)} does not match the "
                                 f"model's fixed shape {list(dims)}")
        shapes[name] = tuple(spec.shape)
    return shapes


def _check_dtype(spec, declared_dtype: str, name: str) -> None:
    if spec is None or spec.dtype is None or spec.dtype == declared_dtype:
        return
    from ..policy import INTEGER_INPUT_DTYPES  # pylint: disable=import-outside-toplevel

    if declared_dtype == "float32" and spec.dtype in INTEGER_INPUT_DTYPES + ("float16",
                                                                            "bfloat16"):
        return  # the converted model takes it in that dtype (checked against --dtype later)
    raise UsageError(f"--input {name}: the model takes {declared_dtype}, not {spec.dtype}; a "
                     f"float32 input can be fed as uint8/int8 images or in the low-precision "
                     "dtype, other inputs keep the dtype the model declares")


def _import_onnx(path: str, specs: dict, notes: list) -> Imported:
    import onnx  # pylint: disable=import-outside-toplevel
    from tvm import relax  # pylint: disable=import-outside-toplevel

    from .models import import_onnx  # pylint: disable=import-outside-toplevel

    try:
        model = onnx.load(path)
    except Exception as err:  # pylint: disable=broad-except  # protobuf errors vary
        raise UsageError(f"cannot read {path!r} as ONNX ({one_line(err)}); give "
                         f"{FORMATS_TEXT}") from None
    if not model.graph.node:
        raise UsageError(f"{path!r} holds no ONNX graph; give {FORMATS_TEXT}")
    initializers = {i.name for i in model.graph.initializer}
    declared = []
    for value in model.graph.input:
        if value.name in initializers:
            continue
        tensor = value.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else d.dim_param or "?"
                for d in tensor.shape.dim]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type).name
        declared.append((value.name, dims, dtype))
    specs = _resolve_specs(specs, declared, path)
    shapes = _input_shapes(declared, specs, path)
    for name, _, dtype in declared:
        _check_dtype(specs.get(name), dtype, name)
    shape_dict = {name: list(shape) for name, shape in shapes.items()}
    mod = import_onnx(model, shape_dict, notes)
    func = mod["main"]
    if relax.analysis.defined_symbolic_vars(func) or _has_unknown_shape(func.ret_ty):
        mod = import_onnx(model, shape_dict, notes, simplify=True)  # fold data-dependent shapes
    params = list(mod["main"].params)
    inputs = [ModelInput(p.name, name, shapes[name], dtype)
              for p, (name, _, dtype) in zip(params, declared)]
    return Imported(mod, inputs, notes)


def _has_unknown_shape(ty) -> bool:
    from tvm import relax  # pylint: disable=import-outside-toplevel

    if isinstance(ty, relax.TensorType):
        return ty.shape is None
    if isinstance(ty, relax.TupleType):
        return any(_has_unknown_shape(field) for field in ty.fields)
    return False


_TFLITE_TYPES = {0: "float32", 1: "float16", 2: "int32", 3: "uint8", 4: "int64", 6: "bool",
                 7: "int16", 9: "int8", 10: "float64"}


def _import_tflite(path: str, specs: dict, notes: list) -> Imported:
    import tflite  # pylint: disable=import-outside-toplevel
    from tvm.relax.frontend.tflite import from_tflite  # pylint: disable=import-outside-toplevel

    with open(path, "rb") as handle:
        model = tflite.Model.GetRootAsModel(handle.read(), 0)
    try:
        graph = model.Subgraphs(0)
        declared = []
        for i in range(graph.InputsLength()):
            tensor = graph.Tensors(graph.Inputs(i))
            shape = [int(d) for d in tensor.ShapeAsNumpy()] if tensor.ShapeLength() else []
            signature = ([int(d) for d in tensor.ShapeSignatureAsNumpy()]
                         if tensor.ShapeSignatureLength() else shape)
            dims = [d if s >= 0 else "?" for d, s in zip(shape, signature)]
            declared.append((tensor.Name().decode(), dims,
                             _TFLITE_TYPES.get(tensor.Type(), "float32")))
    except Exception as err:  # pylint: disable=broad-except  # a corrupt flatbuffer
        raise UsageError(f"cannot read {path!r} as TFLite ({one_line(err)})") from None
    specs = _resolve_specs(specs, declared, path)
    shapes = _input_shapes(declared, specs, path)
    for name, _, dtype in declared:
        _check_dtype(specs.get(name), dtype, name)
    try:
        imported = from_tflite(model, {n: shapes[n] for n, _, _ in declared},
                               {n: d for n, _, d in declared})
    except Exception as err:  # pylint: disable=broad-except
        raise ConvertFailure(f"TVM cannot import {path}: {one_line(err)}") from None
    mod = imported[0] if isinstance(imported, tuple) else imported
    params = list(mod["main"].params)
    inputs = [ModelInput(p.name, name, shapes[name], dtype)
              for p, (name, _, dtype) in zip(params, declared)]
    return Imported(mod, inputs, notes)


def _import_pt2(path: str, specs: dict, notes: list) -> Imported:
    try:
        import torch  # pylint: disable=import-outside-toplevel
    except ImportError:
        raise UsageError("reading .pt2 files needs torch: pip install -r requirements.txt") \
            from None
    import tvm  # pylint: disable=import-outside-toplevel
    from tvm.relax.frontend.torch import (  # pylint: disable=import-outside-toplevel
        from_exported_program,
    )

    from ..execution import with_function  # pylint: disable=import-outside-toplevel

    try:
        program = torch.export.load(path)
    except Exception as err:  # pylint: disable=broad-except
        raise UsageError(f"cannot read {path!r} as a torch.export program ({one_line(err)}); "
                         "save one with torch.export.save") from None
    try:
        mod = from_exported_program(program, unwrap_unit_return_tuple=True)
    except Exception as err:  # pylint: disable=broad-except
        raise ConvertFailure(f"TVM cannot import {path}: {one_line(err)}") from None
    func = mod["main"]
    declared = []
    for param in func.params:
        dims = [int(d) if isinstance(d, tvm.tirx.IntImm) else str(d)
                for d in param.ty.shape.values]
        declared.append((param.name, dims, str(param.ty.dtype)))
    specs = _resolve_specs(specs, declared, path)
    shapes = _input_shapes(declared, specs, path)
    bindings = {}
    for param, (name, _, dtype) in zip(func.params, declared):
        _check_dtype(specs.get(name), dtype, name)
        for dim, value in zip(param.ty.shape.values, shapes[name]):
            if not isinstance(dim, tvm.tirx.IntImm):
                bindings[dim] = value
    if bindings:
        func = func.bind_symbolic_vars(bindings)
        mod = with_function(mod, "main", func)
        notes.append("symbolic dimensions bound to the --input shapes: "
                     + ", ".join(f"{var}={value}" for var, value in bindings.items()))
    inputs = [ModelInput(name, name, shapes[name], dtype) for name, _, dtype in declared]
    return Imported(mod, inputs, notes)


def import_model(path: str, fmt: str, specs: dict) -> Imported:
    """Import ``path`` (format ``fmt``) as a Relax module with concrete input shapes."""
    importer = {"onnx": _import_onnx, "tflite": _import_tflite, "pt2": _import_pt2}[fmt]
    notes: list = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            imported = importer(path, specs, notes)
        except (UsageError, ConvertFailure):
            raise
        except Exception as err:  # pylint: disable=broad-except  # frontends raise many types
            raise ConvertFailure(f"TVM cannot import {path}: {one_line(err)}") from None
    for message in dict.fromkeys(str(w.message).strip() for w in caught):
        if message:  # the frontends' warnings (renamed inputs, ...) go to the report, not stderr
            imported.notes.append(f"import: {message}")
    if not imported.inputs:
        raise ConvertFailure(f"{path} has no data inputs to feed")
    return imported


# ------------------------------------------------------------------------------ calibration
def image_layout(shape: tuple) -> tuple | None:
    """``(layout, channels, height, width)`` of an image-batch shape, or None."""
    if len(shape) != 4:
        return None
    if shape[1] in (1, 3) and shape[3] not in (1, 3):
        return "NCHW", shape[1], shape[2], shape[3]
    if shape[3] in (1, 3):
        return "NHWC", shape[3], shape[1], shape[2]
    if shape[1] in (1, 3):
        return "NCHW", shape[1], shape[2], shape[3]
    return None


def list_images(folder: str) -> list:
    files = sorted(os.path.join(folder, f) for f in os.listdir(folder)
                   if f.lower().endswith(IMAGE_EXTENSIONS) and not f.startswith("."))
    return [f for f in files if os.path.isfile(f)]


def load_image(path: str, channels: int, height: int, width: int) -> np.ndarray:
    """One image as uint8 ``(height, width, channels)``: centre-cropped to the aspect ratio, then
    resized with Pillow's bilinear filter."""
    from PIL import Image  # pylint: disable=import-outside-toplevel

    try:
        with Image.open(path) as opened:
            picture = opened.convert("RGB" if channels == 3 else "L")
    except Exception as err:  # pylint: disable=broad-except  # PIL raises many types
        raise UsageError(f"cannot read image {path!r} ({one_line(err)}); remove it from the "
                         "calibration folder") from None
    scale = min(picture.width / width, picture.height / height)
    crop_w, crop_h = max(1, round(width * scale)), max(1, round(height * scale))
    left, top = (picture.width - crop_w) // 2, (picture.height - crop_h) // 2
    picture = picture.crop((left, top, left + crop_w, top + crop_h))
    array = np.asarray(picture.resize((width, height), Image.BILINEAR), dtype=np.uint8)
    return array.reshape(height, width, channels)


def normalization_spec(normalize, layout: str, channels: int) -> dict:
    """``--normalize`` as relay_amp's ``input_normalization`` for uint8 pixels."""
    axis = 1 if layout == "NCHW" else 3
    if normalize == "none":
        return {"scale": 1.0 / 255.0, "offset": 0.0}
    mean, std = normalize
    if len(mean) != channels:
        mean, std = (mean * channels)[:channels], (std * channels)[:channels]
    return {"mean": [255.0 * m for m in mean], "std": [255.0 * s for s in std], "axis": axis}


def apply_normalization(array: np.ndarray, spec: dict) -> np.ndarray:
    """Integer values to float32 the way relay_amp folds ``spec`` into a converted input."""
    values = array.astype(np.float32)
    if "scale" in spec:
        return values * np.float32(spec["scale"]) + np.float32(spec["offset"])
    shape = [1] * values.ndim
    shape[spec["axis"]] = -1
    mean = np.asarray(spec["mean"], np.float32).reshape(shape)
    std = np.asarray(spec["std"], np.float32).reshape(shape)
    return (values - mean) / std


@dataclass
class Calibration:
    """Calibration data: what the float32 model and the converted model are fed, per batch."""

    reference: list  # batches (lists in parameter order) for the float32 model
    converted: list  # the same for the converted model (integer or low-precision inputs)
    source: dict


def _feed_dtype(name: str, io: dict) -> str | None:
    return io.get(name)


def load_images(folder: str, inputs: list, normalize, io: dict, limit: int | None,
                progress: bool) -> Calibration:
    """Batches from a folder of images for a model with one image input."""
    from tqdm import tqdm  # pylint: disable=import-outside-toplevel

    files = list_images(folder)
    if not files:
        raise UsageError(f"no images in {folder!r} (looked for {', '.join(IMAGE_EXTENSIONS)}); "
                         "give a folder of images or an .npz of arrays per input name")
    if len(inputs) != 1:
        raise UsageError(f"a folder of images feeds a model with one input; this one has "
                         f"{len(inputs)} ({', '.join(i.source for i in inputs)}): give an .npz "
                         "with an array per input name")
    model_input = inputs[0]
    layout = image_layout(model_input.shape)
    if layout is None:
        raise UsageError(f"input {model_input.source!r} has shape {list(model_input.shape)}, not "
                         "an image batch (N,3,H,W) or (N,H,W,3): give an .npz instead of images")
    order, channels, height, width = layout
    integer_model = model_input.dtype.startswith(("uint", "int"))
    feed = _feed_dtype(model_input.name, io)
    if normalize is None and not integer_model:
        raise UsageError("images need --normalize (how the model expects its pixels): "
                         f"{NORMALIZE_HELP}")
    if limit:
        files = files[:limit]
    batch = model_input.shape[0]
    count = max(1, -(-len(files) // batch))
    files = [files[i % len(files)] for i in range(count * batch)]
    pixels = []
    for path in tqdm(files, desc="calibration images", unit="image", disable=not progress):
        pixels.append(load_image(path, channels, height, width))
    reference, converted = [], []
    spec = None if integer_model else normalization_spec(normalize, order, channels)
    for start in range(0, len(pixels), batch):
        array = np.stack(pixels[start:start + batch])  # NHWC uint8
        if order == "NCHW":
            array = array.transpose(0, 3, 1, 2)
        array = np.ascontiguousarray(array)
        if integer_model:
            reference.append([array.astype(model_input.dtype)])
            converted.append([array.astype(model_input.dtype)])
            continue
        floats = apply_normalization(array, spec)
        reference.append([floats])
        if feed in ("float16", "bfloat16"):
            converted.append([_low(floats, feed)])
        elif feed is not None:
            converted.append([array.astype(feed)])
        else:
            converted.append([floats])
    source = {"kind": "images", "path": os.path.abspath(folder), "images": len(set(files)),
              "batches": len(reference), "layout": order,
              "normalize": None if integer_model else spec}
    return Calibration(reference, converted, source)


def _low(array: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "float16":
        return array.astype(np.float16)
    import ml_dtypes  # pylint: disable=import-outside-toplevel

    return array.astype(ml_dtypes.bfloat16)


def load_npz(path: str, inputs: list, io: dict, normalize, limit: int | None) -> Calibration:
    """Batches from an ``.npz`` with one array per input name: the input's shape (one batch) or
    a stack of batches along a new or the batch axis."""
    try:
        archive = np.load(path, allow_pickle=False)
        arrays = {key: archive[key] for key in archive.files}
    except Exception as err:  # pylint: disable=broad-except
        raise UsageError(f"cannot read {path!r} as an .npz of arrays ({one_line(err)})") \
            from None
    names = {}
    for model_input in inputs:
        for key in (model_input.source, model_input.name):
            if key in arrays:
                names[model_input.name] = key
                break
    missing = [i.source for i in inputs if i.name not in names]
    extra = sorted(set(arrays) - set(names.values()))
    if missing:
        hint = f" (it has {', '.join(sorted(arrays))})" if arrays else " (it is empty)"
        raise UsageError(f"{os.path.basename(path)} has no array for input(s) "
                         f"{', '.join(missing)}{hint}: save one array per input name")
    if extra:
        raise UsageError(f"{os.path.basename(path)} has arrays {', '.join(extra)} that are not "
                         f"inputs of the model (its inputs: {', '.join(i.source for i in inputs)})")
    per_input = {}
    for model_input in inputs:
        array, shape = arrays[names[model_input.name]], tuple(model_input.shape)
        if array.shape == shape:
            batches = [array]
        elif array.shape[1:] == shape:
            batches = list(array)
        elif shape and array.ndim == len(shape) and array.shape[1:] == shape[1:] and \
                array.shape[0] % shape[0] == 0:
            batches = [array[i:i + shape[0]] for i in range(0, array.shape[0], shape[0])]
        else:
            raise UsageError(f"array {names[model_input.name]!r} has shape {list(array.shape)}; "
                             f"input {model_input.source!r} takes {list(shape)} (or a stack of "
                             "them along a first axis)")
        per_input[model_input.name] = batches
    counts = {len(b) for b in per_input.values()}
    if len(counts) != 1:
        raise UsageError(f"the arrays in {os.path.basename(path)} hold different numbers of "
                         "batches per input; give each input the same number")
    count = counts.pop()
    if limit:
        count = min(count, limit)
    reference, converted = [], []
    for index in range(count):
        ref_batch, conv_batch = [], []
        for model_input in inputs:
            array = per_input[model_input.name][index]
            feed = _feed_dtype(model_input.name, io)
            kind = np.dtype(model_input.dtype).kind if model_input.dtype != "bfloat16" else "f"
            if feed is not None and feed not in ("float16", "bfloat16"):
                if array.dtype.kind not in "ui":
                    raise UsageError(f"array {names[model_input.name]!r} is {array.dtype}; input "
                                     f"{model_input.source!r} is fed as {feed}: save {feed} "
                                     "values")
                spec = io_normalization(model_input, normalize)
                ref_batch.append(apply_normalization(array, spec))
                conv_batch.append(array.astype(feed))
                continue
            if kind in "ui" and array.dtype.kind == "f":
                raise UsageError(f"array {names[model_input.name]!r} is {array.dtype}; input "
                                 f"{model_input.source!r} takes {model_input.dtype}")
            value = np.ascontiguousarray(array.astype(model_input.dtype))
            ref_batch.append(value)
            conv_batch.append(_low(value, feed) if feed else value)
        reference.append(ref_batch)
        converted.append(conv_batch)
    source = {"kind": "npz", "path": os.path.abspath(path), "batches": count}
    return Calibration(reference, converted, source)


def io_normalization(model_input: ModelInput, normalize) -> dict:
    """The normalization folded into an integer-fed input."""
    layout = image_layout(model_input.shape)
    order, channels = (layout[0], layout[1]) if layout else ("NCHW", 1)
    return normalization_spec(normalize, order, channels)


# ------------------------------------------------------------------------------ conversion
@dataclass
class Options:
    """What ``relay-amp convert`` was asked to do (validated by :func:`check_options`)."""

    model: str
    out: str
    dtype: str | None = None
    target: str = "host"
    calibrate: str | None = None
    tolerance: float | None = None
    metric: str = "relative_l2"
    max_evaluations: int = 16
    inputs: list = field(default_factory=list)  # InputSpec
    normalize: str | None = None
    policy: str | None = None
    fp32_ops: list = field(default_factory=list)
    exclude: list = field(default_factory=list)
    max_samples: int | None = None
    progress: bool = True
    command: str = ""


@dataclass
class Checked:
    """Options after validation, everything that needs no model import."""

    fmt: str
    specs: dict
    target: dict
    target_notes: list
    policy: object  # relay_amp.Policy (dtype, fp32 ops, exclusions)
    normalize: object
    calibration_kind: str | None


def check_out(out: str) -> None:
    if not out:
        raise UsageError("-o OUT is empty: name the folder to write")
    if os.path.exists(out) and not os.path.isdir(out):
        raise UsageError(f"-o {out!r} is a file; name a folder (it will hold model.so and the "
                         "reports)")
    if os.path.isdir(out):
        present = set(os.listdir(out))
        foreign = sorted(present - set(OUTPUT_FILES))
        if foreign or (present and "report.json" not in present):
            raise UsageError(f"-o {out!r} already holds files that relay-amp convert did not "
                             f"write ({', '.join(foreign or sorted(present))}); name a new or "
                             "empty folder")


def _exclusion_names(values: list) -> tuple[list, list]:
    names, patterns = [], []
    for value in values:
        if value.startswith("re:"):
            patterns.append(value[3:])
        else:
            names.append(value)
    return names, patterns


def check_options(options: Options) -> Checked:
    """Every check that needs no model import; raises :class:`UsageError`."""
    from ..policy import Policy  # pylint: disable=import-outside-toplevel

    fmt = detect_format(options.model)
    check_out(options.out)
    specs = {}
    for spec in options.inputs:
        if spec.name in specs:
            raise UsageError(f"--input {spec.name} is given twice; give each input once")
        specs[spec.name] = spec
    if options.dtype is not None and options.dtype not in ("float16", "bfloat16"):
        close = difflib.get_close_matches(options.dtype, ["float16", "bfloat16"], n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        raise UsageError(f"--dtype {options.dtype!r}: {hint}use float16 or bfloat16")
    if options.dtype is None and options.policy is None:
        raise UsageError("give --dtype float16 or --dtype bfloat16 (or a --policy file that "
                         "names one)")
    if options.tolerance is not None:
        if not (math.isfinite(options.tolerance) and options.tolerance > 0):
            raise UsageError(f"--tolerance {options.tolerance:g}: give a positive number, e.g. "
                             "--tolerance 0.01 (relative L2 error against float32)")
        if options.calibrate is None:
            raise UsageError("--tolerance needs data to measure on: add --calibrate DIR (images) "
                             "or --calibrate FILE.npz")
    if options.max_evaluations < 1:
        raise UsageError("--max-evaluations must be at least 1")
    if options.max_samples is not None and options.max_samples < 1:
        raise UsageError("--max-samples must be at least 1")
    calibration_kind = None
    if options.calibrate is not None:
        if not os.path.exists(options.calibrate):
            raise UsageError(f"--calibrate {options.calibrate!r} does not exist; give a folder of "
                             "images or an .npz of arrays per input name")
        if os.path.isdir(options.calibrate):
            calibration_kind = "images"
            if not list_images(options.calibrate):
                raise UsageError(f"no images in {options.calibrate!r} (looked for "
                                 f"{', '.join(IMAGE_EXTENSIONS)}); give a folder of images or "
                                 "an .npz of arrays per input name")
        elif options.calibrate.lower().endswith(".npz"):
            calibration_kind = "npz"
        else:
            raise UsageError(f"--calibrate {options.calibrate!r} is neither a folder of images nor "
                             "an .npz file")
    normalize = parse_normalize(options.normalize)
    if options.policy is not None:
        policy = _read_policy(options.policy)
    else:
        policy = Policy(options.dtype)
    if options.dtype is not None and options.dtype != policy.dtype:
        policy = policy.with_dtype(options.dtype)
    fp32_ops = split_list(options.fp32_ops)
    try:
        if fp32_ops:
            policy.fp32(*fp32_ops)
    except (ValueError, TypeError) as err:
        raise UsageError(f"--fp32-ops: {one_line(err)}".replace(" in set_category(fp32)", "")) \
            from None
    names, patterns = _exclusion_names(split_list(options.exclude))
    try:
        policy.exclude(*names)
        policy.exclude(*patterns, regex=True)
    except (ValueError, TypeError) as err:
        raise UsageError(f"--exclude: {one_line(err)}") from None
    target, target_notes = parse_target(options.target)
    return Checked(fmt, specs, target, target_notes, policy, normalize, calibration_kind)


def _read_policy(path: str):
    from ..policy import Policy  # pylint: disable=import-outside-toplevel

    if not os.path.isfile(path):
        raise UsageError(f"--policy {path!r} does not exist; give a policy.json (a convert run "
                         "writes one to its OUT folder)")
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise UsageError(f"--policy {path!r} is not JSON ({one_line(err)})") from None
    try:
        return Policy.from_dict(data)
    except (ValueError, TypeError, KeyError) as err:
        raise UsageError(f"--policy {path}: {one_line(err)}") from None


def _binding_names(mod) -> set:
    from tvm import relax  # pylint: disable=import-outside-toplevel

    names = set()
    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            params = {param.name for param in func.params}
            names |= {var.name for var in relax.analysis.all_vars(func)} - params
    return names


def _check_exclusions(mod, given: list) -> None:
    """Names in ``--exclude`` must be bindings of the model (regexes are not checked)."""
    names, _ = _exclusion_names(given)
    known = _binding_names(mod)
    for name in names:
        if name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=3)
            hint = f"did you mean {', '.join(close)}? " if close else ""
            raise UsageError(f"--exclude {name!r} is not a binding of the model; {hint}the "
                             "binding names are the report's 'binding' column (run once without "
                             "--exclude and see report.md)")


def _io_settings(policy, checked: Checked, imported: Imported, dtype: str):
    """The converted model's input dtypes: ``--input NAME:SHAPE:DTYPE`` and the policy's own."""
    from ..policy import INTEGER_INPUT_DTYPES  # pylint: disable=import-outside-toplevel

    data = policy.to_dict()
    by_source = {i.source: i for i in imported.inputs}
    for source, spec in checked.specs.items():
        model_input = by_source[source]
        if spec.dtype is None or spec.dtype == model_input.dtype:
            continue
        if spec.dtype in ("float16", "bfloat16"):
            if spec.dtype != dtype:
                raise UsageError(f"--input {source}: {spec.dtype} input with --dtype {dtype}; "
                                 f"feed it as {dtype} or float32")
            if model_input.name not in data["low_precision_inputs"]:
                data["low_precision_inputs"].append(model_input.name)
        elif spec.dtype in INTEGER_INPUT_DTYPES:
            if checked.normalize is None:
                raise UsageError(f"--input {source}: fed as {spec.dtype}, the model needs to know "
                                 f"how to scale it: add --normalize {NORMALIZE_HELP}")
            data["input_dtypes"][model_input.name] = spec.dtype
            data["input_normalization"][model_input.name] = io_normalization(
                model_input, checked.normalize)
    io = dict(data["input_dtypes"])
    io.update({name: dtype for name in data["low_precision_inputs"]})
    params = {i.name for i in imported.inputs}
    stray = sorted(set(io) - params)
    if stray:
        raise UsageError(f"the policy feeds {', '.join(stray)} in another dtype, but the model "
                         f"has no such input (its inputs: {', '.join(sorted(params))})")
    return data, io


def _without_io(data: dict) -> dict:
    return {**data, "input_dtypes": {}, "input_normalization": {}, "low_precision_inputs": []}


@contextlib.contextmanager
def _stage(desc: str, progress: bool):
    """A one-step progress bar for a step whose progress TVM does not report."""
    from tqdm import tqdm  # pylint: disable=import-outside-toplevel

    bar = tqdm(total=1, desc=desc, disable=not progress, bar_format="{desc}: {bar} {elapsed}")
    try:
        yield bar
        bar.update(1)
    finally:
        bar.close()


def _cross_compiler(target: dict):
    """``(fcompile or None, library file name, note)`` for exporting an llvm target."""
    import tvm  # pylint: disable=import-outside-toplevel

    triple = target.get("mtriple")
    if target.get("kind") != "llvm" or not triple:
        return None, "model.so", None
    here = tvm.target.codegen.llvm_get_system_triple().split("-")[0]
    arch = triple.split("-")[0]
    if arch == here or (arch, here) in (("x86_64", "x86_64"),):
        return None, "model.so", None
    from tvm.support import cc  # pylint: disable=import-outside-toplevel

    for compiler in (f"{triple}-g++", f"{triple}-gcc"):
        if shutil.which(compiler):
            return cc.cross_compiler(compiler), "model.so", f"linked with {compiler}"
    return None, "model.tar", (f"no {triple}-g++ here to link the library: model.tar holds the "
                               "object files, and tvm.runtime.load_module('model.tar') links them "
                               f"on the {arch} machine (or install {triple}-g++ here and convert "
                               "again for a model.so)")


def _build(mod, target: dict, folder: str):
    """Compile for ``target`` and export; returns ``(executable, library file name, note)``."""
    import tvm  # pylint: disable=import-outside-toplevel

    from .gpu_bench import compile_module  # pylint: disable=import-outside-toplevel

    executable = compile_module(mod, tvm.target.Target(target))
    fcompile, library, note = _cross_compiler(target)
    path = os.path.join(folder, library)
    if fcompile is not None:
        executable.export_library(path, fcompile=fcompile)
    else:
        executable.export_library(path)
    return executable, library, note


def _runs_here(target: dict) -> bool:
    import tvm  # pylint: disable=import-outside-toplevel

    if target.get("kind") != "llvm":
        return False
    triple = target.get("mtriple")
    here = tvm.target.codegen.llvm_get_system_triple().split("-")[0]
    if triple and triple.split("-")[0] != here:
        return False
    features = target.get("mattr") or []
    cpu = target.get("mcpu")
    return not features and (cpu is None or cpu == tvm.target.codegen.llvm_get_system_cpu())


def measure_accuracy(mod, converted, executable, target: dict, data: Calibration,
                     progress: bool) -> dict:
    """float32 vs the converted model on the calibration data, both run on this CPU."""
    from tvm import relax  # pylint: disable=import-outside-toplevel

    from ..execution import agreement, compile_module, run  # pylint: disable=C0415

    with _stage("accuracy: compile float32 for this CPU", progress):
        reference_vm = compile_module(mod)
    if executable is not None and _runs_here(target):
        import tvm  # pylint: disable=import-outside-toplevel

        converted_vm = relax.VirtualMachine(executable, tvm.cpu())
        where = "the built library, on this CPU"
    else:
        with _stage("accuracy: compile the converted model for this CPU", progress):
            converted_vm = compile_module(converted)
        where = "this CPU (the converted module compiled for it; the library's target differs)"
    from tqdm import tqdm  # pylint: disable=import-outside-toplevel

    references, outputs, per_batch = [], [], []
    for ref_batch, conv_batch in tqdm(list(zip(data.reference, data.converted)),
                                      desc="accuracy", unit="batch", disable=not progress):
        ref = run(reference_vm, ref_batch)
        out = run(converted_vm, conv_batch)
        references.extend(ref)
        outputs.extend(out)
        per_batch.append(agreement(ref, out).as_dict())
    overall = agreement(references, outputs).as_dict()
    count = len(data.reference)
    outputs_per_batch = len(references) // max(count, 1)
    per_output = []
    for k in range(outputs_per_batch):
        pick = slice(k, None, outputs_per_batch)
        per_output.append({"output": k, "shape": list(references[k].shape),
                           **agreement(references[pick], outputs[pick]).as_dict()})
    return {"ran_on": where, "batches": count, "source": data.source, **overall,
            "worst_batch_relative_l2": max(b["relative_l2"] for b in per_batch),
            "outputs": per_output, "per_batch": per_batch}


def _json_safe(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def convert_model(options: Options) -> dict:
    """Do everything ``relay-amp convert`` does; returns the saved report's data.

    Raises :class:`UsageError` for a bad argument (nothing is written) and
    :class:`ConvertFailure` when a step fails; OUT is complete or untouched either way.
    """
    checked = check_options(options)
    out = os.path.abspath(options.out)
    parent = os.path.dirname(out)
    created = None
    probe = parent
    while not os.path.exists(probe):
        created, probe = probe, os.path.dirname(probe)
    os.makedirs(parent, exist_ok=True)
    work = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.partial-", dir=parent)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(work, 0o777 & ~umask)  # mkdtemp's 0700 would become OUT's mode
    try:
        data = _convert_into(options, checked, work)
        _replace(work, out)
        return data
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        if created is not None:
            shutil.rmtree(created, ignore_errors=True)
        raise


def _replace(work: str, out: str) -> None:
    """Move the finished folder to ``out`` (replacing a previous convert output there)."""
    if os.path.isdir(out):
        old = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.old-", dir=os.path.dirname(out))
        os.rmdir(old)
        os.rename(out, old)
        os.rename(work, out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(work, out)


def _convert_into(options: Options, checked: Checked, work: str) -> dict:
    import relay_amp  # pylint: disable=import-outside-toplevel

    from ..policy import Policy  # pylint: disable=import-outside-toplevel

    progress, timings = options.progress, {}
    notes = list(checked.target_notes)
    for note in notes:
        print(f"relay-amp convert: {note}", file=sys.stderr)
    start = time.perf_counter()
    with _stage(f"import {os.path.basename(options.model)}", progress):
        imported = import_model(options.model, checked.fmt, checked.specs)
    timings["import_s"] = time.perf_counter() - start
    notes.extend(imported.notes)
    mod = imported.mod
    _check_exclusions(mod, split_list(options.exclude))
    dtype = checked.policy.dtype
    policy_data, io = _io_settings(checked.policy, checked, imported, dtype)
    search_policy = Policy.from_dict(_without_io(policy_data))

    data = None
    if checked.calibration_kind == "images":
        data = load_images(options.calibrate, imported.inputs, checked.normalize, io,
                           options.max_samples, progress)
    elif checked.calibration_kind == "npz":
        data = load_npz(options.calibrate, imported.inputs, io, checked.normalize,
                        options.max_samples)
    calibration = None
    if data is not None:
        start = time.perf_counter()
        with _stage(f"calibrate ({len(data.reference)} batches, float32 on this CPU)", progress):
            try:
                calibration = relay_amp.calibrate(mod, data.reference)
            except ValueError as err:
                raise UsageError(f"--calibrate: {one_line(err)}") from None
        timings["calibrate_s"] = time.perf_counter() - start

    search, search_reasons = None, {}
    fp32_bindings: list = []
    if options.tolerance is not None:
        from tqdm import tqdm  # pylint: disable=import-outside-toplevel

        start = time.perf_counter()
        bar = tqdm(total=options.max_evaluations, desc=f"search (tolerance {options.tolerance:g})",
                   unit="evaluation", disable=not progress)
        def step(fp32, value):
            bar.update(1)
            bar.set_postfix_str(f"{len(fp32)} float32, error {value:.3g}")

        try:
            _, searched = relay_amp.auto_mixed_precision(
                mod, data.reference, options.tolerance, metric=options.metric, dtype=dtype,
                target=checked.target, max_evaluations=options.max_evaluations,
                policy=search_policy, calibrated=calibration if calibration is not None else True,
                on_evaluation=step)
        except RuntimeError as err:
            raise ConvertFailure(f"{one_line(err)}: raise --tolerance or --max-evaluations") \
                from None
        finally:
            bar.close()
        timings["search_s"] = time.perf_counter() - start
        search = searched.search
        fp32_bindings = list(search.fp32_bindings)
        search_reasons = {row.name: row.reasons for row in searched.rows
                          if row.function == "main" and row.name in fp32_bindings}

    final_data = dict(policy_data)
    final_data["exclude_names"] = list(policy_data["exclude_names"]) + [
        name for name in fp32_bindings if name not in policy_data["exclude_names"]]
    policy = Policy.from_dict(final_data)
    start = time.perf_counter()
    with _stage(f"convert to {dtype}", progress):
        converted, report = relay_amp.convert(mod, policy=policy, target=checked.target,
                                              calibration=calibration)
    timings["convert_s"] = time.perf_counter() - start
    if search_reasons:
        import dataclasses  # pylint: disable=import-outside-toplevel

        report.rows = [dataclasses.replace(row, reasons=search_reasons[row.name])
                       if row.function == "main" and row.name in search_reasons else row
                       for row in report.rows]
    report.search = search

    start = time.perf_counter()
    with _stage(f"build for {checked.target.get('kind')}", progress):
        try:
            executable, library, build_note = _build(converted, checked.target, work)
        except (UsageError, ConvertFailure):
            raise
        except Exception as err:  # pylint: disable=broad-except  # TVM raises many types
            raise ConvertFailure(f"compiling for {options.target} failed: {one_line(err)}") \
                from None
    timings["build_s"] = time.perf_counter() - start
    if build_note:
        notes.append(build_note)

    accuracy = None
    if data is not None:
        start = time.perf_counter()
        accuracy = measure_accuracy(mod, converted, executable, checked.target, data, progress)
        if options.tolerance is not None:
            accuracy["tolerance"] = options.tolerance
            accuracy["metric"] = options.metric
        timings["accuracy_s"] = time.perf_counter() - start
        with open(os.path.join(work, "accuracy.json"), "w", encoding="utf-8") as handle:
            json.dump(_json_safe(accuracy), handle, indent=2)

    with open(os.path.join(work, "policy.json"), "w", encoding="utf-8") as handle:
        handle.write(policy.to_json() + "\n")
    import tvm  # pylint: disable=import-outside-toplevel

    saved = {
        "report_format": REPORT_FORMAT,
        "relay_amp_version": relay_amp.__version__,
        "command": options.command,
        "model": {"path": os.path.abspath(options.model), "format": checked.fmt,
                  "inputs": [{"name": i.source, "parameter": i.name, "shape": list(i.shape),
                              "dtype": i.dtype, "fed_as": io.get(i.name, i.dtype)}
                             for i in imported.inputs]},
        "dtype": dtype,
        "target": _plain(tvm.target.Target(checked.target).export()),
        "target_given": options.target,
        "library": library,
        "policy": "policy.json",
        "calibration": data.source if data is not None else None,
        "tolerance": options.tolerance,
        "accuracy": ({k: v for k, v in accuracy.items() if k not in ("per_batch", "outputs")}
                     if accuracy else None),
        "timings_s": timings,
        "notes": notes,
        "conversion": report.to_dict(),
    }
    saved = _json_safe(saved)
    with open(os.path.join(work, "report.json"), "w", encoding="utf-8") as handle:
        json.dump(saved, handle, indent=2)
    with open(os.path.join(work, "report.md"), "w", encoding="utf-8") as handle:
        handle.write(markdown_report(saved))
    return saved


# ------------------------------------------------------------------------------ reports
def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


def _md_cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def loading_snippet(saved: dict) -> list:
    library = saved["library"]
    if saved["target"].get("kind") == "cuda":
        return [
            "```python",
            "import tvm",
            "from relay_amp.eval.bundle_runner import enable_cuda  # NVRTC compiles the CUDA "
            "source at load",
            "enable_cuda(tvm, 'nvrtc')",
            f"vm = tvm.runtime.vm.VirtualMachine(tvm.runtime.load_module('{library}'), "
            "tvm.cuda())",
            "outputs = vm['main'](*[tvm.runtime.tensor(x, tvm.cuda()) for x in inputs])",
            "```",
        ]
    return [
        "```python",
        "import tvm",
        f"vm = tvm.runtime.vm.VirtualMachine(tvm.runtime.load_module('{library}'), tvm.cpu())",
        "outputs = vm['main'](*[tvm.runtime.tensor(x) for x in inputs])",
        "```",
    ]


def markdown_report(saved: dict) -> str:
    """report.md: what was converted, how, how well, and how to load it."""
    conversion = saved["conversion"]
    target = saved["target"]
    target_text = ", ".join(f"{k}={v}" for k, v in target.items()
                            if k in ("kind", "arch", "mcpu", "mtriple", "mattr"))
    lines = [f"# relay-amp convert: {os.path.basename(saved['model']['path'])}", "",
             f"`{saved['command']}`" if saved.get("command") else "", "",
             "| | |", "|---|---|",
             f"| model | `{saved['model']['path']}` ({saved['model']['format']}) |",
             "| inputs | " + "; ".join(
                 f"`{i['name']}` {'x'.join(map(str, i['shape']))} {i['dtype']}"
                 + (f" (fed as {i['fed_as']})" if i["fed_as"] != i["dtype"] else "")
                 for i in saved["model"]["inputs"]) + " |",
             f"| dtype | {saved['dtype']} |",
             f"| target | {target_text} |",
             f"| library | `{saved['library']}` |",
             f"| policy | `{saved['policy']}` (re-use with `--policy`) |", "",
             "## Summary", "", conversion["summary"], ""]
    if saved.get("accuracy"):
        acc = saved["accuracy"]
        lines += ["## Accuracy on the calibration data", "",
                  f"float32 vs converted over {acc['batches']} batches, run on {acc['ran_on']}:",
                  "", "| relative L2 | max abs | cosine | NaN/Inf | worst batch rel. L2 |",
                  "|---|---|---|---|---|",
                  f"| {_fmt(acc['relative_l2'])} | {_fmt(acc['max_abs'])} | "
                  f"{_fmt(acc['cosine'])} | {acc['nonfinite']} | "
                  f"{_fmt(acc['worst_batch_relative_l2'])} |", ""]
    search = conversion.get("search")
    if search:
        lines += ["## Accuracy-driven fallback", "",
                  f"Tolerance {search['tolerance']:g} ({'met' if search['met'] else 'not met'}: "
                  f"{search['metric_value']:.3g}) with {len(search['fp32_bindings'])} binding(s) "
                  f"kept in float32 ({', '.join(search['fp32_bindings']) or 'none'}), "
                  f"{search['evaluations']} evaluations, {search['seconds']:.1f} s.", ""]
    if conversion.get("notes") or saved.get("notes"):
        lines += ["## Notes", ""]
        lines += [f"- {_md_cell(n)}" for n in saved.get("notes", []) + conversion["notes"]]
        lines.append("")
    lines += ["## Load it", ""] + loading_snippet(saved) + [""]
    lines += ["## Every binding", "",
              "| function | binding | op | inputs | compute | acc | output | casts | rule |",
              "|---|---|---|---|---|---|---|---|---|"]
    for row in conversion["rows"]:
        lines.append("| " + " | ".join(_md_cell(v) for v in (
            row["function"], row["name"], row["op"], ",".join(row["input_dtypes"]),
            row["compute_dtype"], row["accumulation_dtype"], row["output_dtype"],
            row["casts_added"], row["rule"])) + " |")
    return "\n".join(lines) + "\n"


def read_report(path: str) -> dict:
    if os.path.isdir(path):
        path = os.path.join(path, "report.json")
    if not os.path.isfile(path):
        raise UsageError(f"{path!r} does not exist; give the report.json a convert run wrote")
    try:
        with open(path, encoding="utf-8") as handle:
            saved = json.load(handle)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise UsageError(f"{path!r} is not JSON ({one_line(err)})") from None
    if not isinstance(saved, dict) or "conversion" not in saved or "rows" not in saved.get(
            "conversion", {}):
        raise UsageError(f"{path!r} is not a report.json from relay-amp convert")
    return saved


def format_report(saved: dict, rules=(), ops=(), compute=None, limit=None) -> str:
    """The text ``relay-amp report`` prints: summary, notes, accuracy, then the (filtered) rows."""
    from ..report import BindingRecord, Report  # pylint: disable=import-outside-toplevel

    conversion = saved["conversion"]
    rows = conversion["rows"]
    known_ops = sorted({row["op"] for row in rows})
    for op in ops:
        if op not in known_ops:
            close = difflib.get_close_matches(op, known_ops, n=3)
            hint = f"did you mean {', '.join(close)}? " if close else ""
            raise UsageError(f"--op {op!r}: no row of this report has that op; {hint}its ops "
                             f"are {', '.join(known_ops)}")
    picked = [row for row in rows
              if (not ops or row["op"] in ops)
              and (not rules or any(r.lower() in row["rule"].lower() for r in rules))
              and (compute is None or row["compute_dtype"] == compute)]
    report = Report(conversion["dtype"],
                    rows=[BindingRecord.from_dict(row)
                          for row in picked])
    target = saved.get("target", {})
    lines = [f"model   {saved['model']['path']} ({saved['model']['format']})",
             "target  " + ", ".join(f"{k}={v}" for k, v in target.items()
                                     if k in ("kind", "arch", "mcpu", "mtriple", "mattr")),
             f"library {saved.get('library')}",
             conversion["summary"]]
    lines += list(saved.get("notes", [])) + list(conversion.get("notes", []))
    search = conversion.get("search")
    if search:
        lines.append(f"search: tolerance {search['tolerance']:g} "
                     f"{'met' if search['met'] else 'NOT met'} ({search['metric_value']:.3g}) "
                     f"with {len(search['fp32_bindings'])} float32 binding(s) in "
                     f"{search['evaluations']} evaluations")
    accuracy = saved.get("accuracy")
    if accuracy:
        lines.append(f"accuracy on {accuracy['batches']} calibration batches: relative L2 "
                     f"{_fmt(accuracy['relative_l2'])}, max abs {_fmt(accuracy['max_abs'])}, "
                     f"cosine {_fmt(accuracy['cosine'])}, NaN/Inf {accuracy['nonfinite']}")
    filters = [f"rule contains {' or '.join(map(repr, rules))}" if rules else "",
               f"op in {', '.join(ops)}" if ops else "",
               f"compute {compute}" if compute else ""]
    filters = [f for f in filters if f]
    lines.append("")
    lines.append(f"{len(picked)} of {len(rows)} rows" + (f" ({'; '.join(filters)})"
                                                        if filters else ""))
    if picked:
        lines.append(report.table(max_rows=limit))
    return "\n".join(lines)


__all__ = ["UsageError", "ConvertFailure", "Options", "convert_model", "parse_target",
           "parse_input", "detect_format", "import_model", "read_report", "format_report",
           "markdown_report"]
