"""Executed aarch64 instructions per inference of registry models, float32 against relay_amp's
float16 and bfloat16, on the emulated aarch64 CPU (issue 32 item 4's speed figure measurable
without a board): each variant compiled for aarch64, exported with the cross compiler, run once
through TVM's RPC on ``qemu-aarch64`` with ``scripts/arm/insn_count.c`` counting every executed
instruction by kind, and its outputs compared with float32's (relative L2).

    bash scripts/arm/setup_emulator.sh        # as root, once
    python scripts/arm_insn_count.py --out results/arm_insn_count.json --markdown table.md

Variants: ``float32-tvm`` and ``float16-tvm`` are built by TVM's CPU pipeline (what
``tvm.compile`` gives: dot products mostly scalar); the others by ``relay_amp.cpu_pipeline``
(dot products vectorized): ``float32`` (``+neon``), ``float16`` (relay_amp's aarch64 defaults,
``+neon,+fullfp16``: float32 accumulation), ``float16-fmlal`` (the same with ``+fp16fml``:
float16 dot products on FMLAL), ``float16-acc16`` (the same with float16
accumulation of convolutions and matmuls asked, the fast and less accurate choice),
``float16-blocksB`` (the same target with B products summed in float16 per block, the blocks
in float32: ``Policy.set_accumulation_block``, B in 4, 8, 16, 32) and ``bfloat16``
(``+neon,+bf16``). Batch 1, the model's first input batch, conversions
uncalibrated. Rows already in ``--out`` are kept; each model runs in its own process. Counts are
not times: QEMU runs each instruction at its own cost, a board does not.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

MODELS = ("resnet50_v1", "mobilenetv2_1.0", "yolov8n_320", "bert_base", "llama_smollm_135m")
#: name -> (dtype, accumulation asked for convolutions and matmuls (a dtype, or the products
#: per float16 block), relay_amp.cpu_pipeline, the target: a name in relay_amp.eval.arm_emulator)
VARIANTS = {
    "float32-tvm": ("float32", None, False, "TARGET_FP32"),
    "float16-tvm": ("float16", None, False, "TARGET_FP16"),
    "float32": ("float32", None, True, "TARGET_FP32"),
    "float16": ("float16", None, True, "TARGET_FP16"),
    "float16-fmlal": ("float16", None, True, "TARGET_FP16FML"),
    "float16-acc16": ("float16", "float16", True, "TARGET_FP16"),
    **{f"float16-blocks{b}": ("float16", b, True, "TARGET_FP16") for b in (4, 8, 16, 32)},
    "bfloat16": ("bfloat16", None, True, "TARGET_BF16"),
}
MIX_COLUMNS = ("fma .4s", "fma s", "fma .8h", "fma h", "fmlal", "bfdot", "bfmmla", "bfmlal",
               "convert")


def build(loaded, variant: str, workdir: str) -> str:
    """The library of one variant, linked for aarch64."""
    import tvm

    import relay_amp
    from relay_amp.builds.remote import export_for
    from relay_amp.eval import arm_emulator

    dtype, accumulation, schedules, target_name = VARIANTS[variant]
    target = getattr(arm_emulator, target_name)
    mod = loaded.mod
    if dtype != "float32":
        policy = relay_amp.Policy(dtype)
        for op in ("nn.conv2d", "matmul"):
            if isinstance(accumulation, int):
                policy.set_accumulation_block(op, accumulation)
            elif accumulation:
                policy.set_accumulation_dtype(op, accumulation)
        mod, _ = relay_amp.convert(mod, dtype, policy=policy, target=target)
    executable = tvm.compile(mod, target=tvm.target.Target(target),
                             relax_pipeline=relay_amp.cpu_pipeline(target, schedules))
    return export_for(executable, os.path.join(workdir, f"{variant}.so"), target)


def measure(name: str, variants: tuple, warmup: int = 0, kernels: int = 0) -> dict:
    import relay_amp
    from relay_amp.eval import models
    from relay_amp.eval.arm_emulator import ArmEmulator

    row = {"model": name, "variants": {}}
    loaded = models.load(name, batch_size=1)
    inputs = loaded.batches[0]
    row["inputs"] = [list(x.shape) for x in inputs]
    reference = None
    with tempfile.TemporaryDirectory() as workdir, ArmEmulator(
            count_instructions=True, session_timeout=7200, count_kernels=kernels > 0) as emulator:
        for variant in variants:
            start = time.perf_counter()
            try:
                lib = build(loaded, variant, workdir)
                built = time.perf_counter()
                count = emulator.count(lib, inputs, warmup=warmup)
            except Exception as err:  # the cell says what failed
                row["variants"][variant] = {"status": "error",
                                            "message": f"{type(err).__name__}: {err}"[:400]}
                continue
            if variant == "float32-tvm" or (variant == "float32" and reference is None):
                reference = count.outputs  # TVM's float32 build, else relay_amp's
            row["variants"][variant] = {
                "status": "ok", "total": count.total, "mix": count.mix(),
                "top": dict(sorted(count.kinds.items(), key=lambda kv: -kv[1])[:20]),
                "error_vs_float32": (relay_amp.agreement(reference, count.outputs).relative_l2
                                     if reference is not None else None),
                "build_s": built - start, "count_s": time.perf_counter() - built}
            if kernels:
                row["variants"][variant]["kernels"] = dict(
                    sorted(count.kernels.items(), key=lambda kv: -kv[1])[:kernels])
    return row


def markdown(rows: dict, names) -> str:
    """The table of docs/ARM.md: instructions per inference (millions) and their ratio to
    float32 as TVM and as relay_amp build it, the dot-product instruction mix (millions), the
    error against float32."""
    lines = ["| model | variant | instructions (M) | ÷ float32, TVM | ÷ float32, relay_amp | "
             + " | ".join(MIX_COLUMNS) + " | error vs float32 |",
             "|---|---|---:|---:|---:|" + "---:|" * len(MIX_COLUMNS) + "---:|"]
    for name in names:
        row = rows.get(name)
        if not row:
            continue
        if row.get("error"):
            lines.append(f"| {name} | fails: {row['error'][:100]} |")
        bases = [row["variants"].get(v, {}).get("total") for v in ("float32-tvm", "float32")]
        for variant, cell in row["variants"].items():
            if cell["status"] != "ok":
                lines.append(f"| {name} | {variant} | fails: {cell['message'][:80]} |")
                continue
            ratios = " | ".join(f"{cell['total'] / base:.2f}" if base else "" for base in bases)
            mix = " | ".join(f"{cell['mix'][c] / 1e6:.1f}" if cell["mix"][c] else "0"
                             for c in MIX_COLUMNS)
            error = cell["error_vs_float32"]
            error = "" if error is None else f"{error:.2g}"
            lines.append(f"| {name} | {variant} | {cell['total'] / 1e6:,.0f} | {ratios} | "
                         f"{mix} | {error} |")
    return "\n".join(lines)


def _failed(name: str, message: str) -> dict:
    return {"model": name, "error": message, "variants": {}}


def main(argv=None) -> int:
    from relay_amp.eval.isolation import measure_each

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="results/arm_insn_count.json")
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated")
    parser.add_argument("--variants", default=",".join(v for v in VARIANTS if "blocks" not in v),
                        help="comma-separated (default: all but the blocks); float32-tvm first: "
                             "the others' error is against it")
    parser.add_argument("--timeout", type=float, default=7200.0, help="seconds per model")
    parser.add_argument("--warmup", type=int, default=0,
                        help="runs before the counted one: 0 counts the first run's one-time "
                             "work in; 1 is the steady state bench_arm_peers.py counts")
    parser.add_argument("--markdown", default=None, help="also write the table here")
    parser.add_argument("--kernels", type=int, default=0,
                        help="also record the N functions that execute most, per variant")
    args = parser.parse_args(argv)
    names = args.models.split(",")
    variants = tuple(args.variants.split(","))
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        parser.error(f"unknown variants {sorted(unknown)}; choose from {', '.join(VARIANTS)}")
    rows = measure_each(names, measure, args.out, args.timeout, _failed,
                        (variants, args.warmup, args.kernels))
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as handle:
            handle.write(markdown(rows, names) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
