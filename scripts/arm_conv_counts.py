"""Executed aarch64 instructions of each distinct convolution (and matmul with a constant
weight) of a registry model, built alone by ``relay_amp.cpu_pipeline`` and counted on the
emulated aarch64 CPU: where a model's instructions go, shape by shape.

    bash scripts/arm/setup_emulator.sh        # as root, once
    python scripts/arm_conv_counts.py resnet50_v1 --out results/resnet50_convs.json

Each convolution is rebuilt in NHWC with HWIO weights (what ``relay_amp.builds.nhwc`` makes of
an NCHW model; an NHWC model's own weight layout is kept), followed by a relu, from random
inputs and weights, float32 for ``+neon`` or ``--dtype bfloat16`` converted for ``+neon,+bf16``;
counted in the steady state (``ArmEmulator.count(warmup=1)``). Rows: the shape, how often the
model has it, its multiply-accumulates, the instructions of one run, their kinds (the 12 most
frequent), and instructions per multiply-accumulate. Counts are not times.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import tempfile

import numpy as np
from tqdm import tqdm

OPS = ("relax.nn.conv2d", "relax.matmul")


def shapes(mod) -> list:
    """``(op, input shape, weight shape, strides, padding, groups, data layout, kernel
    layout)`` -> how many calls of ``mod`` have it (static shapes only)."""
    from tvm import relax

    found = collections.Counter()

    def visit(expr):
        if not (isinstance(expr, relax.Call) and getattr(expr.op, "name", "") in OPS):
            return
        try:
            dims = [tuple(int(d) for d in arg.ty.shape) for arg in expr.args[:2]]
        except (TypeError, AttributeError):  # a symbolic extent
            return
        attrs = expr.attrs
        conv = expr.op.name == "relax.nn.conv2d"
        found[(expr.op.name, *dims,
               tuple(int(s) for s in attrs.strides) if conv else None,
               tuple(int(p) for p in attrs.padding) if conv else None,
               int(attrs.groups) if conv else None,
               str(attrs.data_layout) if conv else None,
               str(attrs.kernel_layout) if conv else None)] += 1

    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return sorted(found.items(), key=lambda item: str(item[0]))


def single(key, rng):
    """A module of the one op ``key`` describes (and a relu), its input and its MACs."""
    from tvm import relax

    op, xs, ws, strides, padding, groups, layout, kernel_layout = key
    x_shape, w_shape, attrs = xs, ws, {}
    if op == "relax.nn.conv2d":
        if layout == "NCHW":
            (n, c, h, w), (o, i, kh, kw) = xs, ws
            x_shape, w_shape, kernel_layout = (n, h, w, c), (kh, kw, i, o), "HWIO"
        dims = dict(zip(kernel_layout, w_shape))
        n, h, w, _ = x_shape
        out_h = (h + padding[0] + padding[2] - dims["H"]) // strides[0] + 1
        out_w = (w + padding[1] + padding[3] - dims["W"]) // strides[1] + 1
        macs = n * out_h * out_w * dims["O"] * dims["I"] * dims["H"] * dims["W"]
        attrs = dict(strides=strides, padding=padding, groups=groups, data_layout="NHWC",
                     kernel_layout=kernel_layout)
    else:
        macs = int(np.prod(xs)) * ws[-1]
    x = relax.Var("x", relax.TensorType(x_shape, "float32"))
    weight = relax.const(rng.standard_normal(w_shape).astype("float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            y = builder.emit(relax.op.nn.conv2d(x, weight, **attrs) if attrs
                             else relax.op.matmul(x, weight))
            out = builder.emit_output(relax.op.nn.relu(y))
        builder.emit_func_output(out)
    return builder.get(), rng.standard_normal(x_shape).astype("float32"), macs


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--out", required=True)
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    args = parser.parse_args(argv)

    import tvm

    import relay_amp
    from relay_amp.builds.remote import export_for
    from relay_amp.eval import models
    from relay_amp.eval.arm_emulator import TARGET_BF16, TARGET_FP32, ArmEmulator

    target = TARGET_BF16 if args.dtype == "bfloat16" else TARGET_FP32
    rng = np.random.default_rng(0)
    rows, workdir = [], tempfile.mkdtemp(prefix="arm_conv_counts_")
    found = shapes(models.load(args.model, batch_size=1).mod)
    with ArmEmulator(count_instructions=True) as emulator:
        for number, (key, calls) in enumerate(tqdm(found, unit="shape", desc=args.model)):
            mod, x, macs = single(key, rng)
            if args.dtype != "float32":
                mod, _ = relay_amp.convert(mod, args.dtype, target=target)
            executable = tvm.compile(mod, target=tvm.target.Target(target),
                                     relax_pipeline=relay_amp.cpu_pipeline(target))
            library = export_for(executable, os.path.join(workdir, f"{number}.so"), target)
            count = emulator.count(library, [x], warmup=1)
            rows.append({"op": key[0], "input": key[1], "weight": key[2], "strides": key[3],
                         "groups": key[5], "layout": key[6], "calls": calls, "macs": macs,
                         "instructions": count.total,
                         "per_mac": round(count.total / macs, 4),
                         "kinds": dict(sorted(count.kinds.items(), key=lambda kv: -kv[1])[:12])})
    total = sum(row["calls"] * row["instructions"] for row in rows)
    macs = sum(row["calls"] * row["macs"] for row in rows)
    with open(args.out, "w", encoding="utf-8") as handle:
        json.dump({"model": args.model, "dtype": args.dtype, "target": target, "rows": rows,
                   "instructions": total, "macs": macs}, handle, indent=1)
    print(f"{args.model} {args.dtype}: {total / 1e6:.1f} M instructions over "
          f"{len(rows)} shapes, {total / macs:.3f} an MAC")


if __name__ == "__main__":
    main()
