"""Every place relay_amp reaches into TVM beyond its public API, in one list.

Each :class:`Patch` says what it changes, why TVM 0.27 needs it, whether it lasts for the
process and how it is undone, and the test that fails when a TVM release makes it wrong or
unneeded. ``tests/house/test_tvm_patches.py`` checks that every listed place and pin exists and
that the package makes no such reach anywhere else (a process-wide callback override, an import
finder, a closure rebind).
"""

from __future__ import annotations

from typing import NamedTuple


class Patch(NamedTuple):
    """One reach into TVM.

    Attributes
    ----------
    name : str
        A short name.
    where : str
        The code that does it (``module:qualified name``).
    patches : str
        What in TVM it changes.
    why : str
        What fails without it.
    lasts : str
        How long it stays, and how it is undone.
    pin : str
        The test (``path::name``) that fails when TVM changes under it.
    """

    name: str
    where: str
    patches: str
    why: str
    lasts: str
    pin: str


PATCHES = (
    Patch(
        name="legalization builder rebind",
        where="relay_amp.kernels:_rebind_builder",
        patches="the closure cells of the TE function an op's FLegalize returns that hold the "
                "recording builder relay_amp legalized it with",
        why="relay_amp re-emits TVM's legalization of an op with casts inside (mixed, "
            "absorbing and narrowing kernels); matmul's TE function infers its output shape "
            "with the builder it was legalized with, and TVM offers no legalization without "
            "a builder",
        lasts="that one function object, made afresh by each legalization call: nothing "
              "outside the kernel being emitted sees it",
        pin="tests/pass/test_kernels.py::"
            "test_matmuls_legalization_closes_over_its_builder_and_the_rebind_reaches_it",
    ),
    Patch(
        name="CUDA source post-processing hook",
        where="relay_amp.builds.codegen.cuda:_Hook.register",
        patches="the global function tvm_callback_cuda_postproc (registered with "
                "override=True, chaining to the one registered before)",
        why="TVM's CUDA code for cross-thread reductions over volatile shared memory does "
            "arithmetic on volatile half and bfloat16 values, for which cuda_fp16.h and "
            "cuda_bf16.h declare no operators: nvcc and NVRTC reject the source",
        lasts="the process, once a relay_amp CUDA build ran or enable() was called; "
              "disable() (or volatile_half_operators(False)) makes it pass sources through to "
              "the earlier callback unchanged; it is never unregistered, since the callback "
              "it chains to may be anyone's",
        pin="tests/pass/test_codegen_cuda.py",
    ),
    Patch(
        name="CUDA compiler for the GPU host",
        where="relay_amp.cuda_loader:enable_cuda",
        patches="the global function tvm_callback_cuda_compile (registered with override=True)",
        why="TVM's own callback asks the current compilation target for the arch, which a "
            "runtime-only TVM on the GPU host cannot answer: a library holding CUDA source "
            "would not load",
        lasts="the process, from the user's call of enable_cuda; not undone (it is what "
              "loads every CUDA library after it)",
        pin="tests/eval/test_gpu_bundle.py",
    ),
    Patch(
        name="lazy CUDA tensor intrinsics",
        where="relay_amp.builds.tensor_cores:cuda_intrinsics",
        patches="sys.modules['tvm.s_tir.tensor_intrin.cuda'] (TVM's module run from its source "
                "with its TensorIntrin.register statements held back) and a sys.meta_path "
                "finder that registers them all if the package is imported later",
        why="importing TVM's CUDA intrinsics registers 91 of them and its package imports "
            "every target's: 27-38 s of the first tensor-core build on 2 cores, most of it "
            "TVMScript calling inspect.stack() inside an import",
        lasts="the process; a later import of tvm.s_tir.tensor_intrin (meta_schedule does) "
              "runs the package as it is and registers every held-back intrinsic, and where "
              "TVM's module has another shape it is imported as it is",
        pin="tests/pass/test_tensor_cores.py",
    ),
)


def describe() -> str:
    """The list as text, one paragraph a patch."""
    return "\n\n".join(
        f"{p.name} ({p.where}): patches {p.patches}. Why: {p.why}. Lasts: {p.lasts}. "
        f"Pinned by {p.pin}." for p in PATCHES)


__all__ = ["PATCHES", "Patch", "describe"]
