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

``--blocked-macs`` loads each model again and converts it with each folder's policy (as its
sweep did, uncalibrated) to add the share of its dot products' multiply-accumulates that the
blocks cover: a call whose window is larger than the block, or whose reduction is no multiple
of it, keeps float32 accumulation (its report row says so).

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


def blocked_macs(results: dict) -> dict:
    """{model: the share of its dot products' multiply-accumulates summed in blocks} under the
    policy and target ``results`` were measured with (empty where the policy asks no blocks)."""
    import relay_amp

    meta = results.get("meta", {})
    if not (meta.get("policy") or {}).get("accumulation_blocks"):
        return {}
    policy = relay_amp.Policy.from_dict(meta["policy"])
    shares = {}
    for name in results["models"]:
        _, report = relay_amp.convert(_loaded(name), "float16", policy=policy,
                                      target=meta.get("relay_amp_target"))
        dots = [row for row in report.rows if row.macs]
        total = sum(row.macs for row in dots)
        blocked = sum(row.macs for row in dots
                      if any(r.code == "blocked_accumulation" for r in row.reasons))
        shares[name] = blocked / total if total else None
    return shares


_MODULES: dict = {}


def _loaded(name: str):
    from relay_amp.eval import models

    if name not in _MODULES:
        _MODULES[name] = models.load(name, batch_size=1).mod
    return _MODULES[name]


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
                continue
            mark = "" if row["ratio"] <= 1.1 else " ✗"
            share = row.get("blocked_macs")
            cells.append(f"{row['ratio']:.2f}{mark}"
                         + ("" if share is None else f" ({100 * share:.0f} %)"))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    meets = [label for label in labels
             if all(row["ratio"] is not None and row["ratio"] <= 1.1
                    for row in columns[label].values())]
    lines += ["", "Each cell: the largest ratio, over the model's outputs, of relay_amp's "
              "relative L2 error to TVM's built-in pass's on the same inputs (✗: above 1.1); "
              "in brackets, where measured, the share of the dot products' multiply-accumulates "
              "summed in blocks. "
              "Every model within 1.1: " + (", ".join(meets) if meets else "none") + "."]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", nargs="+", metavar="LABEL=FOLDER",
                        help="a sweep's output folder and the column label for it")
    parser.add_argument("--json", default=None, help="also write the rows here")
    parser.add_argument("--blocked-macs", action="store_true",
                        help="add the share of multiply-accumulates the blocks cover")
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
        if args.blocked_macs:
            for name, share in blocked_macs(results).items():
                columns[label][name]["blocked_macs"] = share
    print(markdown(columns))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(columns, handle, indent=1, default=float)
    return 0


if __name__ == "__main__":
    sys.exit(main())
