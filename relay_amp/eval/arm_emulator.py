"""An emulated aarch64 CPU behind TVM's RPC, for tests and the harness.

``scripts/arm/setup_emulator.sh`` installs QEMU's user-mode emulator and the aarch64 cross
compiler and builds ``scripts/arm/rpc_server.cc`` into ``.arm/rpc/``. :class:`ArmEmulator` starts
that server under ``qemu-aarch64-static`` on a free loopback port and connects to it with
``tvm.rpc.connect``, the call a user makes for a real board:

>>> with ArmEmulator() as emulator:                                    # doctest: +SKIP
...     outputs = emulator.run("model.so", [x])     # relay_amp.builds.remote.run_remote over RPC

Several emulated CPUs can stand behind TVM's RPC tracker as a pool of boards does:
:class:`RpcTracker` runs ``python -m tvm.exec.rpc_tracker``, ``ArmEmulator(tracker=..., key=...)``
registers its server with it, and ``relay_amp.builds.remote.session_from(tracker, key)`` gives a
session with a free one.

A run whose code the emulated CPU cannot execute (``-cpu cortex-a53`` has no FP16 arithmetic)
raises :class:`EmulatorError` naming the signal; a run that hangs ends at the session timeout.
Emulated times say nothing about a board's speed.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import gc
import os
import pathlib
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import tvm
import tvm.rpc

from ..builds import remote

#: Where ``scripts/arm/setup_emulator.sh`` puts the wheels and the server (``RELAY_AMP_ARM_DIR``
#: overrides it; the script's ``ARM_DIR``).
ARM_DIR = pathlib.Path(os.environ.get("RELAY_AMP_ARM_DIR",
                                      pathlib.Path(__file__).resolve().parents[2] / ".arm"))
#: The aarch64 libraries the cross compiler's packages install, which QEMU loads the server with.
SYSROOT = "/usr/aarch64-linux-gnu"
QEMU = "qemu-aarch64-static"
#: Debian's dynamically linked QEMU (package ``qemu-user``), the build that loads TCG plugins: it
#: runs the server when executed instructions are counted (``qemu-aarch64-static`` cannot load one).
QEMU_PLUGINS = "qemu-aarch64"
CROSS_CXX = "aarch64-linux-gnu-g++"
#: The target the tests and the harness compile for: an aarch64 CPU with NEON and FP16 arithmetic.
TARGET_FP16 = {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon", "+fullfp16"]}
#: The same with FMLAL (``+fp16fml``: float16 products added into float32 sums, Cortex-A76,
#: Neoverse N1 and later): relay_amp's build runs float16 dot products on it.
TARGET_FP16FML = {"kind": "llvm", "mtriple": "aarch64-linux-gnu",
                  "mattr": ["+neon", "+fullfp16", "+fp16fml"]}
#: The same with bfloat16 dot products (``+bf16``).
TARGET_BF16 = {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon", "+bf16"]}
#: The float32 build's target: NEON, no half or bfloat16 arithmetic.
TARGET_FP32 = {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon"]}


class EmulatorError(RuntimeError):
    """The emulated CPU or its RPC server failed: the message says how (a signal, a timeout)."""


def server_path(arm_dir: str | os.PathLike | None = None) -> pathlib.Path:
    """The RPC server binary ``setup_emulator.sh`` built."""
    return pathlib.Path(arm_dir or ARM_DIR) / "rpc" / "rpc_server"


def counter_path(arm_dir: str | os.PathLike | None = None) -> pathlib.Path:
    """The instruction-counting QEMU plugin ``setup_emulator.sh`` built
    (``scripts/arm/insn_count.c``)."""
    return pathlib.Path(arm_dir or ARM_DIR) / "insn" / "libinsn_count.so"


def missing(arm_dir: str | os.PathLike | None = None,
            count_instructions: bool = False) -> str | None:
    """Why the emulator (with ``count_instructions``, its instruction counter) cannot run here
    (``None`` where it can)."""
    qemu = QEMU_PLUGINS if count_instructions else QEMU
    lacking = [name for name in (qemu, CROSS_CXX) if shutil.which(name) is None]
    if count_instructions and not counter_path(arm_dir).is_file():
        lacking.append(str(counter_path(arm_dir)))
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
    count_instructions : bool, optional
        Run the server under :data:`QEMU_PLUGINS` with the instruction-counting plugin
        (:func:`counter_path`) and one runtime thread, so that :meth:`count` can say what a run
        executes. Slower than plain emulation.
    tracker : tuple of (str, int) or str, optional
        An RPC tracker's address (``(host, port)`` or ``"host:port"``): the server registers
        with it under ``key`` (``rpc_server --tracker``), :meth:`start` waits until it has, and
        :meth:`connect` asks the tracker for a session, which any free server under ``key``
        may serve. Not with ``count_instructions`` (the counts are this server's).
    key : str, optional
        The key to register under; needs ``tracker``.
    count_kernels : bool, optional
        With ``count_instructions``, also count per function of the counted library
        (:attr:`InstructionCount.kernels`): the plugin then records each translated block.
    """

    def __init__(self, cpu: str | None = None, arm_dir: str | os.PathLike | None = None,
                 start_timeout: float = 120.0, session_timeout: float = 600.0,
                 count_instructions: bool = False, tracker=None, key: str | None = None,
                 count_kernels: bool = False):
        if (tracker is None) != (key is None):
            raise ValueError("tracker and key go together: the server registers with the "
                             "tracker under the key")
        if tracker is not None and count_instructions:
            raise ValueError("count_instructions needs the sessions on this server: "
                             "not with a tracker")
        self.tracker = None if tracker is None else remote.parse_address(tracker)
        self.key = key
        self.cpu = cpu
        self.arm_dir = pathlib.Path(arm_dir or ARM_DIR)
        self.count_instructions = count_instructions
        if count_kernels and not count_instructions:
            raise ValueError("count_kernels needs count_instructions")
        self.count_kernels = count_kernels
        self._counts_dir: str | None = None
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
        reason = missing(self.arm_dir, self.count_instructions)
        if reason:
            raise EmulatorError(reason)
        qemu, env = [QEMU], None
        if self.count_instructions:
            self._counts_dir = tempfile.mkdtemp(prefix="insn_counts_")
            qemu = [QEMU_PLUGINS, "-plugin",
                    f"{counter_path(self.arm_dir)},out={self._counts_dir}/counts"
                    + (",blocks=1" if self.count_kernels else "")]
            # the plugin's counters are not atomic: one thread of TVM's runtime
            env = {**os.environ, "TVM_NUM_THREADS": "1"}
        tracking = []
        if self.tracker is not None:
            tracking = ["--tracker", "{}:{}".format(*self.tracker), "--key", self.key]
        command = [*qemu, "-L", SYSROOT, *(["-cpu", self.cpu] if self.cpu else []),
                   str(self.server), "--host", "127.0.0.1", "--port", "0", "--no-core-dumps",
                   "--exit-with-parent", *tracking]
        descriptor, self._log_path = tempfile.mkstemp(prefix="rpc_server_", suffix=".log")
        with os.fdopen(descriptor, "w") as log:
            self._process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log,
                                             stdin=subprocess.DEVNULL, text=True, env=env)
        deadline = time.monotonic() + self.start_timeout
        line = self._line(deadline, "listen")
        match = re.search(r"listening on .*:(\d+)$", line)
        if not match:
            self.stop()
            raise EmulatorError(f"unexpected first line from the RPC server: {line!r}")
        self.port = int(match.group(1))
        if self.tracker is not None:
            what = "register with the tracker at {}:{} under key {}".format(*self.tracker,
                                                                           self.key)
            line = self._line(deadline, what)
            if not line.startswith("registered with"):
                self.stop()
                raise EmulatorError(f"unexpected line from the RPC server: {line!r}")
        return self

    def _line(self, deadline: float, what: str) -> str:
        """The server's next line on stdout, by ``deadline``; stops it and raises if none
        (the server failed to ``what``)."""
        line = ""
        while not line.endswith("\n"):
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self._process.stdout], [], [], max(left, 0))
            if not ready:
                log = self.log()
                self.stop()
                raise EmulatorError(f"the emulated RPC server did not {what} within "
                                    f"{self.start_timeout:g} s: {log}")
            chunk = self._process.stdout.readline()
            if not chunk:
                status = self._process.wait()
                log = self.log()
                self.stop()
                raise EmulatorError(f"the emulated RPC server exited ({_status_text(status)}) "
                                    f"before it could {what}: {log}")
            line += chunk
        return line.strip()

    def connect(self) -> tvm.rpc.RPCSession:
        """A new ``tvm.rpc`` session with the server (one per run: a session that crashed is
        gone, the server is not); with a tracker, the tracker's session with a free server
        under the key, waiting for one at most ``start_timeout``."""
        if self._process is None or self._process.poll() is not None:
            raise EmulatorError("the emulated RPC server is not running"
                                + (f": {self.log()}" if self._log_path else ""))
        if self.tracker is not None:
            return remote.session_from(self.tracker, self.key, timeout=self.start_timeout,
                                       session_timeout=self.session_timeout)
        return tvm.rpc.connect("127.0.0.1", self.port, session_timeout=self.session_timeout)

    def run(self, lib_path: str | os.PathLike,
            inputs: Sequence[np.ndarray] | Mapping[str, np.ndarray],
            func: str = "main", repeat: int = 1) -> list[np.ndarray]:
        """Upload a library, run ``func`` on the emulated CPU (``repeat`` times), return the
        outputs (:func:`relay_amp.builds.remote.run_remote` in a new session).

        Raises
        ------
        EmulatorError
            If the emulated CPU could not run the code (``SIGILL``: an instruction it lacks),
            the session timed out or the server died.
        """
        session = self.connect()
        try:
            return remote.run_remote(session, lib_path, inputs, func, repeat=repeat)
        except Exception as error:
            raise self.explain(error) from error

    def count(self, lib_path: str | os.PathLike,
              inputs: Sequence[np.ndarray] | Mapping[str, np.ndarray],
              func: str = "main", warmup: int = 0, runs: int = 1) -> InstructionCount:
        """The aarch64 instructions one run of ``func`` executes on the emulated CPU, by kind.

        Two sessions load the library and set the inputs; one runs ``func`` ``warmup`` times,
        the other ``warmup + runs`` times. The count is their difference over ``runs`` (each
        kind rounded): uploading and loading are left out; the first run's work (its memory
        pool) is in with ``warmup=0`` and out from 1 (the steady state). Needs
        ``count_instructions=True``. The count is that of the code and inputs on one thread,
        repeatable to about 1e-5; it is not a time.

        Raises
        ------
        EmulatorError
            As :meth:`run` does, or if the emulator does not count.
        """
        if not self.count_instructions:
            raise EmulatorError("this emulator does not count instructions: start it with "
                                "ArmEmulator(count_instructions=True)")
        if warmup < 0 or runs < 1:
            raise ValueError(f"warmup must be 0 or more and runs 1 or more, got {warmup}, {runs}")
        loaded, _, loaded_blocks = self._session_counts(lib_path, inputs, func, warmup)
        ran, outputs, ran_blocks = self._session_counts(lib_path, inputs, func, warmup + runs)
        kernels = {}
        if self.count_kernels:
            functions = _functions(str(lib_path))
            before = function_counts(loaded_blocks, lib_path, functions)
            after = function_counts(ran_blocks, lib_path, functions)
            kernels = {name: round((number - before.get(name, 0)) / runs)
                       for name, number in after.items() if number != before.get(name, 0)}
        return InstructionCount({kind: round((ran[kind] - loaded.get(kind, 0)) / runs)
                                 for kind in ran if ran[kind] != loaded.get(kind, 0)},
                                tuple(outputs), kernels)

    def _session_counts(self, lib_path, inputs, func: str,
                        repeat: int) -> tuple[dict[str, int], list[np.ndarray], str | None]:
        """What one session that runs ``func`` ``repeat`` times executed, from the file its
        process wrote at exit, the outputs, and the path of its blocks' counts (with
        ``count_kernels``, else None)."""
        before = set(os.listdir(self._counts_dir))
        outputs = self.run(lib_path, inputs, func, repeat=repeat)
        gc.collect()  # the session closes, and its process exits, when its last reference goes
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            written = sorted(name for name in set(os.listdir(self._counts_dir)) - before
                             if not name.endswith(".blocks"))
            if written and not _running(int(written[0].rsplit(".", 1)[1])):
                path = os.path.join(self._counts_dir, written[0])
                blocks = path + ".blocks" if self.count_kernels else None
                return read_counts(path), outputs, blocks
            time.sleep(0.05)
        raise EmulatorError(f"the session's process wrote no instruction counts within 60 s: "
                            f"{self.log()}")

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
        if self._counts_dir:
            shutil.rmtree(self._counts_dir, ignore_errors=True)
        self._counts_dir = None


class RpcTracker:
    """TVM's RPC tracker (``python -m tvm.exec.rpc_tracker``) on a free loopback port, the
    tracker a pool of boards registers with.

    Parameters
    ----------
    host : str, optional
        The address it binds to.
    start_timeout : float, optional
        Seconds to wait until it answers.

    Attributes
    ----------
    address : tuple of (str, int)
        ``(host, port)``, for ``ArmEmulator(tracker=...)`` and
        ``relay_amp.builds.remote.session_from``; set by :meth:`start`.
    """

    def __init__(self, host: str = "127.0.0.1", start_timeout: float = 60.0):
        self.host = host
        self.start_timeout = start_timeout
        self.address: tuple[str, int] | None = None
        self._process: subprocess.Popen | None = None
        self._log = None
        self._deadline = 0.0

    def __enter__(self) -> RpcTracker:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def start(self, wait: bool = True) -> RpcTracker:
        """Start the tracker; with ``wait``, :meth:`wait` until it answers (else the caller
        does, e.g. after other work: the tracker takes seconds to import TVM)."""
        with socket.socket() as probe:
            probe.bind((self.host, 0))
            port = probe.getsockname()[1]
        self._log = tempfile.TemporaryFile(mode="w+")
        # a session of its own: the tracker runs in a child process (TVM's PopenWorker) that
        # stop() ends with it
        self._process = subprocess.Popen(
            [sys.executable, "-m", "tvm.exec.rpc_tracker", "--host", self.host,
             "--port", str(port), "--port-end", str(port + 1)],
            stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True)
        self.address = (self.host, port)
        self._deadline = time.monotonic() + self.start_timeout
        return self.wait() if wait else self

    def wait(self) -> RpcTracker:
        """Wait until the tracker answers (its summary), at most ``start_timeout`` from
        :meth:`start`.

        Raises
        ------
        EmulatorError
            If it exited or did not answer in time (the message has its output).
        """
        if self._process is None:
            raise EmulatorError("the tracker is not running: start() it first")
        while True:
            try:
                remote.tracker_summary(self.address, timeout=5.0)
                return self
            except remote.TrackerError as error:
                if self._process.poll() is not None or time.monotonic() > self._deadline:
                    log = self.log()
                    self.stop()
                    raise EmulatorError("TVM's RPC tracker did not start on {}:{} ({}): {}"
                                        .format(*self.address, error, log)) from None
                time.sleep(0.2)

    def summary(self) -> dict:
        """The tracker's summary (:func:`relay_amp.builds.remote.tracker_summary`)."""
        return remote.tracker_summary(self.address)

    def log(self, last: int = 2000) -> str:
        """The end of the tracker's output."""
        if self._log is None:
            return ""
        self._log.seek(0)
        return self._log.read()[-last:].strip()

    def stop(self) -> None:
        """Stop the tracker (the servers registered with it go on serving and reconnect to a
        new one at the same address)."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        if process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)  # its worker, if it outlived it
        if self._log is not None:
            self._log.close()
        self._log = None


#: The instruction mix a count reports: a name and the kinds it sums (a kind is a mnemonic and its
#: first operand's shape, as ``scripts/arm/insn_count.c`` writes it: ``"fmla .8h"``, ``"fmadd h"``).
INSTRUCTION_MIX: dict[str, Callable[[str, str], bool]] = {
    "fma .8h": lambda op, shape: op in ("fmla", "fmls") and shape in (".8h", ".4h"),
    "fma .4s": lambda op, shape: op in ("fmla", "fmls") and shape in (".4s", ".2s"),
    "fma h": lambda op, shape: op in _SCALAR_FMA and shape == "h",
    "fma s": lambda op, shape: op in _SCALAR_FMA and shape == "s",
    "fmlal": lambda op, shape: op.startswith(("fmlal", "fmlsl")),
    "bfdot": lambda op, shape: op == "bfdot",
    "bfmmla": lambda op, shape: op == "bfmmla",
    "bfmlal": lambda op, shape: op in ("bfmlalb", "bfmlalt"),
    "convert": lambda op, shape: op.startswith(("fcvt", "bfcvt")) or op in ("shll", "shll2"),
    "load": lambda op, shape: op.startswith("ld"),
    "store": lambda op, shape: op.startswith("st"),
}
_SCALAR_FMA = ("fmadd", "fmsub", "fnmadd", "fnmsub")


@dataclasses.dataclass(frozen=True)
class InstructionCount:
    """Executed aarch64 instructions by kind (:meth:`ArmEmulator.count`).

    Attributes
    ----------
    kinds : dict of str to int
        Count per kind: mnemonic and the first operand's shape (``"fmla .8h"``, ``"fmadd h"``,
        ``"ldr q"``).
    outputs : tuple of numpy.ndarray
        The counted run's outputs.
    """

    kinds: dict[str, int]
    outputs: tuple = dataclasses.field(default=(), compare=False, repr=False)
    #: With ``ArmEmulator(count_kernels=True)``: instructions per function of the counted
    #: library (its kernels: ``fused_conv2d_add_relu_compute_``), per other library by file
    #: name (``libc.so.6``), and ``"?"`` for code outside any file.
    kernels: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)

    @property
    def total(self) -> int:
        """Every executed instruction."""
        return sum(self.kinds.values())

    def mix(self) -> dict[str, int]:
        """The count of each :data:`INSTRUCTION_MIX` entry, and ``"total"``."""
        mix = dict.fromkeys(INSTRUCTION_MIX, 0)
        for kind, number in self.kinds.items():
            op, _, shape = kind.partition(" ")
            for name, matches in INSTRUCTION_MIX.items():
                if matches(op, shape):
                    mix[name] += number
        mix["total"] = self.total
        return mix


def read_counts(path: str) -> dict[str, int]:
    """The counts one process wrote (``scripts/arm/insn_count.c``: "count<TAB>kind" lines),
    kind to number."""
    counts: dict[str, int] = {}
    with open(path) as lines:
        for line in lines:
            number, _, kind = line.rstrip("\n").partition("\t")
            counts[kind] = counts.get(kind, 0) + int(number)
    return counts


def _functions(library: str) -> tuple[list, list]:
    """The function symbols of the aarch64 ``library`` (sorted addresses and names) and its
    loadable segments (file offset, address), read with the cross binutils."""
    names = subprocess.run(["aarch64-linux-gnu-nm", "-n", "--defined-only", library],
                           capture_output=True, text=True, check=True).stdout
    symbols = [(int(fields[0], 16), fields[2]) for fields in map(str.split, names.splitlines())
               if len(fields) == 3 and fields[1] in "tT"]
    headers = subprocess.run(["aarch64-linux-gnu-readelf", "-lW", library],
                             capture_output=True, text=True, check=True).stdout
    segments = sorted((int(fields[1], 16), int(fields[2], 16))
                      for fields in map(str.split, headers.splitlines())
                      if fields and fields[0] == "LOAD")
    return symbols, segments


def function_counts(path: str, library: str | os.PathLike,
                    functions: tuple | None = None) -> dict[str, int]:
    """Instructions per function of ``library`` from a blocks file of
    ``scripts/arm/insn_count.c`` (``blocks=1``: each block's executions, instructions and host
    address, and the file mappings), other files' code summed by file name. The library the
    session loaded is matched to ``library`` by file name; ``functions``: its symbols and
    segments as :func:`_functions` reads them, where already read."""
    blocks, mappings = [], []
    with open(path) as lines:
        for line in lines:
            if line.startswith("map\t"):
                fields = line[4:].split()
                if len(fields) >= 6:
                    low, high = (int(x, 16) for x in fields[0].split("-"))
                    mappings.append((low, high, int(fields[2], 16), fields[5]))
            else:
                executed, size, host = line.split("\t")
                blocks.append((int(executed) * int(size), int(host, 16)))
    name = os.path.basename(str(library))
    symbols, segments = functions or _functions(str(library))
    addresses = [address for address, _ in symbols]
    counts: dict[str, int] = {}
    for number, host in blocks:
        mapping = next((m for m in mappings if m[0] <= host < m[1]), None)
        if mapping is None:
            key = "?"
        elif os.path.basename(mapping[3]) != name:
            key = os.path.basename(mapping[3])
        else:
            offset = host - mapping[0] + mapping[2]
            start, address = max((s for s in segments if s[0] <= offset), default=(0, 0))
            index = bisect.bisect_right(addresses, offset - start + address) - 1
            key = symbols[index][1] if index >= 0 else "?"
        counts[key] = counts.get(key, 0) + number
    return counts


def _running(pid: int) -> bool:
    """Whether a process runs (a zombie has exited)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


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
