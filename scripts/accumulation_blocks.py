"""The accuracy of float16 accumulated in blocks (issue 45 item 3), beside float32 and float16
accumulation: per model, the largest per-output ratio of relay_amp's error to TVM's built-in
pass's (the sweep's criterion: ≤ 1.1 on every output), one column per accumulation setting.

Each setting is one ``relay-amp sweep`` folder, all with the same models, target and batches:

    T="llvm -mtriple=aarch64-linux-gnu -mattr=+neon,+fullfp16"
    relay-amp sweep --models M --dtypes float16 --target "$T" --batches 4 --no-gpu-cost \\
        --out results/blocks/float32
    relay-amp sweep ... --policy b16.json --out results/blocks/b16   # and so on
    python scripts/accumulation_blocks.py float32=results/blocks/float32 \\
        B16=results/blocks/b16 ... --json docs/results/accumulation_blocks.json

A policy file for blocks of 16 on every dot product: ``Policy("float16")`` with
``set_accumulation_block(op, 16)`` for matmul, nn.conv1d, nn.conv2d and nn.conv3d, written by
``Policy.to_json()``; float16 accumulation: ``set_accumulation_dtype(op, "float16")``.
"""

from __future__ import annotations

import argparse
import json
import sys

from relay_amp.eval.sweep import per_output_ratios

VARIANT, BUILTIN = "relay_amp:float16", "tvm:float16"


def worst_ratios(results: dict) -> dict:
    """{model: (largest per-output ratio or None, that output, relay_amp's relative L2, the
    built-in's, batches)} of one sweep's results; None where a row did not run."""
    rows = {}
    for name, model in results["models"].items():
        ours, theirs = model["variants"].get(VARIANT, {}), model["variants"].get(BUILTIN, {})
        ratios = per_output_ratios(ours, theirs) if ours.get("status") == "ok" and theirs.get(
            "status") == "ok" else []
        index, ratio = max(ratios, key=lambda item: item[1]) if ratios else (None, None)
        rows[name] = {"ratio": ratio, "output": index, "relative_l2": ours.get("relative_l2"),
                      "builtin_relative_l2": theirs.get("relative_l2"),
                      "status": ours.get("status"), "batches": model.get("batches"),
                      "code_version": model.get("code_version")}
    return rows


def markdown(columns: dict) -> str:
    labels = list(columns)
    models = list(dict.fromkeys(name for rows in columns.values() for name in rows))
    lines = ["| model | " + " | ".join(labels) + " |", "|---|" + "---:|" * len(labels)]
    for name in models:
        cells = []
        for label in labels:
            row = columns[label].get(name)
            if row is None or row["ratio"] is None:
                cells.append(row["status"] if row else "")
            else:
                mark = "" if row["ratio"] <= 1.1 else " ✗"
                cells.append(f"{row['ratio']:.2f}{mark}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    meets = [label for label in labels
             if all(row["ratio"] is not None and row["ratio"] <= 1.1
                    for row in columns[label].values())]
    lines += ["", "Each cell: the largest ratio, over the model's outputs, of relay_amp's "
              "relative L2 error to TVM's built-in pass's on the same inputs (✗: above 1.1). "
              "Every model within 1.1: " + (", ".join(meets) if meets else "none") + "."]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", nargs="+", metavar="LABEL=FOLDER",
                        help="a sweep's output folder and the column label for it")
    parser.add_argument("--json", default=None, help="also write the rows here")
    args = parser.parse_args(argv)
    columns = {}
    for item in args.folders:
        label, sep, folder = item.partition("=")
        if not sep or not label or not folder:
            parser.error(f"expected LABEL=FOLDER; got {item!r}")
        try:
            with open(f"{folder}/results.json", encoding="utf-8") as handle:
                results = json.load(handle)
        except OSError as err:
            parser.error(f"{folder}: {err}")
        columns[label] = worst_ratios(results)
    print(markdown(columns))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(columns, handle, indent=1, default=float)
    return 0


if __name__ == "__main__":
    sys.exit(main())
