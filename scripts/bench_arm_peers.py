"""relay_amp's aarch64 builds beside the runtimes users would run instead, in executed
instructions per inference on the emulated aarch64 CPU (issue 44 item 1, aarch64).

Peers (``relay_amp.eval.arm_peers``): LiteRT with XNNPACK on every MediaPipe TFLite model of
the registry, in float32 and in XNNPACK's float16 path (asked through the model's
``reduced_precision_support`` metadata: LiteRT's Python API has no option for it); ONNX Runtime's
CPU provider on the ONNX files of the others (GluonCV exports, YOLOv8n, PP-OCR), float32. They
run under an aarch64 Python inside ``qemu-aarch64 -cpu max,sve=off``; relay_amp's builds
(``scripts/arm_insn_count.py``'s variants, float32 for ``+neon`` only) run there through TVM's
RPC. Both sides: one thread, the registry's first input batch, the steady state (N + k runs minus
N runs, over k); each peer count the least of several processes (LiteRT spin-waits). Every
relay_amp row gives its relative L2 error against the peer's float32 outputs.

    bash scripts/arm/setup_emulator.sh && bash scripts/arm/setup_peers.sh   # as root, once
    python scripts/bench_arm_peers.py --out results/arm_peers.json --markdown table.md

Each model runs in its own process; rows already in ``--out`` are kept. Counts are not times.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import arm_insn_count  # scripts/, beside this file
from tqdm import tqdm

MEDIAPIPE = ("face_detection_short_range", "face_landmark", "iris_landmark",
             "palm_detection_lite", "palm_detection_full", "hand_landmark_lite",
             "hand_landmark_full")
ONNX = ("mobilenetv2_1.0", "ppocr_mobile_v2_cls", "ppocrv4_rec", "ppocrv4_det", "yolov8n_320",
        "resnet50_v1")
#: relay_amp's variants beside a peer with a float16 path, and beside one without.
VARIANTS = ("float32", "float16-fmlal", "float16-acc16")
ONNX_VARIANTS = ("float32",)


def peer_model(loaded, workdir: str) -> tuple[str, str]:
    """``(peer, file)``: the runtime a user would run ``loaded`` with and the file it takes."""
    import onnx

    from relay_amp.eval.gpu_bench import drop_initializer_inputs

    name = loaded.spec.name
    if "tflite_path" in loaded.extra:
        return "litert", loaded.extra["tflite_path"]
    path = loaded.extra.get("onnx_path")
    if path is None:
        raise ValueError(f"{name}: no TFLite or ONNX file to give a peer "
                         f"(a {loaded.spec.family} model)")
    # MXNet's exporter lists every weight as a graph input too, which keeps ONNX Runtime from
    # folding constants (batch norms into convolutions): the peer gets them as weights
    peer_path = os.path.join(workdir, f"{name}.peer.onnx")
    onnx.save(drop_initializer_inputs(onnx.load(path)), peer_path)
    return "onnxruntime", peer_path


def _error(reference, outputs) -> tuple[float | None, str | None]:
    import relay_amp

    try:
        return relay_amp.agreement(reference, list(outputs)).relative_l2, None
    except ValueError as err:  # outputs that do not line up: the cell says how
        return None, str(err)[:200]


def _cell(who: str, precision: str, kinds: dict, reference, outputs, protocol: str,
          seconds: float, **extra) -> dict:
    from relay_amp.eval import arm_peers

    error, mismatch = _error(reference, outputs) if reference is not None else (None, None)
    return {"runtime": who, "precision": precision, "status": "ok",
            "total": sum(kinds.values()), "mix": arm_peers.mix(kinds),
            "top": dict(sorted(kinds.items(), key=lambda kv: -kv[1])[:20]),
            "error_vs_peer_float32": error, "error_note": mismatch, "protocol": protocol,
            "seconds": seconds, **extra}


def measure(name: str, variants: tuple, onnx_variants: tuple, peer_protocols: dict,
            relay_protocol: tuple, peer_float16: bool) -> dict:
    """One model's row: its peer's counts and relay_amp's, each with its error against the
    peer's float32 outputs."""
    from relay_amp.eval import arm_peers, models
    from relay_amp.eval.arm_emulator import ArmEmulator

    relay_warmup, relay_runs = relay_protocol
    relay_text = f"(N+{relay_runs} − N)/{relay_runs}, N={relay_warmup}, one process"
    row = {"model": name, "cells": []}
    loaded = models.load(name, batch_size=1)
    inputs = [x for x in loaded.batches[0]]
    row["inputs"] = [list(x.shape) for x in inputs]
    with tempfile.TemporaryDirectory(prefix="bench_arm_peers_") as workdir:
        peer, path = peer_model(loaded, workdir)
        row["peer"], row["peer_file"] = peer, os.path.basename(path)
        protocol = arm_peers.Protocol(*peer_protocols[peer])
        precisions = [("float32", path)]
        if peer == "litert" and peer_float16:
            precisions.append(("float16", arm_peers.with_float16_hint(
                path, os.path.join(workdir, f"{name}.fp16.tflite"))))
        ours = variants if peer == "litert" else onnx_variants
        steps = tqdm(total=len(precisions) * 2 * protocol.processes + len(ours), desc=name,
                     unit="count", leave=False)
        reference = None
        for precision, model in precisions:
            start = time.perf_counter()
            try:
                counted = arm_peers.count_peer(peer, model, inputs, protocol,
                                               progress=steps.update)
            except Exception as err:  # a peer that does not load the model: relay_amp's go on
                row["cells"].append({"runtime": arm_peers.PEER_NAMES[peer],
                                     "precision": precision, "status": "error",
                                     "message": f"{type(err).__name__}: {err}"[:400]})
                continue
            if precision == "float32":
                reference = counted.outputs
            row["cells"].append(_cell(arm_peers.PEER_NAMES[peer], precision, counted.kinds,
                                      reference, counted.outputs, str(protocol),
                                      time.perf_counter() - start, totals=counted.totals,
                                      log=counted.log))
        with ArmEmulator(arm_peers.CPU, count_instructions=True,
                         session_timeout=7200) as emulator:
            for variant in ours:
                start = time.perf_counter()
                try:
                    lib = arm_insn_count.build(loaded, variant, workdir)
                    count = emulator.count(lib, inputs, warmup=relay_warmup, runs=relay_runs)
                except Exception as err:  # the cell says what failed
                    row["cells"].append({"runtime": "relay_amp", "precision": variant,
                                         "status": "error",
                                         "message": f"{type(err).__name__}: {err}"[:400]})
                    steps.update()
                    continue
                row["cells"].append(_cell("relay_amp", variant, count.kinds, reference,
                                          count.outputs, relay_text,
                                          time.perf_counter() - start))
                steps.update()
        steps.close()
    return row


def _failed(name: str, message: str) -> dict:
    return {"model": name, "error": message, "cells": []}


def main(argv=None) -> int:
    from relay_amp.eval import arm_peers
    from relay_amp.eval.isolation import measure_each

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="results/arm_peers.json")
    parser.add_argument("--models", default=",".join(MEDIAPIPE + ONNX), help="comma-separated")
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help="relay_amp's variants beside LiteRT (scripts/arm_insn_count.py's)")
    parser.add_argument("--onnx-variants", default=",".join(ONNX_VARIANTS),
                        help="relay_amp's variants beside ONNX Runtime (float32 only)")
    parser.add_argument("--litert-protocol", default="1,10,3",
                        help="N,k,processes of LiteRT's counts (it spins: k=10, min of 3)")
    parser.add_argument("--onnxruntime-protocol", default="1,2,1",
                        help="N,k,processes of ONNX Runtime's counts (on one thread, with "
                             "spinning off, it has no thread to spin)")
    parser.add_argument("--relay-protocol", default="1,1",
                        help="N,k of relay_amp's counts (one process each: TVM's runtime on "
                             "one thread does not spin)")
    parser.add_argument("--no-peer-float16", dest="peer_float16", action="store_false",
                        help="skip LiteRT's float16 path")
    parser.add_argument("--timeout", type=float, default=7200.0, help="seconds per model")
    parser.add_argument("--markdown", default=None, help="also write the table here")
    args = parser.parse_args(argv)
    reason = arm_peers.missing()
    if reason:
        parser.error(reason)
    names = [n for n in args.models.split(",") if n]
    variants = tuple(v for v in args.variants.split(",") if v)
    onnx_variants = tuple(v for v in args.onnx_variants.split(",") if v)
    unknown = set(variants + onnx_variants) - set(arm_insn_count.VARIANTS)
    if unknown:
        parser.error(f"unknown variants {sorted(unknown)}; choose from "
                     f"{', '.join(arm_insn_count.VARIANTS)}")
    peer_protocols = {peer: tuple(int(x) for x in getattr(args, f"{peer}_protocol").split(","))
                      for peer in arm_peers.PEERS}
    relay_protocol = tuple(int(x) for x in args.relay_protocol.split(","))
    header = {"cpu": arm_peers.CPU, "peers": arm_peers.versions(),
              "date": time.strftime("%Y-%m-%d")}
    rows = measure_each(names, measure, args.out, args.timeout, _failed,
                        (variants, onnx_variants, peer_protocols, relay_protocol,
                         args.peer_float16), header)
    table = arm_peers.table(rows, names)
    print(table)
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as handle:
            handle.write(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
