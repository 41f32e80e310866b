"""GPU benchmark: GluonCV ResNet-50 and a BERT-base-sized encoder in float32, relay_amp
float16/bfloat16 and TVM's built-in float16, checked against float32 and timed side by side.

Weights are function parameters, generated from a seed where the benchmark runs, so no weight
file has to travel to the GPU host; each variant takes them in its own dtype (relay_amp's
``low_precision_inputs``, TVM's ``fp16_input_names``), so no variant pays a run-time weight cast.

``build`` (any host with nvcc) converts and compiles every variant for a CUDA arch and proves the
generated CUDA compiles with nvcc; ``run`` (a host with an NVIDIA GPU and a CUDA-enabled TVM)
compiles, runs and times them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import tvm
from tvm import relax

from ..builds.pipeline import build as compile_module
from .bundle_runner import make_weights

VARIANTS = ("fp32", "relay_amp:float16", "relay_amp:bfloat16", "tvm:float16")


@dataclass
class BenchModel:
    name: str
    mod: tvm.IRModule
    data: dict  # name -> input array (the non-weight parameters)
    weights: list  # weight parameter names
    #: the PyTorch counterpart the GPU bundle's runner times beside it
    #: (``bundle_runner.torch_model``), or None
    torch: dict | None = None
    #: a model whose weights are constants of ``mod`` (a registry export): the tensors its
    #: constants are lifted to parameters by (``bundle_zoo.WeightTable``), and where the GPU
    #: bundle's runner gets them (the manifest's ``weight_source``); None: ``weights`` are
    #: parameters already, made with ``make_weights``
    weight_table: object = None
    weight_source: dict | None = None
    notes: list = field(default_factory=list)


# ------------------------------------------------------------------------------ models
def bert_encoder(layers=12, hidden=768, heads=12, ffn=3072, seq=128, batch=1) -> BenchModel:
    """A BERT-base-sized Transformer encoder (post-norm, GELU) with weights as parameters."""
    builder = relax.BlockBuilder()
    head_dim = hidden // heads
    x = relax.Var("x", relax.TensorType((batch, seq, hidden), "float32"))
    weights = []

    def weight(name, shape):
        var = relax.Var(name, relax.TensorType(shape, "float32"))
        weights.append(var)
        return var

    specs = []
    for i in range(layers):
        specs.append({k: weight(f"l{i}.{k}", s) for k, s in (
            ("wq", (hidden, hidden)), ("bq", (hidden,)), ("wk", (hidden, hidden)),
            ("bk", (hidden,)), ("wv", (hidden, hidden)), ("bv", (hidden,)),
            ("wo", (hidden, hidden)), ("bo", (hidden,)),
            ("g1", (hidden,)), ("b1", (hidden,)), ("w1", (hidden, ffn)), ("c1", (ffn,)),
            ("w2", (ffn, hidden)), ("c2", (hidden,)), ("g2", (hidden,)), ("b2", (hidden,)))})
    op = relax.op
    with builder.function("main", [x] + weights):
        with builder.dataflow():
            h = x
            for p in specs:
                def project(value, w, b):
                    return builder.emit(op.add(op.matmul(value, w), b))

                def split_heads(value):
                    return builder.emit(op.reshape(value, (batch, seq, heads, head_dim)))

                q = split_heads(project(h, p["wq"], p["bq"]))
                k = split_heads(project(h, p["wk"], p["bk"]))
                v = split_heads(project(h, p["wv"], p["bv"]))
                context = builder.emit(op.nn.attention(q, k, v, scale=head_dim ** -0.5))
                context = builder.emit(op.reshape(context, (batch, seq, hidden)))
                attended = builder.emit(op.add(h, project(context, p["wo"], p["bo"])))
                h = builder.emit(op.nn.layer_norm(attended, p["g1"], p["b1"], axes=[-1]))
                inner = builder.emit(op.nn.gelu(project(h, p["w1"], p["c1"])))
                out = builder.emit(op.add(h, project(inner, p["w2"], p["c2"])))
                h = builder.emit(op.nn.layer_norm(out, p["g2"], p["b2"], axes=[-1]))
            result = builder.emit_output(h)
        builder.emit_func_output(result)
    data = {"x": np.random.default_rng(0).normal(size=(batch, seq, hidden)).astype("float32")}
    torch = {"kind": "bert_encoder", "hidden": hidden, "layers": layers, "heads": heads,
             "ffn": ffn, "inputs": ["x"]}
    return BenchModel("bert_base_encoder" if layers == 12 else f"bert_{layers}x{hidden}",
                      builder.get(), data, [w.name for w in weights], torch)


def drop_initializer_inputs(model):
    """Remove from an ONNX model's graph inputs those that are initializers too; returns it.

    MXNet's exporter lists every weight both as an initializer and as a graph input. TVM's
    ``from_onnx(keep_params_in_input=True)`` makes a parameter of each, so without this every
    weight would be a parameter twice and the module ill-formed.
    """
    initializers = {tensor.name for tensor in model.graph.initializer}
    inputs = [value for value in model.graph.input if value.name not in initializers]
    del model.graph.input[:]
    model.graph.input.extend(inputs)
    return model


#: GluonCV classifiers and the torchvision model of the same architecture (GluonCV's v1 ResNets
#: stride in the first 1x1 convolution of a block, torchvision's in the 3x3: the same FLOPs).
TORCHVISION = {"resnet18_v1": "resnet18", "resnet34_v1": "resnet34", "resnet50_v1": "resnet50",
               "resnet101_v1": "resnet101", "mobilenetv2_1.0": "mobilenet_v2",
               "vgg16": "vgg16", "densenet121": "densenet121", "squeezenet1.1": "squeezenet1_1"}


def gluon_model(name="resnet50_v1", workdir=None, batch: int = 1) -> BenchModel:
    """A GluonCV model (the sweep's loader) through ONNX, its weights lifted to parameters."""
    import onnx
    from tvm.relax.frontend.onnx import from_onnx

    from .models import load

    loaded = load(name, workdir, batch_size=batch)
    mod = from_onnx(drop_initializer_inputs(onnx.load(loaded.extra["onnx_path"])),
                    keep_params_in_input=True)
    data_name = mod["main"].params[0].name
    weights = [p.name for p in mod["main"].params[1:]]
    torch = ({"kind": "torchvision", "name": TORCHVISION[name], "inputs": [data_name]}
             if name in TORCHVISION else None)
    return BenchModel(name if batch == 1 else f"{name}_b{batch}", mod,
                      {data_name: loaded.batches[0][0]}, weights, torch)


def weight_shapes(model: BenchModel) -> dict:
    """The model's weights, name to shape, in parameter order (the input of ``make_weights``)."""
    params = {p.name: p for p in model.mod["main"].params}
    return {name: tuple(int(d) for d in params[name].ty.shape.values) for name in model.weights}


# ------------------------------------------------------------------------------ compiling
def check_tensorize() -> None:
    """Raise RuntimeError unless ``Schedule.tensorize`` works in this TVM (run in a child
    process, since the broken case is a segfault; with this relay_amp's loader of TVM's
    intrinsics, :func:`relay_amp.builds.tensor_cores.cuda_intrinsics`)."""
    import os
    import subprocess
    import sys

    import relay_amp

    code = ("import tvm\nfrom tvm import te\n"
            "from relay_amp.builds.tensor_cores import cuda_intrinsics\ncuda_intrinsics()\n"
            "from tvm.s_tir.dlight.gpu.matmul import MatmulTensorization\n"
            "a = te.placeholder((128, 128), 'float16')\nb = te.placeholder((128, 128), 'float16')\n"
            "k = te.reduce_axis((0, 128))\n"
            "c = te.compute((128, 128), lambda i, j: te.sum(a[i, k].astype('float32') "
            "* b[k, j].astype('float32'), axis=k))\n"
            "f = te.create_prim_func([a, b, c])\n"
            "t = tvm.target.Target({'kind': 'cuda', 'arch': 'sm_80'})\n"
            "assert MatmulTensorization().apply(f, t, False) is not None\n")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.dirname(os.path.dirname(relay_amp.__file__)), env.get("PYTHONPATH", "")]
    ).rstrip(os.pathsep)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=False, env=env)
    if result.returncode:
        from importlib.metadata import version

        raise RuntimeError(
            f"Schedule.tensorize fails in apache-tvm {version('apache-tvm')} with "
            f"apache-tvm-ffi {version('apache-tvm-ffi')} (exit {result.returncode}); "
            "apache-tvm-ffi 0.1.14.post1 works: pip install apache-tvm-ffi==0.1.14.post1")


# ------------------------------------------------------------------------------ variants
def variant_module(model: BenchModel, variant: str, target) -> tvm.IRModule:
    """The module of one variant; weights come in as parameters of the variant's dtype."""
    import relay_amp

    if variant == "fp32":
        return model.mod
    tool, dtype = variant.split(":")
    if tool == "relay_amp":
        return relay_amp.convert(model.mod, dtype, target=target,
                                 low_precision_inputs=model.weights)[0]
    return relax.transform.ToMixedPrecision(out_dtype="float32",
                                            fp16_input_names=model.weights)(model.mod)


def _weight_dtypes(mod) -> dict:
    return {p.name: str(p.ty.dtype) for p in mod["main"].params}


def build(model: BenchModel, arch: str = "sm_90", out_dir: str | None = None,
          check_with_nvcc: bool = True) -> dict:
    """Convert and compile every variant for CUDA ``arch``; return per-variant build facts.

    With ``check_with_nvcc``, the CUDA source TVM generates is compiled to a cubin with nvcc, the
    proof that it builds on a GPU host. Runs on any machine with nvcc (no GPU needed).
    """
    import os
    import subprocess
    import tempfile
    from concurrent.futures import ThreadPoolExecutor

    target = tvm.target.Target({"kind": "cuda", "arch": arch})
    facts, pending = {}, {}
    folder = out_dir or tempfile.mkdtemp(prefix="relay_amp_gpu_")

    def nvcc(path):
        result = subprocess.run(
            ["nvcc", "-cubin", f"-arch={arch}", "-o", path[:-3] + ".cubin", path],
            capture_output=True, text=True, check=False)
        return "ok" if result.returncode == 0 else result.stderr[-500:]

    # nvcc of one variant runs while the next one compiles
    with ThreadPoolExecutor(max_workers=2) as pool:
        for variant in VARIANTS:
            start = time.perf_counter()
            mod = variant_module(model, variant, target)
            executable = compile_module(mod, target)
            fact = {"compile_s": time.perf_counter() - start,
                    "input_dtypes": sorted(set(_weight_dtypes(mod).values()))}
            source = "\n".join(m.inspect_source("cuda") for m in executable.mod.imports[0].imports
                               if m.kind == "cuda")
            fact["kernels"] = source.count("__global__")
            if check_with_nvcc:
                path = os.path.join(folder, f"{model.name}-{variant.replace(':', '-')}.cu")
                with open(path, "w", encoding="utf-8") as handle:
                    handle.write(source)
                pending[variant] = pool.submit(nvcc, path)
            facts[variant] = fact
        for variant, future in pending.items():
            facts[variant]["nvcc"] = future.result()
    return facts


def run(model: BenchModel, arch: str | None = None, repeats: int = 50, seed: int = 0) -> dict:
    """Compile, run and time every variant on the first CUDA GPU (needs a CUDA-enabled TVM)."""
    from ..execution import agreement

    device = tvm.cuda(0)
    if not device.exist:
        raise RuntimeError("no CUDA GPU is visible to TVM on this machine")
    arch = arch or f"sm_{device.compute_version.replace('.', '')}"
    target = tvm.target.Target({"kind": "cuda", "arch": arch})
    weights = make_weights(weight_shapes(model), seed)
    results, reference = {}, None
    for variant in VARIANTS:
        mod = variant_module(model, variant, target)
        vm = relax.VirtualMachine(compile_module(mod, target), device)
        dtypes = _weight_dtypes(mod)
        args = []
        for param in mod["main"].params:
            value = model.data.get(param.name, weights.get(param.name))
            args.append(tvm.runtime.tensor(_cast(value, dtypes[param.name]), device))
        output = vm["main"](*args)
        outputs = [output.numpy().astype("float32")]
        timer = vm.time_evaluator("main", device, number=repeats, repeat=3)
        latency = float(np.median(timer(*args).results) * 1e3)
        if variant == "fp32":
            reference = outputs
        err = agreement(reference, outputs)
        results[variant] = {"latency_ms": latency, "relative_l2": err.relative_l2,
                            "nonfinite": err.nonfinite}
    base = results["fp32"]["latency_ms"]
    for row in results.values():
        row["speedup_vs_fp32"] = base / row["latency_ms"]
    return results


def _cast(value: np.ndarray, dtype: str) -> np.ndarray:
    from ..dtypes import numpy_dtype

    return np.ascontiguousarray(value.astype(numpy_dtype(dtype)))


def format_table(name: str, results: dict) -> str:
    lines = [f"{name}", f"{'variant':22s} {'latency ms':>11s} {'speedup':>8s} {'rel L2':>10s}"]
    for variant, row in results.items():
        if "latency_ms" in row:
            lines.append(f"{variant:22s} {row['latency_ms']:11.3f} {row['speedup_vs_fp32']:8.2f} "
                         f"{row['relative_l2']:10.2e}")
        else:
            lines.append(f"{variant:22s} compile {row['compile_s']:.1f} s, {row['kernels']} "
                         f"kernels, nvcc {row.get('nvcc', 'not run')}")
    return "\n".join(lines)
