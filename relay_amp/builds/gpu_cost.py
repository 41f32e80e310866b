"""What a module costs a GPU, measured without one: kernels and the bytes at their boundaries.

Most kernels of the models mixed precision is for are bandwidth-bound: their time follows the
bytes that cross kernel boundaries, plus a fixed cost per launch. :func:`gpu_cost` puts a module
through the Relax passes of the CUDA build up to scheduling — by default those of
:func:`relay_amp.cuda_pipeline` (attention decomposed, split-K), or TVM's own (``pipeline="tvm"``:
the fused module relay_amp's pipeline starts from) — then library dispatch, LegalizeOps,
AnnotateTIROpPattern, FoldConstant, FuseOps, FuseTIR, and RewriteDataflowReshape (which turns
reshapes into views that launch nothing), and counts, in each Relax function:

* ``kernels``: the ``call_tir`` calls left, one launch each: what the executable launches per
  inference (``tests/pass/test_gpu_cost_build.py`` checks this against the built executable's
  calls and CUDA kernels);
* ``bytes``: for every ``call_tir``, the bytes of its tensor arguments plus its result. A tensor
  that the kernel reads only through indices it loads from another tensor (the table of a
  ``take``, an embedding lookup) counts at most one element per element of the result: a
  gather reads the rows it picks, not the table. Symbolic extents count as the sizes given in
  ``symbolic`` (a sequence length), and a tensor with an extent left unknown counts 0;
* ``casts``: ``call_tir`` of a lone ``astype`` between two float dtypes (a cast that fused into
  no other kernel), and of those, ``parameter_casts``: the ones that read a function parameter
  or a constant; ``integer_casts``: lone casts to or from an integer or boolean dtype (a model's
  own ``input_ids.astype("int32")``, which float32 has too);
* ``copies``: kernels that only move data (every value they store is one they load: a
  transpose, a strided slice, a concatenation).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

import tvm
from tvm import relax

from ..relax_utils import element_count, prim_func_blocks

_FLOAT_PREFIXES = ("float", "bfloat")
_CONSTANT = type(relax.const(0.0))


@dataclass(frozen=True)
class GpuCost:
    """Kernel-boundary cost of one module (summed over its Relax functions)."""

    kernels: int
    bytes: int
    float_bytes: int  # the part of ``bytes`` that float tensors move
    casts: int
    parameter_casts: int
    integer_casts: int = 0
    copies: int = 0

    def ideal_low_precision_bytes(self, low_bytes: int = 2) -> int:
        """These kernels with every float tensor stored in ``low_bytes`` per element
        (meaningful for a float32 module: the lower bound of a conversion that adds no kernel)."""
        return self.bytes - self.float_bytes + self.float_bytes * low_bytes // 4

    def as_dict(self) -> dict:
        return asdict(self)


#: What :func:`gpu_cost` can measure: the module as ``relay_amp.cuda_pipeline`` builds it, or as
#: TVM's own CUDA pipeline does (the fused module, without relay_amp's rewrites).
PIPELINES = ("relay_amp", "tvm")


def lower_for_cuda(mod: tvm.IRModule, target, pipeline: str = "relay_amp") -> tvm.IRModule:
    """``mod`` after the passes of a CUDA build that decide its kernels and their operands
    (``pipeline``: one of :data:`PIPELINES`)."""
    from tvm.relax.backend.cuda import pipeline as tvm_pipeline

    from .pipeline import TVM_SCHEDULE_PASS, graph_rewrites

    if pipeline not in PIPELINES:
        raise ValueError(f"pipeline must be one of {PIPELINES}, not {pipeline!r}")
    target = tvm.target.Target(target) if not isinstance(target, tvm.target.Target) else target
    passes = graph_rewrites(target) if pipeline == "relay_amp" else []
    passes += tvm_pipeline.library_dispatch_passes(target) + [
        p for p in tvm_pipeline.legalize_passes(target) if p.info.name != TVM_SCHEDULE_PASS]
    passes.append(relax.transform.RewriteDataflowReshape())
    with target:
        return tvm.transform.Sequential(passes)(mod)


def _tensor_bytes(ty, sizes=None, limit=None) -> tuple[int, int]:
    """(bytes, float bytes) of a tensor type (symbolic extents from ``sizes``, name -> int; a
    tensor with an extent left unknown counts 0), or of the tensors of a tuple type. ``limit``
    caps the element count (a gathered tensor)."""
    if isinstance(ty, relax.TensorType):
        count = element_count(ty, sizes)
        if count is None:
            return 0, 0
        if limit is not None:
            count = min(count, limit)
        dtype = str(ty.dtype)
        size = count * tvm.DataType(dtype).bits // 8
        return size, size if dtype.startswith(_FLOAT_PREFIXES) else 0
    if isinstance(ty, tvm.ir.type.TupleType):
        found = [_tensor_bytes(field, sizes) for field in ty.fields]
        return sum(s for s, _ in found), sum(f for _, f in found)
    return 0, 0


def _gathered_params(func, blocks) -> set:
    """Positions of the parameters of PrimFunc ``func`` that its ``blocks`` read only at indices
    loaded from another buffer (``A[idx[i], j]``)."""
    positions = {param.name: index for index, param in enumerate(func.params)}
    gathered, direct = set(), set()
    for block in blocks:
        for region in block.reads:
            index = positions.get(region.source.name)
            if index is not None:
                loads = any(_loads(r.min) for r in region.region)
                (gathered if loads else direct).add(index)
    return gathered - direct


_LOAD = tvm.ir.expr.TensorLoad


def _loads(expr) -> bool:
    """Does ``expr`` read a buffer (an index loaded from memory)?"""
    if isinstance(expr, _LOAD):
        return True
    return any(_loads(getattr(expr, name)) for name in ("a", "b", "value", "condition",
                                                        "true_value", "false_value")
               if isinstance(getattr(expr, name, None), tvm.ir.expr.Expr))


def _only_moves_data(blocks) -> bool:
    """Does every one of ``blocks`` (a PrimFunc's) store a value it loads, unchanged?"""
    return bool(blocks) and all(
        block.init is None and isinstance(block.body, tvm.tirx.BufferStore)
        and isinstance(block.body.value, _LOAD) for block in blocks)


_CAST_KERNEL = re.compile(r"cast\d*")


def _is_cast_kernel(name: str) -> bool:
    """LegalizeOps names the PrimFunc of a lone ``astype`` ``cast`` (``cast1``, ...); FuseTIR
    names a fused group ``fused_...``: a cast that fused into another kernel never matches."""
    return _CAST_KERNEL.fullmatch(name) is not None


def module_cost(lowered: tvm.IRModule, symbolic: dict | None = None) -> GpuCost:
    """The cost of a module already put through :func:`lower_for_cuda`; ``symbolic`` maps the
    names of symbolic extents to sizes."""
    kernels = total = float_total = casts = parameter_casts = integer_casts = copies = 0
    gathers: dict = {}
    moves: dict = {}
    for _, func in lowered.functions_items():
        if not isinstance(func, relax.Function):
            continue
        params = {p.__chandle__() for p in func.params}
        body = func.body
        blocks = body.blocks if isinstance(body, relax.SeqExpr) else []
        for block in blocks:
            for binding in block.bindings:
                value = binding.value
                if not (isinstance(value, tvm.ir.Call) and isinstance(value.op, tvm.ir.Op)
                        and value.op.name == "relax.call_tir"):
                    continue
                kernels += 1
                callee = value.args[0]
                args = value.args[1].fields if isinstance(value.args[1], relax.Tuple) else []
                if callee.name_hint not in gathers:
                    blocks = prim_func_blocks(lowered[callee])
                    gathers[callee.name_hint] = _gathered_params(lowered[callee], blocks)
                    moves[callee.name_hint] = _only_moves_data(blocks)
                copies += moves[callee.name_hint]
                out_elements = max((element_count(t, symbolic) or 0 for t in _tensor_types(
                    binding.var.ty)), default=0)
                for index, tensor in enumerate(list(args) + [binding.var]):
                    limit = out_elements if index in gathers[callee.name_hint] else None
                    size, float_size = _tensor_bytes(tensor.ty, symbolic, limit)
                    total += size
                    float_total += float_size
                if _is_cast_kernel(callee.name_hint):
                    dtypes = {str(getattr(t.ty, "dtype", "")) for t in (args[0], binding.var)}
                    if all(d.startswith(_FLOAT_PREFIXES) for d in dtypes):
                        casts += 1
                        if any(isinstance(a, _CONSTANT) or a.__chandle__() in params
                               for a in args):
                            parameter_casts += 1
                    else:
                        integer_casts += 1
    return GpuCost(kernels, total, float_total, casts, parameter_casts, integer_casts, copies)


def _tensor_types(ty) -> list:
    if isinstance(ty, relax.TensorType):
        return [ty]
    if isinstance(ty, tvm.ir.type.TupleType):
        return [t for field in ty.fields for t in _tensor_types(field)]
    return []


def symbolic_sizes(mod: tvm.IRModule, inputs, function: str = "main") -> dict:
    """The sizes of the symbolic extents of ``function``'s parameters in ``inputs`` (arrays in
    parameter order), for :func:`gpu_cost`'s ``symbolic``."""
    sizes = {}
    for param, value in zip(mod[function].params, inputs):
        shape = getattr(getattr(param.ty, "shape", None), "values", None) or ()
        for dim, extent in zip(shape, getattr(value, "shape", ())):
            if isinstance(dim, tvm.tirx.Var):
                sizes[dim.name] = int(extent)
    return sizes


def gpu_cost(mod: tvm.IRModule, target=None, symbolic: dict | None = None,
             pipeline: str = "relay_amp") -> GpuCost:
    """Kernels, bytes at kernel boundaries and standalone casts of ``mod`` on a CUDA target.

    Parameters
    ----------
    mod : tvm.IRModule
        A Relax module (float32, or the output of a conversion); not modified.
    target : tvm.target.Target or dict, optional
        A CUDA target. Default ``{"kind": "cuda", "arch": "sm_90"}``.
    symbolic : dict, optional
        Sizes of symbolic extents by name (``{"seq_len": 128}``; :func:`symbolic_sizes` reads
        them from inputs). A tensor with an extent not given counts no bytes.
    pipeline : str
        ``"relay_amp"`` (default): the kernels ``relay_amp.cuda_pipeline`` builds;
        ``"tvm"``: those of TVM's own CUDA pipeline (``tvm.compile``'s default), the fused
        module relay_amp's pipeline starts from.

    Returns
    -------
    GpuCost
        Kernels, bytes, float bytes, standalone float casts, the casts of parameters or
        constants among them, standalone integer casts, and kernels that only copy.
    """
    return module_cost(lower_for_cuda(mod, target or {"kind": "cuda", "arch": "sm_90"}, pipeline),
                       symbolic)
