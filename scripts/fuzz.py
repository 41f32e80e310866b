"""Fuzz relay_amp with random Relax functions; prints how many examples kept every invariant.

python scripts/fuzz.py --examples 10000 --numeric-every 20
Every example checks: the input module is untouched, the output is well-formed, signature and
return dtypes are preserved, converting again changes nothing, and every low-precision binding is
in the report. Every --numeric-every-th If-free example is also compiled and run against float32.
"""

import argparse
import collections
import json
import sys
import time

from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from relay_amp.eval import fuzz


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=10000)
    parser.add_argument("--numeric-every", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--target", default="none",
                        help="convert with this target's defaults, as a JSON dict (e.g. "
                             "'{\"kind\": \"cuda\", \"arch\": \"sm_90\"}'), or none")
    args = parser.parse_args(argv)
    target = None if args.target == "none" else json.loads(args.target)
    counts = collections.Counter()
    ops = collections.Counter()
    worst = {"float16": 0.0, "bfloat16": 0.0}
    start = time.time()

    @settings(max_examples=args.examples, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(case=fuzz.cases(), dtype=st.sampled_from(["float16", "bfloat16"]))
    def run(case, dtype):
        try:
            converted, _ = fuzz.check_invariants(case, dtype, target)
        except Exception:
            print(f"FAILING {dtype} {case.ops}\n{case.mod.script(show_meta=False)}", flush=True)
            raise
        counts["examples"] += 1
        counts[dtype] += 1
        batch_dim = case.mod["main"].params[0].ty.shape.values[0]
        counts["static batch" if hasattr(batch_dim, "value") else "symbolic batch"] += 1
        ops.update(case.ops)
        if "if" not in case.ops and counts["examples"] % args.numeric_every == 0:
            try:
                error = fuzz.check_numerics(case, converted, dtype)
            except Exception:
                print(f"FAILING NUMERICS {dtype} {case.ops}\n{case.mod.script(show_meta=False)}"
                      f"\n{converted.script(show_meta=False)}", flush=True)
                raise
            counts["numeric checks"] += 1
            worst[dtype] = max(worst[dtype], error)
        if counts["examples"] % 500 == 0:
            print(f"{counts['examples']} examples, {time.time() - start:.0f} s", flush=True)

    try:
        seed(args.seed)(run)()
        status = 0
    except Exception as err:  # hypothesis re-raises the shrunk failing example
        print(f"INVARIANT BROKEN: {type(err).__name__}: {err}", file=sys.stderr)
        status = 1
    print(f"\n{counts['examples']} examples in {time.time() - start:.0f} s, "
          f"{0 if status == 0 else 1} invariant broken")
    for key in ("float16", "bfloat16", "static batch", "symbolic batch", "numeric checks"):
        print(f"  {key}: {counts[key]}")
    print(f"  worst relative L2 vs float32: float16 {worst['float16']:.3g}, "
          f"bfloat16 {worst['bfloat16']:.3g}")
    print("  ops: " + ", ".join(f"{name} {count}" for name, count in ops.most_common()))
    return status


if __name__ == "__main__":
    sys.exit(main())
