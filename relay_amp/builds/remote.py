"""Run a compiled module on another machine's CPU through TVM's RPC, the way one runs on a board.

Build here for the board's target, export the library with a compiler for the board's CPU, and
run it over a :mod:`tvm.rpc` session (``tvm.rpc.connect(host, port)`` to an RPC server on the
board, e.g. ``scripts/arm/rpc_server.cc`` built by ``scripts/arm/setup_emulator.sh``):

>>> target = {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon", "+fullfp16"]}
>>> new, report = relay_amp.convert(mod, "float16", target=target)      # doctest: +SKIP
>>> executable = tvm.compile(new, target=tvm.target.Target(target))     # doctest: +SKIP
>>> lib = export_for(executable, "model.so", target)                     # doctest: +SKIP
>>> outputs = run_remote(tvm.rpc.connect("board", 9090), lib, [x])       # doctest: +SKIP

A pool of boards behind TVM's RPC tracker (``python -m tvm.exec.rpc_tracker``, each board's
server registered under a key, e.g. ``rpc_server --tracker tracker:9190 --key rk3588``) gives a
session with a free board under the key:

>>> session = session_from(("tracker", 9190), "rk3588")                 # doctest: +SKIP
>>> outputs = run_remote(session, lib, [x])                              # doctest: +SKIP

This module needs only tvm and numpy (and relay_amp.execution, which needs no more).
"""

from __future__ import annotations

import os
import shutil
import socket
import struct
import time
from collections.abc import Mapping, Sequence

import numpy as np
import tvm
import tvm.rpc
from tvm.rpc import base as rpc_base

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


class TrackerError(RuntimeError):
    """An RPC tracker could not give a session: none answers at the address, or no server
    under the key was free within the timeout. The message says which."""


def parse_address(address) -> tuple[str, int]:
    """An address as ``(host, port)``.

    Parameters
    ----------
    address : str or tuple of (str, int)
        ``"HOST:PORT"`` (``"[::1]:9190"`` for IPv6), or ``(host, port)``.

    Returns
    -------
    tuple of (str, int)

    Raises
    ------
    ValueError
        If ``address`` is neither.
    """
    if isinstance(address, str):
        host, _, port = address.rpartition(":")
        host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    elif isinstance(address, Sequence) and len(address) == 2:
        host, port = str(address[0]), str(address[1])
    else:
        host, port = "", ""
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"expected HOST:PORT or (host, port) (a tracker's address), "
                         f"got {address!r}")
    return host, int(port)


def _tracker_call(tracker, message, timeout: float, waiting_for: str):
    """One request to a tracker on a fresh connection and its answer; ``socket.timeout``
    (``TimeoutError``) out of the answer's wait, :class:`TrackerError` for the rest."""
    host, port = parse_address(tracker)
    deadline = time.monotonic() + timeout
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except OSError as error:
        raise TrackerError(f"no RPC tracker answers at {host}:{port} ({error}): start one with "
                           f"python -m tvm.exec.rpc_tracker --host {host} --port {port}") from None
    with sock:
        try:
            sock.sendall(struct.pack("<i", rpc_base.RPC_TRACKER_MAGIC))
            magic = struct.unpack("<i", rpc_base.recvall(sock, 4))[0]
        except OSError as error:
            raise TrackerError(f"{host}:{port} did not answer as a TVM RPC tracker within "
                               f"{timeout:g} s ({error})") from None
        if magic != rpc_base.RPC_TRACKER_MAGIC:
            raise TrackerError(f"{host}:{port} is not a TVM RPC tracker (it answered "
                               f"{magic:#x}, not RPC_TRACKER_MAGIC)")
        sock.settimeout(max(deadline - time.monotonic(), 0.001))
        rpc_base.sendjson(sock, message)
        try:
            return rpc_base.recvjson(sock)
        except TimeoutError:
            raise
        except OSError as error:
            raise TrackerError(f"the tracker at {host}:{port} closed the connection while "
                               f"{waiting_for} ({error})") from None


def tracker_summary(tracker, timeout: float = 10.0) -> dict:
    """What a tracker knows: the servers registered with it and each key's queue.

    Parameters
    ----------
    tracker : tuple of (str, int) or str
        The tracker's address, ``(host, port)`` or ``"host:port"``.
    timeout : float, optional
        Seconds to wait for the tracker's answer.

    Returns
    -------
    dict
        TVM's summary: ``"server_info"``, a list of ``{"key": "server:KEY", "addr": [host,
        port]}``, and ``"queue_info"``, ``{KEY: {"free": n, "pending": n}}``.

    Raises
    ------
    TrackerError
        If no tracker answers at the address within ``timeout``.
    """
    try:
        answer = _tracker_call(tracker, [rpc_base.TrackerCode.SUMMARY], timeout,
                               "asked for its summary")
    except TimeoutError:
        host, port = parse_address(tracker)
        raise TrackerError(f"the tracker at {host}:{port} did not send its summary within "
                           f"{timeout:g} s") from None
    if answer[0] != rpc_base.TrackerCode.SUCCESS:
        raise TrackerError(f"the tracker refused the summary: {answer!r}")
    return answer[1]


def servers_under(summary: dict, key: str) -> list[tuple[str, int]]:
    """The addresses of the servers a tracker's :func:`tracker_summary` lists under ``key``."""
    return sorted((str(item["addr"][0]), int(item["addr"][1]))
                  for item in summary.get("server_info", ())
                  if item.get("key") == f"server:{key}")


def session_from(tracker, key: str, priority: int = 1, timeout: float = 60.0,
                 session_timeout: float = 0) -> tvm.rpc.RPCSession:
    """A ``tvm.rpc`` session with a free server under ``key``, from TVM's RPC tracker.

    The request of ``tvm.rpc.connect_tracker(host, port).request(key)``, with a limit: TVM's
    waits as long as no server under the key is free (forever for a key none has). The tracker
    hands each server to one client at a time, so the session has its board to itself.

    Parameters
    ----------
    tracker : tuple of (str, int) or str
        The tracker's address, ``(host, port)`` or ``"host:port"``.
    key : str
        The key the servers registered under (``rpc_server --key KEY``).
    priority : int, optional
        The request's priority in the tracker's queue (higher first).
    timeout : float, optional
        Seconds to wait for the tracker and a free server under the key.
    session_timeout : float, optional
        Seconds the server lets the session last (0: no limit); see ``tvm.rpc.connect``.

    Returns
    -------
    tvm.rpc.RPCSession
        The session; the server is free again once it is closed (its last reference gone).

    Raises
    ------
    TrackerError
        If no tracker answers at the address, or no server under ``key`` was free within
        ``timeout`` (the message says whether the tracker lists any under the key).
    """
    host, port = parse_address(tracker)
    try:
        answer = _tracker_call((host, port), [rpc_base.TrackerCode.REQUEST, key, "", priority],
                               timeout, f"waiting for a server under key {key!r}")
    except TimeoutError:
        raise TrackerError(_why_none_free(host, port, key, timeout)) from None
    if answer[0] != rpc_base.TrackerCode.SUCCESS:
        raise TrackerError(f"the tracker at {host}:{port} refused the request for key "
                           f"{key!r}: {answer!r}")
    server_host, server_port, match_key = answer[1]
    try:
        return tvm.rpc.connect(server_host, server_port, match_key,
                               session_timeout=session_timeout)
    except RuntimeError as error:  # TVM's errors: a server gone since it registered, say
        raise TrackerError(f"the tracker at {host}:{port} gave the server "
                           f"{server_host}:{server_port} for key {key!r}, which gave no "
                           f"session: {str(error).strip().splitlines()[-1]}") from error


def _why_none_free(host: str, port: int, key: str, timeout: float) -> str:
    """The words of a request that timed out: no server under the key, or all of them busy."""
    try:
        summary = tracker_summary((host, port), timeout=5.0)
    except TrackerError as error:
        return f"no server under key {key!r} within {timeout:g} s, and then {error}"
    servers = servers_under(summary, key)
    if servers:
        listed = ", ".join(f"{h}:{p}" for h, p in servers)
        return (f"all {len(servers)} servers under key {key!r} at the tracker {host}:{port} "
                f"({listed}) stayed busy for {timeout:g} s")
    keys = sorted({item["key"].partition(":")[2] for item in summary.get("server_info", ())})
    return (f"no RPC server is registered under key {key!r} with the tracker at {host}:{port} "
            f"(waited {timeout:g} s; keys it has: {', '.join(map(repr, keys)) or 'none'}): "
            f"start one with rpc_server --tracker {host}:{port} --key {key}")
