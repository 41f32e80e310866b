"""relay_amp's CPU build against the runtimes users would run instead, on this x86 host.

Each registry model runs in one process beside its peer: ONNX Runtime's CPU provider on the
ONNX file the model came from (GluonCV exports, YOLOv8n, PP-OCR), PyTorch eager on the
transformers. The two are timed in interleaved rounds (a warm-up each, then rounds in which
each runs once); the table gives the median of the per-round ratio, relay_amp's build time
(compile + export) beside TVM's own CPU pipeline's, and relay_amp's output error against the
peer's float32 output, so that a fast wrong build cannot pass. Every thread count runs in its
own process (TVM's runtime reads ``TVM_NUM_THREADS`` once). The registry's models are timed as
float32 builds; a ``relay-amp convert`` library (``--library OUT``) as it was converted, one row
per size of its symbolic dimensions (``--sizes seq=64,128``), so one library gives both rows.

    python scripts/bench_peers.py --models resnet50_v1,mobilenetv2_1.0,yolov8n_320 \\
        --threads 1,2 --rounds 7
    python scripts/bench_peers.py --models bert_base --tokens 64,128 --threads 1,2
    python scripts/bench_peers.py --models "" --chains 20,100    # build time alone
    python scripts/bench_peers.py --library OUT --sizes seq=64,128  # a relay-amp convert library

Times move with the machine's load; the ratio of two runtimes timed side by side is the figure
to read. The aarch64 peers (instruction counts on the emulated CPU) are
scripts/bench_arm_peers.py.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

THREAD_VARIABLES = ("TVM_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
                    "OPENBLAS_NUM_THREADS")


def _onnx_peer(path: str, threads: int):
    import onnx
    import onnxruntime

    from relay_amp.eval.gpu_bench import drop_initializer_inputs

    # MXNet's exporter lists every weight as a graph input too, which keeps ONNX Runtime
    # from folding constants (batch norms into convolutions): the peer gets them as weights
    model = drop_initializer_inputs(onnx.load(path)).SerializeToString()
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
    # its idle threads spin by default, taking the cores from the runtime timed next to it
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = onnxruntime.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    inputs = [i.name for i in session.get_inputs()]

    def run(*arrays):
        return session.run(None, dict(zip(inputs, arrays)))

    return f"ONNX Runtime {onnxruntime.__version__}", run


def _torch_peer(module, threads: int):
    import torch

    torch.set_num_threads(threads)

    def run(*arrays):
        with torch.no_grad():
            out = module(*(torch.from_numpy(a) for a in arrays))
        return [o.numpy() for o in (out if isinstance(out, tuple) else (out,))]

    return f"PyTorch {torch.__version__.split('+')[0]} eager", run


def _build(mod, target, relay_amp_schedules: bool, workdir: str):
    """The VM function and the build's seconds (compile + export + load)."""
    import tvm
    from tvm import relax

    import relay_amp

    start = time.perf_counter()
    executable = tvm.compile(mod, target=target,
                             relax_pipeline=relay_amp.cpu_pipeline(target, relay_amp_schedules))
    path = os.path.join(workdir, f"build_{int(relay_amp_schedules)}.so")
    executable.export_library(path)
    seconds = time.perf_counter() - start
    vm = relax.VirtualMachine(tvm.runtime.load_module(path), tvm.cpu())
    return vm["main"], seconds


def _cases(name: str, tokens):
    """``(label, relax module, peer factory, inputs)`` for model ``name``."""
    import numpy as np

    from relay_amp.eval import models, transformers_zoo

    spec = models.get_spec(name)
    if spec.family == "transformers":
        built = transformers_zoo.build(name)
        mod = transformers_zoo.to_relax(built)
        first = built.batches[0]
        lengths = tokens or [first[0].shape[-1]]
        for length in lengths:
            inputs = [np.ascontiguousarray(np.resize(x, (*x.shape[:-1], length)))
                      if x.dtype.kind == "i" else x for x in first]
            yield f"{name} ({length} tokens)", mod, (
                lambda threads, m=built.module: _torch_peer(m, threads)), inputs
        return
    loaded = models.load(name, batch_size=1)  # its folder lives while this generator does
    path = loaded.extra.get("onnx_path")
    if path is None:
        raise SystemExit(f"{name}: no ONNX file to give ONNX Runtime (a {spec.family} model)")
    yield name, loaded.mod, (lambda threads: _onnx_peer(path, threads)), [
        np.ascontiguousarray(x) for x in loaded.batches[0]]


def _library_cases(folder: str, sizes: str):
    """``(label, library path, peer factory, inputs)`` per size of a ``relay-amp convert``
    output whose inputs have symbolic dimensions: ``sizes`` is ``NAME=A,B[;NAME=C,D]`` (the
    n-th size of every name makes the n-th row). Integer inputs are ones (token ids, masks),
    float inputs seeded normal values; the peer runs the model file the library came from."""
    import numpy as np

    with open(os.path.join(folder, "report.json")) as handle:
        report = json.load(handle)
    given = {name: [int(v) for v in values.split(",")]
             for name, values in (part.split("=", 1) for part in sizes.split(";") if part)}
    model = report["model"]
    if any(i["fed_as"] != i["dtype"] for i in model["inputs"]):
        raise SystemExit("--library: an input fed in another dtype than the model's; convert "
                         "without :DTYPE in --input to compare with the peer")
    if model["format"] == "onnx":
        peer = functools.partial(_onnx_peer, model["path"])
    elif model["format"] == "pt2":
        import torch

        program = torch.export.load(model["path"])
        peer = functools.partial(_torch_peer, program.module())
    else:
        raise SystemExit(f"--library: no peer for a {model['format']} model")
    symbolic = {row["name"] for row in model.get("symbolic", [])}
    if set(given) != symbolic:
        raise SystemExit(f"--sizes names {sorted(given)}; the library's symbolic dimensions are "
                         f"{sorted(symbolic)}")
    rng = np.random.default_rng(0)
    for index in range(min((len(values) for values in given.values()), default=1)):
        at = {name: values[index] for name, values in given.items()}
        inputs = []
        for spec in model["inputs"]:
            shape = [d if isinstance(d, int) else at[d.split("=")[0]] for d in spec["shape"]]
            inputs.append(np.ones(shape, spec["dtype"]) if spec["dtype"].startswith(("int",
                          "uint")) else rng.standard_normal(shape).astype(spec["dtype"]))
        label = (", ".join(f"{name}={value}" for name, value in at.items()) or "fixed: "
                 + ", ".join("x".join(map(str, array.shape)) for array in inputs))
        yield (f"{os.path.basename(model['path'])} ({label}; one {report['dtype']} library)",
               os.path.join(folder, report["library"]), peer, inputs)


def _child(args) -> int:
    import numpy as np
    import tvm

    import relay_amp
    from relay_amp.eval.bench import interleaved_times
    from relay_amp.execution import agreement, flatten_outputs

    target = tvm.target.Target(relay_amp.host_target())
    threads = args.threads_child
    cases = (_library_cases(args.library, args.sizes) if args.library else
             (case for name in args.models.split(",") for case in _cases(name, args.tokens)))
    for label, mod, peer_factory, inputs in cases:
        if isinstance(mod, str):  # a library built by relay-amp convert
            library = tvm.runtime.load_module(mod)
            ours = tvm.relax.VirtualMachine(library, tvm.cpu())["main"]
            build_s = tvm_build_s = None
        else:
            with tempfile.TemporaryDirectory(prefix="bench_peers_build_") as workdir:
                ours, build_s = _build(mod, target, True, workdir)  # loaded: the file can go
                tvm_build_s = (_build(mod, target, False, workdir)[1] if args.tvm_build
                               else None)
        peer, peer_run = peer_factory(threads)
        tvm_inputs = [tvm.runtime.tensor(x) for x in inputs]
        reference = [np.asarray(o) for o in peer_run(*inputs)]
        error = agreement(reference, flatten_outputs(ours(*tvm_inputs))).relative_l2
        times = interleaved_times({"peer": functools.partial(peer_run, *inputs),
                                   "ours": functools.partial(ours, *tvm_inputs)},
                                  (), args.rounds)
        ratios = [o / p for o, p in zip(times["ours"], times["peer"])]
        print(json.dumps({
            "model": label, "threads": threads, "peer": peer,
            "peer_ms": statistics.median(times["peer"]) * 1e3,
            "relay_amp_ms": statistics.median(times["ours"]) * 1e3,
            "ratio": statistics.median(ratios), "rounds": args.rounds,
            "relative_l2": error, "outputs": len(reference),
            "build_s": build_s, "tvm_build_s": tvm_build_s}), flush=True)
    return 0


def elementwise_chain(length: int):
    """A MatMul, ``length`` alternating Relu and Sigmoid ops and a Softmax (float32): TVM fuses
    the chain into the matmul's kernel, the case that once made relay_amp's build slow."""
    import numpy as np
    from tvm import relax

    builder = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((8, 64), "float32"))
    weight = relax.const(np.random.default_rng(0).standard_normal((64, 64)).astype("float32"))
    with builder.function("main", [x]):
        with builder.dataflow():
            y = builder.emit(relax.op.matmul(x, weight))
            for i in range(length):
                y = builder.emit(relax.op.nn.relu(y) if i % 2 == 0 else relax.op.sigmoid(y))
            out = builder.emit_output(builder.emit(relax.op.nn.softmax(y)))
        builder.emit_func_output(out)
    return builder.get()


def chain_build_times(lengths) -> list[dict]:
    """Build seconds (compile + export) of :func:`elementwise_chain` by TVM's CPU pipeline and
    by relay_amp's, alternately, for each length."""
    import tvm

    import relay_amp

    target = tvm.target.Target(relay_amp.host_target())
    rows = []
    for length in lengths:
        mod = elementwise_chain(length)
        with tempfile.TemporaryDirectory(prefix="bench_peers_chain_") as workdir:
            seconds = {ours: _build(mod, target, ours, workdir)[1] for ours in (False, True)}
        rows.append({"ops": length, "tvm_build_s": seconds[False],
                     "relay_amp_build_s": seconds[True]})
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    return rows


def _table(rows, cpu: str) -> str:
    lines = [f"host: {cpu}", "",
             "| model | threads | peer | peer (ms) | relay_amp (ms) | ratio (median of "
             "rounds) | rel. L2 vs peer | build s: relay_amp / TVM's |",
             "|---|---:|---|---:|---:|---:|---:|---|"]
    for r in rows:
        build = "(built by convert)" if r["build_s"] is None else f"{r['build_s']:.1f}"
        if r["tvm_build_s"]:
            build += f" / {r['tvm_build_s']:.1f} ({r['build_s'] / r['tvm_build_s']:.2f} ×)"
        lines.append(f"| {r['model']} | {r['threads']} | {r['peer']} | {r['peer_ms']:.1f} | "
                     f"{r['relay_amp_ms']:.1f} | {r['ratio']:.2f} × | {r['relative_l2']:.1e} | "
                     f"{build} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="mobilenetv2_1.0,resnet50_v1,yolov8n_320")
    parser.add_argument("--threads", default="1,2", help="thread counts, each in its own process")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved timed rounds (≥ 7)")
    parser.add_argument("--tokens", default="", help="sequence lengths for the transformers "
                        "(default: each model's own first batch)")
    parser.add_argument("--no-tvm-build", dest="tvm_build", action="store_false",
                        help="skip building with TVM's own CPU pipeline (its build time)")
    parser.add_argument("--chains", default="", help="also the build time of a MatMul followed "
                        "by chains of these many elementwise ops (e.g. 100,1000)")
    parser.add_argument("--library", help="a relay-amp convert OUT folder (symbolic "
                        "dimensions): one row per size of --sizes, instead of --models")
    parser.add_argument("--sizes", default="", help="with --library: NAME=A,B[;NAME=C,D], "
                        "e.g. seq=64,128 or batch=1,4")
    parser.add_argument("--json", help="also write the rows to this file")
    parser.add_argument("--threads-child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.tokens = [int(t) for t in args.tokens.split(",") if t]
    if args.threads_child:
        return _child(args)
    rows = []
    for threads in (int(t) for t in args.threads.split(",") if args.models or args.library):
        env = {**os.environ, **{v: str(threads) for v in THREAD_VARIABLES}}
        command = [sys.executable, __file__, "--threads-child", str(threads),
                   "--models", args.models, "--rounds", str(args.rounds),
                   "--tokens", ",".join(map(str, args.tokens))]
        if args.library:
            command += ["--library", args.library, "--sizes", args.sizes]
        if not args.tvm_build:
            command.append("--no-tvm-build")
        child = subprocess.run(command, env=env, stdout=subprocess.PIPE, text=True)
        rows += [json.loads(line) for line in child.stdout.splitlines() if line.startswith("{")]
        if child.returncode:
            print(f"threads={threads}: the benchmark process failed ({child.returncode})",
                  file=sys.stderr)
            return child.returncode
    import relay_amp

    if rows:
        print(_table(rows, str(relay_amp.host_target())), flush=True)
    # after the models: a long chain's build takes minutes
    chains = chain_build_times(int(n) for n in args.chains.split(",") if n)
    if chains:
        print("\n| MatMul + elementwise chain | TVM's build (s) | relay_amp's build (s) | ratio |")
        print("|---:|---:|---:|---:|")
        for row in chains:
            print(f"| {row['ops']} ops | {row['tvm_build_s']:.1f} | {row['relay_amp_build_s']:.1f} "
                  f"| {row['relay_amp_build_s'] / row['tvm_build_s']:.2f} × |")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"models": rows, "chains": chains}, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
