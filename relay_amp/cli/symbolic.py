"""Symbolic dimensions of ``relay-amp convert``: named in ``--input`` (``images:batch,3,320,320``,
``ids:1,seq=1..512``) or left symbolic by the model file, kept as one ``tir.Var`` per name
through the import, the conversion and the build, so that one library runs every size.

A bounded name becomes the main function's ``tir_var_upper_bound`` attribute, the bound TVM's
memory planner needs to give a symbolic tensor static storage; the data given to ``--calibrate``
picks the sizes calibration and the accuracy check run at."""

from __future__ import annotations

import re

from .arguments import SymbolicDim, UsageError

#: The attribute of a Relax function that TVM's static memory planner reads the largest value of
#: each symbolic variable from (``StaticPlanBlockMemory``).
UPPER_BOUND_ATTR = "tir_var_upper_bound"
#: Its smallest (which ``torch.export``'s importer records too).
LOWER_BOUND_ATTR = "tir_var_lower_bound"


def is_symbolic(shape) -> bool:
    """Whether ``shape`` (ints and :class:`SymbolicDim`) has a symbolic dimension."""
    return any(isinstance(dim, SymbolicDim) for dim in shape)


def model_dim_name(declared, input_name: str, axis: int) -> str:
    """The name of a dimension the model leaves symbolic: its own (``batch``) where that is a
    name, else ``INPUT_AXIS`` (ONNX's unnamed ``?``, an expression such as ``N*2``)."""
    text = str(declared)
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", text):
        return text
    return re.sub(r"[^A-Za-z0-9_]", "_", f"{input_name}_{axis}").lstrip("0123456789")


def dim_text(dim) -> str:
    """A dimension as the report and the errors show it: ``8``, ``batch`` or ``seq=1..512``."""
    return str(dim)


def symbols_of(shapes: dict) -> dict:
    """Name -> :class:`SymbolicDim` over every input's shape, each name once, with the range
    one of its uses gives (the ``--input`` parser has checked that they agree)."""
    symbols: dict = {}
    for shape in shapes.values():
        for dim in shape:
            if isinstance(dim, SymbolicDim) and (dim.name not in symbols
                                                 or dim.lower is not None):
                symbols[dim.name] = dim
    return symbols


def with_ranges(shapes: dict, ranges: dict) -> dict:
    """``shapes`` with every use of a name carrying the range ``ranges`` gives it (a name
    bounded in one ``--input`` is bounded in all)."""
    def bounded(dim):
        if isinstance(dim, SymbolicDim) and ranges.get(dim.name, (None, None))[0] is not None:
            return SymbolicDim(dim.name, *ranges[dim.name])
        return dim

    return {name: tuple(bounded(dim) for dim in shape) for name, shape in shapes.items()}


def tvm_shapes(shapes: dict) -> dict:
    """Input name -> shape for TVM's importers: ints, and one ``tir.Var`` (int64) per name,
    shared by every input that uses it."""
    from tvm import tirx

    variables: dict = {}

    def dim_value(dim):
        if isinstance(dim, SymbolicDim):
            return variables.setdefault(dim.name, tirx.Var(dim.name, "int64"))
        return dim

    return {name: [dim_value(dim) for dim in shape] for name, shape in shapes.items()}


def with_bounds(mod, symbols: dict):
    """``mod`` with each bounded name's sizes in ``main``'s ``tir_var_lower_bound`` and
    ``tir_var_upper_bound``; bounds already there stay where their variable does (an importer
    records ``torch.export``'s), those of variables bound away are dropped."""
    from tvm import relax, tirx

    from ..execution import with_function

    func = mod["main"]
    present = {str(var) for var in relax.analysis.defined_symbolic_vars(func)}
    for attr, index in ((LOWER_BOUND_ATTR, 1), (UPPER_BOUND_ATTR, 2)):
        known = dict(func.attrs[attr]) if func.attrs and attr in func.attrs else {}
        bounds = {str(k): int(v) for k, v in known.items() if str(k) in present}
        bounds.update({name: (dim.name, dim.lower, dim.upper)[index]
                       for name, dim in symbols.items() if dim.upper is not None})
        if bounds or known:
            func = func.with_attr(attr, {name: tirx.IntImm("int64", value)
                                         for name, value in bounds.items()})
    return with_function(mod, "main", func)


def bind_sizes(shape: tuple, actual: tuple, sizes: dict) -> bool:
    """Whether an array of shape ``actual`` fits ``shape``; binds the sizes of its names in
    ``sizes`` (a name already bound must take the same size)."""
    if len(shape) != len(actual):
        return False
    trial = dict(sizes)
    for dim, size in zip(shape, actual):
        if isinstance(dim, SymbolicDim):
            if trial.setdefault(dim.name, int(size)) != int(size):
                return False
        elif dim != size:
            return False
    sizes.update(trial)
    return True


def check_sizes(sizes: dict, symbols: dict, where: str) -> None:
    """A usage error where a size in ``sizes`` (name -> size) is outside its name's range."""
    for name, size in sizes.items():
        dim = symbols.get(name)
        if dim is None:
            continue
        if size < 1 or (dim.lower is not None and not dim.lower <= size <= dim.upper):
            allowed = f"{dim.lower}..{dim.upper}" if dim.lower is not None else "1 or more"
            raise UsageError(f"{where} gives dimension {name} the size {size}, outside its "
                             f"range {allowed}")


def describe(inputs: list, symbols: dict) -> list:
    """The report's list of symbolic dimensions: each name, its range, where it occurs."""
    rows = []
    for name, dim in symbols.items():
        uses = [f"{i.source}[{axis}]" for i in inputs for axis, d in enumerate(i.shape)
                if isinstance(d, SymbolicDim) and d.name == name]
        rows.append({"name": name, "lower": dim.lower, "upper": dim.upper, "inputs": uses,
                     "memory_planned_for": dim.upper})
    return rows


def symbolic_line(rows: list) -> str | None:
    """One line saying which dimensions are symbolic, or None where none is."""
    if not rows:
        return None
    parts = []
    for row in rows:
        sizes = (f"{row['lower']}..{row['upper']}, memory planned for {row['upper']}"
                 if row["upper"] is not None else "any size, memory allocated per call")
        parts.append(f"{row['name']} ({sizes}; {', '.join(row['inputs'])})")
    return "symbolic dimensions, one library for every size: " + "; ".join(parts)


def build_notes(mod, target: dict) -> list:
    """What a symbolic extent changes in the build for ``target``: for CUDA, the matmuls that
    relay_amp's split-K leaves whole because an operand's extent is symbolic."""
    from tvm import ir, relax, tirx

    if target.get("kind") != "cuda":
        return []
    matmul = ir.Op.get("relax.matmul")
    count = 0
    for _, func in mod.functions_items():
        if not isinstance(func, relax.Function):
            continue
        for call in _calls(func.body):
            if call.op.same_as(matmul) and any(
                    arg.ty.shape is not None and not all(isinstance(d, tirx.IntImm)
                                                         for d in arg.ty.shape.values)
                    for arg in call.args):
                count += 1
    if not count:
        return []
    return [f"{count} matmuls have a symbolic extent: relay_amp.cuda_pipeline's split-K, which "
            "needs static shapes, leaves them whole (a fixed-shape library splits those with few "
            "output tiles along K); dlight's tensor-core rule takes them at any size"]


def _calls(expr) -> list:
    from tvm import relax

    calls = []
    relax.analysis.post_order_visit(expr, lambda node: calls.append(node)
                                    if isinstance(node, relax.Call) else None)
    return calls
