"""What a module costs a GPU, measured without one: kernels and the bytes at their boundaries.

Most kernels of the models mixed precision is for are bandwidth-bound: their time follows the
bytes that cross kernel boundaries, plus a fixed cost per launch. :func:`gpu_cost` puts a module
through the passes ``tvm.compile`` runs for CUDA before scheduling (library dispatch, LegalizeOps,
AnnotateTIROpPattern, FoldConstant, FuseOps, FuseTIR, and RewriteDataflowReshape, which turns
reshapes into views that launch nothing) and counts, in each Relax function:

* ``kernels``: the ``call_tir`` calls left, one launch each (a fused PrimFunc may still be
  scheduled into more than one CUDA kernel; ``gpu_bench.build`` counts ``__global__`` functions);
* ``bytes``: for every ``call_tir``, the bytes of its tensor arguments plus its result;
* ``casts``: ``call_tir`` of a lone ``astype`` (a cast that fused into no other kernel), and of
  those, ``parameter_casts``: the ones that read a function parameter or a constant.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

import tvm
from tvm import relax

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

    def ideal_low_precision_bytes(self, low_bytes: int = 2) -> int:
        """These kernels with every float tensor stored in ``low_bytes`` per element
        (meaningful for a float32 module: the lower bound of a conversion that adds no kernel)."""
        return self.bytes - self.float_bytes + self.float_bytes * low_bytes // 4

    def as_dict(self) -> dict:
        return asdict(self)


def lower_for_cuda(mod: tvm.IRModule, target) -> tvm.IRModule:
    """``mod`` after the passes of TVM's CUDA pipeline that decide kernels and their operands."""
    from tvm.relax.backend.cuda import pipeline  # pylint: disable=import-outside-toplevel

    target = tvm.target.Target(target) if not isinstance(target, tvm.target.Target) else target
    passes = pipeline.library_dispatch_passes(target) + [
        relax.transform.LegalizeOps(),
        relax.transform.AnnotateTIROpPattern(),
        relax.transform.FoldConstant(),
        relax.transform.FuseOps(),
        relax.transform.FuseTIR(),
        relax.transform.RewriteDataflowReshape(),
    ]
    with target:
        return tvm.transform.Sequential(passes)(mod)


def _tensor_bytes(ty) -> tuple[int, int]:
    """(bytes, float bytes) of a static-shape tensor type, or of the tensors of a tuple type."""
    if isinstance(ty, relax.TensorType):
        if ty.shape is None or not isinstance(ty.shape, relax.ShapeExpr):
            return 0, 0
        count = 1
        for dim in ty.shape.values:
            if not isinstance(dim, tvm.tirx.IntImm):
                return 0, 0  # a symbolic extent: not counted
            count *= int(dim)
        dtype = str(ty.dtype)
        size = count * tvm.DataType(dtype).bits // 8
        return size, size if dtype.startswith(_FLOAT_PREFIXES) else 0
    if isinstance(ty, tvm.ir.type.TupleType):
        sizes = [_tensor_bytes(field) for field in ty.fields]
        return sum(s for s, _ in sizes), sum(f for _, f in sizes)
    return 0, 0


_CAST_KERNEL = re.compile(r"cast\d*")


def _is_cast_kernel(name: str) -> bool:
    """LegalizeOps names the PrimFunc of a lone ``astype`` ``cast`` (``cast1``, ...); FuseTIR
    names a fused group ``fused_...``: a cast that fused into another kernel never matches."""
    return _CAST_KERNEL.fullmatch(name) is not None


def module_cost(lowered: tvm.IRModule) -> GpuCost:
    """The cost of a module already put through :func:`lower_for_cuda`."""
    kernels = total = float_total = casts = parameter_casts = 0
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
                args = value.args[1].fields if isinstance(value.args[1], relax.Tuple) else []
                for tensor in list(args) + [binding.var]:
                    size, float_size = _tensor_bytes(tensor.ty)
                    total += size
                    float_total += float_size
                if _is_cast_kernel(value.args[0].name_hint):
                    casts += 1
                    if any(isinstance(a, _CONSTANT) or a.__chandle__() in params
                           for a in args):
                        parameter_casts += 1
    return GpuCost(kernels, total, float_total, casts, parameter_casts)


def gpu_cost(mod: tvm.IRModule, target=None) -> GpuCost:
    """Kernels, bytes at kernel boundaries and standalone casts of ``mod`` on a CUDA target.

    Parameters
    ----------
    mod : tvm.IRModule
        A Relax module (float32, or the output of a conversion); not modified.
    target : tvm.target.Target or dict, optional
        A CUDA target. Default ``{"kind": "cuda", "arch": "sm_90"}``.

    Returns
    -------
    GpuCost
        Kernels, bytes, float bytes, standalone casts and the casts of parameters or constants.
    """
    return module_cost(lower_for_cuda(mod, target or {"kind": "cuda", "arch": "sm_90"}))
