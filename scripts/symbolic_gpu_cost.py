"""The GPU cost (:func:`relay_amp.gpu_cost`: kernels and bytes at kernel boundaries, counted
without a GPU) of one symbolic-shape module at two sizes, beside the fixed-shape modules of those
sizes: a model file imported as ``relay-amp convert`` imports it, converted for CUDA sm_90.

    python scripts/symbolic_gpu_cost.py MODEL.onnx|.pt2 --input images:batch,3,320,320 \\
        --sizes batch=1,4 [--dtype float16]

The fixed-shape module of a size is the same file imported with every input's symbolic
dimensions given that size.
"""

from __future__ import annotations

import argparse
import sys

TARGET = {"kind": "cuda", "arch": "sm_90"}


def _fixed(model_input, at: dict):
    """``--input`` for ``model_input`` with the sizes ``at`` in place of its names."""
    from relay_amp.cli.arguments import InputSpec, SymbolicDim

    return InputSpec(model_input.source, tuple(at[d.name] if isinstance(d, SymbolicDim) else d
                                               for d in model_input.shape))


def rows(path: str, texts: list, sizes: dict, dtype: str) -> list[dict]:
    """One row per size index: the symbolic module's cost at those sizes and the fixed one's."""
    import relay_amp
    from relay_amp.cli.arguments import detect_format, parse_input
    from relay_amp.cli.frontends import import_model
    from relay_amp.cli.symbolic import symbols_of, with_bounds

    fmt = detect_format(path)
    specs = {spec.name: spec for spec in map(parse_input, texts)}

    def converted(given):
        imported = import_model(path, fmt, given)
        symbols = symbols_of({i.source: i.shape for i in imported.inputs})
        module, _ = relay_amp.convert(with_bounds(imported.mod, symbols), dtype, target=TARGET)
        return module, symbols, imported.inputs

    symbolic, symbols, inputs = converted(specs)
    if set(sizes) != set(symbols):
        raise SystemExit(f"--sizes names {sorted(sizes)}; the symbolic dimensions are "
                         f"{sorted(symbols)}")
    result = []
    for index in range(min(len(values) for values in sizes.values())):
        at = {name: values[index] for name, values in sizes.items()}
        fixed = converted({i.source: _fixed(i, at) for i in inputs})[0]
        ours = relay_amp.gpu_cost(symbolic, TARGET, symbolic=at)
        theirs = relay_amp.gpu_cost(fixed, TARGET)
        result.append({"sizes": at, "symbolic": ours.as_dict(), "fixed": theirs.as_dict()})
        print(result[-1], file=sys.stderr, flush=True)
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("--input", action="append", default=[], help="as relay-amp convert's")
    parser.add_argument("--sizes", required=True, help="NAME=A,B[;NAME=C,D]")
    parser.add_argument("--dtype", default="float16")
    args = parser.parse_args(argv)
    sizes = {name: [int(v) for v in values.split(",")]
             for name, values in (part.split("=", 1) for part in args.sizes.split(";"))}
    print("| sizes | kernels: symbolic / fixed | MB at kernel boundaries: symbolic / fixed |")
    print("|---|---:|---:|")
    for row in rows(args.model, args.input, sizes, args.dtype):
        label = ", ".join(f"{k}={v}" for k, v in row["sizes"].items())
        mine, theirs = row["symbolic"], row["fixed"]
        print(f"| {label} | {mine['kernels']} / {theirs['kernels']} | "
              f"{mine['bytes'] / 1e6:.2f} / {theirs['bytes'] / 1e6:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
