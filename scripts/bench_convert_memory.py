"""Peak memory and time of ``relay-amp convert`` on an ONNX model whose weights live in an
external data file, against the weights' size.

    python scripts/bench_convert_memory.py                          # BERT-large shape, 1.3 GB
    python scripts/bench_convert_memory.py --layers 2 --hidden 128  # a quick look

The model is the registry's BERT encoder (``relay_amp.eval.transformers_zoo``: its wrapper,
seeded ``transformers`` initialization, explicit position and token-type ids) at a larger
configuration, exported by ``torch.onnx.export`` at a fixed sequence length into a temporary
folder and saved with every tensor of at least 1 KiB in ``weights.bin`` beside ``model.onnx``.
The export runs in a child process and so does the convert (``python -m relay_amp.cli convert
model.onnx --dtype float16 -o OUT``: the default target, this CPU, with its build and export),
so the peak resident memory of the convert's process (its ``ru_maxrss``, as the kernel counts
it) is the convert's alone. The compiler and linker it runs to export the library are processes
of their own and are not measured (a forked child's ``ru_maxrss`` counts its parent's pages).
Each stage's seconds come from the report's ``timings_s``; RSS is sampled every 50 ms to give
each stage's peak.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

_EXPORT = """
import sys, numpy as np, onnx, torch, transformers
from relay_amp.eval.transformers_zoo import SEED, _encoder_wrapper, token_ids
hidden, layers, heads, seq, path = (int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]),
                                    int(sys.argv[4]), sys.argv[5])
config = transformers.BertConfig(hidden_size=hidden, num_hidden_layers=layers,
                                 num_attention_heads=heads, intermediate_size=4 * hidden)
torch.manual_seed(SEED)
with torch.no_grad():
    module = _encoder_wrapper(transformers.BertModel(config).eval(), explicit_positions=True)
    ids = torch.from_numpy(token_ids(1, seq, config.vocab_size)[0])
    folder = path.rsplit("/", 1)[0]
    plain = folder + "/plain.onnx"
    torch.onnx.export(module, (ids, torch.ones_like(ids)), plain, dynamo=False,
                      input_names=["input_ids", "attention_mask"],
                      output_names=["hidden", "pooled"], opset_version=17)
del module
model = onnx.load(plain)
onnx.save_model(model, path, save_as_external_data=True, all_tensors_to_one_file=True,
                location="weights.bin", size_threshold=1024)
import os; os.remove(plain)
"""

_MEASURE = """
import json, resource, sys, threading, time
start = time.perf_counter()
samples, done = [], threading.Event()
def sample():
    while not done.is_set():
        with open("/proc/self/status") as status:
            rss = next(int(l.split()[1]) for l in status if l.startswith("VmRSS:"))
        samples.append((time.perf_counter() - start, rss * 1024))
        time.sleep(0.05)
threading.Thread(target=sample, daemon=True).start()
from relay_amp.cli import main
called = time.perf_counter() - start
code = main(sys.argv[1:])
seconds = time.perf_counter() - start
done.set()
print(json.dumps({"exit_code": code, "seconds": seconds, "called_s": called,
                  "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                  "samples": samples}))
"""

#: The report's stages in the order the convert runs them (``timings_s``).
STAGES = ("import_s", "calibrate_s", "search_s", "convert_s", "build_relax_passes_s",
          "build_tir_passes_s", "build_codegen_s", "build_export_s")


def stage_peaks(samples: list, called: float, timings: dict) -> dict:
    """The largest RSS sampled in each stage: ``startup`` (Python, TVM and relay_amp imported)
    until the command is called, then the report's stages laid end to end from there (the
    checks before the import and the steps between stages, a few milliseconds, are taken as
    nothing)."""
    bounds, begin = [("startup", 0.0, called)], called
    for stage in [s for s in STAGES if s in timings]:
        bounds.append((stage, begin, begin + timings[stage]))
        begin += timings[stage]
    peaks = {}
    for stage, first, last in bounds:
        inside = [rss for t, rss in samples if first <= t < last]
        peaks[stage] = max(inside) if inside else None
    return peaks


def export(folder: str, hidden: int, layers: int, heads: int, seq: int) -> str:
    """The model saved with external data in ``folder``; returns the path of ``model.onnx``."""
    path = os.path.join(folder, "model.onnx")
    subprocess.run([sys.executable, "-c", _EXPORT, str(hidden), str(layers), str(heads),
                    str(seq), path], check=True)
    return path


def measure_convert(path: str, out: str, dtype: str = "float16") -> dict:
    """Run the convert in a child that samples its own RSS; returns its exit code, seconds,
    peak RSS (``ru_maxrss``) and the samples."""
    command = ["convert", path, "--dtype", dtype, "-o", out]  # its progress bars: stderr
    result = subprocess.run([sys.executable, "-c", _MEASURE, *command], check=True,
                            stdout=subprocess.PIPE, text=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--seq", type=int, default=64, help="tokens (fixed in the export)")
    parser.add_argument("--dtype", default="float16", choices=("float16", "bfloat16"))
    parser.add_argument("--repeats", type=int, default=1, help="converts of the same file")
    parser.add_argument("--out", default="results/convert_memory.json")
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="relay_amp_memory_") as folder:
        start = time.perf_counter()
        path = export(folder, args.hidden, args.layers, args.heads, args.seq)
        exported_s = time.perf_counter() - start
        weights = os.path.getsize(os.path.join(folder, "weights.bin"))
        model_file = os.path.getsize(path)
        for repeat in range(args.repeats):
            out = os.path.join(folder, f"out{repeat}")
            row = measure_convert(path, out, args.dtype)
            if row["exit_code"] == 0:
                with open(os.path.join(out, "report.json"), encoding="utf-8") as handle:
                    report = json.load(handle)
                row["timings_s"], row["notes"] = report["timings_s"], report["notes"]
                row["summary"] = report["conversion"]["summary"]
                row["library_bytes"] = os.path.getsize(os.path.join(out, "model.so"))
                row["stage_peak_rss_bytes"] = stage_peaks(row["samples"], row["called_s"],
                                                          row["timings_s"])
            del row["samples"]
            row["peak_rss_per_weight_byte"] = row["peak_rss_bytes"] / weights
            rows.append(row)
    result = {"config": {"hidden": args.hidden, "layers": args.layers, "heads": args.heads,
                         "intermediate": 4 * args.hidden, "seq": args.seq, "dtype": args.dtype},
              "weights_bytes": weights, "model_file_bytes": model_file, "export_s": exported_s,
              "self_peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
              "converts": rows}
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as handle:
        json.dump(result, handle, indent=1)
    for row in rows:
        print(f"weights {weights / 2**30:.3f} GiB; convert exit {row['exit_code']}: "
              f"{row['seconds']:.1f} s, peak RSS {row['peak_rss_bytes'] / 2**30:.3f} GiB "
              f"({row['peak_rss_per_weight_byte']:.2f}x the weights)")
        if "timings_s" in row:
            print("  seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in row["timings_s"].items()))
            print("  peak RSS / weights by stage: " + ", ".join(
                f"{k} {v / weights:.2f}" for k, v in row["stage_peak_rss_bytes"].items()
                if v is not None))
    return 0 if all(r["exit_code"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
