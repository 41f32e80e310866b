"""Run a relay_amp GPU bundle with TVM's runtime only: load, check against float32, time.

This file is copied into every bundle that ``scripts/gpu_bundle.py`` writes, and runs there as a
standalone script on a host that has numpy and nothing of relay_amp or TVM installed::

    python BUNDLE/bundle_runner.py [--out DIR] [--repeats 100] [--compiler nvrtc|nvcc]

It imports only numpy, the standard library and the TVM (runtime only, without the compiler
library) that the bundle carries. Libraries built for CUDA hold CUDA source, which TVM's CUDA
loader compiles when it loads them, through the global function ``tvm_callback_cuda_compile``:
NVRTC (cuda-bindings) by default, nvcc with ``--compiler nvcc`` (``relay_amp/cuda_loader.py``,
copied into the bundle beside this file). Weights are made here, the same
values for every variant, each variant taking them in its own dtype (:func:`model_weights`): from
the manifest's seed (:func:`make_weights`), read from a file the bundle carries, or rebuilt with
``transformers`` from the registry's config and seed and checked bit for bit against the build's
digests. Results go to ``results.json`` and ``results.md`` in ``--out``.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import gzip
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

try:  # beside this file in a bundle; from the package where relay_amp is installed
    from cuda_loader import enable_cuda
except ImportError:
    from relay_amp.cuda_loader import enable_cuda

MANIFEST = "manifest.json"


# ------------------------------------------------------------------------------ weights
def make_weights(shapes: dict, seed: int = 0) -> dict:
    """Deterministic float32 weights of plausible magnitude.

    Parameters
    ----------
    shapes : dict
        Weight name to shape, in the order that defines the random stream (the parameter order).
    seed : int
        Seed of the ``numpy.random.default_rng`` stream.

    Returns
    -------
    dict
        Weight name to float32 array: variances uniform in [0.5, 1.5], scales (``gamma``, norm
        gains named ``.g``, ``.g1``...) near 1, other vectors small, matrices and kernels normal
        with a 1/sqrt(fan-in) scale.
    """
    rng = np.random.default_rng(seed)
    weights = {}
    for name, shape in shapes.items():
        shape = tuple(int(d) for d in shape)
        lower = name.lower()
        if "var" in lower:
            value = rng.uniform(0.5, 1.5, shape)
        elif "gamma" in lower or re.search(r"\.g\d*$", lower):
            value = 1 + 0.1 * rng.normal(size=shape)
        elif len(shape) <= 1:
            value = 0.1 * rng.normal(size=shape)
        else:
            fan_in = int(np.prod(shape[1:])) if len(shape) > 2 else shape[0]
            value = rng.normal(size=shape) / np.sqrt(max(fan_in, 1))
        weights[name] = np.asarray(value, dtype="float32")
    return weights


def sha256(array: np.ndarray) -> str:
    """The SHA-256 of an array's bytes in C order (its dtype and shape are not part of it)."""
    return hashlib.sha256(np.ascontiguousarray(array).view(np.uint8)).hexdigest()


def transformers_weights(spec: dict) -> dict:
    """The float tensors (parameters and buffers, by their names in the wrapper of
    :func:`transformers_module`) of the ``transformers`` model ``spec`` describes, as numpy."""
    import torch

    module = transformers_module(spec)
    tensors = {**dict(module.named_buffers()), **module.state_dict(keep_vars=False)}
    return {name: tensor.detach().cpu().numpy() for name, tensor in tensors.items()
            if torch.is_floating_point(tensor)}


def model_weights(bundle: str, model: dict) -> tuple:
    """The weights of one manifest model, name to array, and where they came from.

    ``model["weight_source"]["kind"]``: ``file`` (an ``.npz`` in the bundle), ``transformers``
    (rebuilt from the config and seed, :func:`transformers_weights`; each weight's SHA-256 is
    compared with the build's, and where torch or ``transformers`` cannot rebuild the model the
    weights come from :func:`make_weights` instead), or ``seeded`` (the default:
    :func:`make_weights`).

    Returns
    -------
    tuple
        ``(values, info)``: ``info`` holds ``source`` (what was used) and, for ``transformers``,
        ``bit_identical`` and the names of the weights that differ.
    """
    source = model.get("weight_source") or {"kind": "seeded"}
    shapes = weight_shapes(model)
    if source["kind"] == "file":
        with np.load(os.path.join(bundle, source["path"])) as stored:
            return {key: stored[key] for key in stored.files}, {"source": "file " + source["path"]}
    if source["kind"] == "transformers":
        try:
            values = transformers_weights(source["torch"])
        except Exception as error:  # no torch, or a transformers that builds it otherwise
            return (make_weights(shapes, model["weight_seed"]),
                    {"source": f"seeded (cannot rebuild with transformers: {_one_line(error)})"})
        differ = sorted(name for name, digest in source["sha256"].items()
                        if name not in values or sha256(values[name]) != digest)
        missing = {name: shape for name, shape in shapes.items() if name not in values}
        values.update(make_weights(missing, model["weight_seed"]))
        return values, {"source": "transformers, rebuilt here", "bit_identical": not differ,
                        "differ": differ[:20], "differ_count": len(differ)}
    return make_weights(shapes, model["weight_seed"]), {"source": "seeded"}


# ------------------------------------------------------------------------------ dtypes
def bfloat16_bits(values: np.ndarray) -> np.ndarray:
    """float32 to bfloat16 bit patterns (uint16), rounding to nearest even; NaN stays NaN.

    Done with integer arithmetic so that no ml_dtypes is needed on the GPU host.
    """
    bits = np.array(values, dtype=np.float32, order="C").view(np.uint32)  # keeps 0-d 0-d
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> 16
    nan = np.isnan(np.asarray(values, dtype=np.float32))
    return np.asarray(np.where(nan, np.uint16(0x7FC0), rounded), dtype=np.uint16)


def bfloat16_to_float32(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (uint16) to float32, exactly."""
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)


def to_device(tvm, value: np.ndarray, dtype: str, device):
    """``value`` in TVM dtype ``dtype`` on ``device``."""
    if dtype == "bfloat16":
        tensor = tvm.runtime.empty(value.shape, "bfloat16", device)
        return tensor.copyfrom(bfloat16_bits(value))
    return tvm.runtime.tensor(np.array(value, dtype=dtype, order="C"), device)  # keeps 0-d 0-d


def to_numpy(tensor) -> np.ndarray:
    """A TVM tensor as numpy; bfloat16 comes back as float32."""
    if str(tensor.dtype) == "bfloat16":
        view = tensor._create_view(tensor.shape, "uint16")  # noqa: SLF001 - no public uint16 view of a TVM tensor
        return bfloat16_to_float32(view.numpy())
    return tensor.numpy()


def compare(reference: list, outputs: list) -> dict:
    """Relative L2 error of ``outputs`` against ``reference`` over the float outputs together,
    and the count of NaN/Inf values where the reference is finite.

    The error is taken where both are finite, so that a few non-finite values do not hide how
    close the rest is; the count says how many there are. Where the reference itself is not
    finite (``reference_nonfinite`` counts its values) or has no float value at all, nothing is
    compared there: with no value compared the error is NaN, never a zero that looks perfect.
    """
    if len(reference) != len(outputs):
        raise ValueError(f"{len(outputs)} outputs but {len(reference)} reference outputs")
    num = den = 0.0
    nonfinite = reference_nonfinite = compared = 0
    for ref, out in zip(reference, outputs):
        if ref.shape != out.shape:
            raise ValueError(f"output shape {out.shape} differs from reference {ref.shape}")
        if ref.dtype.kind != "f":
            continue
        ref64, out64 = ref.astype(np.float64), out.astype(np.float64)
        finite_ref = np.isfinite(ref64)
        reference_nonfinite += int(np.count_nonzero(~finite_ref))
        nonfinite += int(np.count_nonzero(finite_ref & ~np.isfinite(out64)))
        keep = finite_ref & np.isfinite(out64)
        compared += int(np.count_nonzero(keep))
        num += float(np.sum((ref64[keep] - out64[keep]) ** 2))
        den += float(np.sum(ref64[keep] ** 2))
    if not compared:
        error = float("nan")
    else:
        error = float(np.sqrt(num / den)) if den > 0 else float(np.sqrt(num))
    row = {"relative_l2": error, "nonfinite": nonfinite}
    if reference_nonfinite:
        row["reference_nonfinite"] = reference_nonfinite
    return row


# ------------------------------------------------------------------------------ TVM runtime
def import_bundled_tvm(bundle: str):
    """Import the TVM the bundle carries, in runtime-only mode, and return the module.

    Raises
    ------
    RuntimeError
        If the imported TVM is not the bundle's, or loaded its compiler library.
    """
    bundle = os.path.abspath(bundle)
    sys.path.insert(0, bundle)
    os.environ["TVM_USE_RUNTIME_LIB"] = "1"
    # tvm_ffi would otherwise import PyTorch, where installed, and may JIT-build an extension
    os.environ.setdefault("TVM_FFI_DISABLE_TORCH_C_DLPACK", "1")
    import tvm
    import tvm.runtime.vm

    if not os.path.abspath(tvm.__file__).startswith(bundle + os.sep):
        raise RuntimeError(f"imported {tvm.__file__}, not the TVM of the bundle {bundle}")
    if not tvm.base._RUNTIME_ONLY:  # noqa: SLF001 - TVM tells a runtime-only build only here
        raise RuntimeError("TVM did not start in runtime-only mode")
    return tvm


def loaded_tvm_libraries() -> list:
    """Paths of the TVM shared libraries mapped into this process (Linux; else empty)."""
    try:
        with open("/proc/self/maps", encoding="utf-8") as handle:
            paths = {line.split()[-1] for line in handle if "libtvm" in line}
    except OSError:
        return []
    return sorted(paths)


# ------------------------------------------------------------------------------ running
def weight_shapes(model: dict) -> dict:
    """The model's weights, name to shape, in parameter order."""
    return {name: shape for name, shape in model["weights"]}


_UNPACKED = tempfile.mkdtemp(prefix="bundle_libraries_")
atexit.register(shutil.rmtree, _UNPACKED, True)


def library_file(bundle: str, library: str) -> str:
    """The path of a library to load: a gzip-compressed one is unpacked to a temporary folder."""
    path = os.path.join(bundle, library)
    if not library.endswith(".gz"):
        return path
    unpacked = os.path.join(_UNPACKED, library[:-3].replace("/", "__"))
    with gzip.open(path, "rb") as source, open(unpacked, "wb") as target:
        shutil.copyfileobj(source, target)
    return unpacked


class KernelProfile:
    """Per-call device time of a VM function, by callee symbol, through the VM's instrument hook.

    On CUDA each call is bracketed by CUDA events on the default stream (cuda-bindings); on other
    devices by a device sync and the wall clock, which adds the launch overhead to each call.
    """

    def __init__(self, device):
        self.device = device
        self.pending = []
        try:
            from cuda.bindings import runtime

            self.cudart = runtime if device.dlpack_device_type() == 2 else None
        except ImportError:
            self.cudart = None

    def _mark(self):
        if self.cudart is None:
            self.device.sync()
            return time.perf_counter()
        _, event = self.cudart.cudaEventCreate()
        self.cudart.cudaEventRecord(event, 0)
        return event

    def __call__(self, _func, symbol, before_run, _ret, *_args):
        if before_run:
            self.pending.append([str(symbol), self._mark(), None])
        else:
            self.pending[-1][2] = self._mark()
        return 0

    def collect(self, runs: int) -> list:
        """``[symbol, milliseconds per run, calls per run]``, longest first."""
        self.device.sync()
        totals = {}
        for symbol, start, end in self.pending:
            if self.cudart is None:
                elapsed = (end - start) * 1e3
            else:
                self.cudart.cudaEventSynchronize(end)
                elapsed = float(self.cudart.cudaEventElapsedTime(start, end)[1])
                self.cudart.cudaEventDestroy(start)
                self.cudart.cudaEventDestroy(end)
            entry = totals.setdefault(symbol, [0.0, 0])
            entry[0] += elapsed
            entry[1] += 1
        self.pending = []
        rows = [[symbol, total / runs, count // runs] for symbol, (total, count) in totals.items()]
        return sorted(rows, key=lambda row: -row[1])


def profile_variant(tvm, vm, args, device, runs: int = 5) -> dict:
    """Time every call the VM makes in ``main`` (see :class:`KernelProfile`)."""
    profile = KernelProfile(device)
    vm.set_instrument(profile)
    try:
        for _ in range(runs):
            vm["main"](*args)
        rows = profile.collect(runs)
    finally:
        vm.set_instrument(None)
    return {"calls": sum(row[2] for row in rows), "call_ms": sum(row[1] for row in rows),
            "top": rows[:25]}


def run_variant(tvm, bundle: str, entry: dict, device, values: dict, repeats: int,
                warmup: int, profile: bool = False) -> tuple:
    """Load one variant's library, run it once and time it.

    A parameter that names a ``weight`` takes that entry of ``values`` (else its own name's).
    Where the entry has ``num_input``, the parameters past the inputs are weights that
    ``main_transform_params`` (``entry["transform"]``) turns into what ``main`` takes, once,
    before ``main`` runs: what a build with the weights as constants folds.

    Returns
    -------
    tuple
        ``(row, outputs)``: the row of measurements, and the outputs as numpy arrays.
    """
    start = time.perf_counter()
    library = tvm.runtime.load_module(library_file(bundle, entry["library"]))
    vm = tvm.runtime.vm.VirtualMachine(library, device)
    load_s = time.perf_counter() - start
    args = [to_device(tvm, values[p.get("weight", p["name"])], p["dtype"], device)
            for p in entry["params"]]
    transform_s = None
    if "num_input" in entry:
        inputs = entry["num_input"]
        start = time.perf_counter()
        transformed = list(vm[entry["transform"]](args[inputs:]))
        device.sync()
        transform_s = time.perf_counter() - start
        args = args[:inputs] + transformed
    result = vm["main"](*args)
    outputs = [to_numpy(t) for t in ([result] if hasattr(result, "dtype") else result)]
    for _ in range(warmup):
        vm["main"](*args)
    device.sync()
    timer = vm.time_evaluator("main", device, number=1, repeat=repeats)
    times_ms = np.array(timer(*args).results) * 1e3
    row = {"load_s": load_s, "latency_ms": float(np.median(times_ms)),
           "min_ms": float(times_ms.min()), "runs": int(times_ms.size)}
    if transform_s is not None:
        row["transform_params_s"] = transform_s
    if profile and entry.get("mode") != "cuda_graph":
        row["profile"] = profile_variant(tvm, vm, args, device)
    return row, outputs


# ------------------------------------------------------------------------------ PyTorch
#: PyTorch variants timed beside TVM's: ``(name, compiled, autocast dtype, torch.compile mode)``.
TORCH_VARIANTS = (
    ("torch eager float32", False, None, None),
    ("torch eager autocast float16", False, "float16", None),
    ("torch eager autocast bfloat16", False, "bfloat16", None),
    ("torch.compile autocast float16", True, "float16", "default"),
    ("torch.compile autocast float16 (cuda graphs)", True, "float16", "reduce-overhead"),
    ("torch.compile autocast bfloat16", True, "bfloat16", "default"),
)


def torch_model(spec: dict):
    """The PyTorch counterpart of a bundle model, with seeded weights: ``(module, convnet)``.

    ``spec["kind"]``: ``torchvision`` (``name``, e.g. ``resnet50``), ``bert_encoder`` (BERT's
    encoder layers over hidden states: ``hidden``, ``layers``, ``heads``, ``ffn``), ``llama``
    (a LLaMA causal LM over token ids: ``hidden``, ``layers``, ``heads``, ``kv_heads``,
    ``intermediate``, ``vocab``), the shapes of the TVM model beside it, or ``transformers``
    (the registry's own model and weights: :func:`transformers_module`).
    """
    import torch

    torch.manual_seed(0)
    kind = spec["kind"]
    if kind == "transformers":
        return transformers_module(spec), False
    if kind == "torchvision":
        import torchvision

        return getattr(torchvision.models, spec["name"])(weights=None), True
    if kind == "bert_encoder":
        from transformers import BertConfig, BertModel

        config = BertConfig(hidden_size=spec["hidden"], num_hidden_layers=spec["layers"],
                            num_attention_heads=spec["heads"], intermediate_size=spec["ffn"],
                            attn_implementation="sdpa")
        encoder = BertModel(config).encoder

        class Encoder(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.encoder = encoder

            def forward(self, hidden):
                return self.encoder(hidden).last_hidden_state

        return Encoder(), False
    if kind == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        config = LlamaConfig(hidden_size=spec["hidden"], num_hidden_layers=spec["layers"],
                             num_attention_heads=spec["heads"],
                             num_key_value_heads=spec["kv_heads"],
                             intermediate_size=spec["intermediate"], vocab_size=spec["vocab"],
                             attn_implementation="sdpa", use_cache=False)
        model = LlamaForCausalLM(config)

        class Logits(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.model = model

            def forward(self, ids):
                return self.model(input_ids=ids).logits

        return Logits(), False
    raise ValueError(f"unknown PyTorch model kind {kind!r}")


def transformers_module(spec: dict):
    """The registry's ``transformers`` model (``relay_amp.eval.transformers_zoo``) rebuilt
    from ``spec`` (its ``torch_spec``): the config class and arguments, the model class, seeded
    with ``torch.manual_seed(spec["seed"])`` before the config and the model are made, as the
    registry's ``build`` does, in the wrapper its export used: ``encoder`` (``input_ids``,
    ``attention_mask``, with explicit zero token types and positions; returns the last hidden
    state and the pooled vector) or ``causal_lm`` (returns the logits)."""
    import torch
    import transformers

    torch.manual_seed(spec["seed"])
    config = getattr(transformers, spec["config_class"])(**spec["config"])
    with torch.no_grad():
        model = getattr(transformers, spec["model_class"])(config).eval()
    wrapper = spec["wrapper"]

    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask):
            out = self.model(input_ids=input_ids, attention_mask=attention_mask,
                             token_type_ids=torch.zeros_like(input_ids),
                             position_ids=torch.arange(input_ids.shape[1],
                                                       device=input_ids.device).unsqueeze(0))
            pooled = getattr(out, "pooler_output", None)
            hidden = out.last_hidden_state
            return hidden, hidden[:, 0] if pooled is None else pooled

    class CausalLM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask):
            return self.model(input_ids=input_ids, attention_mask=attention_mask,
                              use_cache=False).logits

    wrappers = {"encoder": Encoder, "causal_lm": CausalLM}
    if wrapper not in wrappers:
        raise ValueError(f"unknown transformers wrapper {wrapper!r}")
    return wrappers[wrapper]().eval()


def time_torch(spec: dict, values: dict, device_kind: str, repeats: int, warmup: int,
               variants=TORCH_VARIANTS) -> dict:
    """Time the PyTorch counterpart of a model as its users run it for speed: inference mode,
    ``cudnn.benchmark``, channels-last convnets, autocast, ``torch.compile``.

    Returns
    -------
    dict
        Variant name to a row (``latency_ms``, ``min_ms``, ``runs``, ``nonfinite``), or to
        ``{"error": ...}`` (PyTorch or a model library missing, a compile that fails).
    """
    try:
        import torch

        module, convnet = torch_model(spec)
    except Exception as error:
        return {name: {"error": _one_line(error)} for name, *_ in variants}
    device = torch.device("cuda" if device_kind == "cuda" else "cpu")
    torch.backends.cudnn.benchmark = True
    module = module.eval().to(device)
    inputs = [torch.from_numpy(np.ascontiguousarray(values[name])).to(device)
              for name in spec["inputs"]]
    if convnet:
        module = module.to(memory_format=torch.channels_last)
        inputs = [x.contiguous(memory_format=torch.channels_last) for x in inputs]
    rows = {}
    for name, compiled, dtype, mode in variants:
        try:
            rows[name] = _time_torch_variant(torch, module, inputs, device, compiled, dtype,
                                             mode, repeats, warmup)
        except Exception as error:
            rows[name] = {"error": _one_line(error)}
        print(_row_line(spec.get("model", "torch"), name, rows[name]), flush=True)
    return rows


def _time_torch_variant(torch, module, inputs, device, compiled, dtype, mode, repeats, warmup):
    compiled_run = torch.compile(module, mode=mode) if compiled else module
    graphs = compiled and mode == "reduce-overhead"

    def run(*args):
        # torch.compile's CUDA graphs reuse their output buffers: each call is a new step,
        # and what is kept past the next call is a copy
        if graphs:
            torch.compiler.cudagraph_mark_step_begin()
        return compiled_run(*args)

    autocast = (torch.autocast(device.type, dtype=getattr(torch, dtype)) if dtype
                else contextlib.nullcontext())
    cuda = device.type == "cuda"
    times = []
    with torch.inference_mode(), autocast:
        output = run(*inputs)
        if graphs:
            output = tuple(o.clone() for o in (
                output if isinstance(output, (tuple, list)) else (output,)))
        for _ in range(warmup):
            run(*inputs)
        for _ in range(repeats):
            if cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(
                    enable_timing=True)
                start.record()
                run(*inputs)
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end))
            else:
                begin = time.perf_counter()
                run(*inputs)
                times.append((time.perf_counter() - begin) * 1e3)
    times_ms = np.array(times)
    outputs = output if isinstance(output, (tuple, list)) else (output,)
    nonfinite = sum(int(torch.count_nonzero(~torch.isfinite(o.float())).item()) for o in outputs)
    return {"latency_ms": float(np.median(times_ms)), "min_ms": float(times_ms.min()),
            "runs": int(times_ms.size), "nonfinite": nonfinite}


def precompile(bundle: str, libraries: list, compiler: str, cache: str, jobs: int) -> list:
    """Compile the CUDA of ``libraries`` into ``cache`` with ``jobs`` processes at once.

    Each process loads its share of the libraries, which makes TVM's loader compile their CUDA
    through the caching callback; the timed run then loads every library from the cache. Returns
    the error lines of processes that failed (their libraries are compiled again, and fail with
    their own message, in the timed run).
    """
    shares = [libraries[i::jobs] for i in range(jobs) if libraries[i::jobs]]
    script = os.path.abspath(__file__)
    processes = [subprocess.Popen([sys.executable, script, "--bundle", bundle, "--compiler",
                                   compiler, "--cache", cache, "--load-only", ",".join(share)],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for share in shares]
    errors = []
    for process in processes:
        output, _ = process.communicate()
        if process.returncode:
            errors.append(output.strip().splitlines()[-1] if output.strip() else
                          f"exit {process.returncode}")
    return errors


def _load_only(bundle: str, libraries: list, compiler: str, cache: str) -> int:
    tvm = import_bundled_tvm(bundle)
    enable_cuda(tvm, compiler, cache)
    for library in libraries:
        tvm.runtime.load_module(library_file(bundle, library))
    return 0


def run_bundle(bundle: str, repeats: int = 100, warmup: int = 10, compiler: str = "nvrtc",
               models=None, checkpoint=None, cache: str | None = None, jobs: int = 1,
               profile: bool = False, torch_variants=()) -> dict:
    """Run every variant of every model in the bundle; one row per variant, errors included.

    ``checkpoint``, if given, is called with the results so far after every variant, so that a
    run stopped part-way still leaves what it measured. With ``cache`` (a folder), compiled
    CUDA is kept there, and with ``jobs`` > 1 every library's CUDA is compiled first by that
    many processes at once (:func:`precompile`). ``torch_variants`` (names of
    :data:`TORCH_VARIANTS`) are timed after each model's TVM variants, in this process, for the
    models whose manifest entry names a PyTorch counterpart (``torch``).

    Returns
    -------
    dict
        ``{"environment": ..., "models": {model: {variant: row}}, "weights": {model: info}}``
        (``info`` from :func:`model_weights`). A row holds either the measurements
        (``latency_ms``, ``speedup_vs_fp32``, ``relative_l2``, ``nonfinite``...), ``error``, a
        one-line message, or ``skipped``: a variant the build could not make (the manifest's
        ``skipped``), which is not an error of this run.
    """
    with open(os.path.join(bundle, MANIFEST), encoding="utf-8") as handle:
        manifest = json.load(handle)
    tvm = import_bundled_tvm(bundle)
    environment = {"python": platform.python_version(), "numpy": np.__version__,
                   "tvm": tvm.__version__, "tvm_file": tvm.__file__,
                   "runtime_only": bool(tvm.base._RUNTIME_ONLY),  # noqa: SLF001 - TVM tells a runtime-only build only here
                   "device_kind": manifest["device"], "built_for": manifest["target"]}
    setup_error = None
    try:
        if manifest["device"] == "cuda":
            enable_cuda(tvm, compiler, cache)
            if cache and jobs > 1:
                start = time.perf_counter()
                libraries = [entry["library"] for name, model in manifest["models"].items()
                             if not models or name in models
                             for entry in model["variants"].values()]
                environment["precompile_errors"] = precompile(bundle, libraries, compiler,
                                                              cache, jobs)
                environment["precompile_s"] = time.perf_counter() - start
            device = tvm.cuda(0)
            environment.update(gpu=device.device_name, compute_version=device.compute_version,
                               compiler=compiler)
        else:
            device = tvm.cpu(0)
    except RuntimeError as error:
        setup_error = str(error)
    results, weights = {}, {}
    for name, model in manifest["models"].items():
        if models and name not in models:
            continue
        rows = results[name] = {}
        if setup_error:
            rows.update({variant: {"error": setup_error} for variant in model["variants"]})
            continue
        values, weights[name] = model_weights(bundle, model)
        with np.load(os.path.join(bundle, model["inputs"])) as inputs:
            values.update({key: inputs[key] for key in inputs.files})
        references = {}
        for variant, entry in model["variants"].items():
            try:
                row, outputs = run_variant(tvm, bundle, entry, device, values, repeats, warmup,
                                           profile)
            except Exception as error:
                rows[variant] = {"error": _one_line(error)}
                continue
            if entry["base"] == "fp32":
                references.setdefault(entry["mode"], outputs)
            # every variant is checked against the plain float32 build where it ran
            reference = references.get("vm", references.get(entry["mode"]))
            if reference is not None:
                row.update(compare(reference, outputs))
            row["mode"] = entry["mode"]
            rows[variant] = row
            print(_row_line(name, variant, row), flush=True)
            _add_speedups(model, rows)
            if checkpoint:
                checkpoint({"environment": environment, "models": results, "weights": weights})
        rows.update({variant: {"skipped": reason}
                     for variant, reason in model.get("skipped", {}).items()})
        if torch_variants and model.get("torch") and _torch_version(environment):
            chosen = [v for v in TORCH_VARIANTS if v[0] in torch_variants]
            spec = {**model["torch"], "model": name}
            for variant, row in time_torch(spec, values, manifest["device"], repeats, warmup,
                                           chosen).items():
                rows[variant] = {**row, "mode": "vm"}  # compared with TVM's float32 VM
            _add_speedups(model, rows)
            if checkpoint:
                checkpoint({"environment": environment, "models": results, "weights": weights})
        _add_speedups(model, rows)
    environment["tvm_libraries"] = loaded_tvm_libraries()
    return {"environment": environment, "models": results, "weights": weights}


def _torch_version(environment: dict) -> str | None:
    """PyTorch's version where it is installed (recorded in ``environment["torch"]`` either
    way, so a run without it says so instead of leaving its rows out silently)."""
    if "torch" not in environment:
        import importlib.util

        if importlib.util.find_spec("torch") is None:
            environment["torch"] = None
        else:
            import torch

            environment["torch"] = torch.__version__
    return environment["torch"]


def _add_speedups(model: dict, rows: dict) -> None:
    """Speed-up over TVM's float32 variant built for the same execution mode (PyTorch rows:
    over TVM's float32 in the plain VM)."""
    base = {row["mode"]: row["latency_ms"] for v, row in rows.items()
            if "latency_ms" in row and model["variants"].get(v, {}).get("base") == "fp32"}
    for row in rows.values():
        if "latency_ms" in row and row.get("mode") in base:
            row["speedup_vs_fp32"] = base[row["mode"]] / row["latency_ms"]


def _one_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    message = lines[-1] if lines else ""
    return f"{type(error).__name__}: {message}"[:300]


def _row_line(model: str, variant: str, row: dict) -> str:
    if "error" in row:
        return f"{model} {variant}: {row['error']}"
    error = f"rel L2 {row['relative_l2']:.2e}" if "relative_l2" in row else "no reference"
    return f"{model} {variant}: {row['latency_ms']:.3f} ms, {error}"


def format_markdown(results: dict) -> str:
    """The results as a markdown table: latency, speed-up over float32, relative L2, NaN/Inf."""
    env = results["environment"]
    lines = [f"Device: {env.get('gpu', env['device_kind'])}"
             f"{' (compute ' + env['compute_version'] + ')' if 'compute_version' in env else ''}"
             f", TVM {env['tvm']} runtime only, Python {env['python']}, numpy {env['numpy']}"
             + ("" if "torch" not in env else f", PyTorch {env['torch']}" if env["torch"]
                else " (PyTorch not installed: no PyTorch rows)"), "",
             "| model | variant | latency ms (median) | speed-up vs fp32 | rel. L2 vs fp32 "
             "| NaN/Inf |", "|---|---|---:|---:|---:|---:|"]
    for model, rows in results["models"].items():
        for variant, row in rows.items():
            if "error" in row or "skipped" in row:
                what = (f"error: {row['error']}" if "error" in row else
                        f"not built: {row['skipped']}")
                lines.append(f"| {model} | {variant} | {what} | | | |")
                continue
            speedup = f"{row['speedup_vs_fp32']:.2f}" if "speedup_vs_fp32" in row else "-"
            rel = f"{row['relative_l2']:.2e}" if "relative_l2" in row else "-"
            nonfinite = row.get("nonfinite", "-")
            if row.get("reference_nonfinite"):
                nonfinite = f"{nonfinite} ({row['reference_nonfinite']} in float32's output)"
            lines.append(f"| {model} | {variant} | {row['latency_ms']:.3f} | {speedup} | {rel} "
                         f"| {nonfinite} |")
    if results.get("weights"):
        lines += ["", "Weights:"]
        for model, info in results["weights"].items():
            check = ("" if "bit_identical" not in info else
                     ", bit-identical to the build's" if info["bit_identical"] else
                     f", {info['differ_count']} differ from the build's (other versions of torch "
                     "or transformers here)")
            lines.append(f"- {model}: {info['source']}{check}")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    """Command line: run the bundle this script sits in and write results.json/results.md."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--bundle", default=os.path.dirname(os.path.abspath(__file__)),
                        help="bundle folder (default: the folder of this script)")
    parser.add_argument("--out", default=".", help="folder for results.json and results.md")
    parser.add_argument("--repeats", type=int, default=100, help="timed runs (median reported)")
    parser.add_argument("--warmup", type=int, default=10, help="untimed runs before timing")
    parser.add_argument("--compiler", choices=("nvrtc", "nvcc"),
                        default=os.environ.get("TVM_CUDA_COMPILE_MODE", "nvrtc").lower(),
                        help="CUDA source compiler (default: NVRTC through cuda-bindings)")
    parser.add_argument("--models", default=None, help="comma-separated subset of the models")
    parser.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "relay_amp_cubins"),
                        help="folder of compiled CUDA, reused across runs (default: %(default)s)")
    parser.add_argument("--jobs", type=int, default=min(8, os.cpu_count() or 1),
                        help="processes that compile the CUDA first (default: %(default)s)")
    parser.add_argument("--profile", action="store_true",
                        help="also time each kernel call (results.json, 'profile')")
    parser.add_argument("--torch", default=",".join(v[0] for v in TORCH_VARIANTS),
                        help="PyTorch variants timed beside TVM's, comma-separated, or '' for "
                             "none (default: all, where the host has torch: %(default)s)")
    parser.add_argument("--load-only", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.load_only is not None:
        return _load_only(args.bundle, args.load_only.split(","), args.compiler, args.cache)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    os.makedirs(args.out, exist_ok=True)

    def save(results):
        with open(os.path.join(args.out, "results.json"), "w", encoding="utf-8") as handle:
            json.dump(results, handle, indent=1)
        table = format_markdown(results)
        with open(os.path.join(args.out, "results.md"), "w", encoding="utf-8") as handle:
            handle.write(table)
        return table

    torch_variants = [v for v in args.torch.split(",") if v]
    unknown = sorted(set(torch_variants) - {v[0] for v in TORCH_VARIANTS})
    if unknown:
        parser.error(f"unknown --torch variants {unknown}")
    results = run_bundle(args.bundle, args.repeats, args.warmup, args.compiler,
                         args.models.split(",") if args.models else None, checkpoint=save,
                         cache=args.cache, jobs=args.jobs, profile=args.profile,
                         torch_variants=torch_variants)
    print(save(results))
    rows = [row for model in results["models"].values() for row in model.values()]
    return 0 if rows and all("error" not in row for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
