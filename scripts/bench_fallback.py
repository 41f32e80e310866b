"""Fallback search benchmark: relay_amp's output-effect search vs its local-error ranking vs
segment bisection.

python scripts/bench_fallback.py --models palm_detection_full,light_squeezenet \
    --out results/fallback.json
Each model is searched at a tolerance of half the error of its plain (calibrated) conversion.
"""

import argparse
import json
import sys

from relay_amp.cli.progress import progress_bar
from relay_amp.eval import bench_fallback


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="palm_detection_full,face_detection_short_range,"
                        "ppocr_mobile_v2_cls,light_squeezenet,light_shufflenet")
    parser.add_argument("--dtype", default="float16")
    parser.add_argument("--out", default="results/fallback.json")
    parser.add_argument("--methods", default="relay_amp,relay_amp_local,bisection",
                        help="which searches (default: %(default)s)")
    args = parser.parse_args(argv)
    methods = [m for m in args.methods.split(",") if m]
    unknown = sorted(set(methods) - {key for key, _ in bench_fallback.METHODS})
    if unknown:
        parser.error(f"unknown method(s): {', '.join(unknown)}")
    rows = []
    for name in progress_bar(args.models.split(","), desc="fallback", unit="model"):
        rows.append(bench_fallback.measure(name, args.dtype, methods=methods))
        with open(args.out, "w", encoding="utf-8") as handle:
            json.dump(rows, handle, indent=1, default=float)
    print(bench_fallback.table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
