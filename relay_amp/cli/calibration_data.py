"""Calibration data in: a folder of images or an ``.npz``, normalized and batched per input."""

from __future__ import annotations

import os
import zipfile
from dataclasses import dataclass

import numpy as np

from .arguments import NORMALIZE_HELP, UsageError, one_line
from .frontends import ModelInput
from .progress import progress_bar
from .symbolic import SymbolicDim, bind_sizes, check_sizes, is_symbolic, symbols_of

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm",
                    ".pgm")


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
    from PIL import Image

    try:
        with Image.open(path) as opened:
            picture = opened.convert("RGB" if channels == 3 else "L")
    except (OSError, ValueError, Image.DecompressionBombError) as err:  # not an image PIL reads
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
class CalibrationBatches:
    """Calibration data: what the float32 model and the converted model are fed, per batch."""

    reference: list  # batches (lists in parameter order) for the float32 model
    converted: list  # the same for the converted model (integer or low-precision inputs)
    source: dict


def _feed_dtype(name: str, io: dict) -> str | None:
    return io.get(name)


def load_images(folder: str, inputs: list, normalize, io: dict, limit: int | None,
                progress: bool) -> CalibrationBatches:
    """Batches from a folder of images for a model with one image input."""
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
    shown = ",".join(map(str, model_input.shape))
    if layout is None:
        raise UsageError(f"input {model_input.source!r} has shape [{shown}], not an image batch "
                         "(N,3,H,W) or (N,H,W,3): give an .npz instead of images")
    order, channels, height, width = layout
    if is_symbolic(layout[1:]):
        fixed = [str(d) if i == 0 or not isinstance(d, SymbolicDim) else "N"
                 for i, d in enumerate(model_input.shape)]
        raise UsageError(f"input {model_input.source!r} has a symbolic image size [{shown}]: "
                         "images are resized to one size, give it with --input "
                         f"{model_input.source}:{','.join(fixed)} (or give an .npz)")
    integer_model = model_input.dtype.startswith(("uint", "int"))
    feed = _feed_dtype(model_input.name, io)
    if normalize is None and not integer_model:
        raise UsageError("images need --normalize (how the model expects its pixels): "
                         f"{NORMALIZE_HELP}")
    if limit:
        files = files[:limit]
    batch = model_input.shape[0]
    note = None
    if isinstance(batch, SymbolicDim):
        note = (f"calibration images fed {batch.lower or 1} per batch: the batch dimension "
                f"{batch.name} is symbolic (an .npz feeds other sizes)")
        batch = batch.lower or 1
    count = max(1, -(-len(files) // batch))
    files = [files[i % len(files)] for i in range(count * batch)]
    pixels = []
    for path in progress_bar(files, desc="calibration images", unit="image", disable=not progress):
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
              "batches": len(reference), "batch_size": batch, "layout": order,
              "normalize": None if integer_model else spec}
    if note:
        source["note"] = note
    return CalibrationBatches(reference, converted, source)


def _low(array: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "float16":
        return array.astype(np.float16)
    import ml_dtypes

    return array.astype(ml_dtypes.bfloat16)


def load_npz(path: str, inputs: list, io: dict, normalize, limit: int | None) -> CalibrationBatches:
    """Batches from an ``.npz`` with one array per input name: the input's shape (one batch) or
    a stack of batches along a new or the batch axis."""
    try:
        archive = np.load(path, allow_pickle=False)
        arrays = {key: archive[key] for key in archive.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:  # not an .npz of arrays
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
    if any(is_symbolic(i.shape) for i in inputs):
        return _symbolic_npz(path, inputs, arrays, names, io, normalize, limit)
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
    reference, converted = _feed(inputs, per_input, names, io, normalize, count)
    source = {"kind": "npz", "path": os.path.abspath(path), "batches": count}
    return CalibrationBatches(reference, converted, source)


def _symbolic_npz(path: str, inputs: list, arrays: dict, names: dict, io: dict, normalize,
                  limit: int | None) -> CalibrationBatches:
    """Batches for a model with symbolic dimensions: each array one batch whose symbolic
    dimensions take the sizes it has (the same size for a name in every input), or a stack of
    such batches along a new first axis."""
    sizes: dict = {}
    stacked = None
    for model_input in inputs:
        key = names[model_input.name]
        array = arrays[key]
        if stacked is not False and bind_sizes(model_input.shape, array.shape[1:], sizes):
            stacked = True
        elif stacked is not True and bind_sizes(model_input.shape, array.shape, sizes):
            stacked = False
        else:
            raise UsageError(f"array {key!r} has shape {list(array.shape)}; input "
                             f"{model_input.source!r} takes "
                             f"[{','.join(map(str, model_input.shape))}] (a named dimension "
                             "any size in its range, the same in every input that names it; "
                             "or a stack of them along a first axis)")
    check_sizes(sizes, symbols_of({i.name: i.shape for i in inputs}), os.path.basename(path))
    per_input = {i.name: list(arrays[names[i.name]]) if stacked else [arrays[names[i.name]]]
                 for i in inputs}
    if len({len(batches) for batches in per_input.values()}) != 1:
        raise UsageError(f"the arrays in {os.path.basename(path)} hold different numbers of "
                         "batches per input; give each input the same number")
    count = len(next(iter(per_input.values())))
    if limit:
        count = min(count, limit)
    reference, converted = _feed(inputs, per_input, names, io, normalize, count)
    source = {"kind": "npz", "path": os.path.abspath(path), "batches": count, "sizes": sizes}
    return CalibrationBatches(reference, converted, source)


def _feed(inputs: list, per_input: dict, names: dict, io: dict, normalize,
          count: int) -> tuple[list, list]:
    """The first ``count`` batches for the float32 and for the converted model, in the dtypes
    each takes."""
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
    return reference, converted


def load_calibration(kind: str | None, path: str, inputs: list, normalize, io: dict,
                     limit: int | None, progress: bool) -> CalibrationBatches | None:
    """The ``--calibrate`` data (``kind`` images or npz) as batches for both models; None
    without it."""
    if kind == "images":
        return load_images(path, inputs, normalize, io, limit, progress)
    if kind == "npz":
        return load_npz(path, inputs, io, normalize, limit)
    return None


def io_normalization(model_input: ModelInput, normalize) -> dict:
    """The normalization folded into an integer-fed input."""
    layout = image_layout(model_input.shape)
    order, channels = (layout[0], layout[1]) if layout else ("NCHW", 1)
    return normalization_spec(normalize, order, channels)
