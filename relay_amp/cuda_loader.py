"""Run a relay_amp CUDA library on a GPU host that has TVM's runtime alone.

A CUDA library exported from the PyPI wheel of TVM holds CUDA source: the wheel has no CUDA
compiler, so TVM's loader compiles that source on the GPU host, through the callback
``tvm_callback_cuda_compile``. :func:`enable_cuda` loads TVM's CUDA runtime and registers that
callback for the host's GPU (NVRTC or nvcc), then ``tvm.runtime.load_module`` takes the library::

    import tvm
    from relay_amp.cuda_loader import enable_cuda
    enable_cuda(tvm, "nvrtc")
    vm = tvm.runtime.vm.VirtualMachine(tvm.runtime.load_module("model.so"), tvm.cuda())

This file imports the standard library alone (TVM is passed in), so on a host without
relay_amp it is copied beside the script and imported as ``cuda_loader`` (the GPU bundle does
so). Registering the callback is a process-wide change to TVM: :mod:`relay_amp.tvm_patches`.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
import tempfile


def enable_cuda(tvm, compiler: str, cache: str | None = None) -> None:
    """Load TVM's CUDA runtime and register the CUDA source compiler its loader calls.

    TVM loads ``libtvm_runtime_cuda.so`` only when its compiler library is present, so it is
    loaded here. TVM's own ``tvm_callback_cuda_compile`` asks the current compilation target for
    the arch, which runtime-only TVM cannot answer, so a callback that passes the GPU's arch
    replaces it. With ``cache``, a folder, each compiled cubin is kept there under the hash of
    its source, arch and compiler, and a later load of the same source reads it back.
    """
    import tvm_ffi

    library = os.path.join(os.path.dirname(tvm.__file__), "lib", "libtvm_runtime_cuda.so")
    try:
        ctypes.CDLL(library, ctypes.RTLD_LOCAL)
    except OSError as error:
        raise RuntimeError(f"cannot load TVM's CUDA runtime ({error}); is CUDA 13's libcudart "
                           "on the library path (LD_LIBRARY_PATH)?") from None
    device = tvm.cuda(0)
    if not device.exist:
        raise RuntimeError("no CUDA GPU is visible to TVM on this machine")
    arch = "sm_" + device.compute_version.replace(".", "")

    def compile_uncached(code):
        if compiler == "nvcc":
            return _nvcc(code, arch)
        from tvm.support import nvcc

        return nvcc.compile_cuda(code, target_format="cubin", arch=arch, compiler="nvrtc")

    def compile_cuda(code):
        if not cache:
            return compile_uncached(code)
        key = hashlib.sha256(f"{compiler} {arch}\n{code}".encode()).hexdigest()
        path = os.path.join(cache, key + ".cubin")
        if os.path.exists(path):
            with open(path, "rb") as handle:
                return bytearray(handle.read())
        binary = compile_uncached(code)
        os.makedirs(cache, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=cache, delete=False) as handle:
            handle.write(bytes(binary))
        os.replace(handle.name, path)  # atomic: parallel compilers never see half a file
        return binary

    tvm_ffi.register_global_func("tvm_callback_cuda_compile", compile_cuda, override=True)


# the flags TVM's own nvcc path passes, so both compilers build the same code the same way
_NVCC_FLAGS = ["-O3", "--use_fast_math", "-U__CUDA_NO_HALF_OPERATORS__",
               "-U__CUDA_NO_HALF_CONVERSIONS__", "-U__CUDA_NO_BFLOAT16_OPERATORS__",
               "-U__CUDA_NO_BFLOAT16_CONVERSIONS__", "-U__CUDA_NO_BFLOAT162_OPERATORS__",
               "-U__CUDA_NO_BFLOAT162_CONVERSIONS__"]


def _nvcc(code: str, arch: str) -> bytearray:
    with tempfile.TemporaryDirectory(prefix="bundle_nvcc_") as folder:
        source, cubin = os.path.join(folder, "kernels.cu"), os.path.join(folder, "kernels.cubin")
        with open(source, "w", encoding="utf-8") as handle:
            handle.write(code)
        result = subprocess.run(["nvcc", "--cubin", f"-arch={arch}", *_NVCC_FLAGS, "-o", cubin,
                                 source], capture_output=True, text=True, check=False)
        if result.returncode:
            raise RuntimeError(f"nvcc failed: {result.stdout[-2000:]}{result.stderr[-2000:]}")
        with open(cubin, "rb") as handle:
            return bytearray(handle.read())


__all__ = ["enable_cuda"]
