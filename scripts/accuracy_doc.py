"""Write docs/ACCURACY.md from a sweep's results.json (and a fallback benchmark's JSON)."""

import argparse
import json
import os
import sys

from relay_amp.eval import sweep


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--results", default="results/results.json")
    parser.add_argument("--fallback", default="results/fallback.json")
    parser.add_argument("--command", default="relay-amp sweep --all --out results/")
    parser.add_argument("--out", default="docs/ACCURACY.md")
    parser.add_argument("--target-results", default=None,
                        help="a sweep's results.json run with a target's defaults: appended as a "
                             "side-by-side section")
    parser.add_argument("--section", action="append", default=[], metavar="TITLE=RESULTS",
                        help="a sweep's results.json of further models, appended as a section "
                             "of its own with its run's date and headline counts (repeatable)")
    parser.add_argument("--append", default=None,
                        help="a Markdown file appended as is (hand-written notes on the run)")
    args = parser.parse_args(argv)
    with open(args.results, encoding="utf-8") as handle:
        results = json.load(handle)
    fallback = None
    if os.path.exists(args.fallback):
        with open(args.fallback, encoding="utf-8") as handle:
            fallback = json.load(handle)
    folder = os.path.dirname(args.out) or "."
    sweep.plot_errors(results, os.path.join(folder, "accuracy_error.png"))
    text = sweep.accuracy_markdown(results, args.command, fallback, "accuracy_error.png")
    if args.target_results:
        with open(args.target_results, encoding="utf-8") as handle:
            after = json.load(handle)
        target = json.dumps(after.get("meta", {}).get("relay_amp_target"))
        text += (f"\n## With a target's defaults: {target}\n\n"
                 f"Command: `relay-amp sweep --target '{target}'` (the sweep's default target), "
                 f"{after.get('meta', {}).get('date', '')}, same machine; "
                 f"{len(after['models'])} of {len(results['models'])} models re-run.\n\n"
                 + sweep.target_comparison_markdown(results, after))
    for section in args.section:
        title, _, path = section.partition("=")
        if not path:
            parser.error(f"--section {section!r}: expected TITLE=RESULTS")
        with open(path, encoding="utf-8") as handle:
            extra = json.load(handle)
        text += sweep.section_markdown(title, extra)
    if args.append:
        with open(args.append, encoding="utf-8") as handle:
            text += "\n" + handle.read()
    with open(args.out, "w", encoding="utf-8") as handle:
        handle.write(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
