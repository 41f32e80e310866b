"""Shared test helpers: the invariants of every conversion, numeric runs, nvcc, assembly, and
modules several test files use."""

import glob
import importlib.util
import os
import re
import shutil
import subprocess

import numpy as np
import tvm
import tvm_ffi

import relay_amp
from relay_amp import execution

#: ImageNet's per-channel mean and std on the 0-255 scale (uint8 images straight in).
IMAGENET_UINT8 = {"mean": [255.0 * m for m in (0.485, 0.456, 0.406)],
                  "std": [255.0 * s for s in (0.229, 0.224, 0.225)]}


def host_normalize(batch):
    """``uint8`` NCHW images as a float32 pipeline feeds them: ``(x - mean) / std`` per
    channel (:data:`IMAGENET_UINT8`)."""
    mean = np.array(IMAGENET_UINT8["mean"], "float32")[:, None, None]
    std = np.array(IMAGENET_UINT8["std"], "float32")[:, None, None]
    return ((batch.astype("float32") - mean) / std).astype("float32")


def builtin_convert(mod):
    """TVM's own ``relax.transform.ToMixedPrecision`` (float16, float32 outputs): the baseline."""
    return tvm.relax.transform.ToMixedPrecision(out_dtype="float32")(mod)


def convert_checked(mod, dtype, **kwargs):
    """Convert, and check the invariants every conversion must keep."""
    before_hash = tvm_ffi.structural_hash(mod)
    before_text = mod.script(show_meta=False)
    new, report = relay_amp.convert(mod, dtype, **kwargs)
    assert tvm_ffi.structural_hash(mod) == before_hash, "the input module was changed"
    assert mod.script(show_meta=False) == before_text, "the input module was changed"
    tvm.relax.analysis.well_formed(new)
    again, _ = relay_amp.convert(new, dtype, **kwargs)
    tvm.ir.assert_structural_equal(again, new)
    return new, report


def random_inputs(mod, seed=0, low=-1.0, high=1.0, func="main"):
    rng = np.random.default_rng(seed)
    arrays = []
    for param in mod[func].params:
        ty = param.ty
        shape = [int(d) for d in ty.shape.values]
        dtype = str(ty.dtype)
        if dtype.startswith("int"):
            arrays.append(rng.integers(0, shape[0] if shape else 2, size=shape).astype(dtype))
        elif dtype == "bool":
            arrays.append(rng.random(shape) > 0.5)
        else:
            arrays.append(rng.uniform(low, high, size=shape).astype(dtype))
    return arrays


def run_module(mod, inputs):
    return execution.run(relay_amp.compile_module(mod), inputs)


NVCC = shutil.which("nvcc")


def nvcc_compile(code: str, tmp_path, archs=("sm_80", "sm_90")):
    """Compile CUDA source with nvcc for ``archs``: ``(exit status, its output)``."""
    source = tmp_path / "kernel.cu"
    source.write_text(code)
    gencode = [f for a in archs for f in ("-gencode", f"arch=compute_{a[3:]},code={a}")]
    result = subprocess.run([NVCC, "-fatbin", *gencode, "-o", str(tmp_path / "kernel.fatbin"),
                             str(source)], capture_output=True, text=True, check=False)
    return result.returncode, result.stdout + result.stderr


def _cuda_toolkit():
    """(a CUDA toolkit root whose headers NVRTC can include, its include folder), or Nones."""
    roots = [os.environ.get("CUDA_PATH", "")] + sorted(glob.glob("/usr/local/cuda*"))
    for root in filter(None, roots):
        for header in sorted(glob.glob(os.path.join(root, "targets", "*", "include",
                                                    "cuda_runtime.h"))
                             + glob.glob(os.path.join(root, "include", "cuda_runtime.h"))):
            return root, os.path.dirname(header)
    return None, None


CUDA_TOOLKIT, CUDA_INCLUDE = _cuda_toolkit()
NVRTC = CUDA_TOOLKIT if importlib.util.find_spec("cuda.bindings") else None


def nvrtc_compile(code: str, arch: str = "sm_90") -> bytes:
    """Compile CUDA source to a cubin the way the GPU host's loader does
    (``relay_amp.cuda_loader.enable_cuda(tvm, "nvrtc")``: TVM's NVRTC path)."""
    from tvm.support import nvcc

    # TVM looks for the headers beside ``which nvcc``, which may be a wrapper script
    saved = os.environ.get("CUDA_PATH")
    os.environ["CUDA_PATH"] = CUDA_TOOLKIT
    try:
        return bytes(nvcc.compile_cuda(code, target_format="cubin", arch=arch, compiler="nvrtc"))
    finally:
        if saved is None:
            del os.environ["CUDA_PATH"]
        else:
            os.environ["CUDA_PATH"] = saved


def asm_functions(asm: str) -> dict:
    """Assembly split at its global labels: {function or kernel name: its lines, joined}."""
    functions, name = {}, None
    for line in asm.splitlines():
        label = re.match(r"([A-Za-z_][\w.$]*):", line)
        if label and not label.group(1).startswith((".L", "L", "$")):
            name = label.group(1)
            functions[name] = []
        elif name is not None:
            functions[name].append(line)
    return {name: "\n".join(lines) for name, lines in functions.items()}


def asm_kernel(asm: str, name: str) -> str:
    """The assembly of the one kernel named like ``name``: its compute function, or, where TVM
    made none, its ``__tvm_ffi_`` function."""
    functions = asm_functions(asm)
    for wanted in (lambda f: f.endswith("_compute_"), lambda f: f.startswith("__tvm_ffi_")):
        found = [body for f, body in functions.items() if name in f and wanted(f)]
        if found:
            assert len(found) == 1, f"{len(found)} kernels named like {name}"
            return found[0]
    raise AssertionError(f"no {name} in the assembly")


def projection(rows, inputs, outputs, seed=0, weight_scale=0.125, bias_scale=1.0):
    """``x @ W + b``: ``rows`` (an int, or a name for a symbolic count) by ``inputs`` times a
    constant ``[inputs, outputs]`` weight, plus a constant bias; float32."""
    from tvm import relax

    rng = np.random.default_rng(seed)
    count = rows if isinstance(rows, int) else tvm.tirx.Var(rows, "int64")
    x = relax.Var("x", relax.TensorType((count, inputs), "float32"))
    w = relax.const((rng.standard_normal((inputs, outputs)) * weight_scale).astype("float32"))
    b = relax.const((bias_scale * rng.standard_normal((outputs,))).astype("float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            out = builder.emit_output(relax.op.add(relax.op.matmul(x, w), b))
        builder.emit_func_output(out)
    return builder.get()


def block_loops(func) -> dict:
    """Each block's name in the TIR ``func`` -> the loops around each place it runs, outermost
    first, as ``(extent, kind)`` (a block's ``init`` walked under its block's loops)."""
    found = {}

    def walk(stmt, loops):
        if isinstance(stmt, tvm.tirx.For):
            walk(stmt.body, [*loops, (int(stmt.extent), stmt.kind)])
        elif isinstance(stmt, tvm.s_tir.SBlockRealize):
            if stmt.block.name_hint != "root":
                found.setdefault(stmt.block.name_hint, []).append(loops)
            walk(stmt.block.body, loops)
            if stmt.block.init is not None:
                walk(stmt.block.init, loops)
        elif isinstance(stmt, tvm.tirx.SeqStmt):
            for s in stmt.seq:
                walk(s, loops)
        elif hasattr(stmt, "body"):
            walk(stmt.body, loops)

    walk(func.body, [])
    return found


def residual_block(channels=28, outputs=42, shared=True, both=True):
    """A MediaPipe block as relay_amp's bfloat16 conversion leaves it (bfloat16 operands,
    float32 sums), in NHWC: ``y = relu(x)`` in float32; its cast to bfloat16 into a 3 x 3
    depthwise convolution with a bias, to which (``shared``) ``y`` is added; that sum's cast
    into a 1 x 1 convolution to ``outputs`` channels. Returns ``(the sum, the 1 x 1
    convolution)``, or without ``both`` the latter."""
    import ml_dtypes
    from tvm import relax

    rng = np.random.default_rng(9)
    bf16 = ml_dtypes.bfloat16
    x = relax.Var("x", relax.TensorType((1, 12, 12, channels), "float32"))
    depthwise = (rng.standard_normal((3, 3, channels, 1)) / 3).astype(bf16)
    pointwise = (rng.standard_normal((1, 1, channels, outputs)) / 4).astype(bf16)
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            y = builder.emit(relax.op.nn.relu(x))
            d = builder.emit(relax.op.nn.conv2d(
                builder.emit(relax.op.astype(y, "bfloat16")), relax.const(depthwise),
                padding=1, groups=channels, data_layout="NHWC", kernel_layout="HWOI",
                out_dtype="float32"))
            d = builder.emit(relax.op.add(d, relax.const(
                rng.standard_normal(channels).astype("float32"))))
            if shared:
                d = builder.emit(relax.op.add(d, y))
            o = builder.emit(relax.op.nn.conv2d(
                builder.emit(relax.op.astype(d, "bfloat16")), relax.const(pointwise),
                data_layout="NHWC", kernel_layout="HWIO", out_dtype="float32"))
            out = builder.emit_output(relax.Tuple([d, o]) if both else o)
        builder.emit_func_output(out)
    return builder.get()
