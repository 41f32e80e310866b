"""Target defaults: which low-precision dtypes relay_amp converts for a TVM target, and what
TVM 0.27's build makes of them.

*Converts* means the report's compute dtype is the low-precision one (dot products accumulate in
float32 unless the policy asks otherwise); *storage* means ops keep float32 compute with their
weights stored in the low-precision dtype. The rest of each cell is what the code ``tvm.compile``
generates does in the dot products (matmuls, convolutions) of a convnet block, a BERT layer and a
LLaMA layer, measured by ``tests/pass/test_target_table.py``: *float32 arithmetic* means the
kernels read the low-precision values, widen them and multiply and accumulate in float32, so the
bytes halve but the arithmetic is no faster. ``nn.attention`` (no ``out_dtype``: float16
accumulation in the report) is legalized by TVM into batch matmuls that compute in float16 (half
FMAs) on every target that builds, except with ``relay_amp.cuda_pipeline``, which decomposes it
into matmuls that accumulate in float32.

=====================  =====================================  ======================================
target                 float16                                bfloat16
=====================  =====================================  ======================================
cuda sm_XY             converts on sm_53+. With               converts on sm_80+: bfloat16 tensor
                       ``relay_amp.cuda_pipeline`` on         cores (WMMA, float32 accumulators) as
                       sm_70+, matmuls and convolutions       for float16, other dot products
                       whose extents (batch aside) all        float32 arithmetic. Older arches: an
                       exceed 64 run on tensor cores (WMMA    error unless the policy's
                       16x16x16, float16 inputs, float32      ``fallback="storage"``
                       accumulators); smaller ones,
                       attention's matmuls (head size <= 64)
                       and every dot product on sm_53 to
                       sm_69: float32 arithmetic on CUDA
                       cores. TVM's own CUDA pipeline
                       computes ``nn.attention`` in float16.
                       Older arches: storage
llvm aarch64           converts with ``+fullfp16`` (or an     converts with ``+bf16`` (or an
                       ``mcpu`` that has it): float32         ``mcpu`` with it). TVM's own build
                       arithmetic by default (``fcvt``        emits no BFDOT, BFMMLA or BFMLAL:
                       widening, float32 FMAs); half FMAs     values widened with integer shifts,
                       (``fmadd h``, ``fmla v.8h``) with      float32 arithmetic. relay_amp's
                       float16 accumulation asked             runs matmuls and convolutions with
                       (``Policy.set_accumulation_dtype``).   constant weights on ``bfmmla``
                       relay_amp's build                      (``bfdot`` where a tile's 8 rows or
                       (:func:`relay_amp.cpu_pipeline`)       columns do not fit), depthwise
                       computes matmuls and convolutions      ones on ``bfmlalb/t``
                       in vector FMAs (``fmla v.4s``,         (:mod:`relay_amp.builds.bfmmla`,
                       ``fmla v.8h``), TVM's own mostly in    :mod:`relay_amp.builds.bfdot`).
                       scalar ``fmadd``. Without: storage     Without: storage
llvm x86               converts with ``avx512fp16``: as on    converts with ``avx512bf16`` or
                       aarch64 (``vcvtsh2ss`` widening,       ``amx-bf16``, but no VDPBF16PS or AMX:
                       float32 FMAs;                          values widened with integer shifts,
                       ``vfmadd*sh``/``vfmadd*ph`` with       float32 arithmetic. Without: storage
                       float16 accumulation asked). Without:
                       storage
llvm, other            storage                                storage
rocm                   converts: float32 arithmetic in dot    converts on gfx90a, gfx94x, gfx95x,
                       products (no MFMA, WMMA or half FMA;   gfx11xx and gfx12xx: values widened
                       measured on gfx90a, gfx942 and         with integer shifts, float32
                       gfx1100). The build needs a ROCm       arithmetic; other GPUs: an error
                       installation (device bitcode,          unless ``fallback="storage"``
                       ``ld.lld``)
vulkan                 converts, but this TVM wheel has no    an error (or ``fallback``): no code
                       Vulkan code generator: the build       generator
                       fails
metal, opencl, webgpu  converts: float32 arithmetic in dot    an error (or ``fallback``): TVM's code
                       products on float16 storage (OpenCL    generators have no bfloat16 type
                       needs ``cl_khr_fp16``, WebGPU
                       ``shader-f16``)
c, other kinds         storage                                storage
=====================  =====================================  ======================================

Where a dtype does not convert, dot-product ops keep float32 compute and only their weights are
stored in the low-precision dtype (storage). TVM's build may undo that: the CUDA build folds the
widening of constant weights at build time, so its library holds them in float32; on CPUs a cast
kernel widens them on every run. CPU features are read from LLVM itself
(``llvm_cpu_has_features``), so any ``mcpu`` or ``mattr`` works.

GPU targets (cuda, rocm, vulkan, metal, opencl, webgpu) are *memory-bound*: most kernels of a
model spend their time moving the tensors at their boundaries, so the kernel settings of
:class:`relay_amp.Policy` (``decompose_batch_norm``, ``mixed_kernels``,
``low_precision_boundaries``) default to on there, and to off on CPUs and without a target,
where the extra conversions inside kernels cost compute and bytes matter less.
``low_precision_residuals`` defaults to :data:`UNCENTRED` on memory-bound targets: residual
streams are stored in low precision and added in float32 registers, except a stream whose sum a
normalization centres (post-norm transformers), where rounding the stream costs the digits the
subtraction keeps.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import tvm

from .builds.cpu_features import cpu_has
from .op_registry import LOW_CATEGORIES, Category
from .policy import Decision
from .reasons import Reason
from .relax_utils import TVM_ERRORS


@dataclass(frozen=True)
class TargetCaps:
    """What one target can do with the low-precision dtypes."""

    name: str
    fp16_compute: bool
    bf16_compute: bool
    bf16_supported: bool = True  # False: bfloat16 is an error without an explicit fallback
    #: The CPU's float16 FMA (aarch64 ``fmadd h``/``fmla v.8h``, x86 ``vfmadd*sh``/``vfmadd*ph``)
    #: accumulates in float16.
    #: Dot products still accumulate in float32 by default (the accurate choice, measured on
    #: the registry: docs/ARM.md); ``Policy.set_accumulation_dtype(op, "float16")`` takes it.
    fp16_native_accumulation: bool = False
    half_fma: str = ""  # that instruction, for the report
    #: Kernels are bound by memory traffic (GPUs): the kernel settings default to on.
    memory_bound: bool = False
    #: Why bfloat16 is refused where ``bf16_supported`` is False: the target's own limitation.
    bf16_limitation: str = ""

    def computes(self, dtype: str) -> bool:
        return self.fp16_compute if dtype == "float16" else self.bf16_compute


class UnsupportedDtypeError(ValueError):
    """The target cannot use the requested low-precision dtype."""


def as_target(target) -> tvm.target.Target | None:
    """Accept a ``tvm.target.Target``, a target dict or kind name, or None."""
    if target is None or isinstance(target, tvm.target.Target):
        return target
    if isinstance(target, (dict, str)):
        try:
            return tvm.target.Target(target)
        except TVM_ERRORS as err:  # TVM raises its own error types
            raise ValueError(f"invalid target {target!r}: {str(err).splitlines()[-1]}") from None
    raise TypeError("target must be a tvm.target.Target, a dict or None; "
                    f"got {type(target).__name__}")


def target_caps(target: tvm.target.Target) -> TargetCaps:
    """The low-precision capabilities of ``target`` (see the module table)."""
    kind = target.kind.name
    attrs = target.attrs
    if kind == "cuda":
        arch = str(attrs["arch"]) if "arch" in attrs else ""
        match = re.fullmatch(r"sm_(\d+)[a-z]?", arch)
        if not match:
            return TargetCaps("cuda (no arch)", True, False, bf16_supported=False,
                              memory_bound=True, bf16_limitation="without an arch, CUDA "
                              "bfloat16 arithmetic cannot be assumed (it needs sm_80 or newer)")
        sm = int(match.group(1))
        return TargetCaps(f"cuda {arch}", sm >= 53, sm >= 80, bf16_supported=sm >= 80,
                          memory_bound=True, bf16_limitation=f"{arch} has no bfloat16 "
                          "arithmetic (CUDA has it from sm_80)")
    if kind == "llvm":
        triple = str(attrs["mtriple"]) if "mtriple" in attrs else ""
        cpu = str(attrs["mcpu"]) if "mcpu" in attrs else "generic"
        name = f"llvm {cpu}" + (f" ({triple})" if triple else "")
        if not triple:
            triple = tvm.target.codegen.llvm_get_system_triple()
        if triple.startswith(("aarch64", "arm64")):
            fp16 = cpu_has("fullfp16", target)
            return TargetCaps(name, fp16, cpu_has("bf16", target),
                              fp16_native_accumulation=fp16, half_fma="fmadd h / fmla v.8h")
        if triple.startswith(("x86_64", "i686", "i386")):
            fp16 = cpu_has("avx512fp16", target)
            return TargetCaps(name, fp16,
                              cpu_has("avx512bf16", target) or cpu_has("amx-bf16", target),
                              fp16_native_accumulation=fp16, half_fma="vfmadd*sh / vfmadd*ph")
        return TargetCaps(name, False, False)
    if kind == "rocm":
        cpu = str(attrs["mcpu"]) if "mcpu" in attrs else ""
        bf16 = bool(re.match(r"gfx(90a|94\d|95\d|11\d\d|12\d\d)", cpu))
        return TargetCaps(f"rocm {cpu}".strip(), True, bf16, bf16_supported=bf16,
                          memory_bound=True, bf16_limitation=f"{cpu or 'this GPU'} has no "
                          "bfloat16 arithmetic (gfx90a, gfx94x, gfx95x, gfx11xx and gfx12xx "
                          "have it)")
    if kind in ("vulkan", "metal", "opencl", "webgpu"):
        return TargetCaps(kind, True, False, bf16_supported=False, memory_bound=True,
                          bf16_limitation=_shader_bf16_limitation(kind))
    return TargetCaps(kind, False, False)


#: The aarch64 cores users name in ``mcpu``, for :func:`arm_cpu_path`.
ARM_CPUS = ("neoverse-n1", "neoverse-v1", "neoverse-v2", "cortex-a76", "cortex-a55",
            "cortex-a53", "apple-m1", "apple-m2")
#: The features that decide relay_amp's aarch64 path (LLVM's names).
ARM_FEATURES = ("fullfp16", "fp16fml", "bf16", "i8mm", "sve")


def arm_cpu_path(mcpu: str) -> dict:
    """What an aarch64 core named ``mcpu`` has (LLVM's own feature table) and the path
    relay_amp's build takes for float16 and bfloat16 there.

    Returns
    -------
    dict
        ``mcpu``, ``features`` (feature -> bool, :data:`ARM_FEATURES`), ``float16`` and
        ``bfloat16`` (the path, in words: what the dot products execute).
    """
    target = tvm.target.Target({"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": mcpu})
    features = {name: cpu_has(name, target) for name in ARM_FEATURES}
    caps = target_caps(target)
    if caps.computes("float16") and features["fp16fml"]:
        float16 = ("converts: float16 operands multiplied into float32 sums (fmlal/fmlal2) where "
                   "a kernel's lanes are contiguous and a multiple of 4, else widened (fcvtl) "
                   "into fmla v.4s; fmla v.8h with float16 accumulation asked")
    elif caps.computes("float16"):
        float16 = ("converts: float16 operands widened (fcvtl) into float32 vector FMAs "
                   "(fmla v.4s); fmla v.8h with float16 accumulation asked")
    else:
        float16 = "storage: float32 compute, weights stored in float16 (no fullfp16)"
    if caps.computes("bfloat16"):
        bfloat16 = ("converts: matmuls and convolutions with constant weights on bfmmla "
                    "(8 x 8 tiles; bfdot by element where the output channels are not a "
                    "multiple of 8 or the rows fewer than 8), depthwise convolutions of 8k "
                    "channels on bfmlalb/bfmlalt (weights packed at build time, float32 sums); "
                    "other dot products (attention's) widened by shifts into float32 vector "
                    "FMAs")
    else:
        bfloat16 = "storage: float32 compute, weights stored in bfloat16 (no bf16)"
    return {"mcpu": mcpu, "features": features, "float16": float16, "bfloat16": bfloat16}


def _shader_bf16_limitation(kind: str) -> str:
    if tvm.get_global_func(f"target.build.{kind}", allow_missing=True) is None:
        return f"this TVM build has no {kind} code generator (target.build.{kind})"
    return (f"TVM's {kind} code generator has no bfloat16 type: it stores bfloat16 as 16-bit "
            "integers and computes in float32, so bfloat16 saves bytes but no arithmetic")


def target_rule(target, dtype: str, fallback: str | None):
    """The target-defaults layer of a policy: ``(op, Decision) -> Decision``, or None.

    Raises
    ------
    UnsupportedDtypeError
        ``dtype`` is bfloat16, the target has no bfloat16 support and ``fallback`` is None.
    """
    if target is None:
        return None
    caps = target_caps(target)
    if dtype == "bfloat16" and not caps.bf16_supported and fallback is None:
        raise UnsupportedDtypeError(
            f"target {caps.name} has no bfloat16 support: {caps.bf16_limitation}; convert to "
            "float16, or pass Policy(fallback='storage') to store weights in bfloat16 and "
            "compute in float32"
        )
    if caps.computes(dtype):
        half_fma = dtype == "float16" and caps.fp16_native_accumulation

        def fast(op: str, decision: Decision) -> Decision:
            if decision.category not in LOW_CATEGORIES:
                return decision
            reasons = decision.reasons + (Reason.of("target_fast", target=caps.name,
                                                    dtype=dtype),)
            if (half_fma and decision.category == Category.LOW_PRECISION_FP32_ACCUMULATE
                    and not decision.accumulation_from_user):
                reasons += (Reason.of("target_float32_accumulation",
                                      instruction=caps.half_fma, op=op),)
            return Decision(decision.category, reasons, decision.accumulation_dtype,
                            decision.accumulation_from_user, decision.accumulation_block)
        return fast

    def storage_only(op: str, decision: Decision) -> Decision:
        if decision.category in LOW_CATEGORIES:
            return Decision(Category.STORAGE, (Reason.of(
                "target_storage_only", target=caps.name, dtype=dtype, op=op),),
                            decision.accumulation_dtype)
        return decision
    return storage_only


#: ``low_precision_residuals`` as memory-bound targets resolve its default: a residual stream
#: is stored in low precision unless a normalization centres the sum it is added into (the
#: post-norm transformer's stream), which keeps float32.
UNCENTRED = "uncentred"


@dataclass(frozen=True)
class KernelSettings:
    """The effective kernel settings of one conversion, each with the reason it holds.
    ``low_precision_residuals`` is True, False or :data:`UNCENTRED`."""

    decompose_batch_norm: bool = False
    mixed_kernels: bool = False
    low_precision_boundaries: bool = False
    low_precision_residuals: bool | str = False
    reasons: tuple = ()  # (setting, value, why), in KERNEL_SETTINGS order
    #: Policy.result_budget, resolved (relay_amp.policy.DEFAULT_RESULT_BUDGET where None).
    result_budget: float = 0.0

    def describe(self) -> str:
        return "; ".join(f"{name} {_setting_word(value)} ({why})"
                         for name, value, why in self.reasons)


def _setting_word(value) -> str:
    if value is True or value is False:
        return "on" if value else "off"
    return f"for {value} streams"


def kernel_settings(policy, target) -> KernelSettings:
    """The policy's kernel settings, with None resolved by the target's default."""
    from .policy import DEFAULT_RESULT_BUDGET, KERNEL_SETTINGS

    caps = target_caps(target) if target is not None else None
    values, reasons = {}, []
    for name in KERNEL_SETTINGS:
        chosen = getattr(policy, name)
        if chosen is not None:
            values[name], why = chosen, "set by the policy"
        elif name == "low_precision_residuals" and not values["low_precision_boundaries"]:
            values[name], why = False, "low_precision_boundaries is off"
        elif caps is None:
            values[name], why = False, "default without a target"
        elif caps.memory_bound and name == "low_precision_residuals":
            values[name], why = UNCENTRED, (
                f"target {caps.name} is memory-bound; a stream a normalization centres keeps "
                "float32")
        elif caps.memory_bound:
            values[name], why = True, f"target {caps.name} is memory-bound"
        else:
            values[name], why = False, f"target {caps.name} is compute-bound"
        reasons.append((name, values[name], why))
    budget = policy.result_budget
    return KernelSettings(**values, reasons=tuple(reasons),
                          result_budget=DEFAULT_RESULT_BUDGET if budget is None else budget)
