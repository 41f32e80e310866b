"""Relax plumbing shared by the planner and the rewriter: dtype and type helpers, the
memoized FFI lookups that keep a conversion fast (every field access of a TVM object
crosses the FFI), the Call constructor without ``Call.__init__``'s imports, and the one wrapper
of TVM's private BlockBuilder calls."""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.ir import Call
from tvm.relax import (
    DataflowVar,
    TensorType,
    Var,
)

GenericConst = type(relax.const(0.0))
TupleType = tvm.ir.type.TupleType
FloatImm = tvm.tirx.FloatImm if hasattr(tvm, "tirx") else tvm.tir.FloatImm
PrimValue = getattr(relax, "PrimValue", None)

def tensor_dtype(expr_or_type) -> str | None:
    ty = expr_or_type if isinstance(expr_or_type, tvm.ir.Type) else expr_or_type.ty
    if type(ty) is not TensorType:  # noqa: E721 (exact type checks skip the ABC machinery)
        return None
    dtype = ty.dtype  # a PrimType, which TVM interns: its name is read once
    entry = _DTYPE_NAMES.get(dtype.__chandle__())
    if entry is None:  # .dtype is the plain name (str() would run the printer)
        entry = _DTYPE_NAMES[dtype.__chandle__()] = (dtype, str(getattr(dtype, "dtype", dtype)))
    return entry[1]


#: PrimType handle -> (the PrimType, kept alive so that its handle is never reused; its name)
_DTYPE_NAMES: dict = {}


class DtypeCache:
    """``tensor_dtype`` of expressions, memoized for one conversion.

    Every access to a TVM object's field crosses the FFI; a conversion asks for the dtype of the
    same variable many times. Entries keep their expression alive, so a handle is never reused
    for another object while the cache lives."""

    __slots__ = ("_entries",)

    def __init__(self):
        self._entries: dict = {}

    def __call__(self, expr) -> str | None:
        key = expr.__chandle__()
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = (expr, tensor_dtype(expr))
        return entry[1]


def last_line(error: BaseException, limit: int = 160) -> str:
    """The last non-empty line of ``error``'s message (TVM's carry a traceback first), at most
    ``limit`` characters; the error's type name where the message is empty."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    return (lines[-1] if lines else type(error).__name__)[:limit]


_ARITHMETIC = {"Add": lambda a, b: a + b, "Sub": lambda a, b: a - b, "Mul": lambda a, b: a * b,
               "FloorDiv": lambda a, b: a // b, "FloorMod": lambda a, b: a % b,
               "Max": max, "Min": min}


def element_count(ty, sizes=None, unknown: int | None = None) -> int | None:
    """Elements of a tensor type: its extents' product, symbolic extents taken from ``sizes``
    (name -> int), an extent named in none of them counted as ``unknown``; None where an extent
    stays unknown or the shape is not known."""
    shape = getattr(ty, "shape", None)
    if shape is None or not isinstance(shape, relax.ShapeExpr):
        return None
    count = 1
    for dim in shape.values:
        extent = _evaluate(dim, sizes or {}, unknown)
        if extent is None:
            return None
        count *= extent
    return count


#: The size a symbolic extent (a sequence length) is given where bytes are compared.
SYMBOLIC_EXTENT = 128


def float32_bytes(expr) -> int:
    """The bytes of a float tensor as float32 (symbolic extents at :data:`SYMBOLIC_EXTENT`);
    0 for anything else."""
    ty = expr.ty
    if type(ty) is not TensorType or not str(ty.dtype).startswith(("float", "bfloat")):
        return 0
    count = element_count(ty, unknown=SYMBOLIC_EXTENT)
    return 4 * count if count else 0


def _evaluate(expr, sizes: dict, unknown: int | None) -> int | None:
    """An extent's value: a constant, a symbolic variable (``sizes``, else ``unknown``), or
    arithmetic of them; None if anything in it is unknown."""
    if isinstance(expr, tvm.tirx.IntImm):
        return int(expr)
    if isinstance(expr, tvm.tirx.Var):
        return sizes.get(expr.name, unknown)
    operation = _ARITHMETIC.get(type(expr).__name__)
    if operation is None:
        return None
    a, b = _evaluate(expr.a, sizes, unknown), _evaluate(expr.b, sizes, unknown)
    return None if a is None or b is None else operation(a, b)


_MISSING_TYPE = tvm.ir.Type.missing()


def new_call(op, args, attrs=None, ty_args=(), span=None) -> Call:
    """``tvm.ir.Call(op, args, attrs, ty_args, span)``, through the constructor's FFI function.

    ``Call.__init__`` runs three function-level imports on every call, which made it a tenth of
    the rewrite's time on long graphs (scripts/bench_convert_time.py); the node is the same
    (``tests/pass/test_relax_utils.py`` checks it)."""
    return _CALL_CONSTRUCTOR(_MISSING_TYPE, op, args, attrs, ty_args, span)


_CALL_CONSTRUCTOR = tvm.ir._ffi_api.Call  # noqa: SLF001 - see new_call


def op_name(call: Call) -> str | None:
    if type(call.op) is tvm.ir.Op:  # noqa: E721
        name = call.op.name
        return name[len("relax."):] if name.startswith("relax.") else name
    return None


def is_call_tir(expr) -> bool:
    """Whether ``expr`` is a ``relax.call_tir``."""
    return isinstance(expr, Call) and op_name(expr) == "call_tir"


def leaves_of(expr) -> list:
    """The leaf expressions of an argument: the fields of (nested) inline tuples, else itself."""
    if type(expr) is not relax.Tuple:  # noqa: E721
        return [expr]
    return [leaf for field in expr.fields for leaf in leaves_of(field)]


VAR_TYPES = frozenset((Var, DataflowVar))


def is_var(expr) -> bool:
    return type(expr) in VAR_TYPES


def lowered_type(ty, low: str):
    """``ty`` with every float32 tensor made ``low``."""
    if isinstance(ty, TensorType):
        if str(ty.dtype) == "float32":
            return TensorType(ty.shape, low, ndim=ty.ndim) if ty.shape is None else TensorType(
                ty.shape, low)
        return ty
    if isinstance(ty, TupleType):
        return TupleType([lowered_type(f, low) for f in ty.fields])
    return ty


def replace_attrs(attrs, **changes):
    """A copy of a call's ``attrs`` with some fields changed."""
    info = type(attrs).__tvm_ffi_type_info__
    fields = {f.name: getattr(attrs, f.name) for f in info.fields}
    fields.update(changes)
    return tvm.ir.make_node(info.type_key, **fields)


def type_leaves(ty):
    if isinstance(ty, TupleType):
        for field in ty.fields:
            yield from type_leaves(field)
    elif isinstance(ty, TensorType):
        yield ty


def scalar_value(arg):
    kind = type(arg)
    if kind is FloatImm:
        return float(arg.value)
    if PrimValue is not None and kind is PrimValue and isinstance(arg.value, FloatImm):
        return float(arg.value.value)
    return None


def bound_value(arg):
    """A clip's bound as a float: :func:`scalar_value`, or an integer one (TVM's TFLite and
    ONNX importers write a ReLU6's as ``T.int64(0)`` and ``T.int64(6)``); None otherwise."""
    value = scalar_value(arg)
    if value is None and PrimValue is not None and type(arg) is PrimValue:
        arg = arg.value
    if value is None and isinstance(arg, tvm.tirx.IntImm):
        value = float(arg.value)
    return value


class BuiltBlock:
    """A binding (or dataflow) block emitted through ``builder`` inside a ``with`` statement;
    ``block`` holds it afterwards. This is the one place relay_amp uses TVM's private
    BlockBuilder calls (``_begin_binding_block``, ``_begin_dataflow_block``, ``_end_block``):
    a mutator rebuilding a SeqExpr block by block has no public way to end a block and get it
    back. ``tests/house/test_layout.py`` fails if TVM renames them."""

    PRIVATE_CALLS = ("_begin_binding_block", "_begin_dataflow_block", "_end_block")

    def __init__(self, builder, dataflow: bool = False):
        self.builder, self.dataflow, self.block = builder, dataflow, None

    def __enter__(self):
        if self.dataflow:
            self.builder._begin_dataflow_block()  # noqa: SLF001 - see the class docstring
        else:
            self.builder._begin_binding_block()  # noqa: SLF001 - see the class docstring
        return self

    def __exit__(self, *exc_info):
        self.block = self.builder._end_block()  # noqa: SLF001 - see the class docstring
        return False


def as_tuple(value) -> tuple:
    return value if isinstance(value, tuple) else (value,)


def same_dtypes(a, b) -> bool:
    if isinstance(a, TensorType) and isinstance(b, TensorType):
        return str(a.dtype) == str(b.dtype)
    if isinstance(a, TupleType) and isinstance(b, TupleType):
        return len(a.fields) == len(b.fields) and all(
            same_dtypes(x, y) for x, y in zip(a.fields, b.fields))
    return True


#: What TVM 0.27 raises when it rejects something relay_amp asks of it (an op in a dtype, a TE
#: computation, a schedule, a target, a module that is not well-formed): the FFI raises
#: TypeError and ValueError, TVM's own errors derive from RuntimeError (InternalError,
#: ScheduleError, and a Python error raised inside a callback comes back as one), and the
#: legalizations, written in Python, fail on an operand they cannot read with AttributeError or
#: an assert. relay_amp catches exactly these where it asks TVM and falls back (keeps the op as
#: it is); tests/pass/test_tvm_errors.py triggers them. KeyError and IndexError are not among them:
#: there they are relay_amp's own bugs.
TVM_ERRORS = (RuntimeError, ValueError, TypeError, AttributeError, AssertionError)


def prim_func_blocks(func) -> list:
    """The blocks (``SBlock`` nodes) of PrimFunc ``func``, or [] where it is not schedulable."""
    from tvm import s_tir

    try:
        schedule = s_tir.Schedule(func)
        blocks, stack = [], [schedule.get_sblock("root")] if "root" in func.script()[:4000] else []
        while stack:
            children = schedule.get_child_blocks(stack.pop())
            blocks.extend(children)
            stack.extend(children)
    except TVM_ERRORS:
        return []
    return [schedule.get(block) for block in blocks]


def read_counts(func) -> dict:
    """How many times each variable of the Relax function ``func`` is read."""

    @relax.expr_functor.visitor
    class Reads(relax.PyExprVisitor):
        def __init__(self):
            super().__init__()
            self.count = {}

        def visit_var_(self, var):
            self.count[var] = self.count.get(var, 0) + 1

        def visit_dataflow_var_(self, var):
            self.visit_var_(var)

    reads = Reads()
    reads.visit_expr(func)
    return reads.count


def bfloat16_cast_source(expr):
    """The float32 tensor ``expr`` rounds to bfloat16 (``astype(x, "bfloat16")``), or None."""
    if not isinstance(expr, Call) or op_name(expr) != "astype" \
            or tensor_dtype(expr.ty) != "bfloat16" or tensor_dtype(expr.args[0].ty) != "float32":
        return None
    return expr.args[0]


def mutate_functions(mutator) -> tvm.IRModule:
    """The module of ``mutator`` (a ``relax.PyExprMutator`` made from it) with every Relax
    function visited by it: how a Relax rewrite applies to a whole module."""
    for gvar, func in list(mutator.builder_.get().functions_items()):
        if isinstance(func, relax.Function):
            mutator.builder_.update_func(gvar, mutator.visit_expr(func))
    return mutator.builder_.get()


def retyped_kernels(mod, kernels: dict) -> tvm.IRModule:
    """``mod`` with each PrimFunc named in ``kernels`` (name -> ``(its new PrimFunc, a function
    of a call's argument list giving the new one)``) replaced, under a new GlobalVar of the
    same name (its type changed, so the old one would no longer check), and every
    ``call_tir`` of it passing the new arguments."""

    @relax.expr_functor.mutator
    class Retyped(relax.PyExprMutator):
        def __init__(self, rest):
            super().__init__(rest)
            self.made = {}

        def visit_call_(self, call):
            call = super().visit_call_(call)
            if not is_call_tir(call) or call.args[0].name_hint not in kernels:
                return call
            name = call.args[0].name_hint
            func, arguments = kernels[name]
            if name not in self.made:
                self.made[name] = self.builder_.add_func(func, name)
            args = relax.Tuple(arguments(list(call.args[1].fields)))
            return relax.Call(call.op, [self.made[name], args, *call.args[2:]], call.attrs,
                              call.ty_args, call.span)

    rest = tvm.IRModule({gvar: func for gvar, func in mod.functions_items()
                         if gvar.name_hint not in kernels}, attrs=mod.attrs,
                        global_infos=mod.global_infos)
    return mutate_functions(Retyped(rest))


def _fields(call) -> list:
    """A ``call_tir``'s arguments where they are an inline tuple, else none."""
    return list(call.args[1].fields) if isinstance(call.args[1], relax.Tuple) else []


def constant_groups(mod, key) -> dict:
    """``{callee's name: [positions, ...]}``: for each callee only ``call_tir`` calls, the
    argument positions at which every call passes a constant of one ``key(constant, uses)``
    (``uses``: how many ``call_tir`` arguments are that constant; a key of None leaves the
    constant out), grouped by key, groups of two or more."""
    calls, uses = [], {}
    elsewhere = set()  # callees some other op calls too (call_tir_inplace): left alone

    def visit(expr):
        if isinstance(expr, Call) and not is_call_tir(expr):
            elsewhere.update(arg.name_hint for arg in (expr.op, *expr.args)
                             if isinstance(arg, tvm.ir.GlobalVar))
        elif is_call_tir(expr):
            calls.append(expr)
            for arg in _fields(expr):
                if isinstance(arg, tvm.ir.expr.GenericConst):
                    uses[arg.id_] = uses.get(arg.id_, 0) + 1

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    positions: dict = {}
    for call in calls:
        found = {n: key(arg, uses[arg.id_]) for n, arg in enumerate(_fields(call))
                 if isinstance(arg, tvm.ir.expr.GenericConst)}
        known = positions.setdefault(call.args[0].name_hint, found)
        positions[call.args[0].name_hint] = {
            n: k for n, k in known.items() if k is not None and found.get(n) == k}
    groups = {}
    for name, found in positions.items():
        by_key: dict = {}
        for n, k in sorted(found.items()):
            by_key.setdefault(k, []).append(n)
        grouped = [tuple(ns) for ns in by_key.values() if len(ns) > 1]
        if grouped and name not in elsewhere:
            groups[name] = grouped
    return groups
