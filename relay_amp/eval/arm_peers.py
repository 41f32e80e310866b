"""The runtimes users would run instead of relay_amp, counted on the emulated aarch64 CPU.

LiteRT (its XNNPACK delegate) on TFLite models and ONNX Runtime on ONNX files run under the
aarch64 Python that ``scripts/arm/setup_peers.sh`` unpacks into :data:`PEERS_DIR`, inside
``qemu-aarch64`` with the instruction counter of ``scripts/arm/setup_emulator.sh``
(:func:`relay_amp.eval.arm_emulator.counter_path`), on the CPU model :data:`CPU`. Each process
runs :mod:`relay_amp.eval.arm_peer_runner`.

A per-inference count is a steady state: processes that run the model ``warmup`` times and
``warmup + runs`` times, the difference over ``runs`` (:func:`steady_state`). LiteRT spin-waits
(``yield``, ``isb``, ``mrs`` of the counter, in loops whose length follows QEMU's speed), and
spinning only adds: each of the two counts is the least total of several processes
(:class:`Protocol`). ``scripts/bench_arm_peers.py`` puts these beside relay_amp's builds.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import pathlib
import subprocess
import tempfile
from collections.abc import Mapping, Sequence

import numpy as np

from . import arm_emulator

#: Where ``scripts/arm/setup_peers.sh`` puts the aarch64 Python (``root``) and the peers' wheels
#: (``site``).
PEERS_DIR = arm_emulator.ARM_DIR / "peers"
#: The one QEMU CPU model of every row, peers and relay_amp alike: ``max`` without SVE, which a
#: peer could otherwise pick kernels for.
CPU = "max,sve=off"
#: TFLite's model metadata that asks XNNPACK for float16 inference with float16 accumulation
#: (``tflite::optimize::kTfLiteReducedPrecisionKey``; the delegate then sets
#: ``XNN_FLAG_HINT_FP16_INFERENCE``). LiteRT's Python ``Interpreter`` has no option for it.
FLOAT16_METADATA = ("reduced_precision_support", "fp16accfp16")
#: The kinds a spin-wait executes (a peer's wait, not its work).
SPIN_KINDS = ("yield", "isb", "nop", "mrs x")
RUNNER = pathlib.Path(__file__).with_name("arm_peer_runner.py")
PEERS = ("litert", "onnxruntime")
#: How the table names each peer.
PEER_NAMES = {"litert": "LiteRT/XNNPACK", "onnxruntime": "ONNX Runtime"}
#: The mix the table gives beside each total (:func:`mix`).
MIX_COLUMNS = ("fma .4s", "fma .8h", "fmlal", "load", "store", "spin")


@dataclasses.dataclass(frozen=True)
class Protocol:
    """How a steady-state count is taken.

    Attributes
    ----------
    warmup : int
        N: runs of the shorter process (at least 1 leaves the first run's work out).
    runs : int
        k: the longer process runs N + k times.
    processes : int
        Processes counted for each of N and N + k; the least total of each is kept.
    """

    warmup: int = 1
    runs: int = 10
    processes: int = 3

    def __str__(self) -> str:
        return f"(N+{self.runs} − N)/{self.runs}, N={self.warmup}, min of {self.processes}"


@dataclasses.dataclass
class PeerCount:
    """A peer's executed instructions per inference, by kind, and its outputs.

    Attributes
    ----------
    kinds : dict of str to float
        Per-inference count of each kind (:func:`steady_state`).
    outputs : list of numpy.ndarray
        The last run's outputs, in the model's output order.
    totals : dict of str to list of int
        Every counted process's total, under ``"N"`` and ``"N+k"``.
    log : str
        The end of the peer's stderr (LiteRT names its delegate there).
    """

    kinds: dict
    outputs: list
    totals: dict
    log: str = ""

    @property
    def total(self) -> float:
        """Every executed instruction per inference."""
        return sum(self.kinds.values())


def missing(peers_dir: str | os.PathLike | None = None) -> str | None:
    """Why the peers cannot be counted here (``None`` where they can)."""
    peers_dir = pathlib.Path(peers_dir or PEERS_DIR)
    lacking = [str(p) for p in (peers_dir / "root" / "usr" / "bin" / "python3.11",
                                peers_dir / "site" / ".requirements")
               if not p.exists()]
    counter = arm_emulator.missing(count_instructions=True)
    if not lacking:
        return counter
    reason = f"no {', '.join(lacking)}: run scripts/arm/setup_peers.sh"
    return f"{counter}; {reason}" if counter else reason


def least(processes: Sequence[Mapping[str, int]]) -> Mapping[str, int]:
    """The count (kind to number) of the process that executed the fewest instructions."""
    if not processes:
        raise ValueError("no process counted")
    return min(processes, key=lambda kinds: sum(kinds.values()))


def steady_state(short: Sequence[Mapping[str, int]], long: Sequence[Mapping[str, int]],
                 runs: int) -> dict[str, float]:
    """Instructions per inference by kind: the least of the processes that ran N + ``runs``
    times minus the least of those that ran N times, over ``runs``.

    Parameters
    ----------
    short, long : sequence of mapping of str to int
        Each process's count by kind, for N and N + ``runs`` runs.
    runs : int
        k.

    Returns
    -------
    dict of str to float
        The kinds whose count differs; a kind counted less in the longer process (noise in
        start-up) is negative.
    """
    if runs < 1:
        raise ValueError(f"runs must be 1 or more, got {runs}")
    low, high = least(short), least(long)
    return {kind: (high.get(kind, 0) - low.get(kind, 0)) / runs
            for kind in sorted(set(low) | set(high)) if high.get(kind, 0) != low.get(kind, 0)}


def mix(kinds: Mapping[str, float]) -> dict[str, float]:
    """The instruction mix of a count (:data:`relay_amp.eval.arm_emulator.INSTRUCTION_MIX`,
    ``"total"``) and ``"spin"``: the :data:`SPIN_KINDS`."""
    result = arm_emulator.InstructionCount(dict(kinds)).mix()
    result["spin"] = sum(kinds.get(kind, 0) for kind in SPIN_KINDS)
    return result


def with_float16_hint(tflite_path: str | os.PathLike, out_path: str | os.PathLike,
                      peers_dir: str | os.PathLike | None = None) -> str:
    """A copy of a TFLite model with :data:`FLOAT16_METADATA`, the way to XNNPACK's float16
    path from LiteRT's Python API. Rewritten with the flatbuffer schema LiteRT's wheel ships
    (``ai_edge_litert/schema_py_generated.py`` in the peers' site folder) and ``flatbuffers``.
    """
    import flatbuffers

    schema_path = pathlib.Path(peers_dir or PEERS_DIR) / "site" / "ai_edge_litert" / \
        "schema_py_generated.py"
    spec = importlib.util.spec_from_file_location("litert_schema", schema_path)
    schema = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(schema)
    with open(tflite_path, "rb") as handle:
        model = schema.ModelT.InitFromPackedBuf(bytearray(handle.read()), 0)
    key, value = FLOAT16_METADATA
    buffer = schema.BufferT()
    buffer.data = list(value.encode())
    model.buffers.append(buffer)
    metadata = schema.MetadataT()
    metadata.name = key
    metadata.buffer = len(model.buffers) - 1
    model.metadata = [m for m in (model.metadata or []) if m.name not in (key, key.encode())]
    model.metadata.append(metadata)
    builder = flatbuffers.Builder(1 << 20)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    with open(out_path, "wb") as handle:
        handle.write(builder.Output())
    return os.fspath(out_path)


def peer_command(peer: str, model: str, inputs_path: str, runs: int, outputs_path: str,
                 counts_prefix: str, peers_dir: str | os.PathLike | None = None,
                 cpu: str = CPU) -> list[str]:
    """The command that runs :mod:`relay_amp.eval.arm_peer_runner` under the counter."""
    peers_dir = pathlib.Path(peers_dir or PEERS_DIR)
    return [arm_emulator.QEMU_PLUGINS, "-cpu", cpu, "-L", str(peers_dir / "root"),
            "-plugin", f"{arm_emulator.counter_path()},out={counts_prefix}",
            str(peers_dir / "root" / "usr" / "bin" / "python3.11"), str(RUNNER),
            peer, model, inputs_path, str(runs), outputs_path]


def run_peer(peer: str, model: str, inputs: Sequence[np.ndarray], runs: int, workdir: str,
             peers_dir: str | os.PathLike | None = None, cpu: str = CPU,
             timeout: float = 3600.0) -> tuple[dict[str, int], list[np.ndarray], str]:
    """One counted process of a peer running ``model`` ``runs`` times.

    Returns
    -------
    tuple
        Its count by kind (every process it started summed: the counter writes one file per
        process), the last run's outputs and the end of its output (LiteRT names its delegate
        there).
    """
    if peer not in PEERS:
        raise ValueError(f"unknown peer {peer!r}; choose from {', '.join(PEERS)}")
    inputs_path = os.path.join(workdir, "inputs.npz")
    if not os.path.exists(inputs_path):
        np.savez(inputs_path, *[np.ascontiguousarray(x) for x in inputs])
    counts_dir = tempfile.mkdtemp(prefix="peer_counts_", dir=workdir)
    outputs_path = os.path.join(counts_dir, "outputs.npz")
    env = {**os.environ, "PYTHONPATH": str(pathlib.Path(peers_dir or PEERS_DIR) / "site"),
           "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(peer_command(peer, model, inputs_path, runs, outputs_path,
                                       os.path.join(counts_dir, "counts"), peers_dir, cpu),
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout)
    if done.returncode:
        raise RuntimeError(f"{peer} on {os.path.basename(model)} failed "
                           f"(exit {done.returncode}): {done.stdout[-1500:]}")
    kinds: dict[str, int] = {}
    for name in os.listdir(counts_dir):
        if name.startswith("counts."):  # one file per process
            counts = arm_emulator.read_counts(os.path.join(counts_dir, name))
            for kind, number in counts.items():
                kinds[kind] = kinds.get(kind, 0) + number
    with np.load(outputs_path) as saved:
        outputs = [saved[f"arr_{i}"] for i in range(len(saved.files))]
    return kinds, outputs, done.stdout[-500:]


def count_peer(peer: str, model: str, inputs: Sequence[np.ndarray],
               protocol: Protocol = Protocol(), peers_dir: str | os.PathLike | None = None,
               cpu: str = CPU, progress=None) -> PeerCount:
    """A peer's instructions per inference on ``model`` under ``protocol``.

    Parameters
    ----------
    peer : str
        ``"litert"`` or ``"onnxruntime"``.
    model : str
        The ``.tflite`` or ``.onnx`` file.
    inputs : sequence of numpy.ndarray
        The model's inputs, in order.
    protocol : Protocol, optional
        N, k and the processes of each (default: LiteRT's recipe, k = 10, min of 3).
    peers_dir : str or os.PathLike, optional
        Default :data:`PEERS_DIR`.
    cpu : str, optional
        QEMU's CPU model.
    progress : callable, optional
        Called with no argument after each process (a progress bar's ``update``).

    Returns
    -------
    PeerCount
        The outputs are those of the last process (N + k runs).

    Raises
    ------
    RuntimeError
        If the peers are not set up, or a process failed (its output's end in the message).
    """
    reason = missing(peers_dir)
    if reason:
        raise RuntimeError(reason)
    counted: dict[str, list] = {"N": [], "N+k": []}
    outputs: list = []
    log = ""
    with tempfile.TemporaryDirectory(prefix="arm_peer_") as workdir:
        for _ in range(protocol.processes):
            for key, runs in (("N", protocol.warmup), ("N+k", protocol.warmup + protocol.runs)):
                kinds, outputs, log = run_peer(peer, model, inputs, runs, workdir, peers_dir,
                                               cpu)
                counted[key].append(kinds)
                if progress:
                    progress()
    return PeerCount(steady_state(counted["N"], counted["N+k"], protocol.runs), outputs,
                     {key: [sum(k.values()) for k in value] for key, value in counted.items()},
                     log)



def versions(peers_dir: str | os.PathLike | None = None) -> dict[str, str]:
    """The distributions installed in the peers' site folder, name to version (from their
    ``.dist-info`` folders)."""
    site = pathlib.Path(peers_dir or PEERS_DIR) / "site"
    found = {}
    for info in site.glob("*.dist-info") if site.is_dir() else ():
        name, _, version = info.name[:-len(".dist-info")].rpartition("-")
        found[name.replace("_", "-").lower()] = version
    return found



def table(rows: Mapping[str, dict], names: Sequence[str]) -> str:
    """The markdown table of ``scripts/bench_arm_peers.py``'s rows (docs/ARM.md).

    Parameters
    ----------
    rows : mapping of str to dict
        Model name to its row: ``{"model", "cells": [...]}``, each cell ``{"runtime",
        "precision", "status", "total", "mix", "error_vs_peer_float32"}`` (or ``"message"``
        where it failed), or ``{"error": ...}`` for a model that failed as a whole.
    names : sequence of str
        The models, in the table's order (those without a row are left out).

    Returns
    -------
    str
        Per model, the peer's lines and relay_amp's: instructions per inference (millions),
        their ratio to the peer's float32 count (and, for a reduced precision, to the peer's
        float16 count), the mix (millions, :data:`MIX_COLUMNS`) and the relative L2 error
        against the peer's float32 outputs.
    """
    lines = ["| model | runtime | precision | instructions (M) | ÷ peer float32 | ÷ peer float16 | "
             + " | ".join(MIX_COLUMNS) + " | rel. L2 vs peer float32 |",
             "|---|---|---|---:|---:|---:|" + "---:|" * len(MIX_COLUMNS) + "---:|"]
    for name in names:
        row = rows.get(name)
        if not row:
            continue
        if row.get("error"):
            lines.append(f"| {name} | fails: {row['error'][:120]} |")
            continue
        peer = {c["precision"]: c["total"] for c in row["cells"]
                if c["runtime"] != "relay_amp" and c["status"] == "ok"}
        for cell in row["cells"]:
            if cell["status"] != "ok":
                lines.append(f"| {name} | {cell['runtime']} | {cell['precision']} | "
                             f"fails: {cell['message'][:100]} |")
                continue
            half = cell["precision"] != "float32" and peer.get("float16")
            ratios = [f"{cell['total'] / peer['float32']:.2f}" if peer.get("float32") else "",
                      f"{cell['total'] / peer['float16']:.2f}" if half else ""]
            mix = [f"{cell['mix'][c] / 1e6:.1f}" if abs(cell["mix"][c]) >= 5e4 else "0"
                   for c in MIX_COLUMNS]
            error = cell["error_vs_peer_float32"]
            if cell["runtime"] != "relay_amp" and cell["precision"] == "float32":
                error = "(reference)"
            elif error is None:
                error = cell.get("error_note") or ""
            else:
                error = f"{error:.2g}"
            lines.append(f"| {name} | {cell['runtime']} | {cell['precision']} | "
                         f"{cell['total'] / 1e6:,.1f} | {' | '.join(ratios)} | "
                         f"{' | '.join(mix)} | {error} |")
    return "\n".join(lines)

__all__ = ["PEERS_DIR", "CPU", "FLOAT16_METADATA", "SPIN_KINDS", "Protocol", "PeerCount",
           "missing", "least", "steady_state", "mix", "with_float16_hint", "peer_command",
           "run_peer", "count_peer", "versions", "table", "PEER_NAMES", "MIX_COLUMNS"]
