"""An emulated aarch64 CPU behind TVM's RPC, for tests and the harness.

``scripts/arm/setup_emulator.sh`` installs QEMU's user-mode emulator and the aarch64 cross
compiler and builds ``scripts/arm/rpc_server.cc`` into ``.arm/rpc/``. :class:`ArmEmulator` starts
that server under ``qemu-aarch64-static`` on a free loopback port and connects to it with
``tvm.rpc.connect``, the call a user makes for a real board:

>>> with ArmEmulator() as emulator:                                    # doctest: +SKIP
...     outputs = emulator.run("model.so", [x])     # relay_amp.remote.run_remote over RPC

A run whose code the emulated CPU cannot execute (``-cpu cortex-a53`` has no FP16 arithmetic)
raises :class:`EmulatorError` naming the signal; a run that hangs ends at the session timeout.
Emulated times say nothing about a board's speed.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import re
import select
import shutil
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence

import numpy as np
import tvm
import tvm.rpc

from .. import remote

#: Where ``scripts/arm/setup_emulator.sh`` puts the wheels and the server (``RELAY_AMP_ARM_DIR``
#: overrides it; the script's ``ARM_DIR``).
ARM_DIR = pathlib.Path(os.environ.get("RELAY_AMP_ARM_DIR",
                                      pathlib.Path(__file__).resolve().parents[2] / ".arm"))
#: The aarch64 libraries the cross compiler's packages install, which QEMU loads the server with.
SYSROOT = "/usr/aarch64-linux-gnu"
QEMU = "qemu-aarch64-static"
CROSS_CXX = "aarch64-linux-gnu-g++"
#: The target the tests and the harness compile for: an aarch64 CPU with NEON and FP16 arithmetic.
TARGET_FP16 = {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon", "+fullfp16"]}
#: The same with bfloat16 dot products (``+bf16``).
TARGET_BF16 = {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon", "+bf16"]}


class EmulatorError(RuntimeError):
    """The emulated CPU or its RPC server failed: the message says how (a signal, a timeout)."""


def server_path(arm_dir: str | os.PathLike | None = None) -> pathlib.Path:
    """The RPC server binary ``setup_emulator.sh`` built."""
    return pathlib.Path(arm_dir or ARM_DIR) / "rpc" / "rpc_server"


def missing(arm_dir: str | os.PathLike | None = None) -> str | None:
    """Why the emulator cannot run here (``None`` where it can)."""
    lacking = [name for name in (QEMU, CROSS_CXX) if shutil.which(name) is None]
    if not os.path.isdir(SYSROOT):
        lacking.append(SYSROOT)
    if not server_path(arm_dir).is_file():
        lacking.append(str(server_path(arm_dir)))
    if not lacking:
        return None
    return f"no {', '.join(lacking)}: run scripts/arm/setup_emulator.sh"


class ArmEmulator:
    """``rpc_server`` under ``qemu-aarch64-static`` on a free loopback port.

    Parameters
    ----------
    cpu : str, optional
        QEMU's CPU model (``-cpu``), e.g. ``"cortex-a53"`` (no FP16 arithmetic); QEMU's default
        (``max``: every feature it emulates) without it.
    arm_dir : str or os.PathLike, optional
        Where ``setup_emulator.sh`` put the server (default :data:`ARM_DIR`).
    start_timeout : float, optional
        Seconds to wait for the server to listen.
    session_timeout : float, optional
        Seconds a session may last before the server kills it (the client's call then raises).
    """

    def __init__(self, cpu: str | None = None, arm_dir: str | os.PathLike | None = None,
                 start_timeout: float = 120.0, session_timeout: float = 600.0):
        self.cpu = cpu
        self.server = server_path(arm_dir)
        self.start_timeout = start_timeout
        self.session_timeout = session_timeout
        self.port: int | None = None
        self._process: subprocess.Popen | None = None
        self._log_path: str | None = None

    def __enter__(self) -> ArmEmulator:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def start(self) -> ArmEmulator:
        """Start the server and wait until it listens."""
        reason = missing(self.server.parent.parent)
        if reason:
            raise EmulatorError(reason)
        command = [QEMU, "-L", SYSROOT, *(["-cpu", self.cpu] if self.cpu else []),
                   str(self.server), "--host", "127.0.0.1", "--port", "0", "--no-core-dumps",
                   "--exit-with-parent"]
        descriptor, self._log_path = tempfile.mkstemp(prefix="rpc_server_", suffix=".log")
        with os.fdopen(descriptor, "w") as log:
            self._process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log,
                                             stdin=subprocess.DEVNULL, text=True)
        deadline = time.monotonic() + self.start_timeout
        line = ""
        while not line.endswith("\n"):
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self._process.stdout], [], [], max(left, 0))
            if not ready:
                self.stop()
                raise EmulatorError(f"the emulated RPC server did not listen within "
                                    f"{self.start_timeout:g} s")
            chunk = self._process.stdout.readline()
            if not chunk:
                status = self._process.wait()
                log = self.log()
                self.stop()
                raise EmulatorError(f"the emulated RPC server exited ({_status_text(status)}) "
                                    f"before it listened: {log}")
            line += chunk
        match = re.search(r"listening on .*:(\d+)$", line.strip())
        if not match:
            self.stop()
            raise EmulatorError(f"unexpected first line from the RPC server: {line!r}")
        self.port = int(match.group(1))
        return self

    def connect(self) -> tvm.rpc.RPCSession:
        """A new ``tvm.rpc`` session with the server (one per run: a session that crashed is
        gone, the server is not)."""
        if self._process is None or self._process.poll() is not None:
            raise EmulatorError("the emulated RPC server is not running"
                                + (f": {self.log()}" if self._log_path else ""))
        return tvm.rpc.connect("127.0.0.1", self.port, session_timeout=self.session_timeout)

    def run(self, lib_path: str | os.PathLike,
            inputs: Sequence[np.ndarray] | Mapping[str, np.ndarray],
            func: str = "main") -> list[np.ndarray]:
        """Upload a library, run ``func`` on the emulated CPU, return the outputs
        (:func:`relay_amp.remote.run_remote` in a new session).

        Raises
        ------
        EmulatorError
            If the emulated CPU could not run the code (``SIGILL``: an instruction it lacks),
            the session timed out or the server died.
        """
        session = self.connect()
        try:
            return remote.run_remote(session, lib_path, inputs, func)
        except Exception as error:
            raise self.explain(error) from error

    def explain(self, error: BaseException) -> BaseException:
        """What the emulator says about an error a session raised: an :class:`EmulatorError`
        that names the signal, the timeout or the server's exit; else ``error`` itself."""
        text = str(error)
        where = f"emulated aarch64 CPU (QEMU -cpu {self.cpu or 'max'})"
        if "raised SIGILL" in text:
            return EmulatorError(f"the remote CPU raised SIGILL: the code needs an instruction it "
                                 f"lacks, e.g. +fullfp16 or +bf16 (the {where}; compile "
                                 "for its mattr/mcpu)")
        if "RPCSessionTimeoutError" in text:
            return EmulatorError(f"the run on the {where} passed the session timeout of "
                                 f"{self.session_timeout:g} s and was killed")
        if "session's process on the RPC server died" in text:
            return EmulatorError(f"the run on the {where} died: {_server_words(text)}")
        if self._process is not None and self._process.poll() is not None:
            return EmulatorError(f"the RPC server of the {where} exited "
                                 f"({_status_text(self._process.returncode)}): {self.log()}")
        return error

    def log(self, last: int = 2000) -> str:
        """The end of the server's log (its stderr)."""
        if not self._log_path or not os.path.exists(self._log_path):
            return ""
        with open(self._log_path, errors="replace") as log:
            return log.read()[-last:].strip()

    def stop(self) -> None:
        """Stop the server (it ends its sessions and removes their work directories)."""
        process, self._process = self._process, None
        if process is not None:
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
            if process.stdout is not None:
                process.stdout.close()
        if self._log_path and os.path.exists(self._log_path):
            os.unlink(self._log_path)
        self._log_path = None


@contextlib.contextmanager
def emulated_session(cpu: str | None = None, **kwargs):
    """A ``tvm.rpc`` session with a fresh emulated aarch64 CPU, stopped afterwards; an error in
    the block comes out as :meth:`ArmEmulator.explain` words it.

    Parameters
    ----------
    cpu : str, optional
        QEMU's CPU model; see :class:`ArmEmulator`.
    **kwargs
        The other arguments of :class:`ArmEmulator`.
    """
    with ArmEmulator(cpu, **kwargs) as emulator:
        session = emulator.connect()
        try:
            yield session
        except Exception as error:
            raise emulator.explain(error) from error
        finally:
            del session


def _server_words(text: str) -> str:
    """The server's own message out of an RPC error's text."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in lines:
        if "the remote CPU raised" in line or "session's process" in line:
            return line
    return lines[-1] if lines else text


def _status_text(status: int | None) -> str:
    if status is None:
        return "still running"
    if status < 0:
        return f"killed by signal {-status}"
    return f"exit code {status}"
