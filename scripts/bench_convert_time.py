"""Conversion time of relay_amp against TVM's built-in pass on a long transformer-like graph.

    python scripts/bench_convert_time.py                    # 850 layers, 5,100 bindings
    python scripts/bench_convert_time.py --layers 200 --profile 15

Each layer is matmul (a (256, 256) weight parameter), gelu, add, mean, subtract and softmax on a
(16, 256) float32 tensor, with no dataflow block, so the built-in pass runs as its users run it
on such a module: ``ConvertToDataflow`` then ``ToMixedPrecision``. Both convert to float16; the
times are medians of rounds that alternate the two in one process (``interleaved_medians``).
``--profile N`` prints relay_amp's N most expensive functions (cProfile, one conversion).
"""

import argparse
import cProfile
import pstats
import sys

import tvm
from tvm import relax

import relay_amp
from relay_amp.eval.bench import interleaved_medians


def layered_graph(layers: int, rows: int = 16, width: int = 256) -> tvm.IRModule:
    """``layers`` layers of matmul, gelu, add, mean, subtract, softmax; weights as parameters."""
    builder = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((rows, width), "float32"))
    weights = [relax.Var(f"w{i}", relax.TensorType((width, width), "float32"))
               for i in range(layers)]
    op = relax.op
    with builder.function("main", [x, *weights]):
        y = x
        for w in weights:
            h = builder.emit(op.matmul(y, w))
            g = builder.emit(op.nn.gelu(h))
            a = builder.emit(op.add(g, y))
            m = builder.emit(op.mean(a, axis=[-1], keepdims=True))
            s = builder.emit(op.subtract(a, m))
            y = builder.emit(op.nn.softmax(s))
        builder.emit_func_output(y)
    return builder.get()


def builtin(mod):
    return tvm.transform.Sequential([
        relax.transform.ConvertToDataflow(),
        relax.transform.ToMixedPrecision(out_dtype="float32")])(mod)


def ours(mod):
    return relay_amp.convert(mod, "float16")[0]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=850, help="layers (6 bindings each)")
    parser.add_argument("--repeats", type=int, default=3, help="alternating rounds")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="print relay_amp's N most expensive functions")
    args = parser.parse_args(argv)
    if args.layers < 1 or args.repeats < 1:
        parser.error("--layers and --repeats must be positive")
    mod = layered_graph(args.layers)
    medians = interleaved_medians({"relay_amp": ours, "built-in": builtin}, (mod,),
                                  args.repeats)
    ratio = medians["relay_amp"] / medians["built-in"]
    print(f"{6 * args.layers} bindings: relay_amp {medians['relay_amp']:.3f} s, TVM's built-in "
          f"pass {medians['built-in']:.3f} s, ratio {ratio:.2f} (medians of {args.repeats} "
          "alternating rounds)")
    if args.profile:
        profiler = cProfile.Profile()
        profiler.runcall(ours, mod)
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(args.profile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
