"""Build the GPU bundle: every variant of each model, compiled here, run on a GPU host.

    python scripts/gpu_bundle.py --out bundle/        # CUDA sm_90: the four hand-made models and
                                                      # the registry's exports (zoo:NAME)
    python BUNDLE/bundle_runner.py --out results/     # on the GPU host: the whole table
    python scripts/gpu_bundle.py --target llvm --models zoo:bert_base --out cpu_bundle/  # this CPU

It prints the bundle's size (also in manifest.json: ``bytes``, and per model). See docs/GPU.md,
relay_amp/eval/gpu_bundle.py and relay_amp/eval/bundle_zoo.py.
"""

import argparse
import logging
import sys

from relay_amp.eval import gpu_bundle


def _batches(text: str) -> list:
    try:
        return [int(b) for b in text.split(",") if b]
    except ValueError:
        raise ValueError(f"--batches takes comma-separated integers; got {text!r}") from None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="bundle folder (new or empty)")
    parser.add_argument("--models", default=",".join(gpu_bundle.DEFAULT_MODELS),
                        help="comma-separated (default: %(default)s; also vit_b16, GluonCV "
                             "model names, and zoo:NAME for other registry models)")
    parser.add_argument("--target", choices=("cuda", "llvm"), default="cuda",
                        help="cuda for --arch, or llvm for this CPU (default: %(default)s)")
    parser.add_argument("--arch", default="sm_90", help="CUDA arch (default: %(default)s)")
    parser.add_argument("--python", default="3.12",
                        help="the GPU host's Python, for tvm_ffi (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="weight seed (default: 0)")
    parser.add_argument("--variants", default=",".join(gpu_bundle.gpu_bench.VARIANTS),
                        help="comma-separated (default: %(default)s; fp32 is always built)")
    parser.add_argument("--batches", default="1",
                        help="comma-separated batch sizes, each a model of its own "
                             "(default: %(default)s; the PyTorch comparison uses 1,8)")
    parser.add_argument("--cuda-graph", action="store_true",
                        help="also build each variant with the VM's CUDA graph mode")
    parser.add_argument("--no-tvm-pipeline", action="store_true",
                        help="do not also build fp32 and relay_amp float16 with TVM's own "
                             "CUDA pipeline")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    logging.getLogger("topi").setLevel(logging.ERROR)  # TVM's legalization of mixed dtypes
    models = [name for name in args.models.split(",") if name]
    try:
        manifest = gpu_bundle.build_bundle(args.out, models, args.target, args.arch, args.python,
                                           args.seed, args.cuda_graph,
                                           progress=not args.quiet,
                                           tvm_pipeline=not args.no_tvm_pipeline,
                                           variants=[v for v in args.variants.split(",") if v],
                                           batches=_batches(args.batches))
    except (FileExistsError, ValueError, RuntimeError) as err:
        print(f"gpu_bundle: {err}", file=sys.stderr)
        return 2
    libraries = sum(len(m["variants"]) for m in manifest["models"].values())
    for name, model in manifest["models"].items():
        skipped = "".join(f"; {v} not built ({why})" for v, why in model.get("skipped", {}).items())
        print(f"  {name}: {len(model['variants'])} libraries, {model['bytes'] / 2**20:.2f} MiB"
              f"{skipped}")
    for name, why in manifest["not_built"].items():
        print(f"  {name}: not built ({why})")
    print(f"  runtime (tvm, tvm_ffi): {manifest['runtime']['bytes'] / 2**20:.2f} MiB")
    print(f"wrote {args.out}: {libraries} libraries, {manifest['bytes'] / 2**20:.1f} MiB of the "
          f"{gpu_bundle.MAX_BUNDLE_BYTES // 2**20} MiB a GPU call carries, built in "
          f"{manifest['build_s'] / 60:.1f} min; "
          f"run: python {args.out.rstrip('/')}/bundle_runner.py --out RESULTS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
