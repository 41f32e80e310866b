"""The models the sweep measures: GluonCV (seeded init, BatchNorm re-estimated on real photos)
and real pretrained weights that installed wheels carry (PP-OCRv4, YOLOv8n, mediapipe).

Every loader works offline: weights come from the wheels, inputs are photos shipped by
scikit-image / scikit-learn or text rendered with the fonts matplotlib ships.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import tempfile
from dataclasses import dataclass, field

import numpy as np

from ..cli.frontends import import_onnx, read_tflite, tflite_to_relax
from .data import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    IMAGENET_UINT8,
    ImageBatches,
    normalize,
    photo_list,
)


@dataclass(frozen=True)
class ModelSpec:
    """One sweep row: how to get the model and what its outputs mean."""

    name: str
    family: str  # gluoncv | paddleocr | yolov8 | mediapipe | transformers
    task: str  # classification | detection | segmentation | pose | ocr-det | ocr-rec | ocr-cls
    #            | raw | encoder | causal-lm
    input_size: tuple  # (height, width)
    weights: str  # "pretrained" or how the weights were made


@dataclass
class LoadedModel:
    """A Relax module plus input batches (each a list of arrays in parameter order)."""

    spec: ModelSpec
    mod: object
    batches: list
    notes: list = field(default_factory=list)
    extra: dict = field(default_factory=dict)
    #: the temporary folder :func:`load` made for the model's files, removed with this object
    folder: object = field(default=None, repr=False, compare=False)


GLUON_WEIGHTS = "Xavier init, BatchNorm re-estimated on real photos"

_GLUON = [
    # (name, task, input size)
    ("resnet18_v1", "classification", 224), ("resnet34_v1", "classification", 224),
    ("resnet50_v1", "classification", 224), ("resnet101_v1", "classification", 224),
    ("resnet18_v2", "classification", 224), ("resnet50_v2", "classification", 224),
    ("resnet18_v1b", "classification", 224), ("resnet50_v1b", "classification", 224),
    ("resnet50_v1c", "classification", 224), ("resnet50_v1d", "classification", 224),
    ("resnext50_32x4d", "classification", 224), ("se_resnet18_v1", "classification", 224),
    ("se_resnext50_32x4d", "classification", 224), ("resnest14", "classification", 224),
    ("resnest50", "classification", 224), ("mobilenet1.0", "classification", 224),
    ("mobilenet0.25", "classification", 224), ("mobilenetv2_1.0", "classification", 224),
    ("mobilenetv2_0.5", "classification", 224), ("mobilenetv3_large", "classification", 224),
    ("mobilenetv3_small", "classification", 224), ("vgg11", "classification", 224),
    ("vgg11_bn", "classification", 224), ("vgg16", "classification", 224),
    ("squeezenet1.0", "classification", 224), ("squeezenet1.1", "classification", 224),
    ("densenet121", "classification", 224), ("inceptionv3", "classification", 299),
    ("googlenet", "classification", 224), ("xception", "classification", 299),
    ("darknet53", "classification", 256), ("hrnet_w18_small_v1_c", "classification", 224),
    ("alexnet", "classification", 224), ("cifar_resnet20_v1", "classification", 32),
    ("cifar_resnet56_v1", "classification", 32), ("cifar_resnet20_v2", "classification", 32),
    ("cifar_wideresnet16_10", "classification", 32),
    ("cifar_resnext29_16x64d", "classification", 32),
    ("simple_pose_resnet18_v1b", "pose", (256, 192)),
    ("ssd_512_resnet50_v1_voc", "detection", 512), ("ssd_300_vgg16_atrous_voc", "detection", 300),
    ("yolo3_darknet53_voc", "detection", 416), ("yolo3_mobilenet1.0_coco", "detection", 416),
    ("faster_rcnn_resnet50_v1b_voc", "detection", 512),
    ("center_net_resnet18_v1b_voc", "detection", 512),
    # 240 px, not GluonCV's 480: at 480 one float32 run of deeplab takes over 10 minutes on
    # this CPU with TVM's untuned schedules (dilated ResNet-50, output stride 8)
    ("fcn_resnet50_voc", "segmentation", 240), ("psp_resnet50_ade", "segmentation", 240),
    ("deeplab_resnet50_ade", "segmentation", 240),
]

_REAL = [
    ModelSpec("ppocrv4_det", "paddleocr", "ocr-det", (320, 320), "pretrained"),
    ModelSpec("ppocrv4_rec", "paddleocr", "ocr-rec", (48, 320), "pretrained"),
    ModelSpec("ppocr_mobile_v2_cls", "paddleocr", "ocr-cls", (48, 192), "pretrained"),
    ModelSpec("yolov8n_320", "yolov8", "detection", (320, 320), "pretrained"),
    ModelSpec("palm_detection_full", "mediapipe", "raw", (192, 192), "pretrained"),
    ModelSpec("palm_detection_lite", "mediapipe", "raw", (192, 192), "pretrained"),
    ModelSpec("face_detection_short_range", "mediapipe", "raw", (128, 128), "pretrained"),
    ModelSpec("face_landmark", "mediapipe", "raw", (192, 192), "pretrained"),
    ModelSpec("hand_landmark_lite", "mediapipe", "raw", (224, 224), "pretrained"),
    ModelSpec("hand_landmark_full", "mediapipe", "raw", (224, 224), "pretrained"),
    ModelSpec("iris_landmark", "mediapipe", "raw", (64, 64), "pretrained"),
]

MEDIAPIPE_FILES = {
    "palm_detection_full": "palm_detection/palm_detection_full.tflite",
    "palm_detection_lite": "palm_detection/palm_detection_lite.tflite",
    "face_detection_short_range": "face_detection/face_detection_short_range.tflite",
    "face_landmark": "face_landmark/face_landmark.tflite",
    "hand_landmark_lite": "hand_landmark/hand_landmark_lite.tflite",
    "hand_landmark_full": "hand_landmark/hand_landmark_full.tflite",
    "iris_landmark": "iris_landmark/iris_landmark.tflite",
}

DEFAULT_MODELS = ("resnet18_v1", "mobilenetv2_1.0")

_TRANSFORMERS = [
    # (name, task, shape of one input row: tokens, pixels or mel bins x frames)
    ("bert_base", "encoder", (64,)), ("distilbert_base", "encoder", (64,)),
    ("vit_small_224", "classification", (224, 224)), ("whisper_base_encoder", "encoder", (80, 500)),
    ("gpt2_small", "causal-lm", (48,)), ("llama_smollm_135m", "causal-lm", (32,)),
]
TRANSFORMER_WEIGHTS = "seeded init (torch.manual_seed(0), transformers' own initializers)"


def _size(size) -> tuple:
    return tuple(size) if isinstance(size, tuple) else (size, size)


REGISTRY: dict[str, ModelSpec] = {
    name: ModelSpec(name, "gluoncv", task, _size(size), GLUON_WEIGHTS)
    for name, task, size in _GLUON
}
REGISTRY.update({spec.name: spec for spec in _REAL})
REGISTRY.update({name: ModelSpec(name, "transformers", task, size, TRANSFORMER_WEIGHTS)
                 for name, task, size in _TRANSFORMERS})


def get_spec(name: str) -> ModelSpec:
    if name not in REGISTRY:
        import difflib

        close = difflib.get_close_matches(name, REGISTRY, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise KeyError(f"unknown model {name!r}{hint} (see `relay-amp sweep --list`)")
    return REGISTRY[name]


def load(name: str, workdir: str | None = None, batch_size: int | None = None,
         batches: int | None = None) -> LoadedModel:
    """Load model ``name`` as a Relax module with its input batches.

    ``batch_size`` sets the batch of GluonCV models (default: 2, or 1 from 300 px up); the other
    models take one input at a time. ``batches`` asks for at least that many input batches
    (None: the loader's own, one for GluonCV): every loader whose source can give more draws
    them (more photos, rendered lines, seeded token rows...; the model itself does not change),
    a loader that already gives as many keeps its own, and one that cannot says so in a note.
    ``len(result.batches)`` is what was given.

    Without ``workdir`` the model's files (``extra["onnx_path"]``, hundreds of MB for some)
    go to a temporary folder that is removed when the result is, or at exit: keep the result
    while a file it names is read.
    """
    spec = get_spec(name)
    if batches is not None and batches < 1:
        raise ValueError(f"batches must be at least 1; got {batches}")
    folder = None if workdir else tempfile.TemporaryDirectory(prefix="relay_amp_")
    workdir = workdir or folder.name
    if spec.family == "gluoncv":
        loaded = _load_gluon(spec, workdir, batch_size, batches)
    else:
        loader = {"paddleocr": _load_paddleocr, "yolov8": _load_yolov8,
                  "mediapipe": _load_mediapipe, "transformers": _load_transformer}[spec.family]
        loaded = loader(spec, workdir, batches)
    loaded.folder = folder
    if batches is not None:
        given = len(loaded.batches)
        loaded.notes.append(f"{given} input batches measured (--batches {batches}"
                            + (": all this loader can give)" if given < batches else ")"))
    return loaded


def mirror_repeats(pixels: np.ndarray, distinct: int) -> np.ndarray:
    """``pixels`` (uint8 ``(N, H, W, 3)``) drawn by cycling through ``distinct`` photos, with
    the images of every second pass mirrored left to right, so that up to ``2 * distinct``
    images are all different (a third pass repeats the first). The first ``distinct`` images
    are unchanged."""
    pixels = np.array(pixels, copy=True)
    for i in range(distinct, len(pixels)):
        if (i // distinct) % 2:
            pixels[i] = pixels[i][:, ::-1]
    return pixels


def photo_pixels(count: int, height: int, width: int | None = None,
                 distinct: bool = False) -> np.ndarray:
    """``count`` of the bundled photos (:func:`.data.photo_list`, in order, cycling) as uint8
    ``(count, height, width, 3)``: each centre-cropped to a square, resized to
    ``max(height, width)`` with Pillow's bilinear filter (:class:`.data.ImageBatches`, the
    same pixels as :func:`.data.sample_images`) and cut to its top-left ``height x width``;
    past the photos, mirrored (:func:`mirror_repeats`).

    With ``distinct``, a photo that equals an earlier one (scikit-image's ``cat`` is
    ``chelsea``) is skipped, and past two passes (the photos, then their mirror images) each
    image is a different square window of its photo (:func:`photo_window`), mirrored on every
    second pass: all ``count`` images differ, and the first two passes are the same for every
    ``count``."""
    width = width or height
    photos = photo_list()
    if distinct:
        unique: dict = {}
        for photo in photos:
            unique.setdefault((photo.shape, photo.tobytes()), photo)
        photos = list(unique.values())
    whole = 2 * len(photos) if distinct else count  # the photos, then their mirror images
    chosen = [photos[i % len(photos)] if i < whole
              else photo_window(photos[i % len(photos)], (i - whole) // len(photos))
              for i in range(count)]
    side = max(height, width)
    pixels = next(iter(ImageBatches(chosen, side, batch_size=count, layout="NHWC")))
    return mirror_repeats(pixels[:, :height, :width], len(photos))


def photo_window(photo: np.ndarray, index: int) -> np.ndarray:
    """Window ``index`` of ``photo``: a square of 40-95 % of its shorter side, its size from
    the golden-ratio sequence and its position from the R2 sequence (additive recurrences
    with low discrepancy), so successive windows differ and cover sizes and positions
    evenly."""
    if index < 0:
        raise ValueError(f"index must be non-negative; got {index}")
    # 1/phi; then 1/g and 1/g**2 for g the plastic number (R2 in two dimensions)
    fraction = 0.40 + 0.55 * ((0.5 + (index + 1) * 0.6180339887) % 1.0)
    across, down = ((0.5 + (index + 1) * 0.7548776662) % 1.0,
                    (0.5 + (index + 1) * 0.5698402910) % 1.0)
    rows, cols = photo.shape[:2]
    side = max(1, int(round(min(rows, cols) * fraction)))
    top, left = int(round(down * (rows - side))), int(round(across * (cols - side)))
    return np.ascontiguousarray(photo[top:top + side, left:left + side])


def split_image_batches(pixels: np.ndarray, size: int, count: int,
                        mean=IMAGENET_MEAN, std=IMAGENET_STD) -> tuple[list, list]:
    """``count`` batches of ``size`` images each from uint8 ``(N, H, W, 3)`` ``pixels`` (the
    first ``count * size``, in order), as two aligned lists of one-input batches: float32 NCHW
    normalized with ``mean`` and ``std`` (:func:`.data.normalize`), and the same images as uint8
    NCHW (for a model given uint8 input with that normalization folded in). Every batch has the
    shape ``(size, 3, H, W)``: a model exported at that batch runs each."""
    if size < 1 or count < 1:
        raise ValueError(f"size and count must be positive; got size={size}, count={count}")
    if len(pixels) < size * count:
        raise ValueError(f"{count} batches of {size} need {size * count} images; got "
                         f"{len(pixels)}")
    chosen = np.asarray(pixels[:size * count])
    floats = normalize(chosen, mean, std)
    uint8 = np.ascontiguousarray(chosen.transpose(0, 3, 1, 2))
    return ([[np.ascontiguousarray(floats[i * size:(i + 1) * size])] for i in range(count)],
            [[np.ascontiguousarray(uint8[i * size:(i + 1) * size])] for i in range(count)])


# ------------------------------------------------------------------------------ ONNX import
# ------------------------------------------------------------------------------ GluonCV
def import_gluoncv():
    """``import gluoncv``, with torch hidden while it imports.

    GluonCV 0.10 checks for PyTorch on import and raises RuntimeError (not ImportError) when it
    finds torch 2.x, so once torch is installed (the ``.pt2`` and transformer paths need it) the
    MXNet half that the sweep uses would not import either.
    """
    import sys

    if "gluoncv" in sys.modules:
        return sys.modules["gluoncv"]
    missing = object()
    saved = sys.modules.get("torch", missing)
    sys.modules["torch"] = None  # makes `import torch` raise ImportError inside gluoncv's check
    try:
        import gluoncv
    finally:
        if saved is missing:
            del sys.modules["torch"]
        else:
            sys.modules["torch"] = saved
    return gluoncv


def _gluon_net(model_zoo, name: str, **options):
    """The model without any pretrained weights: detection, segmentation and pose models default
    to downloading a pretrained backbone (``pretrained_base=True``), which must not happen here.
    ``options`` go to the model (a segmentation model's ``crop_size``)."""
    try:
        return model_zoo.get_model(name, pretrained=False, pretrained_base=False, **options)
    except (TypeError, Warning):  # classification models take no pretrained_base; GluonCV's
        return model_zoo.get_model(name, pretrained=False)  # darknet53 raises Warning for it


def _xavier_or_constant(mx):
    """Xavier for weights; ones (scales, variances) or zeros (shifts) for vectors, which Xavier
    refuses."""

    class XavierOrConstant(mx.init.Xavier):
        def _init_weight(self, name, arr):
            if len(arr.shape) < 2:
                arr[:] = 1.0 if str(name).endswith(("gamma", "var")) else 0.0
            else:
                super()._init_weight(name, arr)

    return XavierOrConstant


def _blocks(block):
    yield block
    for child in block._children.values():  # noqa: SLF001 - GluonCV keeps a block's children and attributes private
        yield from _blocks(child)


def reestimate_batchnorm(net, batch) -> int:
    """Set every BatchNorm's running statistics to those of its input on ``batch``.

    One inference pass: a pre-hook on each BatchNorm measures its input (which already reflects
    the re-estimated layers before it) before the layer runs. Returns the number of layers set.
    """
    from mxnet.gluon import nn

    norms = [b for b in _blocks(net) if isinstance(b, nn.BatchNorm)]

    def measure(block, inputs):
        data = inputs[0]
        axis = block._kwargs.get("axis", 1) % data.ndim  # noqa: SLF001 - GluonCV keeps a block's children and attributes private
        axes = tuple(i for i in range(data.ndim) if i != axis)
        mean = data.mean(axis=axes)
        shape = [1] * data.ndim
        shape[axis] = -1
        var = ((data - mean.reshape(shape)) ** 2).mean(axis=axes)
        block.running_mean.set_data(mean)
        block.running_var.set_data(var)

    hooks = [b.register_forward_pre_hook(measure) for b in norms]
    try:
        net(batch)
    finally:
        for hook in hooks:
            hook.detach()
    return len(norms)


ADAPTIVE_POOL = "_contrib_AdaptiveAvgPooling2D"


def adaptive_pool_input_sizes(symbol_json: str, input_shape) -> dict:
    """``{node name: (height, width)}`` of the input of every ``AdaptiveAvgPooling2D`` in an
    exported MXNet symbol, by MXNet's shape inference at ``input_shape``."""
    import json

    import mxnet as mx

    with open(symbol_json, encoding="utf-8") as handle:
        nodes = json.load(handle)["nodes"]
    pools = [n for n in nodes if n["op"] == ADAPTIVE_POOL]
    if not pools:
        return {}
    internals = mx.sym.load(symbol_json).get_internals()
    outputs = internals.list_outputs()
    sizes = {}
    for pool in pools:
        index, output = pool["inputs"][0][:2]
        source = nodes[index]["name"]
        name = next(candidate for candidate in (source, f"{source}_output",
                                                f"{source}_output{output}")
                    if candidate in outputs)
        _, shapes, _ = internals[outputs.index(name)].infer_shape(data=tuple(input_shape))
        sizes[pool["name"]] = tuple(shapes[0][2:])
    return sizes


@contextlib.contextmanager
def adaptive_pool_export(input_sizes: dict):
    """MXNet's ONNX exporter, within the block, writes ``AdaptiveAvgPooling2D`` with an output
    larger than 1 x 1 (PSPNet's pyramid) as ``AveragePool``.

    The exporter has no such conversion ("output_size != 1 not yet implemented"). Where the
    input's size (``input_sizes``, from :func:`adaptive_pool_input_sizes`) is a multiple of the
    output's, adaptive pooling's bins are equal and do not overlap, so an ``AveragePool`` with
    kernel = stride = input / output is the same operation; other sizes raise.
    """
    from mxnet.onnx.mx2onnx import _export_onnx
    from mxnet.onnx.mx2onnx._op_translations import (
        _op_translations_opset12 as opset12,
    )
    from onnx import helper

    table = _export_onnx.MXNetGraph.registry_.setdefault(12, {})
    original = table.get(ADAPTIVE_POOL)

    def convert(node, **kwargs):
        name, inputs, attrs = opset12.get_inputs(node, kwargs)
        output = [int(v) for v in opset12.convert_string_to_list(attrs.get("output_size", "1"))]
        output = output * 2 if len(output) == 1 else output
        if output == [1, 1] or name not in input_sizes:
            return original(node, **kwargs)
        height, width = input_sizes[name]
        if height % output[0] or width % output[1]:
            raise NotImplementedError(
                f"{ADAPTIVE_POOL} {name}: input {height}x{width} is not a multiple of the output "
                f"{output[0]}x{output[1]}, so no AveragePool equals it")
        kernel = [height // output[0], width // output[1]]
        return [helper.make_node("AveragePool", [inputs[0]], [name], kernel_shape=kernel,
                                 strides=kernel, name=name)]

    table[ADAPTIVE_POOL] = convert
    try:
        yield
    finally:
        table[ADAPTIVE_POOL] = original


def gluon_to_onnx(net, batch: np.ndarray, workdir: str, name: str = "model") -> str:
    """Hybridize ``net`` and export it with ``mx.onnx.export_model`` to ``workdir/NAME.onnx``
    (``AdaptiveAvgPooling2D`` as :func:`adaptive_pool_export` writes it); returns that path."""
    import mxnet as mx

    net.hybridize()
    net(mx.nd.array(batch))
    prefix = os.path.join(workdir, name)
    net.export(prefix)
    onnx_path = prefix + ".onnx"
    sizes = adaptive_pool_input_sizes(prefix + "-symbol.json", batch.shape)
    with adaptive_pool_export(sizes):
        mx.onnx.export_model(prefix + "-symbol.json", prefix + "-0000.params", [batch.shape],
                             [np.float32], onnx_path)
    return onnx_path


def gluon_to_relax(net, batch: np.ndarray, workdir: str, name: str = "model"):
    """Hybridize ``net``, export it with ``mx.onnx.export_model`` and import it into Relax.

    Returns ``(IRModule, onnx_path)``.
    """
    import onnx
    from tvm.relax.frontend.onnx import from_onnx

    onnx_path = gluon_to_onnx(net, batch, workdir, name)
    return from_onnx(onnx.load(onnx_path)), onnx_path


#: GluonCV tasks whose exported graphs go through :func:`onnx_repairs.repair` before import.
REPAIRED_TASKS = ("detection", "segmentation")


def import_repaired(onnx_path: str, batch_shape, notes: list):
    """Load an exported ONNX file, apply the named repairs of :mod:`.onnx_repairs` at the input
    shape ``batch_shape`` (each repair that changed something adds a note) and import it."""
    import onnx

    from . import onnx_repairs

    model = onnx.load(onnx_path)
    initializers = {i.name for i in model.graph.initializer}
    data = [i.name for i in model.graph.input if i.name not in initializers]
    shapes = {data[0]: list(batch_shape)}
    notes.extend(onnx_repairs.repair(model, shapes))
    return import_onnx(model, shapes, notes)


NMS_OPS = ("relax.vision.all_class_non_max_suppression", "relax.vision.non_max_suppression")


def expose_nms_inputs(mod) -> tuple:
    """``mod`` whose ``main`` also returns the boxes and scores each NMS call reads (in
    float32, after its own outputs), and how many it added; ``(mod, 0)`` without NMS.

    After NMS, a detector's outputs are the boxes that survived, in score order: a small change
    in one score can swap two rows or let another box in, so comparing those outputs element by
    element measures which boxes were selected more than how far the numbers moved. What NMS
    reads (every anchor's decoded box and score, in anchor order) is the numeric result. The
    outputs are added to the module as converted, so the conversion is the one the model gets.
    """
    import tvm
    from tvm import relax

    from ..instrument import instrument

    func = mod["main"]

    def probe(binding, bind):
        value = binding.value
        if not (isinstance(value, tvm.ir.Call) and getattr(value.op, "name", "") in NMS_OPS):
            return []
        return [bind(relax.op.astype(arg, "float32"), f"nms_input{i}", visible=True)
                for i, arg in enumerate(value.args[:2])]

    blocks, extra = instrument(func, probe)
    if not extra:
        return mod, 0
    result = func.body.body
    if isinstance(result, relax.Tuple):
        fields = list(result.fields)
    elif isinstance(result.ty, tvm.ir.type.TupleType):  # a var: its fields bound one by one
        fields = [relax.Var(f"output{i}", ty) for i, ty in enumerate(result.ty.fields)]
        blocks.append(relax.BindingBlock([relax.VarBinding(var, relax.TupleGetItem(result, i))
                                          for i, var in enumerate(fields)]))
    else:
        fields = [result]
    returned = relax.BlockBuilder().normalize(relax.Tuple(fields + extra))
    exposed = relax.Function(func.params, relax.SeqExpr(blocks, returned), returned.ty,
                             func.is_pure, func.attrs)
    functions = dict(mod.functions_items())
    functions[mod.get_global_var("main")] = exposed
    return relax.transform.Normalize()(tvm.IRModule(functions, attrs=mod.attrs)), len(extra)


def detection_output_order(onnx_path: str) -> list[int]:
    """Positions of (class ids, scores, boxes) among a GluonCV detector's exported outputs.

    Most detectors export them in that order; CenterNet's exported graph lists the scores (a
    ``TopK`` output) before the class ids (a ``Cast``).
    """
    import onnx

    graph = onnx.load(onnx_path, load_external_data=False).graph
    producers = {out: node.op_type for node in graph.node for out in node.output}
    kinds = [producers.get(o.name, "") for o in graph.output[:3]]
    if kinds[0] == "TopK" and kinds[1] == "Cast":
        return [1, 0, 2]
    return [0, 1, 2]


def _load_gluon(spec: ModelSpec, workdir: str, batch_size: int | None = None,
                batches: int | None = None) -> LoadedModel:
    """Build the GluonCV model, initialize it (seeded Xavier), re-estimate its BatchNorm
    statistics on real photos, export it through ONNX (``workdir/NAME.onnx``) and import it.

    No pretrained weights can be downloaded here, so activations get realistic magnitudes from
    the re-estimated statistics; comparisons made with these models measure low-precision
    agreement with float32, not ImageNet accuracy.

    The inputs are ``batches`` (default 1) batches of ``batch_size`` photos, all of one shape
    (the exported graph's); BatchNorm is re-estimated on the first 8 photos whatever
    ``batches`` is, so the model and its first batch are the same for every count.
    """
    import mxnet as mx
    import onnx
    model_zoo = import_gluoncv().model_zoo
    mx.random.seed(0)
    np.random.seed(0)
    height, width = spec.input_size
    # segmentation heads upsample to a size fixed at construction (crop_size, default 480)
    options = {"crop_size": height} if spec.task == "segmentation" else {}
    net = _gluon_net(model_zoo, spec.name, **options)
    # one image for detection and segmentation: their untuned CPU runs take minutes each
    size = batch_size or (1 if max(height, width) >= 300 or spec.task in REPAIRED_TASKS else 2)
    count = batches or 1
    # uint8 batches from the loader (square inputs); float32 normalized on the host.
    # BatchNorm statistics come from the same 8 photos whatever the count: the same model
    first = photo_pixels(8, height, width)
    calibration = normalize(first)
    # the measured images: the first of those, or count * size different ones (the first
    # batch the same)
    pixels = (first if count == 1 and size <= 8 else
              photo_pixels(count * size, height, width, distinct=True))
    try:  # initialization is deferred to the first call, which therefore sits in the try
        net.initialize(mx.init.Xavier(magnitude=2.0))
        net(mx.nd.array(calibration[:1]))
    except ValueError:  # a vector parameter without its own initializer (SSD's expand layers)
        mx.random.seed(0)
        net = _gluon_net(model_zoo, spec.name, **options)
        net.initialize(_xavier_or_constant(mx)(magnitude=2.0))
        net(mx.nd.array(calibration[:1]))
    reestimate_batchnorm(net, mx.nd.array(calibration))
    float_batches, uint8_batches = split_image_batches(pixels, size, count)
    batch = float_batches[0][0]
    notes: list = []
    extra = {"onnx_path": os.path.join(workdir, spec.name + ".onnx")}
    if spec.task in REPAIRED_TASKS:
        mod = import_repaired(gluon_to_onnx(net, batch, workdir, spec.name), batch.shape, notes)
        if spec.task == "detection":
            extra["detection_outputs"] = detection_output_order(extra["onnx_path"])
            extra["expose_nms_inputs"] = True
    else:
        try:
            mod, _ = gluon_to_relax(net, batch, workdir, spec.name)
        except Exception:  # if the export stands, retry its import with shapes folded
            if not os.path.exists(extra["onnx_path"]):
                raise  # the export itself failed: its error is the row's message
            model = onnx.load(extra["onnx_path"])
            mod = import_onnx(model, {model.graph.input[0].name: list(batch.shape)}, notes, True)
    if height == width:
        extra["uint8"] = {"input": mod["main"].params[0].name,
                          "batches": uint8_batches, "normalization": IMAGENET_UINT8}
    return LoadedModel(spec, mod, float_batches, notes, extra)


# ------------------------------------------------------------------------------ real weights
def _package_file(package: str, filename: str) -> str:
    spec = importlib.util.find_spec(package)
    if spec is None:
        raise ImportError(f"{package} is not installed (pip install -r requirements.txt)")
    for root in spec.submodule_search_locations:
        for directory, _, files in os.walk(root):
            if filename in files:
                return os.path.join(directory, filename)
    raise FileNotFoundError(f"{filename} is not inside the installed {package}")


def _load_onnx_model(path: str, shape: list, spec: ModelSpec, batches, extra=None,
                     simplify: bool = False):
    import onnx

    model = onnx.load(path)
    notes: list = []
    mod = import_onnx(model, {model.graph.input[0].name: shape}, notes, simplify)
    return LoadedModel(spec, mod, batches, notes, {"onnx_path": path, **(extra or {})})


def _load_paddleocr(spec: ModelSpec, workdir: str, batches: int | None = None) -> LoadedModel:
    from . import ocr

    height, width = spec.input_size
    if spec.task == "ocr-det":
        path = _package_file("rapidocr_onnxruntime", "ch_PP-OCRv4_det_infer.onnx")
        pages = ocr.render_pages(count=max(3, batches or 0), size=height)
        batches = [[ocr.det_preprocess(page)] for page in pages]
        return _load_onnx_model(path, [1, 3, height, width], spec, batches)
    if spec.task == "ocr-rec":
        import onnx

        path = _package_file("rapidocr_onnxruntime", "ch_PP-OCRv4_rec_infer.onnx")
        samples = ocr.render_lines(count=max(24, batches or 0), height=height, width=width)
        batches = [[ocr.rec_preprocess(s.image, height, width)] for s in samples]
        meta = {p.key: p.value for p in onnx.load(path, load_external_data=False).metadata_props}
        characters = meta["character"].splitlines()
        return _load_onnx_model(path, [1, 3, height, width], spec, batches,
                                {"truth": [s.text for s in samples], "characters": characters})
    path = _package_file("rapidocr_onnxruntime", "ch_ppocr_mobile_v2.0_cls_infer.onnx")
    samples = ocr.render_lines(count=max(8, batches or 0), height=height, width=width,
                               flips=True)
    batches = [[ocr.rec_preprocess(s.image, height, width)] for s in samples]
    return _load_onnx_model(path, [1, 3, height, width], spec, batches)


def _load_yolov8(spec: ModelSpec, workdir: str, batches: int | None = None) -> LoadedModel:
    path = _package_file("nudenet", "320n.onnx")
    height, width = spec.input_size
    photos = photo_pixels(max(4, batches or 0), height, distinct=True)
    batches = [[np.ascontiguousarray(p.transpose(2, 0, 1)[None].astype(np.float32) / 255.0)]
               for p in photos]
    # the exported graph keeps dynamic shapes that TVM cannot compile: fold them first
    return _load_onnx_model(path, [1, 3, height, width], spec, batches, simplify=True)


def _load_mediapipe(spec: ModelSpec, workdir: str, batches: int | None = None) -> LoadedModel:
    relative = MEDIAPIPE_FILES[spec.name]
    path = _package_file("mediapipe", os.path.basename(relative))
    mod = tflite_to_relax(read_tflite(path))
    height, width = spec.input_size
    photos = photo_pixels(max(3, batches or 0), height, width,
                          distinct=True)
    # mediapipe models take RGB scaled to [-1, 1] (palm, face) or [0, 1] (landmarks)
    scale = (photos.astype(np.float32) / 127.5 - 1.0) if "detection" in spec.name else (
        photos.astype(np.float32) / 255.0)
    batches = [[np.ascontiguousarray(image[None])] for image in scale]
    return LoadedModel(spec, mod, batches, [], {"tflite_path": path})


# ------------------------------------------------------------------------------ transformers
def _load_transformer(spec: ModelSpec, workdir: str, batches: int | None = None) -> LoadedModel:
    """A ``transformers`` model from its config with seeded weights (see
    :mod:`.transformers_zoo`), exported with ``torch.export`` and imported into Relax."""
    from . import transformers_zoo

    built = transformers_zoo.build(spec.name, batches=batches)
    mod = transformers_zoo.to_relax(built)
    notes = [f"size: {transformers_zoo.MODELS[spec.name].size}", *built.notes]
    return LoadedModel(spec, mod, built.batches, notes)


__all__ = ["ModelSpec", "LoadedModel", "REGISTRY", "DEFAULT_MODELS", "get_spec", "load",
           "import_onnx", "import_repaired", "gluon_to_onnx", "import_gluoncv",
           "detection_output_order", "split_image_batches", "photo_pixels", "photo_window",
           "mirror_repeats", "REPAIRED_TASKS", "IMAGENET_MEAN", "IMAGENET_STD"]
