"""Run the ONNX backend test suite through relay_amp and write docs/CONFORMANCE.md.

python scripts/onnx_conformance.py                       # all ~1,390 cases (resumable)
python scripts/onnx_conformance.py --limit 50            # the first 50
"""

import argparse
import json
import sys
from collections import Counter
from datetime import datetime, timezone

from tqdm import tqdm

from relay_amp.eval import conformance
from relay_amp.eval.sweep import machine_description


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--results", default="results/conformance.jsonl")
    parser.add_argument("--doc", default="docs/CONFORMANCE.md")
    args = parser.parse_args(argv)
    paths = conformance.case_dirs()[:args.limit]
    bar = tqdm(total=len(paths), desc="onnx cases", unit="case")

    def progress(done):
        bar.n = done
        bar.refresh()

    import os
    os.makedirs(os.path.dirname(args.results) or ".", exist_ok=True)
    rows = conformance.run_suite(paths, args.results, progress)
    bar.close()
    command = "python scripts/onnx_conformance.py" + (f" --limit {args.limit}" if args.limit else "")
    text = conformance.summary_markdown(rows, command, machine_description(),
                                        datetime.now(timezone.utc).strftime("%Y-%m-%d"))
    with open(args.doc, "w", encoding="utf-8") as handle:
        handle.write(text)
    counts = Counter(r["outcome"] for r in rows)
    print(json.dumps(counts), f"-> {args.doc}")
    return 1 if counts.get("crash") or counts.get("fail") else 0


if __name__ == "__main__":
    sys.exit(main())
