"""CUDA checks that the pass's tests and the harness's tests both make (no GPU needed): the
CUDA source relay_amp's pipeline builds, its tensor-core fragments and, with nvcc, the PTX and
cubins it compiles to."""

import re
import subprocess

import pytest
import tvm
from helpers import NVCC, nvcc_compile

import relay_amp
from relay_amp.builds.codegen import cuda

needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc is not installed on this machine")
TARGETS = {"sm_80": {"kind": "cuda", "arch": "sm_80"}, "sm_90": {"kind": "cuda", "arch": "sm_90"},
           "sm_90a": {"kind": "cuda", "arch": "sm_90a"}, "h100 tag": "nvidia/nvidia-h100"}
#: CUDA's name of each dtype in a WMMA fragment, and PTX's in a wmma.load instruction.
FRAGMENT = {"float16": "half", "bfloat16": "nv_bfloat16"}
PTX = {"float16": "f16", "bfloat16": "bf16"}
#: CUDA's name of each low-precision dtype in kernel source.
CUDA_TYPES = {"float16": "half", "bfloat16": "__nv_bfloat16"}


def cuda_source(mod, target) -> str:
    """The CUDA source of ``mod`` built with relay_amp's CUDA pipeline for ``target``."""
    target = tvm.target.Target(target)
    executable = tvm.compile(mod, target, relax_pipeline=relay_amp.cuda_pipeline(target))
    return executable.mod.imports[0].imports[0].inspect_source("cuda")


def fragment_dtypes(source: str) -> set:
    """The dtypes of the WMMA operand fragments in ``source``."""
    return set(re.findall(r"wmma::fragment<nvcuda::wmma::matrix_[ab], 16, 16, 16, (\w+)", source))


def ptx_tensor_core_inputs(source: str, tmp_path, arch: str) -> set:
    """The input dtypes of the tensor-core operand loads in the PTX nvcc makes of ``source``
    (``wmma.mma`` names only the accumulator's dtype for float16), asserting there are
    ``wmma.mma`` instructions."""
    path = tmp_path / "kernels.cu"
    path.write_text(source)
    result = subprocess.run([NVCC, "-ptx", f"-arch={arch}", "-o", str(tmp_path / "k.ptx"),
                             str(path)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    ptx = (tmp_path / "k.ptx").read_text()
    assert re.search(r"wmma\.mma\.sync\.aligned\.row\.col\.m16n16k16\.f32\.", ptx)
    return set(re.findall(r"wmma\.load\.[ab]\.sync\.aligned\.\w+\.m16n16k16(?:\.shared)?\.(\w+)",
                          ptx))


def compiles_to_cubin(mod, dtype, tmp_path):
    """Convert ``mod`` for sm_90, build it with TVM's pipeline and compile its CUDA with nvcc."""
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})
    converted, report = relay_amp.convert(mod, dtype, target=target)
    assert report.converted
    with cuda.volatile_half_operators():  # TVM's own pipeline: switched on explicitly
        executable = tvm.compile(converted, target=target)
    (device_module,) = executable.mod.imports[0].imports
    source = device_module.inspect_source("cuda")
    assert "__global__" in source and CUDA_TYPES[dtype].strip("_") in source
    status, log = nvcc_compile(source, tmp_path)
    assert status == 0, log[-2000:]
