"""Build every registry model and every ONNX backend-test case the conformance suite converts
for ``cuda -arch=sm_90`` in float32, float16 and bfloat16 (CUDA source: no GPU needed), and
record each build that fails with TVM's error and the schedule rules that raised
(:mod:`relay_amp.eval.cuda_builds`).

python scripts/cuda_build_sweep.py --cases all --models none --workers 2   # the conformance cases
python scripts/cuda_build_sweep.py --cases none --models bert_base,resnet18_v1
python scripts/cuda_build_sweep.py --cases node --limit 50 --dtypes float16
python scripts/cuda_build_sweep.py --markdown-only                       # tables from the results

Results resume: cases already in ``--cases-out``, models already in ``--models-out`` are kept.
"""

import argparse
import json
import sys
import time
from datetime import datetime, timezone

from relay_amp.cli.progress import progress_bar
from relay_amp.eval import conformance, cuda_builds
from relay_amp.eval.sweep import machine_description


def _names(value: str, every: list) -> list:
    if value == "all":
        return list(every)
    if value == "none":
        return []
    return [n for n in value.split(",") if n]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default="all",
                        help="conformance suites (comma-separated, 'all' or 'none')")
    parser.add_argument("--limit", type=int, default=None, help="the first N cases only")
    parser.add_argument("--models", default="none",
                        help="registry models (comma-separated, 'all' or 'none')")
    parser.add_argument("--dtypes", default=",".join(cuda_builds.DTYPES))
    parser.add_argument("--workers", type=int, default=1, help="worker processes")
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="seconds a case may take (a model: 6 times this)")
    parser.add_argument("--cases-out", default="results/cuda_builds_cases.jsonl")
    parser.add_argument("--models-out", default="results/cuda_builds_models.json")
    parser.add_argument("--markdown", default="results/cuda_builds.md")
    parser.add_argument("--markdown-only", action="store_true",
                        help="write the tables from the results without building anything")
    args = parser.parse_args(argv)
    from relay_amp.eval.models import REGISTRY

    dtypes = tuple(d for d in args.dtypes.split(",") if d)
    unknown = [d for d in dtypes if d not in cuda_builds.DTYPES]
    if unknown:
        parser.error(f"unknown dtypes {unknown}; choose from {list(cuda_builds.DTYPES)}")
    suites = _names(args.cases, conformance.suites())
    paths = conformance.case_dirs(suites)[:args.limit] if suites else []
    models = _names(args.models, list(REGISTRY))
    missing = [m for m in models if m not in REGISTRY]
    if missing:
        parser.error(f"unknown models {missing}")
    started = time.time()
    case_rows, model_rows = None, None
    if paths:
        if args.markdown_only:
            case_rows = conformance.rows_from_records(
                conformance.read_records(args.cases_out),
                [conformance.case_name(p) for p in paths])
        else:
            bar = progress_bar(total=len(paths), desc="cases", unit="case")
            case_rows = cuda_builds.run_cases(paths, dtypes, args.cases_out, args.workers,
                                              args.timeout, lambda done: bar.update(done - bar.n))
            bar.close()
    if models:
        if args.markdown_only:
            with open(args.models_out, encoding="utf-8") as handle:
                model_rows = {n: r for n, r in json.load(handle)["models"].items()
                              if n in models}
        else:
            model_rows = cuda_builds.run_models(models, dtypes, args.models_out, args.workers,
                                                6 * args.timeout)
    cases = cuda_builds.case_builds(case_rows, dtypes) if case_rows is not None else None
    summary = cuda_builds.model_builds(model_rows, dtypes) if model_rows is not None else None
    date = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    header = (f"CUDA builds for `cuda -arch=sm_90` ({date}, {machine_description()}"
              + ("" if args.markdown_only else f", {time.time() - started:.0f} s") + "): `"
              + " ".join(["python scripts/cuda_build_sweep.py", *(argv or sys.argv[1:])]) + "`\n")
    text = cuda_builds.summary_markdown(cases, summary, dtypes, header)
    with open(args.markdown, "w", encoding="utf-8") as handle:
        handle.write(text + "\n")
    print(text)
    failed = sum(len(s["failures"][d]) for s in (cases, summary) if s for d in dtypes)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
