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
   dot products run on tensor cores, or why none do.
"""

from __future__ import annotations

import contextlib
import re
import threading

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


# ------------------------------------------------------------------------------ intrinsics
_REGISTERED = threading.Lock()
_registered = False


def register_bfloat16_intrinsics() -> None:
    """Register the bfloat16 WMMA intrinsics (once per process)."""
    global _registered  # noqa: PLW0603 - filled once, on first use
    with _REGISTERED:
        if _registered:
            return
        from tvm.s_tir import TensorIntrin
        from tvm.s_tir.tensor_intrin import cuda

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
    from tvm.s_tir.tensor_intrin import cuda

    register_bfloat16_intrinsics()
    with _SWAP:
        original = cuda.get_wmma_intrin_group

        def group(load_scope, store_scope, in_dtype, out_dtype, trans_b):
            del in_dtype  # dlight always asks for float16
            return bfloat16_intrinsic_group(load_scope, store_scope, out_dtype, trans_b)

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
