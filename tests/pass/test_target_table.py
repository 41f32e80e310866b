"""The target table (relay_amp/targets.py's docstring, docs/GUIDE.md's "Target defaults"), checked
against the code TVM 0.27 generates: for each row a convnet block, a BERT layer and a LLaMA layer
are converted for the row's target, compiled, and the generated code of their dot products is
read: LLVM's assembly for CPUs and AMD GPUs, and for the source-printing GPU back ends (CUDA,
OpenCL, Metal, WebGPU, C) the TIR each code generator prints, with CUDA's source for its tensor
cores. No GPU is needed; x86 and aarch64 code is compiled, never run.

The layers' dot products have every extent but the batch above 64 (dlight's threshold for
tensor cores), so the CUDA row's tensor-core claim is checked on them too. Everything here takes
about 40 s on 2 cores (the tensor-core builds register only the TVM intrinsics they name:
``relay_amp.builds.tensor_cores.cuda_intrinsics``)."""

import contextlib
import functools
import re
from collections import Counter

import numpy as np
import pytest
import tvm
import tvm_ffi
from helpers import asm_functions
from tvm import relax, tirx

import relay_amp
from relay_amp.targets import ARM_CPUS, ARM_FEATURES, arm_cpu_path

op = relax.op
SEQ, HIDDEN, HEADS, FFN, CHANNELS = 128, 128, 2, 256, 128
LAYERS = ("convnet", "bert", "llama")


# ------------------------------------------------------------------------------------ layers
def _const(rng, shape, scale=0.1):
    return relax.const((rng.normal(size=shape) * scale).astype("float32"))


def convnet():
    """conv2d 3x3 + bias + relu, NCHW."""
    rng = np.random.default_rng(0)
    x = relax.Var("x", relax.TensorType((1, CHANNELS, 16, 16), "float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            h = builder.emit(op.nn.conv2d(x, _const(rng, (CHANNELS, CHANNELS, 3, 3)), padding=1))
            h = builder.emit(op.add(h, _const(rng, (1, CHANNELS, 1, 1))))
            out = builder.emit_output(op.nn.relu(h))
        builder.emit_func_output(out)
    return builder.get()


def _linear(emit, rng, value, rows, cols, bias=True):
    out = op.matmul(value, _const(rng, (rows, cols)))
    return emit(op.add(out, _const(rng, (cols,))) if bias else out)


def _heads(emit, value):
    return emit(op.reshape(value, (1, SEQ, HEADS, HIDDEN // HEADS)))


def bert_layer():
    """A post-norm encoder layer: q/k/v projections, softmax attention, output projection,
    residual + layer_norm, GELU FFN, residual + layer_norm."""
    rng = np.random.default_rng(1)
    x = relax.Var("x", relax.TensorType((1, SEQ, HIDDEN), "float32"))
    ones, zeros = (relax.const(np.full(HIDDEN, v, "float32")) for v in (1, 0))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            emit = builder.emit
            q, k, v = (_heads(emit, _linear(emit, rng, x, HIDDEN, HIDDEN)) for _ in range(3))
            context = emit(op.reshape(op.nn.attention(q, k, v), (1, SEQ, HIDDEN)))
            h = emit(op.nn.layer_norm(op.add(_linear(emit, rng, context, HIDDEN, HIDDEN), x),
                                      ones, zeros, axes=[-1]))
            inner = emit(op.nn.gelu(_linear(emit, rng, h, HIDDEN, FFN)))
            out = builder.emit_output(op.nn.layer_norm(
                op.add(_linear(emit, rng, inner, FFN, HIDDEN), h), ones, zeros, axes=[-1]))
        builder.emit_func_output(out)
    return builder.get()


def llama_layer():
    """A pre-norm decoder layer: rms_norm, causal attention, residual, rms_norm, SiLU-gated MLP,
    residual."""
    rng = np.random.default_rng(2)
    x = relax.Var("x", relax.TensorType((1, SEQ, HIDDEN), "float32"))
    gamma = relax.const(np.ones(HIDDEN, "float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            emit = builder.emit
            normed = emit(op.nn.rms_norm(x, gamma, axes=[-1]))
            q, k, v = (_heads(emit, _linear(emit, rng, normed, HIDDEN, HIDDEN, False))
                       for _ in range(3))
            context = emit(op.reshape(op.nn.attention(q, k, v, causal_mask="TopLeft"),
                                      (1, SEQ, HIDDEN)))
            h = emit(op.add(x, _linear(emit, rng, context, HIDDEN, HIDDEN, False)))
            normed = emit(op.nn.rms_norm(h, gamma, axes=[-1]))
            gate = emit(op.nn.silu(_linear(emit, rng, normed, HIDDEN, FFN, False)))
            up = _linear(emit, rng, normed, HIDDEN, FFN, False)
            down = _linear(emit, rng, emit(op.multiply(gate, up)), FFN, HIDDEN, False)
            out = builder.emit_output(op.add(h, down))
        builder.emit_func_output(out)
    return builder.get()


BUILDERS = {"convnet": convnet, "bert": bert_layer, "llama": llama_layer}


@functools.cache
def layer(name):
    return BUILDERS[name]()


# ----------------------------------------------------------------------------------- targets
A64 = {"kind": "llvm", "mtriple": "aarch64-linux-gnu"}
X86 = {"kind": "llvm", "mtriple": "x86_64-linux-gnu"}
TARGETS = {
    "cuda sm_90": {"kind": "cuda", "arch": "sm_90"},
    "cuda sm_75": {"kind": "cuda", "arch": "sm_75"},
    "cuda sm_60": {"kind": "cuda", "arch": "sm_60"},
    "cuda sm_52": {"kind": "cuda", "arch": "sm_52"},
    "aarch64 +fullfp16": {**A64, "mattr": ["+neon", "+fullfp16"]},
    "aarch64 +bf16": {**A64, "mattr": ["+neon", "+bf16"]},
    "aarch64 neon": {**A64, "mattr": ["+neon"]},
    "x86 avx512fp16": {**X86, "mcpu": "sapphirerapids"},
    "x86 avx512bf16": {**X86, "mcpu": "cooperlake"},
    "x86 avx2": {**X86, "mcpu": "haswell"},
    "riscv64": {"kind": "llvm", "mtriple": "riscv64-linux-gnu", "mattr": ["+m", "+a", "+f", "+d"]},
    "rocm gfx90a": {"kind": "rocm", "mcpu": "gfx90a"},
    "rocm gfx942": {"kind": "rocm", "mcpu": "gfx942"},
    "rocm gfx1100": {"kind": "rocm", "mcpu": "gfx1100"},
    "opencl": "opencl",
    "metal": "metal",
    "webgpu": "webgpu",
    "vulkan": "vulkan",
    "c": "c",
}
TARGETS.update({f"aarch64 {cpu}": {**A64, "mcpu": cpu} for cpu in ARM_CPUS})
#: Policy variants: float16 accumulation asked for every dot product (CPU targets' opt-in).
FLOAT16_ACCUMULATION = "float16 accumulation"


def _policy(dtype, variant):
    if variant == FLOAT16_ACCUMULATION:
        return relay_amp.Policy(dtype).set_accumulation_dtype("nn.conv2d", "float16") \
            .set_accumulation_dtype("matmul", "float16")
    if variant == "storage":
        return relay_amp.Policy(dtype, fallback="storage")
    return relay_amp.Policy(dtype)


# ------------------------------------------------------------------- reading generated code
def _role(kernel: str) -> str | None:
    """``attention`` (TVM's legalized ``nn.attention``), ``dot`` (a matmul or convolution
    kernel, epilogues fused or not) or None (other kernels, TVM's ``__tvm_ffi_`` wrappers)."""
    if kernel.startswith("__"):
        return None
    if "attention" in kernel:
        return "attention"
    if re.search(r"matmul|conv2d", kernel):
        return "dot"
    return None


@contextlib.contextmanager
def _capturing(kind):
    """The IRModules handed to ``target.build.<kind>`` while the block runs."""
    name = f"target.build.{kind}"
    original = tvm.get_global_func(name)
    seen = []

    def build(mod, target):
        seen.append(mod)
        return original(mod, target)

    tvm_ffi.register_global_func(name, build, override=True)
    try:
        yield seen
    finally:
        tvm_ffi.register_global_func(name, original, override=True)


@contextlib.contextmanager
def _rocm_unlinked():
    """ROCm's build without a ROCm installation: no device bitcode library linked in and the
    object left unlinked (``ld.lld``), which leaves LLVM's AMDGPU assembly as it was generated."""
    names = ("tvm_callback_rocm_bitcode_path", "tvm_callback_rocm_link")
    originals = [tvm.get_global_func(n) for n in names]
    tvm_ffi.register_global_func(names[0], lambda *_: tvm.runtime.convert([]), override=True)
    tvm_ffi.register_global_func(names[1], lambda obj: obj, override=True)
    try:
        yield
    finally:
        for name, original in zip(names, originals):
            tvm_ffi.register_global_func(name, original, override=True)


def _dtype(expr) -> str:
    return str(getattr(expr.ty, "dtype", expr.ty))


LOW = ("float16", "bfloat16")


def _tir_census(func) -> Counter:
    """What one device kernel computes: ``("mac", dtype)`` per multiply-accumulate statement
    (``acc[i] = acc[i] + a * b``, or an ``fma`` call) and ``("low", op)`` per float16/bfloat16
    arithmetic node; ``("mma", name)`` per tensor-core call."""
    counts = Counter()

    def visit(node):
        if isinstance(node, tirx.BufferStore) and isinstance(node.value, tirx.Add):
            a, b = node.value.a, node.value.b
            if any(isinstance(load, tvm.ir.expr.TensorLoad) and load.source.same_as(node.buffer)
                   and isinstance(other, tirx.Mul) for load, other in ((a, b), (b, a))):
                counts["mac", _dtype(node.value).split("x")[0]] += 1
        elif isinstance(node, tvm.ir.Call) and isinstance(getattr(node.op, "name", None), str):
            name = node.op.name
            if name.endswith("_sync") and "mma" in name:
                counts["mma", name] += 1
            elif name == "tirx.call_pure_extern" and str(node.args[0]) in ('"fma"', "fma"):
                counts["mac", _dtype(node).split("x")[0]] += 1
        elif isinstance(node, (tirx.Mul, tirx.Add, tirx.Sub, tirx.Div)):
            if _dtype(node).split("x")[0] in LOW:
                counts["low", type(node).__name__] += 1

    tvm_ffi.structural_walk(func.body, visit)
    return counts


class Built:
    """One converted, compiled layer: the report, per-kernel code and what it computes."""

    def __init__(self, report, kernels: dict, census: dict | None = None, source: str = ""):
        self.report = report
        self.kernels = kernels  # kernel name -> assembly (CPU, ROCm) or "" (TIR targets)
        self.census = census or {}  # kernel name -> Counter (TIR targets)
        self.source = source  # the device source (CUDA, OpenCL, ...)

    def asm(self, role: str) -> str:
        return "\n".join(code for name, code in self.kernels.items() if _role(name) == role)

    def found(self, role: str, pattern: str) -> list:
        return re.findall(pattern, self.asm(role))

    def each_dot_kernel(self, pattern: str) -> bool:
        """Whether every matmul and convolution kernel has an instruction ``pattern`` matches."""
        dots = [code for name, code in self.kernels.items() if _role(name) == "dot"]
        return bool(dots) and all(re.search(pattern, code) for code in dots)

    def macs(self, role: str) -> set:
        return {key[1] for name, counts in self.census.items() if _role(name) == role
                for key in counts if key[0] == "mac"}

    def low_arithmetic(self, role: str) -> int:
        return sum(n for name, counts in self.census.items() if _role(name) == role
                   for key, n in counts.items() if key[0] == "low")

    def tensor_core_kernels(self) -> list:
        return sorted(name for name, counts in self.census.items()
                      if any(key[0] == "mma" for key in counts))

    def fragments(self) -> set:
        """The dtypes of CUDA's WMMA fragments: inputs (matrix_a/b) and accumulator."""
        return set(re.findall(r"wmma::fragment<nvcuda::wmma::(\w+), 16, 16, 16, (\w+)",
                              self.source))


@functools.cache
def build(target_name: str, layer_name: str, dtype: str, variant: str = "",
          pipeline: str = "relay_amp") -> Built:
    target = tvm.target.Target(TARGETS[target_name])
    kind = target.kind.name
    converted, report = relay_amp.convert(layer(layer_name), policy=_policy(dtype, variant),
                                          target=target)
    if kind == "llvm":
        executable = tvm.compile(converted, target=target, relax_pipeline=relay_amp.cpu_pipeline(
            target, relay_amp_schedules=pipeline == "relay_amp"))
        asm = "\n".join(m.inspect_source("asm") for m in [executable.mod, *executable.mod.imports]
                        if m.kind == "llvm")
        return Built(report, asm_functions(asm))
    if kind == "rocm":
        with _rocm_unlinked():
            executable = tvm.compile(converted, target=target)
        (device,) = executable.mod.imports[0].imports
        return Built(report, asm_functions(device.inspect_source("asm")))
    extra = {}
    if kind == "cuda" and pipeline == "relay_amp":
        extra["relax_pipeline"] = relay_amp.cuda_pipeline(target)
    with _capturing(kind) as seen:
        executable = tvm.compile(converted, target=target, **extra)
    census = {gv.name_hint: _tir_census(f) for mod in seen for gv, f in mod.functions.items()}
    source = "\n".join(m.inspect_source() for m in executable.mod.imports[0].imports)
    kernels = dict.fromkeys(census, "")
    return Built(report, kernels, census, source)


def _has_attention(layer_name):
    return layer_name != "convnet"


# --------------------------------------------------------------------------------- the rows
# AArch64: half arithmetic (a vector or scalar half FMA/add/mul), a half operand widened to
# float32, float32 FMAs, the bfloat16 instructions (+bf16) and bfloat16 widened by a shift.
A64_HALF_FMA = r"\b(?:fmla|fmls|fmadd|fmsub)\s+(?:v\d+\.[48]h|h\d+)\b"
A64_HALF_ARITHMETIC = r"\b(?:fmla|fmls|fmadd|fmsub|fadd|fsub|fmul|fdiv)\s+(?:v\d+\.[48]h|h\d+)\b"
A64_F32_FMA = r"\b(?:fmla|fmadd)\s+(?:v\d+\.[24]s|s\d+)\b"
A64_F32_VECTOR_FMA = r"\bfmla\s+v\d+\.4s"
A64_HALF_VECTOR_FMA = r"\bfmla\s+v\d+\.8h"
A64_SCALAR_FMA = r"\bfn?m(?:add|sub)\s+[hs]\d+"
A64_WIDEN_HALF = r"\bfcvtl2?\s+v\d+\.4s|\bfcvt\s+s\d+, h\d+"
A64_FMLAL = r"\bfmlal2?\s+v\d+\.4s"
A64_BF16 = r"\b(?:bfdot|bfmmla|bfmlal[bt]|bfcvtn2?|bfcvt)\b"
A64_BFDOT = r"\bbfdot\s+v\d+\.4s, v\d+\.8h, v\d+\.2h\[\d\]"
A64_BFMMLA = r"\bbfmmla\s+v\d+\.4s, v\d+\.8h, v\d+\.8h"
A64_BF16_DOT = f"{A64_BFMMLA}|{A64_BFDOT}"
A64_WIDEN_BY_SHIFT = r"\bshll2?\s+v\d+\.4s, v\d+\.[48]h, #16|\blsl\s+w\d+, w\d+, #16"
# x86: AVX512-FP16 half arithmetic, its float32 FMAs, half widened, AVX512-BF16/AMX dot products
X86_HALF_FMA = r"\bvfn?m(?:add|sub)(?:132|213|231)[ps]h\b"
X86_HALF_ARITHMETIC = r"\bv(?:fn?m(?:add|sub)(?:132|213|231)|add|sub|mul|div)[ps]h\b"
X86_F32_FMA = r"\bvfmadd(?:132|213|231)[ps]s\b"
X86_WIDEN_HALF = r"\bvcvt(?:sh2ss|ph2psx?)\b"
X86_BF16 = r"\b(?:vdpbf16ps|tdpbf16ps|vcvtne2?ps2bf16)\b"
X86_WIDEN_BY_SHIFT = r"\b(?:vpslld|shll)\s+\$16,"
# AMDGPU: matrix cores, packed and dot-product half/bfloat16 instructions, half FMAs; float32 FMAs
AMD_LOW_DOT = r"\bv_(?:mfma|wmma|dot2)\w*|\bv_(?:pk_)?(?:fma|fmac|mac|mad)_(?:f16|bf16)" \
              r"(?:_e32|_e64|_sdwa|_dpp)?\b"
# float32 FMAs, with v_fma_mix_f32 (RDNA: float16 operands widened inside a float32 FMA)
AMD_F32_FMA = r"\bv_(?:pk_)?(?:fma|fmac|mac|mad|madmk|madak|fmamk|fmaak|fma_mix)_f32" \
              r"(?:_e32|_e64|_sdwa|_dpp)?\b"
AMD_WIDEN_HALF = r"\bv_cvt_f32_f16\w*"
AMD_WIDEN_BY_SHIFT = r"\bv_lshlrev_b32\w*\s+v\d+, 16, "


# CUDA -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("layer_name", LAYERS)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_cuda_sm90_tensor_cores_with_float32_accumulation_and_no_low_precision_arithmetic(
        dtype, layer_name):
    """sm_90 with relay_amp.cuda_pipeline: the convolution and every projection and FFN matmul
    on tensor cores (WMMA fragments of the dtype, float accumulator); attention's two decomposed
    matmuls (head size 64, not above the threshold) multiply-accumulate in float32 on CUDA
    cores, and nothing accumulates in low precision."""
    built = build("cuda sm_90", layer_name, dtype)
    fragment = {"float16": "half", "bfloat16": "nv_bfloat16"}[dtype]
    assert built.fragments() == {("matrix_a", fragment), ("matrix_b", fragment),
                                 ("accumulator", "float")}
    tensor_cores = built.tensor_core_kernels()
    assert len(tensor_cores) == {"convnet": 1, "bert": 4, "llama": 5}[layer_name]
    cuda_cores = [name for name in built.census if _role(name) == "dot"
                  and name not in tensor_cores]
    assert len(cuda_cores) == (2 if _has_attention(layer_name) else 0), cuda_cores
    assert built.macs("dot") == ({"float32"} if _has_attention(layer_name) else set())
    assert built.macs("attention") == set()  # decomposed (DecomposeAttention)


@pytest.mark.parametrize("layer_name", ["bert", "llama"])
def test_cuda_tvms_own_pipeline_computes_attention_in_float16(layer_name):
    """TVM's CUDA pipeline (``tvm.compile`` without relay_amp.cuda_pipeline) legalizes
    ``nn.attention`` into float16 batch matmuls that accumulate in float16."""
    built = build("cuda sm_90", layer_name, "float16", pipeline="tvm")
    assert built.macs("attention") == {"float16"}
    assert ("matrix_a", "half") in built.fragments()


def test_cuda_sm75_tensor_cores_for_float16_and_no_bfloat16():
    for layer_name in LAYERS:
        built = build("cuda sm_75", layer_name, "float16")
        assert ("accumulator", "float") in built.fragments() and built.tensor_core_kernels()
        with pytest.raises(relay_amp.UnsupportedDtypeError, match="sm_75 has no bfloat16"):
            relay_amp.convert(layer(layer_name), "bfloat16", target=TARGETS["cuda sm_75"])
        storage = build("cuda sm_75", layer_name, "bfloat16", "storage")
        assert not storage.report.converted
        assert storage.fragments() == set() and storage.macs("dot") == {"float32"}
        # the weights' bfloat16 copies are widened back by TVM's FoldConstant at build time
        assert "nv_bfloat16" not in storage.source


@pytest.mark.parametrize("arch", ["sm_60", "sm_52"])
def test_cuda_before_tensor_cores_float16_is_stored_and_computed_in_float32(arch):
    """sm_53..sm_69 convert to float16 (the report's compute dtype) and sm_52 stores weights
    only; either way the build multiplies and accumulates in float32 on CUDA cores."""
    for layer_name in LAYERS:
        built = build(f"cuda {arch}", layer_name, "float16")
        assert bool(built.report.converted) == (arch == "sm_60")
        assert built.fragments() == set() and built.tensor_core_kernels() == []
        assert built.macs("dot") == {"float32"}


# AArch64 --------------------------------------------------------------------------------------
@pytest.mark.parametrize("layer_name", LAYERS)
def test_aarch64_fullfp16_dot_products_are_float32_arithmetic_and_attention_is_float16(
        layer_name):
    """The default: matmuls and convolutions read float16 and widen it (``fcvt``), multiply and
    accumulate in float32; ``nn.attention`` (accumulation float16 in the report) computes with
    half instructions."""
    built = build("aarch64 +fullfp16", layer_name, "float16")
    assert built.found("dot", A64_HALF_ARITHMETIC) == []
    assert built.found("dot", A64_WIDEN_HALF) and built.found("dot", A64_F32_FMA)
    assert bool(built.found("attention", A64_HALF_ARITHMETIC)) == _has_attention(layer_name)


@pytest.mark.parametrize("layer_name", LAYERS)
def test_aarch64_fullfp16_with_float16_accumulation_asked_uses_half_fma(layer_name):
    built = build("aarch64 +fullfp16", layer_name, "float16", FLOAT16_ACCUMULATION)
    assert built.each_dot_kernel(A64_HALF_FMA) and built.found("dot", A64_F32_FMA) == []


@pytest.mark.parametrize("layer_name", LAYERS)
def test_aarch64_bf16_runs_dot_products_on_bfmmla_and_widens_the_rest_by_shifts(layer_name):
    """+bf16 converts to bfloat16. Every matmul and convolution (constant weights) runs on
    ``bfmmla`` (relay_amp.builds.bfmmla) or, where a tile of 8 does not fit, ``bfdot`` by
    element (relay_amp.builds.bfdot), no operand widened; the other bfloat16 instructions
    are the tiles' roundings on ``bfcvtn``/``bfcvtn2`` (relay_amp.builds.bfcvtn), no BFMLAL
    or scalar BFCVT, and attention's operands are widened with integer shifts and computed in
    float32. A float32 FMA in a dot kernel is its epilogue's (GELU's polynomial,
    folded into the write-back), far fewer than the tiles' ``bfmmla``."""
    built = build("aarch64 +bf16", layer_name, "bfloat16")
    assert built.report.converted
    assert built.each_dot_kernel(A64_BF16_DOT)
    assert built.found("dot", A64_WIDEN_BY_SHIFT) == []
    assert len(built.found("dot", A64_F32_FMA)) * 10 < len(built.found("dot", A64_BF16_DOT))
    others = set(re.findall(A64_BF16, "\n".join(built.kernels.values())))
    assert "bfmmla" in others and others <= {"bfdot", "bfmmla", "bfcvtn", "bfcvtn2"}, others
    if _has_attention(layer_name):
        assert built.found("attention", A64_WIDEN_BY_SHIFT)


@pytest.mark.parametrize("layer_name", LAYERS)
def test_aarch64_dot_products_are_vector_fmas_in_relay_amps_build_scalar_in_tvms(layer_name):
    """relay_amp.cpu_pipeline (relay_amp's build) computes every matmul and convolution in
    vector FMAs, ``fmla v.4s`` by default and ``fmla v.8h`` with float16 accumulation asked;
    TVM's CPU pipeline leaves scalar ``fmadd`` in them."""
    for variant, vector in (("", A64_F32_VECTOR_FMA), (FLOAT16_ACCUMULATION, A64_HALF_VECTOR_FMA)):
        built = build("aarch64 +fullfp16", layer_name, "float16", variant)
        assert built.each_dot_kernel(vector) and built.found("dot", A64_SCALAR_FMA) == []
        plain = build("aarch64 +fullfp16", layer_name, "float16", variant, pipeline="tvm")
        assert plain.found("dot", A64_SCALAR_FMA)


@pytest.mark.parametrize("layer_name", LAYERS)
def test_aarch64_without_fullfp16_no_half_arithmetic(layer_name):
    built = build("aarch64 neon", layer_name, "float16")
    assert not built.report.converted
    assert re.findall(A64_HALF_ARITHMETIC, "\n".join(built.kernels.values())) == []


# x86 ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("layer_name", LAYERS)
def test_x86_avx512fp16_dot_products_are_float32_arithmetic_and_attention_is_float16(
        layer_name):
    built = build("x86 avx512fp16", layer_name, "float16")
    assert built.found("dot", X86_HALF_ARITHMETIC) == []
    assert built.found("dot", X86_WIDEN_HALF) and built.found("dot", X86_F32_FMA)
    assert bool(built.found("attention", X86_HALF_ARITHMETIC)) == _has_attention(layer_name)


@pytest.mark.parametrize("layer_name", LAYERS)
def test_x86_avx512fp16_with_float16_accumulation_asked_uses_half_fma(layer_name):
    built = build("x86 avx512fp16", layer_name, "float16", FLOAT16_ACCUMULATION)
    assert built.each_dot_kernel(X86_HALF_FMA) and built.found("dot", X86_F32_FMA) == []


@pytest.mark.parametrize("layer_name", LAYERS)
def test_x86_avx512bf16_has_no_vdpbf16ps_it_widens_by_shifts(layer_name):
    built = build("x86 avx512bf16", layer_name, "bfloat16")
    assert built.report.converted
    assert re.findall(X86_BF16, "\n".join(built.kernels.values())) == []
    assert built.found("dot", X86_WIDEN_BY_SHIFT) and built.found("dot", X86_F32_FMA)


@pytest.mark.parametrize("layer_name", LAYERS)
def test_x86_without_avx512fp16_no_half_arithmetic(layer_name):
    built = build("x86 avx2", layer_name, "float16")
    assert not built.report.converted
    assert re.findall(X86_HALF_ARITHMETIC, "\n".join(built.kernels.values())) == []


# ROCm -----------------------------------------------------------------------------------------
def test_rocm_build_needs_a_rocm_installation():
    """This wheel has ROCm's code generator, but linking a code object needs ROCm's device
    bitcode and ld.lld; without a ROCm installation the build stops there."""
    from tvm.support import rocm

    assert tvm.get_global_func("target.build.rocm", allow_missing=True) is not None
    converted, _ = relay_amp.convert(layer("convnet"), "float16", target=TARGETS["rocm gfx90a"])
    try:
        rocm.find_rocm_path()
    except RuntimeError:
        with pytest.raises(Exception, match="Cannot find ROCm path"):
            tvm.compile(converted, target=tvm.target.Target(TARGETS["rocm gfx90a"]))
    else:  # a machine with ROCm builds it
        tvm.compile(converted, target=tvm.target.Target(TARGETS["rocm gfx90a"]))


ROCM_CASES = [("gfx90a", name) for name in LAYERS] + [("gfx942", "llama"), ("gfx1100", "llama")]


@pytest.mark.parametrize(("mcpu", "layer_name"), ROCM_CASES)
def test_rocm_dot_products_are_float32_arithmetic_no_matrix_cores(mcpu, layer_name):
    """CDNA2/3 (gfx90a, gfx942) have MFMA matrix cores and packed half math and RDNA3 (gfx1100)
    has WMMA, but TVM's ROCm build uses none of them for matmuls and convolutions: float16 loads
    are widened (``v_cvt_f32_f16``, or inside RDNA's ``v_fma_mix_f32``) and multiplied and
    accumulated in float32; ``nn.attention`` computes with ``v_fma_f16``."""
    built = build(f"rocm {mcpu}", layer_name, "float16")
    assert built.report.converted
    assert built.found("dot", AMD_LOW_DOT) == []
    assert built.found("dot", AMD_WIDEN_HALF + r"|\bv_fma_mix_f32")
    assert built.each_dot_kernel(AMD_F32_FMA)
    assert bool(built.found("attention", AMD_LOW_DOT)) == _has_attention(layer_name)


@pytest.mark.parametrize(("mcpu", "layer_name"), ROCM_CASES)
def test_rocm_bfloat16_is_widened_by_shifts_and_computed_in_float32(mcpu, layer_name):
    built = build(f"rocm {mcpu}", layer_name, "bfloat16")
    assert built.report.converted
    assert re.findall(AMD_LOW_DOT, "\n".join(built.kernels.values())) == []
    assert built.found("dot", AMD_WIDEN_BY_SHIFT) and built.each_dot_kernel(AMD_F32_FMA)


# Vulkan, Metal, OpenCL, WebGPU, C -------------------------------------------------------------
def test_vulkan_cannot_be_built_by_this_wheel():
    assert tvm.get_global_func("target.build.vulkan", allow_missing=True) is None
    converted, report = relay_amp.convert(layer("convnet"), "float16", target="vulkan")
    assert report.converted
    with pytest.raises(ValueError, match="target.build.vulkan"):
        tvm.compile(converted, target=tvm.target.Target("vulkan"))
    with pytest.raises(relay_amp.UnsupportedDtypeError, match="no vulkan code generator"):
        relay_amp.convert(layer("convnet"), "bfloat16", target="vulkan")


@pytest.mark.parametrize("kind", ["opencl", "metal", "webgpu"])
def test_shader_targets_dot_products_are_float32_arithmetic_and_attention_is_float16(kind):
    for layer_name in LAYERS:
        built = build(kind, layer_name, "float16")
        assert built.report.converted
        assert "float32" in built.macs("dot") and "float16" not in built.macs("dot")
        if _has_attention(layer_name):
            assert built.low_arithmetic("attention") > 0
        with pytest.raises(relay_amp.UnsupportedDtypeError, match="no bfloat16 type"):
            relay_amp.convert(layer(layer_name), "bfloat16", target=kind)


def test_c_target_stores_float16_and_computes_float32():
    for layer_name in LAYERS:
        built = build("c", layer_name, "float16")
        assert not built.report.converted
        assert built.macs("dot") == {"float32"} and built.low_arithmetic("dot") == 0


def test_other_llvm_cpus_store_float16_and_compute_float32():
    for layer_name in LAYERS:
        built = build("riscv64", layer_name, "float16")
        assert not built.report.converted
        code = "\n".join(built.kernels.values())
        assert re.findall(r"\bf(?:n?m(?:add|sub)|add|sub|mul|div)\.h\b", code) == []
        assert built.found("dot", r"\bfmadd\.s\b")


# ------------------------------------------------------------------- aarch64, per named core
@pytest.mark.parametrize("cpu", ARM_CPUS)
def test_each_named_core_gets_the_path_the_table_gives(cpu):
    """relay_amp.targets.arm_cpu_path says, from LLVM's feature table for ``mcpu``, what a core
    has and what the build does; the convnet block built for that core does exactly that."""
    path = arm_cpu_path(cpu)
    target = tvm.target.Target(TARGETS[f"aarch64 {cpu}"])
    assert path["features"] == {f: bool(tvm.target.codegen.llvm_cpu_has_features(f, target))
                                for f in ARM_FEATURES}
    built = build(f"aarch64 {cpu}", "convnet", "float16")
    assert built.found("dot", A64_HALF_ARITHMETIC) == []  # float32 accumulation either way
    converts = path["float16"].startswith("converts")
    assert converts == path["features"]["fullfp16"]
    fmlal = converts and path["features"]["fp16fml"]
    assert ("fmlal" in path["float16"]) == fmlal
    assert bool(built.found("dot", A64_FMLAL)) == fmlal
    assert bool(built.found("dot", A64_F32_VECTOR_FMA)) == (not fmlal)
    assert bool(built.found("dot", A64_WIDEN_HALF)) == (converts and not fmlal)
    computes = {row.compute_dtype for row in built.report.ops if row.op == "nn.conv2d"}
    assert computes == ({"float16"} if converts else {"float32"})
    assert re.findall(A64_BF16, "\n".join(built.kernels.values())) == []
    if path["features"]["bf16"]:
        assert path["bfloat16"].startswith("converts")
        bf16 = build(f"aarch64 {cpu}", "convnet", "bfloat16")
        assert ("bfmmla" in path["bfloat16"]) and bf16.each_dot_kernel(A64_BF16_DOT)
        assert bf16.found("dot", A64_BFMMLA)
        assert bf16.found("dot", A64_WIDEN_BY_SHIFT) == []
    else:
        assert path["bfloat16"].startswith("storage")
