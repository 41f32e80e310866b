"""Run a compiled module on another machine's CPU through TVM's RPC, the way one runs on a board.

Build here for the board's target, export the library with a compiler for the board's CPU, and
run it over a :mod:`tvm.rpc` session (``tvm.rpc.connect(host, port)`` to an RPC server on the
board, e.g. ``scripts/arm/rpc_server.cc`` built by ``scripts/arm/setup_emulator.sh``):

>>> target = {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon", "+fullfp16"]}
>>> new, report = relay_amp.convert(mod, "float16", target=target)      # doctest: +SKIP
>>> executable = tvm.compile(new, target=tvm.target.Target(target))     # doctest: +SKIP
>>> lib = export_for(executable, "model.so", target)                     # doctest: +SKIP
>>> outputs = run_remote(tvm.rpc.connect("board", 9090), lib, [x])       # doctest: +SKIP

This module needs only tvm and numpy (and relay_amp.execution, which needs no more).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence

import numpy as np
import tvm

from ..execution import contiguous, flatten_outputs

#: The GNU cross compilers tried for a target triple's architecture (the first one found on
#: PATH links the library), beside ``<mtriple>-g++`` itself.
CROSS_COMPILERS = {
    "aarch64": ("aarch64-linux-gnu-g++", "aarch64-linux-gnu-gcc"),
    "arm64": ("aarch64-linux-gnu-g++", "aarch64-linux-gnu-gcc"),
    "armv7": ("arm-linux-gnueabihf-g++", "arm-linux-gnueabihf-gcc"),
    "arm": ("arm-linux-gnueabihf-g++", "arm-linux-gnueabihf-gcc"),
    "riscv64": ("riscv64-linux-gnu-g++", "riscv64-linux-gnu-gcc"),
}


def target_triple(target) -> str:
    """The LLVM triple a target compiles host code for ("" where it names none: this machine's).

    Parameters
    ----------
    target : dict, str or tvm.target.Target
        The target: TVM's JSON dict form, a TVM tag or kind name, or a ``Target``. A target
        with a host (CUDA with an aarch64 host) gives its host's triple.

    Returns
    -------
    str
        The ``mtriple`` attribute, or ``""``.
    """
    target = tvm.target.Target(target)
    if target.host is not None:
        target = target.host
    attrs = dict(target.attrs)
    return str(attrs["mtriple"]) if "mtriple" in attrs else ""


def cross_compiler_for(target, cc: str | None = None):
    """The ``fcompile`` that links a library for ``target``'s CPU, for ``export_library``.

    Parameters
    ----------
    target : dict, str or tvm.target.Target
        The target the module was compiled for.
    cc : str, optional
        The compiler to link with (e.g. ``"aarch64-linux-gnu-g++"``, or a board SDK's). Without
        it: none where the target's CPU is this machine's architecture (TVM's default link),
        else the first of ``<mtriple>-g++``, ``<mtriple>-gcc`` and :data:`CROSS_COMPILERS`'s
        entries for the architecture found on PATH.

    Returns
    -------
    callable or None
        ``tvm.support.cc.cross_compiler(cc)``, or ``None`` for TVM's default.

    Raises
    ------
    RuntimeError
        If the target is another CPU's and no compiler for it is on PATH.
    """
    from tvm.support import cc as tvm_cc

    name = cross_compiler_name(target, cc)
    return None if name is None else tvm_cc.cross_compiler(name)


def cross_compiler_name(target, cc: str | None = None) -> str | None:
    """The compiler :func:`cross_compiler_for` links with (None: TVM's default link)."""
    if cc is not None:
        return cc
    triple = target_triple(target)
    arch = triple.split("-")[0]
    here = tvm.target.codegen.llvm_get_system_triple().split("-")[0]
    if not triple or arch == here:
        return None
    candidates = (f"{triple}-g++", f"{triple}-gcc", *CROSS_COMPILERS.get(arch, ()))
    for name in candidates:
        if shutil.which(name):
            return name
    raise RuntimeError(f"no compiler for {triple} on PATH (tried {', '.join(candidates)}): "
                       "install one (Debian: g++-aarch64-linux-gnu for aarch64) or pass cc=")


def export_for(executable, path: str | os.PathLike, target, cc: str | None = None) -> str:
    """Export a compiled module as a shared library that ``target``'s CPU loads.

    Parameters
    ----------
    executable : tvm.runtime.Executable
        What ``tvm.compile(mod, target=target)`` returned.
    path : str or os.PathLike
        The library to write (``.so``).
    target : dict, str or tvm.target.Target
        The target it was compiled for; its ``mtriple`` picks the compiler.
    cc : str, optional
        The compiler to link with; see :func:`cross_compiler_for`.

    Returns
    -------
    str
        ``path``, as a string.
    """
    path = os.fspath(path)
    fcompile = cross_compiler_for(target, cc)
    if fcompile is None:
        executable.export_library(path)
    else:
        executable.export_library(path, fcompile=fcompile)
    return path


def run_remote(session, lib_path: str | os.PathLike,
               inputs: Sequence[np.ndarray] | Mapping[str, np.ndarray],
               func: str = "main", repeat: int = 1) -> list[np.ndarray]:
    """Upload a library to an RPC server, run one of its functions there, return the outputs.

    Parameters
    ----------
    session : tvm.rpc.RPCSession
        The session, e.g. ``tvm.rpc.connect(host, port)`` to the board's RPC server.
    lib_path : str or os.PathLike
        A library :func:`export_for` wrote for the server's CPU.
    inputs : sequence or mapping of numpy.ndarray
        The function's arguments, in order (a mapping's values in its order).
    func : str, optional
        The function to run (default ``"main"``).
    repeat : int, optional
        How many times to run it on the same inputs in the session (default 1); the outputs
        are the last run's. 0 loads the library and sets the inputs only (returns ``[]``): the
        work of a session without the run, e.g. to count what a run adds.

    Returns
    -------
    list of numpy.ndarray
        The outputs, tuples flattened, bfloat16 outputs as float32.
    """
    if repeat < 0:
        raise ValueError(f"repeat must be 0 or more, got {repeat}")
    lib_path = os.fspath(lib_path)
    name = os.path.basename(lib_path)
    session.upload(lib_path, name)
    device = session.cpu()
    vm = tvm.runtime.vm.VirtualMachine(session.load_module(name), device)
    if isinstance(inputs, Mapping):
        inputs = list(inputs.values())
    args = [tvm.runtime.tensor(contiguous(x), device) for x in inputs]
    # the stateful calls are TVM's way over RPC: a returned tuple stays on the server as an
    # object reference, and its fields come back one tensor at a time
    vm.set_input(func, *args)
    for _ in range(repeat):
        vm.invoke_stateful(func)
    if repeat == 0:
        return []
    return flatten_outputs(_fetch_outputs(vm.module, func))


def _fetch_outputs(vm_module, func: str, *index: int):
    """The last stateful call's result, tuples as Python tuples (``VirtualMachine.get_outputs``
    does the same in a closure that refers to itself: the reference cycle would keep the VM,
    and with it the RPC session, alive until the garbage collector runs)."""
    arity = vm_module["get_output_arity"](func, *index)
    if arity == -1:
        return vm_module["get_output"](func, *index)
    return tuple(_fetch_outputs(vm_module, func, *index, i) for i in range(arity))
