"""How well a sweep's batches decide the per-output criterion (relay_amp float16 error ≤ 1.1 ×
the built-in pass's on every output): per output of each model, the ratio, the batches that
really weigh in (``relay_amp.eval.sweep.effective_batches``) and a paired bootstrap interval of
the ratio over the batches (``relay_amp.eval.sweep.ratio_interval``). relay_amp converts as the
sweep does (calibrated, the sweep's default target, float32 inputs).

    python scripts/per_output_noise.py --models hand_landmark_lite,iris_landmark --batches 256

A one-element probability far in its tail is decided by the few inputs where it is largest: on
those an interval that spans 1.1 says that more inputs, not a different conversion, are needed.
"""

from __future__ import annotations

import argparse
import json
import sys

from tqdm import tqdm


def measure(name: str, batches: int) -> list:
    import relay_amp
    from relay_amp import execution
    from relay_amp.eval import models, sweep
    from relay_amp.eval.stats import builtin_convert

    loaded = models.load(name, batches=batches)
    mod = loaded.mod
    calibration = relay_amp.calibrate(mod, loaded.batches)
    converted, _ = relay_amp.convert(mod, "float16", target=sweep.DEFAULT_TARGET,
                                     calibration=calibration)

    def outputs(module) -> list:
        vm = relay_amp.compile_module(module)
        return [execution.run(vm, batch) for batch in loaded.batches]

    reference, ours, theirs = outputs(mod), outputs(converted), outputs(builtin_convert(mod))
    counts = sweep.effective_batches(reference)
    rows = []
    for index in range(len(reference[0])):
        ratio, low, high = sweep.ratio_interval(reference, ours, theirs, index)
        rows.append({"model": name, "output": index, "elements": int(reference[0][index].size),
                     "batches": len(loaded.batches), "effective_batches": counts[index],
                     "ratio": ratio, "interval_90": [low, high]})
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", required=True, help="comma-separated registry names")
    parser.add_argument("--batches", type=int, default=256,
                        help="input batches per model (default 256; the loaders give distinct "
                             "inputs: photo windows past the photos)")
    parser.add_argument("--out", help="write the rows here as JSON")
    args = parser.parse_args(argv)
    if args.batches < 2:
        parser.error("--batches must be at least 2 for an interval")
    rows = []
    for name in tqdm(args.models.split(","), desc="models", file=sys.stderr):
        rows += measure(name.strip(), args.batches)
    print("| model | output | elements | batches | effective batches | ratio | 90% interval |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for r in rows:
        low, high = r["interval_90"]
        print(f"| {r['model']} | {r['output']} | {r['elements']} | {r['batches']} | "
              f"{r['effective_batches']:.1f} | {r['ratio']:.3f} | {low:.2f}-{high:.2f} |")
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(rows, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
