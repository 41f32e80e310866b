"""CUDA codegen of converted modules, proven with nvcc (no GPU needed), and where relay_amp's
CUDA source hook goes on (relay_amp's CUDA builds, never the import)."""

import ctypes
import ctypes.util
import glob
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import tvm
from cuda_checks import CUDA_TYPES, compiles_to_cubin, needs_nvcc
from helpers import CUDA_INCLUDE, nvcc_compile
from tvm.script import ir as I
from tvm.script import relax as R

from relay_amp.builds.codegen import cuda

ROOT = Path(__file__).resolve().parents[2]

# The shape older TVM emitted for a warp reduction over volatile shared memory: the RFC's error.
REDUCTION = r"""
#include <cuda_fp16.h>
#include <cuda_bf16.h>
extern "C" __global__ void __launch_bounds__(32) reduce(T* __restrict__ A, T* __restrict__ out) {
  __shared__ T red_buf0[32];
  ((volatile T*)red_buf0)[threadIdx.x] = A[threadIdx.x];
  __syncwarp();
  if (threadIdx.x < 16) {
    ((volatile T*)red_buf0)[threadIdx.x] = (((volatile T*)red_buf0)[threadIdx.x]
                                            + ((volatile T*)red_buf0)[(threadIdx.x + 16)]);
    ((volatile T*)red_buf0)[threadIdx.x] = (((volatile T*)red_buf0)[threadIdx.x]
                                            * ((volatile T*)red_buf0)[(threadIdx.x + 8)]);
    if (((volatile T*)red_buf0)[threadIdx.x] < ((volatile T*)red_buf0)[(threadIdx.x + 4)]) {
      ((volatile T*)red_buf0)[threadIdx.x] += ((volatile T*)red_buf0)[(threadIdx.x + 4)];
    }
  }
  __syncwarp();
  if (threadIdx.x == 0) out[0] = A[0] - ((volatile T*)red_buf0)[0] / ((volatile T*)red_buf0)[1];
}
"""
# The other common idiom: the buffer itself declared volatile (qualifier, then storage class,
# then type), and indexed without a cast.
REDUCTION_DECLARED = r"""
#include <cuda_fp16.h>
#include <cuda_bf16.h>
extern "C" __global__ void __launch_bounds__(32) reduce(T* __restrict__ A, T* __restrict__ out) {
  volatile __shared__ T red_buf[32];
  red_buf[threadIdx.x] = A[threadIdx.x];
  __syncwarp();
  if (threadIdx.x < 16) {
    red_buf[threadIdx.x] = red_buf[threadIdx.x] + red_buf[threadIdx.x + 16];
    red_buf[threadIdx.x] = red_buf[threadIdx.x] * red_buf[threadIdx.x + 8];
    if (red_buf[threadIdx.x] < red_buf[threadIdx.x + 4]) {
      red_buf[threadIdx.x] += red_buf[threadIdx.x + 4];
    }
  }
  __syncwarp();
  if (threadIdx.x == 0) out[0] = A[0] - red_buf[0] / red_buf[1];
}
"""
IDIOMS = {"cast": REDUCTION, "declared": REDUCTION_DECLARED}


def reduction(idiom: str, dtype: str) -> str:
    return IDIOMS[idiom].replace("T*", CUDA_TYPES[dtype] + "*").replace(
        "T red", CUDA_TYPES[dtype] + " red")


@needs_nvcc
@pytest.mark.parametrize("idiom", sorted(IDIOMS))
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_volatile_reduction_fails_without_the_hook_and_compiles_with_it(dtype, idiom, tmp_path):
    code = reduction(idiom, dtype)
    status, log = nvcc_compile(code, tmp_path)
    assert status != 0
    assert 'no operator "+" matches these operands' in log
    assert f"volatile {CUDA_TYPES[dtype]} + volatile {CUDA_TYPES[dtype]}" in log
    patched = cuda.patch_source(code)
    assert cuda.MARKER in patched
    status, log = nvcc_compile(patched, tmp_path)
    assert status == 0, log
    assert os.path.getsize(tmp_path / "kernel.fatbin") > 0


def _libnvrtc():
    """libnvrtc from the CUDA toolkit, or from the nvidia-cuda-nvrtc wheel (requirements.txt)."""
    import importlib.util

    patterns = ["/usr/local/cuda*/lib64/libnvrtc.so*",
                "/usr/local/cuda*/targets/*/lib/libnvrtc.so*"]
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations if spec else []):
        patterns.append(os.path.join(root, "cu*", "lib", "libnvrtc.so*"))
    for pattern in patterns:
        for path in sorted(glob.glob(pattern)):
            if "alt" not in os.path.basename(path):
                return path
    return ctypes.util.find_library("nvrtc")


@needs_nvcc
@pytest.mark.zoo  # NVRTC comes with the full development set (requirements.txt)
@pytest.mark.parametrize("idiom", sorted(IDIOMS))
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_patched_source_also_compiles_under_nvrtc(dtype, idiom):
    path = _libnvrtc()
    if path is None:
        pytest.skip("libnvrtc is not installed with this CUDA toolkit")
    for builtins in glob.glob(os.path.join(os.path.dirname(path), "libnvrtc-builtins.so*")):
        if "alt" not in os.path.basename(builtins):
            ctypes.CDLL(builtins, mode=ctypes.RTLD_GLOBAL)  # nvrtc loads it by soname
    nvrtc = ctypes.CDLL(path)
    code = cuda.patch_source(reduction(idiom, dtype))
    program = ctypes.c_void_p()
    assert nvrtc.nvrtcCreateProgram(ctypes.byref(program), code.encode(), b"k.cu", 0, None,
                                    None) == 0
    assert CUDA_INCLUDE, "the CUDA headers that nvcc uses"
    options = [b"--gpu-architecture=sm_90", f"-I{CUDA_INCLUDE}".encode()]
    array = (ctypes.c_char_p * len(options))(*options)
    status = nvrtc.nvrtcCompileProgram(program, len(options), array)
    size = ctypes.c_size_t()
    nvrtc.nvrtcGetProgramLogSize(program, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    nvrtc.nvrtcGetProgramLog(program, log)
    nvrtc.nvrtcDestroyProgram(ctypes.byref(program))
    assert status == 0, log.value.decode()


@pytest.mark.parametrize("declaration, needed", [
    ("volatile __shared__ half red_buf[32];", ["float16"]),
    ("__shared__ volatile half red_buf[32];", ["float16"]),
    ("static __shared__ volatile __half buf[8];", ["float16"]),
    ("half volatile* p = q;", ["float16"]),
    ("x = ((volatile half*)red_buf0)[0];", ["float16"]),
    ("const volatile __half& a = b;", ["float16"]),
    ("volatile __shared__ __nv_bfloat16 red_buf[32];", ["bfloat16"]),
    ("x = ((volatile __nv_bfloat16*)red_buf0)[0];", ["bfloat16"]),
    ("__nv_bfloat16 volatile b; volatile half h;", ["float16", "bfloat16"]),
    ("volatile float x; half y;", []),
    ("volatile int flag; __shared__ __nv_bfloat16 buf[4];", []),
    ("half volatile_count;", []),
])
def test_every_declaration_form_is_detected(declaration, needed):
    assert cuda.needed(declaration) == needed


def test_patch_is_idempotent_and_only_where_needed():
    plain = 'extern "C" __global__ void k(half* a) { a[0] = a[0] + a[1]; }'
    assert cuda.needed(plain) == [] and cuda.patch_source(plain) == plain
    code = REDUCTION.replace("T*", "half*").replace("T red", "half red")
    assert cuda.needed(code) == ["float16"]
    once = cuda.patch_source(code)
    assert cuda.patch_source(once) == once and once.count(cuda.MARKER) == 1
    assert once.index(cuda.MARKER) < once.index("__global__")


def test_hook_chains_to_a_previous_callback_and_switches():
    calls = []

    def previous(code, target):
        calls.append(target)
        return code + "\n// previous ran"

    hook = cuda._Hook()
    hook.previous, hook.enabled, hook.registered = previous, True, True
    code = REDUCTION.replace("T*", "half*").replace("T red", "half red")
    out = hook(code, "target")
    assert calls == ["target"] and "// previous ran" in out and cuda.MARKER in out
    hook.enabled = False
    assert cuda.MARKER not in hook(code, None)
    # the registered global is relay_amp's once switched on (here explicitly; state restored)
    with cuda.volatile_half_operators():
        assert cuda.is_enabled()
        with cuda.volatile_half_operators(False):
            assert not cuda.is_enabled()
            with cuda.volatile_half_operators():
                assert cuda.is_enabled()
            assert not cuda.is_enabled()
        assert cuda.is_enabled()
        registered = tvm.get_global_func(cuda.CALLBACK)
        assert cuda.MARKER in registered(code, None)


def _fresh_python(script: str, tmp_path) -> str:
    path = tmp_path / "fresh.py"  # a file: TVMScript reads the source of what it parses
    path.write_text(textwrap.dedent(script))
    result = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, cwd=ROOT,
                            check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


# A tiny CUDA build: tvm.compile generates the source (and calls tvm_callback_cuda_postproc)
# without a GPU; a callback registered before relay_amp records that relay_amp's hook chained it.
_TINY_BUILD = """
    import tvm
    from tvm.script import ir as I
    from tvm.script import relax as R

    calls = []
    def earlier(code, target):
        calls.append(str(code).count("__global__"))
        return code

    tvm.register_global_func("tvm_callback_cuda_postproc", earlier)

    import relay_amp
    from relay_amp.builds.codegen import cuda

    assert not cuda.is_enabled() and not cuda._HOOK.registered, "importing relay_amp enabled it"
    assert tvm.get_global_func(cuda.CALLBACK)("// code", None) == "// code"
    calls.clear()

    @I.ir_module
    class Add:
        @R.function
        def main(x: R.Tensor((4,), "float32"), y: R.Tensor((4,), "float32")):
            with R.dataflow():
                gv = R.add(x, y)
                R.output(gv)
            return gv

    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})
    BUILD
    print(cuda.is_enabled(), cuda._HOOK.registered, bool(calls) and all(calls))
    patched = tvm.get_global_func(cuda.CALLBACK)("volatile __shared__ half b[2];", None)
    print(cuda.MARKER in patched)
"""


def test_importing_relay_amp_registers_no_cuda_callback(tmp_path):
    out = _fresh_python("""
        import tvm
        import relay_amp
        from relay_amp.builds.codegen import cuda
        print(tvm.get_global_func(cuda.CALLBACK, allow_missing=True), cuda.is_enabled())
    """, tmp_path)
    assert out.split() == ["None", "False"]


@pytest.mark.parametrize("build", [
    "relay_amp.builds.pipeline.build(Add, target)",
    "tvm.compile(Add, target=target, relax_pipeline=relay_amp.cuda_pipeline(target))",
])
def test_relay_amps_cuda_builds_turn_the_hook_on_and_chain(build, tmp_path):
    out = _fresh_python(_TINY_BUILD.replace("BUILD", build), tmp_path)
    assert out.split() == ["True", "True", "True", "True"]


@pytest.mark.parametrize("build", [
    "tvm.compile(Add, target=target)",  # TVM's own pipeline: the user calls cuda.enable()
    "cuda.disable(); relay_amp.builds.pipeline.build(Add, target)",  # switched off stays off
])
def test_other_builds_leave_the_hook_off(build, tmp_path):
    out = _fresh_python(_TINY_BUILD.replace("BUILD", build), tmp_path)
    enabled, registered, calls, patched = out.split()
    assert (enabled, calls, patched) == ("False", "True", "False")


# ----------------------------------------------------------------------------- converted models
def _models():
    @I.ir_module
    class MatmulSoftmax:
        @R.function
        def main(x: R.Tensor((64, 128), "float32"), w: R.Tensor((128, 128), "float32")):
            with R.dataflow():
                lv = R.matmul(x, w)
                gv = R.nn.softmax(lv)
                R.output(gv)
            return gv

    @I.ir_module
    class ConvReduction:
        @R.function
        def main(x: R.Tensor((1, 16, 16, 16), "float32"), w: R.Tensor((32, 16, 3, 3), "float32")):
            with R.dataflow():
                lv = R.nn.conv2d(x, w, padding=[1, 1])
                lv1 = R.nn.relu(lv)
                gv = R.mean(lv1, axis=[2, 3])
                R.output(gv)
            return gv

    @I.ir_module
    class Attention:
        @R.function
        def main(q: R.Tensor((1, 32, 4, 32), "float32"), k: R.Tensor((1, 32, 4, 32), "float32"),
                 v: R.Tensor((1, 32, 4, 32), "float32")):
            with R.dataflow():
                gv = R.nn.attention(q, k, v, scale=0.2, causal_mask="TopLeft")
                R.output(gv)
            return gv

    @I.ir_module
    class LayerNorm:
        @R.function
        def main(x: R.Tensor((8, 64), "float32"), g: R.Tensor((64,), "float32"),
                 b: R.Tensor((64,), "float32"), w: R.Tensor((64, 64), "float32")):
            with R.dataflow():
                lv = R.nn.layer_norm(x, g, b, axes=[-1])
                gv = R.matmul(lv, w)
                R.output(gv)
            return gv

    return {"matmul_softmax": MatmulSoftmax, "conv_reduction": ConvReduction,
            "attention": Attention, "layer_norm": LayerNorm}


@needs_nvcc
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("name", ["matmul_softmax", "conv_reduction", "attention", "layer_norm"])
def test_converted_models_compile_to_cubin_for_sm80_and_sm90(name, dtype, tmp_path):
    compiles_to_cubin(_models()[name], dtype, tmp_path)
