"""Wall time of relay_amp.cpu_pipeline's build against TVM's CPU build, on this host: registry
models at batch 1, float32 and relay_amp's conversion for the host's defaults, the two builds
timed alternately in one process (``relay_amp.eval.bench.interleaved_medians``: a warm-up
each, then rounds in which each runs once; the median kept), as ratios.

    python scripts/bench_cpu_pipeline.py --models resnet50_v1,mobilenetv2_1.0 --repeats 5

Times on a shared machine move with its load; the ratio of two builds timed side by side is the
figure to read, not the milliseconds.
"""

from __future__ import annotations

import argparse
import sys


def main(argv=None) -> int:
    import numpy as np
    import tvm
    from tvm import relax

    import relay_amp
    from relay_amp.eval import models
    from relay_amp.eval.bench import interleaved_medians

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="resnet50_v1,mobilenetv2_1.0,bert_base")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs of each build")
    args = parser.parse_args(argv)
    target = tvm.target.Target(relay_amp.host_target())
    print(f"host target: {target}")
    print("| model | dtype | TVM's build (ms) | relay_amp.cpu_pipeline (ms) | ratio |")
    print("|---|---|---:|---:|---:|")
    for name in args.models.split(","):
        loaded = models.load(name, batch_size=1)
        inputs = [tvm.runtime.tensor(np.ascontiguousarray(x)) for x in loaded.batches[0]]
        converted, _ = relay_amp.convert(loaded.mod, "float16", target=target)
        for dtype, mod in (("float32", loaded.mod), ("relay_amp float16", converted)):
            runs = {}
            for schedules in (False, True):
                executable = tvm.compile(mod, target=target,
                                         relax_pipeline=relay_amp.cpu_pipeline(target, schedules))
                runs[schedules] = relax.VirtualMachine(executable, tvm.cpu())["main"]
            median = interleaved_medians(runs, tuple(inputs), args.repeats)
            print(f"| {name} | {dtype} | {median[False] * 1e3:.1f} | {median[True] * 1e3:.1f} | "
                  f"{median[True] / median[False]:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
