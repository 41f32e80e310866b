"""Model files in: ONNX, TFLite and ``torch.export`` (``.pt2``) imported into Relax with the
data inputs named and shaped. The evaluation harness imports its ONNX models through here too."""

from __future__ import annotations

import difflib
import os
import struct
import warnings
import zipfile
from dataclasses import dataclass, field

from .arguments import FORMATS_TEXT, IMPORT_ERRORS, ConvertFailure, UsageError, one_line
from .symbolic import is_symbolic, tvm_shapes


def import_onnx(model, input_shapes: dict, notes: list, simplify: bool = False):
    """``from_onnx`` with pinned input shapes; if that fails (or ``simplify``), fold shapes and
    constants with onnxsim first."""
    from tvm.relax.frontend.onnx import from_onnx

    def simplified():
        import onnx
        import onnxsim

        if model.ir_version > onnx.IR_VERSION:  # newer exporters stamp a version onnx 1.15
            model.ir_version = onnx.IR_VERSION  # cannot check; the ops themselves are older
            notes.append(f"ir_version lowered to {onnx.IR_VERSION} for onnx {onnx.__version__}")
        fixed = {name: shape for name, shape in input_shapes.items()  # a symbolic input keeps
                 if all(isinstance(d, int) for d in shape)}  # the dims its graph input names
        result, ok = onnxsim.simplify(model, overwrite_input_shapes=fixed)
        if not ok:
            raise RuntimeError("onnxsim could not verify the simplified model")
        notes.append("shapes folded with onnxsim before import")
        return from_onnx(result, shape_dict=input_shapes)

    if simplify:
        return simplified()
    try:
        return from_onnx(model, shape_dict=input_shapes)
    except IMPORT_ERRORS as first:  # retry after simplification
        try:
            return simplified()
        except ImportError:
            raise first from None


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


def _input_shapes(declared: list, specs: dict, path: str, symbolic: bool = True) -> dict:
    """Shapes per input: the declared ones with ``--input`` filling or naming their dims; ints,
    and :class:`SymbolicDim` where a dimension stays symbolic (a name in ``--input``, or the
    model's own where no ``--input`` gives it a number). Where the format cannot keep one
    (``symbolic`` False), a symbolic dimension is a usage error."""
    from .arguments import SymbolicDim, symbolic_ranges
    from .symbolic import model_dim_name, with_ranges

    def fixed(dim):
        return isinstance(dim, int) and dim > 0

    tied = {}  # a dimension the model names (seq), as --input gives it in one of its inputs
    for name, dims, _ in declared:
        if name in specs and len(specs[name].shape) == len(dims):
            tied.update({d: given for d, given in zip(dims, specs[name].shape)
                         if isinstance(d, str) and d != "?"})
    shapes = {}
    for name, dims, _ in declared:
        spec = specs.get(name)
        shown = [d if fixed(d) else "?" for d in dims]
        if spec is None:
            dims = [tied.get(d, d) if isinstance(d, str) else d for d in dims]
            if not symbolic and not all(fixed(d) for d in dims):
                raise UsageError(f"input {name!r} of {os.path.basename(path)} has a symbolic "
                                 f"shape [{','.join(map(str, shown))}]: give it with --input "
                                 f"{name}:" + ",".join(str(d) if fixed(d) else "N" for d in dims))
            shapes[name] = tuple(
                d if fixed(d) or isinstance(d, SymbolicDim) else
                SymbolicDim(model_dim_name(d, name, axis)) for axis, d in enumerate(dims))
            continue
        if len(spec.shape) != len(dims):
            raise UsageError(f"--input {name}: shape {[str(d) for d in spec.shape]} has "
                             f"{len(spec.shape)} dimensions but the model's input has {len(dims)} "
                             f"({shown})")
        for axis, (given, declared_dim) in enumerate(zip(spec.shape, dims)):
            if isinstance(given, SymbolicDim) and not symbolic:
                raise UsageError(f"--input {name}: {os.path.basename(path)} is a TFLite file, "
                                 f"whose importer takes numbers only: give a number for {given}")
            if fixed(declared_dim) and given != declared_dim:
                raise UsageError(f"--input {name}: shape {[str(d) for d in spec.shape]} does not "
                                 f"match the model's fixed shape {list(dims)} (dimension {axis} "
                                 f"is {declared_dim})")
        shapes[name] = tuple(spec.shape)
    return with_ranges(shapes, symbolic_ranges(specs.values()))


def _check_dtype(spec, declared_dtype: str, name: str) -> None:
    if spec is None or spec.dtype is None or spec.dtype == declared_dtype:
        return
    from ..policy import INTEGER_INPUT_DTYPES

    if declared_dtype == "float32" and spec.dtype in INTEGER_INPUT_DTYPES + ("float16",
                                                                            "bfloat16"):
        return  # the converted model takes it in that dtype (checked against --dtype later)
    raise UsageError(f"--input {name}: the model takes {declared_dtype}, not {spec.dtype}; a "
                     f"float32 input can be fed as uint8/int8 images or in the low-precision "
                     "dtype, other inputs keep the dtype the model declares")


def _import_onnx(path: str, specs: dict, notes: list) -> Imported:
    import onnx
    from google.protobuf.message import DecodeError
    from tvm import relax

    try:
        model = onnx.load(path, load_external_data=False)
    except (OSError, DecodeError) as err:  # not a protobuf message
        raise UsageError(f"cannot read {path!r} as ONNX ({one_line(err)}); give "
                         f"{FORMATS_TEXT}") from None
    weights = _load_external_data(model, path)
    if not model.graph.node:
        raise UsageError(f"{path!r} holds no ONNX graph; give {FORMATS_TEXT}")
    initializers = {i.name for i in model.graph.initializer}
    declared = []
    for value in model.graph.input:
        if value.name in initializers or value.name in weights:
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
    shape_dict = tvm_shapes(shapes)
    if any(is_symbolic(shape) for shape in shapes.values()):
        _name_dims(model, shapes)
    mod = import_onnx(model, shape_dict, notes)
    func = mod["main"]
    named = {str(d) for shape in shape_dict.values() for d in shape if not isinstance(d, int)}
    if {str(v) for v in relax.analysis.defined_symbolic_vars(func)} - named or \
            _has_unknown_shape(func.ret_ty):
        mod = import_onnx(model, shape_dict, notes, simplify=True)  # fold data-dependent shapes
    mod = bind_external_weights(mod, weights)
    params = list(mod["main"].params)
    inputs = [ModelInput(p.name, name, shapes[name], dtype)
              for p, (name, _, dtype) in zip(params, declared)]
    return Imported(mod, inputs, notes)


def _name_dims(model, shapes: dict) -> None:
    """Write ``shapes`` (numbers and names) into the graph inputs of ``model``, so that onnxsim
    folds what does not depend on the symbolic ones."""
    from .arguments import SymbolicDim

    for value in model.graph.input:
        for dim, given in zip(value.type.tensor_type.shape.dim, shapes.get(value.name, ())):
            if isinstance(given, SymbolicDim):
                dim.dim_param = given.name
            else:
                dim.dim_value = given


#: An initializer of the main graph kept in an external file, of a float dtype and at least this
#: many bytes, is a weight: it stays out of the protobuf (:func:`_load_external_data`).
EXTERNAL_WEIGHT_BYTES = 64 * 1024
_WEIGHT_DTYPES = ("float32", "float16", "float64")


@dataclass(frozen=True)
class ExternalWeight:
    """A weight left in its external file: read once, straight into a TVM tensor, by
    :func:`bind_external_weights`."""

    name: str  # the initializer's name in the model file
    file: str
    offset: int
    shape: tuple
    dtype: str

    def read(self):
        import numpy as np
        import tvm

        count = int(np.prod(self.shape, dtype=np.int64))
        array = np.fromfile(self.file, dtype=self.dtype, count=count,
                            offset=self.offset).reshape(self.shape)
        return tvm.runtime.tensor(array)


def _load_external_data(model, path: str) -> dict:
    """Read the tensors ``model`` keeps in files beside ``path`` (models past protobuf's 2 GB
    limit ship so), after checking that each file exists and holds its tensor's bytes: a
    missing or truncated file is a usage error naming it, not an import error later.

    The main graph's float initializers of at least :data:`EXTERNAL_WEIGHT_BYTES` are not read:
    they are returned by name (:class:`ExternalWeight`) and become graph inputs named
    ``relay_amp_weight_N`` (:func:`_weights_as_inputs`), so the protobuf that ``from_onnx``
    checks and onnxsim copies holds no weight; :func:`bind_external_weights` reads each into
    the imported module once. The rest is loaded into the protobuf as before."""
    import numpy as np
    import onnx
    from onnx import external_data_helper

    folder = os.path.dirname(os.path.abspath(path))
    every = list(_onnx_tensors(model.graph))  # the main graph's initializers come first
    main = len(model.graph.initializer)
    weights, load = {}, []
    for index, tensor in enumerate(every):
        if not external_data_helper.uses_external_data(tensor):
            continue
        info = external_data_helper.ExternalDataInfo(tensor)
        file = os.path.join(folder, info.location)
        if not os.path.isfile(file):
            raise UsageError(f"{path!r} keeps tensor {tensor.name!r} in {info.location!r}, which "
                             f"is not beside it ({file} does not exist): copy the model's weight "
                             "files with it")
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type))
        count = int(np.prod(tensor.dims, dtype=np.int64))
        needed = info.length or dtype.itemsize * count
        end = (info.offset or 0) + needed
        if os.path.getsize(file) < end:
            raise UsageError(f"{info.location!r} beside {path!r} is truncated: tensor "
                             f"{tensor.name!r} needs bytes {info.offset or 0}..{end}, the file has "
                             f"{os.path.getsize(file)}")
        if (index < main and dtype.name in _WEIGHT_DTYPES and tensor.dims
                and needed == dtype.itemsize * count and needed >= EXTERNAL_WEIGHT_BYTES):
            weights[tensor.name] = ExternalWeight(tensor.name, file, info.offset or 0,
                                                  tuple(tensor.dims), dtype.name)
        else:
            load.append(tensor)
    for tensor in load:
        external_data_helper.load_external_data_for_tensor(tensor, folder)
        tensor.data_location = onnx.TensorProto.DEFAULT
        del tensor.external_data[:]
    if weights:
        _weights_as_inputs(model, weights)
    return weights


def _weights_as_inputs(model, weights: dict) -> None:
    """Turn the initializers named in ``weights`` into graph inputs ``relay_amp_weight_N`` (a
    name ``from_onnx`` keeps as is, so :func:`bind_external_weights` finds its parameter), and
    rekey ``weights`` by the new names."""
    import onnx

    renamed = {name: f"relay_amp_weight_{i}" for i, name in enumerate(weights)}
    kept = [t for t in model.graph.initializer if t.name not in renamed]
    moved = [t for t in model.graph.initializer if t.name in renamed]
    listed = {value.name for value in model.graph.input}
    for value in model.graph.input:  # an old model lists its initializers among the inputs
        if value.name in renamed:
            value.name = renamed[value.name]
    for tensor in moved:
        if tensor.name not in listed:
            model.graph.input.append(onnx.helper.make_tensor_value_info(
                renamed[tensor.name], tensor.data_type, list(tensor.dims)))
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    _rename_uses(model.graph, renamed)
    for name in list(weights):
        weights[renamed[name]] = weights.pop(name)


def _rename_uses(graph, renamed: dict) -> None:
    """Rename the uses of ``renamed``'s keys in ``graph`` and its subgraphs (which may read
    names of the graph around them), unless a subgraph defines the name itself."""
    for node in graph.node:
        node.input[:] = [renamed.get(name, name) for name in node.input]
        for attribute in node.attribute:
            subgraphs = ([attribute.g] if attribute.HasField("g") else []) + list(attribute.graphs)
            for subgraph in subgraphs:
                defined = ({v.name for v in subgraph.input} | {t.name for t in subgraph.initializer}
                           | {o for n in subgraph.node for o in n.output})
                _rename_uses(subgraph, {k: v for k, v in renamed.items() if k not in defined})
    for value in graph.output:
        value.name = renamed.get(value.name, value.name)


def bind_external_weights(mod, weights: dict):
    """``mod`` with its ``relay_amp_weight_N`` parameters bound to the weights
    (:class:`ExternalWeight`), each read from its file once, as constants."""
    from tvm import relax

    if not weights:
        return mod
    func = mod["main"]
    bound = {param: weights[param.name].read() for param in func.params
             if param.name in weights}
    mod = relax.transform.BindParams("main", bound)(mod)
    num_input = func.attrs.get("num_input") if func.attrs is not None else None
    if num_input is not None:
        mod["main"] = mod["main"].with_attr("num_input", int(num_input) - len(bound))
    return mod


def _onnx_tensors(graph):
    """Every tensor of an ONNX graph: its initializers, and those of its nodes' attributes and
    subgraphs (an If's branches, a Loop's body)."""
    yield from graph.initializer
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.HasField("t"):
                yield attribute.t
            yield from attribute.tensors
            if attribute.HasField("g"):
                yield from _onnx_tensors(attribute.g)
            for subgraph in attribute.graphs:
                yield from _onnx_tensors(subgraph)


def _has_unknown_shape(ty) -> bool:
    from tvm import relax

    if isinstance(ty, relax.TensorType):
        return ty.shape is None
    if isinstance(ty, relax.TupleType):
        return any(_has_unknown_shape(field) for field in ty.fields)
    return False


_TFLITE_TYPES = {0: "float32", 1: "float16", 2: "int32", 3: "uint8", 4: "int64", 6: "bool",
                 7: "int16", 9: "int8", 10: "float64"}


def read_tflite(path: str):
    """The TFLite model in the flatbuffer file ``path`` (the one place ``tflite`` is used)."""
    try:
        import tflite
    except ImportError:
        raise UsageError("reading .tflite files needs the tflite package: pip install tflite "
                         "(or pip install -r requirements.txt)") from None

    with open(path, "rb") as handle:
        return tflite.Model.GetRootAsModel(handle.read(), 0)


def tflite_to_relax(model, shapes: dict | None = None, dtypes: dict | None = None):
    """TVM's TFLite importer on ``model`` (from :func:`read_tflite`): its Relax module."""
    from tvm.relax.frontend.tflite import from_tflite

    imported = from_tflite(model, shapes, dtypes)
    return imported[0] if isinstance(imported, tuple) else imported


def exported_to_relax(program, **options):
    """TVM's importer of a ``torch.export`` program (``from_exported_program`` with its keyword
    ``options``): its Relax module."""
    from tvm.relax.frontend.torch import from_exported_program

    return from_exported_program(program, **options)


def _import_tflite(path: str, specs: dict, notes: list) -> Imported:
    model = read_tflite(path)
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
    except (struct.error, IndexError, ValueError) as err:  # a corrupt flatbuffer
        raise UsageError(f"cannot read {path!r} as TFLite ({one_line(err)})") from None
    specs = _resolve_specs(specs, declared, path)
    shapes = _input_shapes(declared, specs, path, symbolic=False)
    for name, _, dtype in declared:
        _check_dtype(specs.get(name), dtype, name)
    try:
        mod = tflite_to_relax(model, {n: shapes[n] for n, _, _ in declared},
                              {n: d for n, _, d in declared})
    except IMPORT_ERRORS as err:
        raise ConvertFailure(f"TVM cannot import {path}: {one_line(err)}") from None
    params = list(mod["main"].params)
    inputs = [ModelInput(p.name, name, shapes[name], dtype)
              for p, (name, _, dtype) in zip(params, declared)]
    return Imported(mod, inputs, notes)


def _import_pt2(path: str, specs: dict, notes: list) -> Imported:
    try:
        import torch
    except ImportError:
        raise UsageError("reading .pt2 files needs torch: pip install -r requirements.txt") \
            from None
    import tvm

    from ..execution import with_function
    from .arguments import SymbolicDim, symbolic_ranges

    try:
        program = torch.export.load(path)
    except (OSError, RuntimeError, ValueError, zipfile.BadZipFile) as err:  # not a .pt2 archive
        raise UsageError(f"cannot read {path!r} as a torch.export program ({one_line(err)}); "
                         "save one with torch.export.save") from None
    try:
        mod = exported_to_relax(program, unwrap_unit_return_tuple=True)
    except IMPORT_ERRORS as err:
        raise ConvertFailure(f"TVM cannot import {path}: {one_line(err)}") from None
    func = mod["main"]
    declared = []
    for param in func.params:
        dims = [int(d) if isinstance(d, tvm.tirx.IntImm) else str(d)
                for d in param.ty.shape.values]
        declared.append((param.name, dims, str(param.ty.dtype)))
    specs = _resolve_specs(specs, declared, path)
    shapes = _input_shapes(declared, specs, path)
    bindings, variables = {}, {}
    for param, (name, _, dtype) in zip(func.params, declared):
        _check_dtype(specs.get(name), dtype, name)
        for dim, value in zip(param.ty.shape.values, shapes[name]):
            if isinstance(dim, tvm.tirx.IntImm) or getattr(value, "name", None) == str(dim):
                continue  # fixed, or kept symbolic under the program's own name
            if isinstance(value, SymbolicDim):
                value = variables.setdefault(value.name, tvm.tirx.Var(value.name, "int64"))
            if dim in bindings and str(bindings[dim]) != str(value):
                raise UsageError(f"--input: the program ties dimension {dim} of its inputs "
                                 f"together; give it one value, not {bindings[dim]} and {value}")
            bindings[dim] = value
    if bindings:
        func = func.bind_symbolic_vars(bindings)
        mod = with_function(mod, "main", func)
        notes.append("symbolic dimensions bound to the --input shapes: "
                     + ", ".join(f"{var}={value}" for var, value in bindings.items()))
    inputs = [ModelInput(name, name, shape, dtype) for (name, _, dtype), shape in
              zip(declared, _pt2_shapes(func, bindings, symbolic_ranges(specs.values())))]
    return Imported(mod, inputs, notes)


def _pt2_shapes(func, bindings: dict, ranges: dict) -> list:
    """The shapes of ``func``'s parameters after ``bindings``: a symbolic dimension keeps the
    range ``--input`` gives its name, else the one ``torch.export`` recorded for it."""
    import tvm

    from .arguments import SymbolicDim

    recorded = {}
    for attr, index in (("tir_var_lower_bound", 0), ("tir_var_upper_bound", 1)):
        for name, value in dict(func.attrs.get(attr, {}) if func.attrs else {}).items():
            recorded.setdefault(str(name), [None, None])[index] = int(value)
    for var, value in bindings.items():  # a program variable renamed by --input
        if str(var) in recorded and not isinstance(value, int):
            recorded.setdefault(str(value), recorded[str(var)])
    shapes = []
    for param in func.params:
        shape = []
        for dim in param.ty.shape.values:
            if isinstance(dim, tvm.tirx.IntImm):
                shape.append(int(dim))
                continue
            lower, upper = ranges.get(str(dim), (None, None))
            if lower is None and recorded.get(str(dim), [None, None])[1] is not None:
                lower, upper = recorded[str(dim)][0] or 1, recorded[str(dim)][1]
            shape.append(SymbolicDim(str(dim), lower, upper))
        shapes.append(tuple(shape))
    return shapes


def import_model(path: str, fmt: str, specs: dict) -> Imported:
    """Import ``path`` (format ``fmt``) as a Relax module with concrete input shapes."""
    importer = {"onnx": _import_onnx, "tflite": _import_tflite, "pt2": _import_pt2}[fmt]
    notes: list = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            imported = importer(path, specs, notes)
        except IMPORT_ERRORS as err:
            raise ConvertFailure(f"TVM cannot import {path}: {one_line(err)}") from None
    for message in dict.fromkeys(str(w.message).strip() for w in caught):
        if message:  # the frontends' warnings (renamed inputs, ...) go to the report, not stderr
            imported.notes.append(f"import: {message}")
    if not imported.inputs:
        raise ConvertFailure(f"{path} has no data inputs to feed")
    return imported
