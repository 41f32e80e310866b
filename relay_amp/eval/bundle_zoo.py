"""The registry's real exports in the GPU bundle (``zoo:NAME``), with their weights left behind.

Each entry is the module the sweep measures, from the registry's own loader and frontend
(:func:`relay_amp.eval.models.load`; the transformers through
:func:`.transformers_zoo.build` and :func:`.transformers_zoo.to_relax`, which that loader calls),
with its weights as constants, and every variant is converted from it as it is. Only then are
the weights taken out of the variant (:func:`lift_weights`): each float constant whose bits equal
a tensor of the model's weight table, in the variant's dtype, becomes a parameter named after
that tensor, and TVM's ``LiftTransformParams`` moves what a build with constants would fold
(the weights' transposes, casts, BatchNorm arithmetic) into ``main_transform_params``, which the
runner calls once before timing ``main``. The library so runs the kernels that the build with
constants runs, and the weights need not travel:

- ``transformers`` (``zoo:bert_base``, ``zoo:llama_smollm_135m``): the host rebuilds the model
  from the same config and ``torch.manual_seed(0)`` (``bundle_runner.transformers_weights``, the
  code that made the weight table here, so every lifted weight is proven bit-identical to the
  registry's export on this machine) and checks each weight's SHA-256 against the build's;
- ``file`` (the mediapipe models and ``zoo:yolov8n_320``, pretrained weights of a few MB): the
  bundle carries them, once per model, in their own dtype;
- ``seeded`` (``zoo:resnet50_v1`` and the other GluonCV models, whose Xavier-initialized,
  BatchNorm-re-estimated weights need MXNet): ``make_weights`` by the ONNX initializers' names.

A constant that matches no tensor of the table (one the importer or the conversion computed)
stays in the library; the manifest counts them per variant.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from ..execution import with_function
from ..relax_utils import GenericConst
from . import bundle_runner
from .gpu_bench import TORCHVISION, BenchModel

#: The registry models the default bundle builds as ``zoo:NAME`` (ResNet-50 v1 is there as the
#: bundle's ``resnet50_v1``; ``zoo:resnet50_v1`` builds it this way too).
ZOO_MODELS = ("bert_base", "llama_smollm_135m", "yolov8n_320", "face_detection_short_range")
PREFIX = "zoo:"
TRANSFORM = "main_transform_params"
#: Why a model has no PyTorch counterpart on the GPU host.
NO_TORCH = {"yolov8": "no PyTorch counterpart: the host has no ultralytics, and the registry's "
                      "YOLOv8n is an ONNX export without its PyTorch source",
            "mediapipe": "no PyTorch counterpart: mediapipe ships TFLite models only"}


class FixedBatch(ValueError):
    """The model's graph is built for one batch size only."""


class WeightTable:
    """Named tensors that a module's constants are matched against, bit for bit, per dtype.

    Parameters
    ----------
    arrays : dict
        Name to numpy array (float32, or float16 for weights stored that way). Equal tensors
        under several names are interchangeable: each constant takes a name not yet taken.
    """

    def __init__(self, arrays: dict):
        self.arrays = {name: np.asarray(value) for name, value in arrays.items()
                       if np.asarray(value).dtype.kind == "f" and np.asarray(value).size > 1}
        self._index: dict = {}

    def names(self, value: np.ndarray) -> list:
        """The names whose tensor, converted to ``value``'s dtype (round to nearest even, as the
        conversion and the runner convert), has ``value``'s shape and bits."""
        dtype = value.dtype
        index = self._index.get(str(dtype))
        if index is None:
            index = self._index[str(dtype)] = {}
            for name, array in self.arrays.items():
                converted = array if array.dtype == dtype else array.astype(dtype)
                index.setdefault((converted.shape, bundle_runner.sha256(converted)),
                                 []).append(name)
        return index.get((value.shape, bundle_runner.sha256(value)), [])


def _is_float(value: np.ndarray) -> bool:
    return value.dtype.kind == "f" or str(value.dtype) == "bfloat16"  # ml_dtypes' kind is "V"


@relax.expr_functor.mutator
class _Lifter(relax.PyExprMutator):
    """Each float constant with a match in the table becomes a parameter (one per constant)."""

    def __init__(self, mod, table: WeightTable):
        super().__init__(mod)
        self.table = table
        self.params: dict = {}  # constant handle -> (var, weight name)
        self.taken: set = set()
        self.embedded = [0, 0]  # constants with no match: count, bytes

    def visit_generic_const_(self, const):
        key = const.__chandle__()
        if key in self.params:
            return self.params[key][0]
        value = const.value.numpy()
        if not _is_float(value) or value.size < 2:
            return const
        names = self.table.names(value)
        if not names:
            self.embedded[0] += 1
            self.embedded[1] += value.nbytes
            return const
        dtype = str(const.ty.dtype)
        free = [n for n in names if (n, dtype) not in self.taken]
        weight = (free or names)[0]
        self.taken.add((weight, dtype))
        source = self.table.arrays[weight].dtype
        label = weight if np.dtype(source) == value.dtype else f"{weight}.{dtype}"
        var = relax.Var(label, const.ty)
        self.params[key] = (var, weight)
        return var


def lift_weights(mod: tvm.IRModule, table: WeightTable) -> tuple:
    """``mod`` with each constant of ``main`` that the table names lifted to a parameter, and
    the weight-only computations lifted into ``main_transform_params`` (see the module).

    Returns
    -------
    tuple
        ``(mod, params, embedded)``: the module; for the manifest, ``main``'s parameters before
        the transform (inputs, then weights, each ``{"name", "dtype"}``, weights with the table
        name they take, ``weight``); ``{"count", "bytes"}`` of the float constants that stay in
        the library.
    """
    func = mod["main"]
    lifter = _Lifter(mod, table)
    body = lifter.visit_expr(func.body)
    inputs = [{"name": p.name, "dtype": str(p.ty.dtype)} for p in func.params]
    embedded = {"count": lifter.embedded[0], "bytes": lifter.embedded[1]}
    if not lifter.params:
        return mod, inputs, embedded
    weights = list(lifter.params.values())
    lifted = relax.Function(list(func.params) + [var for var, _ in weights], body, None,
                            func.is_pure, func.attrs).with_attr("num_input", len(func.params))
    mod = relax.transform.Normalize()(with_function(mod, "main", lifted))
    mod = relax.transform.LiftTransformParams()(mod)
    params = inputs + [{"name": var.name, "dtype": str(var.ty.dtype), "weight": weight}
                       for var, weight in weights]
    return mod, params, embedded


def module_constants(mod: tvm.IRModule) -> dict:
    """The float constants of ``main`` with more than one element, in the order they are first
    used, as ``const0``, ``const1``... (a TFLite or simplified ONNX import names none)."""
    found: dict = {}

    def visit(expr):
        if isinstance(expr, GenericConst) and expr.__chandle__() not in found:
            value = expr.value.numpy()
            if _is_float(value) and value.size > 1:
                found[expr.__chandle__()] = value

    relax.analysis.post_order_visit(mod["main"].body, visit)
    return {f"const{i}": value for i, value in enumerate(found.values())}


def _bind_symbolic(mod: tvm.IRModule, data: list) -> tuple:
    """``main`` with its symbolic dimensions bound to the shapes of ``data`` (its inputs in
    parameter order), as ``relay-amp convert --input`` binds them; and a note."""
    func = mod["main"]
    bindings = {}
    for param, value in zip(func.params, data):
        for dim, size in zip(param.ty.shape.values, value.shape):
            if not isinstance(dim, tvm.tirx.IntImm):
                bindings[dim] = int(size)
    if not bindings:
        return mod, []
    note = ("symbolic dimensions bound (as relay-amp convert --input binds them): "
            + ", ".join(f"{var}={size}" for var, size in bindings.items()))
    return with_function(mod, "main", func.bind_symbolic_vars(bindings)), [note]


def _transformer(name: str, batch: int, tiny: bool) -> BenchModel:
    from . import transformers_zoo

    if name not in transformers_zoo.CONFIGS:
        raise ValueError(f"{PREFIX}{name}: the bundle rebuilds the weights of "
                         f"{', '.join(transformers_zoo.CONFIGS)} only")
    built = transformers_zoo.build(name, tiny=tiny)
    first = built.batches[0]
    if batch > 1:  # more seeded rows of the first row's length; the first row stays
        vocab = built.module.model.config.vocab_size
        ids = np.concatenate(transformers_zoo.token_ids(batch, first[0].shape[1], vocab))
        built.batches = [[ids, np.ones_like(ids)]] + built.batches[1:]
    mod, notes = _bind_symbolic(transformers_zoo.to_relax(built), built.batches[0])
    spec = transformers_zoo.torch_spec(name, tiny)
    table = WeightTable(bundle_runner.transformers_weights(spec))
    data = dict(zip((p.name for p in mod["main"].params), built.batches[0]))
    size = transformers_zoo.MODELS[name].tiny_size if tiny else transformers_zoo.MODELS[name].size
    return BenchModel(name, mod, data, [], {**spec, "inputs": list(data)}, table,
                      {"kind": "transformers", "torch": spec,
                       "origin": "the registry's weights: transformers_zoo.build's seeded init"},
                      [f"size: {size}", *notes])


def _mediapipe_or_yolo(spec, batch: int) -> BenchModel:
    from . import models

    if spec.family == "mediapipe":
        if batch != 1:
            raise FixedBatch(f"{PREFIX}{spec.name} is built for batch 1 only: the TFLite "
                             "graph's reshapes fix the batch at 1")
        loaded = models.load(spec.name)
        origin = f"pretrained, {models.MEDIAPIPE_FILES[spec.name]} of the mediapipe wheel"
    elif batch == 1:
        loaded = models.load(spec.name)
        origin = "pretrained, 320n.onnx of the nudenet wheel"
    else:  # the registry's loader at another batch: the same file and import
        height, width = spec.input_size
        photos = models.photo_pixels(batch, height, width, distinct=True)
        images = np.ascontiguousarray(photos.transpose(0, 3, 1, 2).astype(np.float32) / 255.0)
        loaded = models._load_onnx_model(  # noqa: SLF001 - the registry's own YOLOv8 import
            models._package_file("nudenet", "320n.onnx"),  # noqa: SLF001 - the same file
            [batch, 3, height, width], spec, [[images]], simplify=True)
        origin = "pretrained, 320n.onnx of the nudenet wheel"
    mod = loaded.mod
    data = dict(zip((p.name for p in mod["main"].params), loaded.batches[0]))
    return BenchModel(spec.name, mod, data, [], None, WeightTable(module_constants(mod)),
                      {"kind": "file", "origin": origin},
                      [NO_TORCH[spec.family], *loaded.notes])


def _gluon(spec, batch: int) -> BenchModel:
    import onnx
    from onnx import numpy_helper

    from . import models

    loaded = models.load(spec.name, batch_size=batch)
    graph = onnx.load(loaded.extra["onnx_path"]).graph
    table = WeightTable({init.name: numpy_helper.to_array(init) for init in graph.initializer})
    mod = loaded.mod
    data = dict(zip((p.name for p in mod["main"].params), loaded.batches[0]))
    torch = ({"kind": "torchvision", "name": TORCHVISION[spec.name], "inputs": list(data)}
             if spec.name in TORCHVISION else None)
    return BenchModel(spec.name, mod, data, [], torch, table,
                      {"kind": "seeded", "origin": "make_weights by the ONNX initializers' "
                       "names (the registry's are Xavier init with BatchNorm re-estimated in "
                       "MXNet, which the host has not)"}, list(loaded.notes))


def zoo_model(name: str, batch: int = 1, tiny: bool = False) -> BenchModel:
    """The registry model ``name`` (without ``zoo:``) as a bundle model named ``zoo:NAME`` (at
    a batch other than 1, ``zoo:NAME_bB``); ``tiny``: the tests' size of a transformers model.

    Raises
    ------
    ValueError
        For a model the bundle cannot build this way, or not at ``batch``.
    """
    from .models import get_spec

    try:
        spec = get_spec(name)
    except KeyError as error:
        raise ValueError(str(error.args[0])) from None
    if tiny and spec.family != "transformers":
        raise ValueError(f"{PREFIX}{name}: only transformers models have a tiny size")
    builders = {"transformers": lambda: _transformer(name, batch, tiny),
                "mediapipe": lambda: _mediapipe_or_yolo(spec, batch),
                "yolov8": lambda: _mediapipe_or_yolo(spec, batch),
                "gluoncv": lambda: _gluon(spec, batch)}
    if spec.family not in builders:
        raise ValueError(f"{PREFIX}{name}: the bundle builds {', '.join(builders)} models")
    model = builders[spec.family]()
    model.name = PREFIX + name + ("" if batch == 1 else f"_b{batch}") + ("_tiny" if tiny else "")
    return model
