"""Run the ONNX backend test suite through relay_amp in every mode and write docs/CONFORMANCE.md.

python scripts/onnx_conformance.py --workers 2                 # every case, every mode (resumable)
python scripts/onnx_conformance.py --limit 50                  # the first 50 cases
python scripts/onnx_conformance.py --modes low_io,all_low      # some modes
python scripts/onnx_conformance.py --doc-only                  # rewrite the doc from the results
"""

import argparse
import json
import os
import sys
import time
from collections import Counter
from datetime import datetime, timezone

from relay_amp.cli.progress import progress_bar
from relay_amp.eval import conformance
from relay_amp.eval.sweep import machine_description


def _versions() -> str:
    import onnx
    import tvm

    return f"onnx {onnx.__version__}, TVM {tvm.__version__}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit", type=int, default=None, help="run the first N cases only")
    parser.add_argument("--suites", default=None,
                        help="comma-separated suites (default: every suite the installed onnx "
                             f"ships: {','.join(conformance.suites())})")
    parser.add_argument("--modes", default=",".join(conformance.MODES),
                        help=f"comma-separated modes of {list(conformance.MODES)}")
    parser.add_argument("--workers", type=int, default=1, help="worker processes (default 1)")
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="seconds one step of a case may take before it counts as hung")
    parser.add_argument("--results", default="results/conformance.jsonl")
    parser.add_argument("--doc", default="docs/CONFORMANCE.md")
    parser.add_argument("--notes", default=None,
                        help="a markdown file whose text goes into the doc after the tables")
    parser.add_argument("--doc-only", action="store_true",
                        help="write the doc from --results without running anything")
    args = parser.parse_args(argv)
    modes = tuple(m for m in args.modes.split(",") if m)
    unknown = [m for m in modes if m not in conformance.MODES]
    if unknown:
        parser.error(f"unknown modes {unknown}; choose from {list(conformance.MODES)}")
    suite_names = args.suites.split(",") if args.suites else None
    paths = conformance.case_dirs(suite_names)[:args.limit]
    os.makedirs(os.path.dirname(args.results) or ".", exist_ok=True)
    started = time.time()
    if args.doc_only:
        rows = conformance.rows_from_records(conformance.read_records(args.results),
                                             [conformance.case_name(p) for p in paths])
        duration = None
    else:
        bar = progress_bar(total=len(paths), desc="conformance", unit="case")

        def progress(done):
            bar.update(done - bar.n)

        rows = conformance.run_suite(paths, args.results, progress, args.timeout, args.workers,
                                     modes)
        bar.close()
        duration = time.time() - started
    command = "python scripts/onnx_conformance.py" + "".join(
        f" --{k} {v}" for k, v in (("limit", args.limit), ("suites", args.suites),
                                   ("workers", args.workers if args.workers != 1 else None))
        if v) + (f" --modes {args.modes}" if modes != tuple(conformance.MODES) else "")
    notes = ""
    if args.notes:
        with open(args.notes, encoding="utf-8") as handle:
            notes = handle.read()
    text = conformance.summary_markdown(rows, command, machine_description(),
                                        datetime.now(timezone.utc).strftime("%Y-%m-%d"),
                                        modes, duration_s=duration, versions=_versions(),
                                        notes=notes)
    with open(args.doc, "w", encoding="utf-8") as handle:
        handle.write(text)
    outcomes = {m: dict(conformance.mode_summary(rows, m)["outcomes"]) for m in modes}
    print(json.dumps(outcomes), f"-> {args.doc}")
    bad = Counter(o for counts in outcomes.values() for o in counts if o in ("crash", "fail"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
