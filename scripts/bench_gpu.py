"""GPU benchmark: ResNet-50 and a BERT-base-sized encoder, fp32 vs relay_amp fp16/bf16 vs TVM
fp16.

On a host with an NVIDIA GPU and a CUDA-enabled TVM:   python scripts/bench_gpu.py
On any host with nvcc (no GPU): build and nvcc-check every variant for an arch:
    python scripts/bench_gpu.py --build-only --arch sm_90
See docs/GPU.md for running it on a GPU host without a package index.
"""

import argparse
import sys

from relay_amp.eval import gpu_bench


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="resnet50_v1,bert_base",
                        help="resnet50_v1 and/or bert_base (default: %(default)s)")
    parser.add_argument("--arch", default=None, help="CUDA arch, e.g. sm_90 (default: the GPU's)")
    parser.add_argument("--build-only", action="store_true",
                        help="convert, compile and nvcc-check only; no GPU needed")
    parser.add_argument("--repeats", type=int, default=50, help="timed runs per measurement")
    args = parser.parse_args(argv)
    for name in args.models.split(","):
        model = gpu_bench.bert_encoder() if name == "bert_base" else gpu_bench.gluon_model(name)
        if args.build_only:
            results = gpu_bench.build(model, args.arch or "sm_90")
        else:
            results = gpu_bench.run(model, args.arch, args.repeats)
        print(gpu_bench.format_table(model.name, results), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
