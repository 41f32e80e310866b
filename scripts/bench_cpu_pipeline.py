"""Wall time of relay_amp.cpu_pipeline's build against TVM's CPU build, on this host: registry
models at batch 1, float32 and relay_amp's conversion for the host's defaults, the two builds
timed alternately in one process (rounds of runs, the fastest run of each kept), as ratios.

    python scripts/bench_cpu_pipeline.py --models resnet50_v1,mobilenetv2_1.0 --rounds 3

Times on a shared machine move with its load; the ratio of two builds timed side by side is the
figure to read, not the milliseconds.
"""

from __future__ import annotations

import argparse
import sys
import time


def main(argv=None) -> int:
    import numpy as np
    import tvm
    from tvm import relax

    import relay_amp
    from relay_amp.eval import models

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="resnet50_v1,mobilenetv2_1.0,bert_base")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=3, help="runs per round and build")
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
            machines = {}
            for schedules in (False, True):
                executable = tvm.compile(mod, target=target,
                                         relax_pipeline=relay_amp.cpu_pipeline(target, schedules))
                machines[schedules] = relax.VirtualMachine(executable, tvm.cpu())
                machines[schedules]["main"](*inputs)  # warm up
            best = {False: float("inf"), True: float("inf")}
            for _ in range(args.rounds):
                for schedules, vm in machines.items():
                    for _ in range(args.runs):
                        start = time.perf_counter()
                        vm["main"](*inputs)
                        best[schedules] = min(best[schedules], time.perf_counter() - start)
            print(f"| {name} | {dtype} | {best[False] * 1e3:.1f} | {best[True] * 1e3:.1f} | "
                  f"{best[True] / best[False]:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
