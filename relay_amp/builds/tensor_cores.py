"""Tensor cores on CUDA: which targets and dtypes get them, and the schedule rule that gives them.

TVM 0.27's dlight ``Matmul`` rule puts a matmul or convolution on tensor cores (WMMA
16×16×16) only for float16 and int8 inputs, and only when it reads the target's arch as a
number: ``sm_90a``, what TVM calls an auto-detected H100 and its ``nvidia/nvidia-h100`` tag,
fails that check, so such a target silently gets no tensor cores for any dtype. This module
gives every spelling of a CUDA arch, and bfloat16, the same path:

1. bfloat16 WMMA intrinsics (16×16×16 bfloat16 inputs, float32 accumulator), built with TVM's
   own generators (``get_wmma_load_intrin``, ``get_wmma_sync_intrin``) and registered under
   ``relay_amp_`` names; the float32 fill and store intrinsics are TVM's;
2. :func:`tensor_core_matmul`, dlight's ``Matmul`` rule that sees the arch as a number
   (``sm_90a`` → sm_90: the suffix adds architecture-specific instructions such as wgmma, none of
   which the WMMA path uses) and schedules bfloat16 blocks with dlight's own tensor-core schedule
   (``MatmulTensorization``) on the bfloat16 intrinsics;
3. :func:`tensor_core_note`, the line a conversion's report gets for a CUDA target: which of its
   dot products run on tensor cores, or why none do;
4. :func:`cuda_intrinsics`, TVM's CUDA intrinsics module with each intrinsic registered when a
   schedule names it, not all 91 (and every other target's) on import, which made the first
   tensor-core build in a process take half a minute or more.

This is the one place relay_amp reaches into TVM's tensor-core code.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib
import importlib.abc
import importlib.machinery
import os
import re
import sys
import threading
import types

import tvm

#: The oldest arch with tensor cores for each input dtype (WMMA float16: Volta; bfloat16: Ampere).
MIN_ARCH = {"float16": 70, "bfloat16": 80}
#: dlight's rule keeps a matmul off tensor cores when a fixed extent (batch aside) is at most this.
DLIGHT_MIN_EXTENT = 64
_PREFIX = "relay_amp_wmma_16x16x16_bf16"


def arch_number(target) -> int | None:
    """The compute capability of a CUDA target as a number (``sm_90a`` → 90), else None."""
    if target is None or target.kind.name != "cuda" or "arch" not in target.attrs:
        return None
    match = re.fullmatch(r"sm_(\d+)[a-z]?", str(target.attrs["arch"]))
    return int(match.group(1)) if match else None


def numeric_arch_target(target: tvm.target.Target) -> tvm.target.Target:
    """``target`` with its arch spelled as dlight reads it (``sm_90a`` → ``sm_90``), for the
    schedule rules only; code generation keeps the real target."""
    number = arch_number(target)
    if number is None or str(target.attrs["arch"]) == f"sm_{number}":
        return target
    config = {k: v for k, v in target.export().items() if k not in ("arch", "tag")}
    return tvm.target.Target({**config, "arch": f"sm_{number}"})


def has_tensor_cores(target, dtype: str) -> bool:
    """Whether :func:`tensor_core_matmul` puts ``dtype`` dot products of ``target`` on tensor
    cores (extents permitting)."""
    number = arch_number(target)
    return number is not None and dtype in MIN_ARCH and number >= MIN_ARCH[dtype]


def tensor_core_note(target, dtype: str) -> str | None:
    """What a conversion for ``target`` says about tensor cores for ``dtype``; None for targets
    other than CUDA."""
    if target is None or target.kind.name != "cuda":
        return None
    arch = str(target.attrs["arch"]) if "arch" in target.attrs else "(no arch)"
    if has_tensor_cores(target, dtype):
        note = (f"target cuda {arch}: {dtype} matmuls and convolutions run on tensor cores "
                "(WMMA 16x16x16, float32 accumulation) when compiled with "
                "relay_amp.cuda_pipeline, wherever every extent but the batch exceeds "
                f"{DLIGHT_MIN_EXTENT}")
        if dtype != "float16" or re.fullmatch(r"sm_\d+", arch) is None:
            note += f"; TVM's own CUDA pipeline gives {dtype} on {arch} none"
        return note
    if arch_number(target) is None:
        return (f"target cuda {arch}: no arch that names a compute capability, so no tensor "
                f"cores; give one (e.g. sm_80, sm_90)")
    return (f"target cuda {arch} has no {dtype} tensor cores (they need sm_{MIN_ARCH[dtype]} or "
            "newer): its dot products run on CUDA cores")


# ------------------------------------------------------------------------------ TVM's intrinsics
#: TVM's CUDA tensor intrinsics, which dlight's tensor-core rules import.
CUDA_INTRINSICS = "tvm.s_tir.tensor_intrin.cuda"
_PACKAGE = "tvm.s_tir.tensor_intrin"
_LOADING = threading.RLock()
#: intrinsic name -> its held-back ``TensorIntrin.register`` statement, compiled
_pending: dict = {}
_lazy: list = []  # the lazy module, once made


def _registered_name(statement: ast.stmt, strings: dict) -> str | None:
    """The name a top-level ``TensorIntrin.register(NAME, ...)`` registers, None for any other
    statement; ValueError when the name is not a string this module spells out."""
    call = statement.value if isinstance(statement, ast.Expr) else None
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
            and call.func.attr == "register" and isinstance(call.func.value, ast.Name)
            and call.func.value.id == "TensorIntrin"):
        return None
    first = call.args[0] if call.args else None
    if isinstance(first, ast.Constant) and isinstance(first.value, str):
        return first.value
    if isinstance(first, ast.Name) and first.id in strings:
        return strings[first.id]
    raise ValueError(f"line {statement.lineno}: a registration under a computed name")


def _bound_names(statement: ast.stmt) -> list:
    if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [statement.name]
    if isinstance(statement, (ast.Import, ast.ImportFrom)):
        return [(a.asname or a.name).split(".")[0] for a in statement.names]
    return [node.id for node in ast.walk(statement)
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store)]


def _reads_registry_at_load(statement: ast.stmt) -> bool:
    """Whether running ``statement`` (a function's decorators and defaults, not its body)
    names ``TensorIntrin``, which could read an intrinsic not yet registered."""
    parts = [statement]
    if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
        parts = [*statement.decorator_list, *statement.args.defaults,
                 *[d for d in statement.args.kw_defaults if d is not None]]
    return any(isinstance(node, ast.Name) and node.id == "TensorIntrin"
               for part in parts for node in ast.walk(part))


def plan_cuda_intrinsics(source: str, filename: str):
    """How to run TVM's CUDA intrinsics module with its registrations held back.

    Parameters
    ----------
    source : str
        The module's source (``tvm/s_tir/tensor_intrin/cuda.py``).
    filename : str
        Its path, which the compiled code keeps (TVMScript reads each intrinsic's source from it).

    Returns
    -------
    tuple or None
        ``(code, registrations)``: the module without its top-level
        ``TensorIntrin.register(NAME, ...)`` statements, and NAME -> that statement, both
        compiled; None where the module is not of that shape (a registration under a computed
        name, a top-level name bound twice or rebound through ``global``, another top-level
        use of ``TensorIntrin``, no ``get_wmma_intrin_group``), and then the module is
        imported as it is.
    """
    try:
        tree = ast.parse(source, filename)
    except SyntaxError:
        return None
    strings, bound, kept, registrations = {}, set(), [], {}
    for statement in tree.body:
        try:
            name = _registered_name(statement, strings)
        except ValueError:
            return None
        if name is not None:
            if name in registrations:
                return None
            registrations[name] = compile(ast.Module([statement], []), filename, "exec")
            continue
        names = _bound_names(statement)
        if bound & set(names) or len(set(names)) < len(names):
            return None  # a held-back statement could see a later binding
        if _reads_registry_at_load(statement):
            return None
        bound.update(names)
        if (isinstance(statement, ast.Assign) and len(names) == 1
                and isinstance(statement.value, ast.Constant)
                and isinstance(statement.value.value, str)):
            strings[names[0]] = statement.value.value
        kept.append(statement)
    functions = {s.name for s in kept if isinstance(s, ast.FunctionDef)}
    if (not registrations or "get_wmma_intrin_group" not in functions
            or any(isinstance(node, ast.Global) for node in ast.walk(tree))):
        return None
    return compile(ast.Module(kept, []), filename, "exec"), registrations


class _LazyIntrinsics(types.ModuleType):
    """TVM's CUDA intrinsics module, run from its source with its registrations held back
    (:func:`cuda_intrinsics`): reading one of its intrinsic names (``from ... import
    WMMA_FILL_16x16x16_F32_INTRIN``) registers that intrinsic."""

    def __getattribute__(self, name):
        value = super().__getattribute__(name)
        if type(value) is str and value in _pending:
            register_cuda_intrinsics(value)
        return value


def _registering(group_function):
    """``group_function`` (``get_wmma_intrin_group``, ``get_mma_intrin_group``), registering
    the intrinsics it names before they are returned."""

    @functools.wraps(group_function)
    def group(*args, **kwargs):
        names = group_function(*args, **kwargs)
        register_cuda_intrinsics(*names.values())
        return names

    return group


class _PackageLoader(importlib.abc.Loader):
    """The loader of ``tvm.s_tir.tensor_intrin`` while the lazy module stands in for its
    ``cuda``: the package runs as it is, then every intrinsic held back is registered, so
    importing the package (meta_schedule does) still registers all of TVM's."""

    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        module.__loader__ = module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        register_cuda_intrinsics()


class _PackageFinder(importlib.abc.MetaPathFinder):
    """Finds ``tvm.s_tir.tensor_intrin`` as the other finders do, with :class:`_PackageLoader`."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != _PACKAGE:
            return None
        for finder in sys.meta_path:
            spec = None if finder is self else finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _PackageLoader(spec.loader)
                return spec
        return None


def _module_file() -> str | None:
    """The source file of TVM's CUDA intrinsics module, found without importing its package
    (whose ``__init__`` imports every target's intrinsics)."""
    from importlib.machinery import PathFinder

    from tvm import s_tir

    package = PathFinder.find_spec(_PACKAGE, list(s_tir.__path__))
    if package is None or not package.submodule_search_locations:
        return None
    spec = PathFinder.find_spec(CUDA_INTRINSICS, list(package.submodule_search_locations))
    origin = spec.origin if spec is not None else None
    return origin if origin and origin.endswith(".py") and os.path.isfile(origin) else None


def cuda_intrinsics() -> types.ModuleType:
    """TVM's ``tvm.s_tir.tensor_intrin.cuda``, whose intrinsics are registered when a schedule
    names them.

    Importing that module registers all of its 91 intrinsics, and its package imports every
    other target's: 27-38 s of the first tensor-core build in a process on 2 cores
    (docs/GPU.md), most of it TVMScript's ``prim_func`` calling ``inspect.stack()`` inside the
    import, where each frame of the import machinery makes ``inspect`` scan ``sys.modules``.
    Instead this runs the module from its own source without its ``TensorIntrin.register``
    statements and puts it in ``sys.modules`` (the package stays unimported); a statement runs
    when ``get_wmma_intrin_group`` or ``get_mma_intrin_group`` returns its name (dlight's
    ``MatmulTensorization`` names its intrinsics so), when its name is read from the module, or
    by :func:`register_cuda_intrinsics`; a later import of the package registers them all.
    Where TVM's module has another shape (:func:`plan_cuda_intrinsics`) it is imported as it
    is. ``tests/pass/test_tensor_cores.py`` compares the CUDA source built both ways.

    Returns
    -------
    module
        The module in ``sys.modules`` (made on first call; TVM's own where it was imported
        first).
    """
    with _LOADING:
        module = sys.modules.get(CUDA_INTRINSICS)
        if module is not None:
            return module
        path = _module_file()
        plan = None
        if path is not None and _PACKAGE not in sys.modules:
            with open(path, encoding="utf-8") as handle:
                plan = plan_cuda_intrinsics(handle.read(), path)
        if plan is None:
            return importlib.import_module(CUDA_INTRINSICS)
        code, registrations = plan
        module = _LazyIntrinsics(CUDA_INTRINSICS)
        module.__file__, module.__package__ = path, _PACKAGE
        module.__spec__ = importlib.machinery.ModuleSpec(CUDA_INTRINSICS, None, origin=path)
        sys.modules[CUDA_INTRINSICS] = module
        try:
            exec(code, module.__dict__)
        except Exception:  # noqa: BLE001 - whatever it raised, TVM's own import decides
            del sys.modules[CUDA_INTRINSICS]
            return importlib.import_module(CUDA_INTRINSICS)
        for name, value in list(module.__dict__.items()):
            if re.fullmatch(r"get_\w+_intrin_group", name) and callable(value):
                setattr(module, name, _registering(value))
        from tvm.s_tir import TensorIntrin

        _pending.clear()
        _pending.update({name: code for name, code in registrations.items()
                         if TensorIntrin.get(name, allow_missing=True) is None})
        _lazy[:] = [module]
        if not any(isinstance(finder, _PackageFinder) for finder in sys.meta_path):
            sys.meta_path.insert(0, _PackageFinder())
        return module


def register_cuda_intrinsics(*names: str) -> None:
    """Register TVM's CUDA tensor intrinsics ``names`` (every one when none are given) that
    :func:`cuda_intrinsics` holds back; names registered already, or not TVM's, are skipped.
    Code that tensorizes with a name written out, having imported only
    ``tvm.s_tir.tensor_intrin.cuda``, calls this first."""
    with _LOADING:
        for name in names or list(_pending):
            code = _pending.pop(name, None)
            if code is None:
                continue
            try:
                exec(code, _lazy[0].__dict__)
            except BaseException:
                _pending[name] = code
                raise


# ------------------------------------------------------------------------------ bfloat16
_REGISTERED = threading.Lock()
_registered = False


def register_bfloat16_intrinsics() -> None:
    """Register the bfloat16 WMMA intrinsics (once per process)."""
    global _registered  # noqa: PLW0603 - filled once, on first use
    with _REGISTERED:
        if _registered:
            return
        from tvm.s_tir import TensorIntrin

        cuda = cuda_intrinsics()
        for scope in ("shared", "shared.dyn"):
            suffix = scope.replace(".", "_")
            for operand, is_b, transposed in (("a", False, False), ("a_trans", False, True),
                                              ("b", True, False), ("b_trans", True, True)):
                TensorIntrin.register(
                    f"{_PREFIX}_load_{operand}_{suffix}",
                    *cuda.get_wmma_load_intrin(16, 16, 16, "bfloat16", scope, is_b, transposed),
                    override=True)
        for transposed in (False, True):
            TensorIntrin.register(
                f"{_PREFIX}_sync_f32{'_trans' if transposed else ''}",
                *cuda.get_wmma_sync_intrin(16, 16, 16, "bfloat16", "float32", transposed),
                override=True)
        _registered = True


def bfloat16_intrinsic_group(load_scope: str, store_scope: str, out_dtype: str,
                             trans_b: bool) -> dict:
    """The bfloat16 counterpart of TVM's ``get_wmma_intrin_group``: the names of the init,
    load, compute and store intrinsics (bfloat16 WMMA accumulates in float32 only, so the fill
    and store are TVM's float32 ones)."""
    if out_dtype != "float32":
        raise ValueError(f"bfloat16 WMMA accumulates in float32, not {out_dtype}")
    load, store = load_scope.replace(".", "_"), store_scope.replace(".", "_")
    return {"init": "wmma_fill_16x16x16_f32", "store": f"wmma_store_16x16x16_f32_{store}",
            "load_a": f"{_PREFIX}_load_a_{load}",
            "load_b": f"{_PREFIX}_load_b{'_trans' if trans_b else ''}_{load}",
            "compute": f"{_PREFIX}_sync_f32{'_trans' if trans_b else ''}"}


_SWAP = threading.Lock()


@contextlib.contextmanager
def _bfloat16_groups():
    """dlight's ``MatmulTensorization`` builds its schedule for any 16-bit input, then names its
    intrinsics through ``tvm.s_tir.tensor_intrin.cuda.get_wmma_intrin_group`` with
    ``in_dtype="float16"`` written into the rule, and TVM offers no parameter for the dtype.
    While this is active that lookup answers with the bfloat16 intrinsics, so the schedule is
    dlight's own, not a copy. This is the one place relay_amp reaches into dlight;
    ``tests/pass/test_tensor_cores.py`` fails if TVM changes how the rule finds its intrinsics."""
    cuda = cuda_intrinsics()
    register_bfloat16_intrinsics()
    with _SWAP:
        original = cuda.get_wmma_intrin_group

        def group(load_scope, store_scope, in_dtype, out_dtype, trans_b):
            del in_dtype  # dlight always asks for float16
            names = bfloat16_intrinsic_group(load_scope, store_scope, out_dtype, trans_b)
            register_cuda_intrinsics(*names.values())  # the fill and store are TVM's
            return names

        cuda.get_wmma_intrin_group = group
        try:
            yield
        finally:
            cuda.get_wmma_intrin_group = original


# ------------------------------------------------------------------------------ the rule
def _main_block_dtypes(func, min_extent: int) -> tuple | None:
    """``(input dtype, output dtype)`` of the bfloat16 matmul-like reduction block of ``func``
    when dlight's tensor-core schedule can take it (every fixed extent but the batch above
    ``min_extent``), else None. The block is normalized as dlight's ``Matmul`` rule normalizes
    it."""
    from tvm import s_tir
    from tvm.s_tir.dlight.analysis import get_root_block
    from tvm.s_tir.dlight.gpu.matmul import (
        get_in_out_dtypes,
        get_index_map,
        get_reduction_blocks,
    )

    sch = s_tir.Schedule(func)
    reductions = get_reduction_blocks(sch, sch.get_child_blocks(get_root_block(sch)))
    if reductions is None:
        return None
    main = reductions[0]
    if get_index_map(sch.get(main)) is None or get_in_out_dtypes(sch.get(main))[0] != (
            "bfloat16"):
        return None  # float16 and the rest are dlight's own Matmul rule's to decide
    reindexed = [sch.reindex(main, ("read", 0)), sch.reindex(main, ("read", 1)),
                 sch.reindex(main, ("write", 0))]
    matmul_map, a_map, b_map, c_map = get_index_map(sch.get(main))
    sch.transform_layout(reindexed[0], ("write", 0), a_map)
    sch.transform_layout(reindexed[1], ("write", 0), b_map)
    sch.transform_layout(reindexed[2], ("read", 0), c_map)
    sch.transform_block_layout(main, matmul_map)
    block = sch.get(main)
    for iter_var in block.iter_vars[1:]:
        extent = iter_var.dom.extent
        if isinstance(extent, tvm.tirx.IntImm) and extent.value <= min_extent:
            return None
    return get_in_out_dtypes(block)


def tensor_core_matmul():
    """dlight's ``Matmul`` rule for every spelling of a CUDA arch, with bfloat16 tensor cores.

    Returns
    -------
    tvm.s_tir.dlight.ScheduleRule
        For ``ApplyDefaultSchedule``, in the place of ``dlight.gpu.Matmul()``.
    """
    from tvm.s_tir import dlight as dl
    from tvm.s_tir.dlight.gpu.matmul import (
        MatmulTensorization,
    )

    class TensorCoreMatmul(dl.gpu.Matmul):
        """dlight's Matmul with the arch read as a number and bfloat16 on tensor cores."""

        def apply(self, func, target, tunable):
            if not isinstance(func, tvm.tirx.PrimFunc):
                return None
            scheduling = numeric_arch_target(target)
            if (has_tensor_cores(target, "bfloat16") and self.is_target_available(target)
                    and "dlight.do_not_tensorize" not in func.attrs.keys()):
                dtypes = _main_block_dtypes(func, DLIGHT_MIN_EXTENT)
                if dtypes == ("bfloat16", "float32"):
                    with _bfloat16_groups():
                        scheduled = MatmulTensorization().apply(func, scheduling, tunable)
                    if scheduled is not None:
                        return scheduled
            return super().apply(func, scheduling, tunable)

    return TensorCoreMatmul()
