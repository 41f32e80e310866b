"""Build here, run on a GPU host with TVM's runtime only: a folder that carries everything.

:func:`build_bundle` converts and compiles every variant (float32, relay_amp float16 and
bfloat16, TVM's built-in float16; for CUDA each also with the VM's CUDA graph mode) of each model
for one target, exports each library, and writes one folder::

    BUNDLE/
      manifest.json        models, variants, libraries, parameter names and dtypes, where each
                           model's weights come from, sizes
      bundle_runner.py     the runner (a copy of relay_amp/eval/bundle_runner.py): numpy + this
                           folder
      cuda_loader.py       relay_amp/cuda_loader.py, which the runner imports
      <model>/<variant>.so.gz the exported libraries, gzip-compressed
      <model>/inputs.npz   the data inputs (weights are generated on the host from their seed,
                           or rebuilt there: see :mod:`.bundle_zoo`)
      <model>/weights.npz  a registry export's pretrained weights, where the bundle carries them
      tvm/, tvm_ffi/       TVM without its compiler library, and tvm_ffi for the host's Python

The registry's real exports (``zoo:NAME``) are built from their constants and their weights
lifted out afterwards (:mod:`.bundle_zoo`).

On the host: ``python BUNDLE/bundle_runner.py --out RESULTS``; where the host has PyTorch, the
runner also times each model's PyTorch counterpart (``manifest.json``'s ``torch``: eager,
autocast and ``torch.compile``) in the same process. A library built for CUDA holds
CUDA source (this wheel's TVM has no CUDA compiler); TVM's CUDA loader compiles it there, through
NVRTC or nvcc. A bundle built for ``llvm`` runs the same way on this machine.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import tvm

from .. import cuda_loader
from ..cli.progress import progress_bar
from . import bundle_runner, bundle_zoo, gpu_bench

#: The models of the GPU bundle, by the name :func:`bundle_model` takes.
BUNDLE_MODELS = ("resnet50_v1", "mobilenetv2_1.0", "bert_base", "llama_decoder")
#: The registry's real exports in the bundle (:mod:`.bundle_zoo`).
ZOO_BUNDLE_MODELS = tuple(bundle_zoo.PREFIX + name for name in bundle_zoo.ZOO_MODELS)
#: What ``scripts/gpu_bundle.py`` builds by default.
DEFAULT_MODELS = BUNDLE_MODELS + ZOO_BUNDLE_MODELS
#: Variants a model may lack: one that fails to convert or compile is recorded as skipped.
OPTIONAL_VARIANTS = ("tvm:float16",)
CUDA_GRAPH = " (cuda graph)"
TVM_PIPELINE = " (TVM pipeline)"
#: Variants also built with TVM's own CUDA pipeline, to show what relay_amp's pipeline changes.
TVM_PIPELINE_VARIANTS = ("fp32", "relay_amp:float16")
#: What a runtime-only TVM does not need: the compiler library, headers and sources.
_TVM_SKIP = ("libtvm_compiler.so", "3rdparty", "src", "include", "__pycache__")
_FFI_SKIP = ("3rdparty", "include", "__pycache__", "cython")
MAX_BUNDLE_BYTES = 64 * 1024 * 1024


def bundle_model(name: str, batch: int = 1) -> gpu_bench.BenchModel:
    """A model of the bundle at ``batch``: GluonCV models by name, ``bert_base``, ``vit_b16``,
    ``llama_decoder`` (realistic sizes; weights as parameters), or a registry export as
    ``zoo:NAME`` (:func:`.bundle_zoo.zoo_model`). A batch other than 1 is in the model's name
    (``bert_base_b8``)."""
    from . import transformer_graphs
    from .models import REGISTRY

    if name.startswith(bundle_zoo.PREFIX):
        return bundle_zoo.zoo_model(name[len(bundle_zoo.PREFIX):], batch)
    builders = {"bert_base": gpu_bench.bert_encoder, "vit_b16": transformer_graphs.vit_encoder,
                "llama_decoder": transformer_graphs.llama_decoder}
    if name in builders:
        model = builders[name](batch=batch)
        model.name = name if batch == 1 else f"{name}_b{batch}"
        return model
    gluon = sorted(n for n, spec in REGISTRY.items()
                   if spec.family == "gluoncv" and spec.task == "classification")
    if name not in gluon:
        raise ValueError(f"unknown bundle model {name!r}: use {', '.join(builders)} or a GluonCV "
                         f"classifier ({', '.join(gluon[:4])}, ...)")
    return gpu_bench.gluon_model(name, batch=batch)


def _target(kind: str, arch: str):
    if kind == "cuda":
        return tvm.target.Target({"kind": "cuda", "arch": arch})
    if kind == "llvm":
        from tvm.target.codegen import llvm_get_system_cpu

        return tvm.target.Target({"kind": "llvm", "mcpu": llvm_get_system_cpu()})
    raise ValueError(f"bundle target kind {kind!r}: use 'cuda' or 'llvm'")


def _copy_package(package, destination: str, skip) -> None:
    source = os.path.dirname(package.__file__)
    shutil.copytree(source, destination,
                    ignore=lambda folder, names: [n for n in names if n in skip])


def runtime_packages(out_dir: str, python: str | None = None) -> dict:
    """Put TVM (without its compiler library) and tvm_ffi for Python ``python`` in ``out_dir``.

    ``tvm`` is pure Python plus version-independent libraries, so the installed one is copied,
    with ``typing_extensions`` (one pure-Python file) that tvm_ffi imports.
    tvm_ffi holds an extension built per Python version: for this Python it is copied, for
    another (``"3.12"``) its wheel of the installed version is fetched with ``pip download``.
    """
    import tvm_ffi
    import typing_extensions

    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    python = python or here
    _copy_package(tvm, os.path.join(out_dir, "tvm"), _TVM_SKIP)
    shutil.copy(typing_extensions.__file__, out_dir)  # pure Python; tvm_ffi imports it
    if python == here:
        _copy_package(tvm_ffi, os.path.join(out_dir, "tvm_ffi"), _FFI_SKIP)
        return {"python": python, "tvm_ffi": "copied from this Python"}
    import zipfile
    from importlib.metadata import version

    release = version("apache-tvm-ffi")
    with tempfile.TemporaryDirectory(prefix="relay_amp_ffi_") as folder:
        command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                   "--only-binary=:all:", "--python-version", python, "-d", folder,
                   f"apache-tvm-ffi=={release}"]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        wheels = [f for f in os.listdir(folder) if f.endswith(".whl")]
        if result.returncode or not wheels:
            raise RuntimeError(f"cannot fetch tvm_ffi {release} for Python {python}: "
                               f"{(result.stderr or result.stdout).strip()[-300:]}")
        with zipfile.ZipFile(os.path.join(folder, wheels[0])) as wheel:
            members = [m for m in wheel.namelist() if m.startswith("tvm_ffi/")
                       and not any(part in _FFI_SKIP for part in m.split("/"))]
            wheel.extractall(out_dir, members)
    return {"python": python, "tvm_ffi": wheels[0]}


def build_bundle(out_dir: str, models=BUNDLE_MODELS, kind: str = "cuda", arch: str = "sm_90",
                 python: str | None = "3.12", weight_seed: int = 0, cuda_graph: bool = False,
                 progress: bool = True, tvm_pipeline: bool = True,
                 variants=gpu_bench.VARIANTS, batches=(1,)) -> dict:
    """Build every variant of ``models`` for one target into the bundle folder ``out_dir``.

    Parameters
    ----------
    out_dir : str
        The bundle folder; must not exist or be empty.
    models : sequence of str or BenchModel
        Model names (:func:`bundle_model`) or built models.
    kind : {"cuda", "llvm"}
        CUDA for ``arch``, or this host's CPU.
    python : str, optional
        The host's Python version, for tvm_ffi (default 3.12, the GPU host's; None: this one's).
    cuda_graph : bool
        For CUDA, also build each variant with the VM's CUDA graph mode.
    tvm_pipeline : bool
        For CUDA, also build ``TVM_PIPELINE_VARIANTS`` with TVM's own pipeline (every variant is
        built with :func:`relay_amp.cuda_pipeline`).
    variants : sequence of str
        Which of ``gpu_bench.VARIANTS`` to build (float32 always comes first: the reference).
    batches : sequence of int
        The batch sizes each model named by ``models`` is built for (a built model is taken
        as it is); where 1 is one of them, a registry export whose graph fixes batch 1 is left
        out of the others, in the manifest's ``not_built``.

    Returns
    -------
    dict
        The manifest written to ``manifest.json``, with ``bytes``, the folder's size (also per
        model, and ``runtime``'s for TVM and tvm_ffi), and ``build_s``.

    Raises
    ------
    FileExistsError
        If ``out_dir`` holds files. On any other error the folder is removed.
    """
    if os.path.isdir(out_dir) and os.listdir(out_dir):
        raise FileExistsError(f"bundle folder {out_dir} is not empty; give a new folder")
    began = time.perf_counter()
    target = _target(kind, arch)
    if kind == "cuda":
        gpu_bench.check_tensorize()
    if not batches or any(int(b) < 1 for b in batches):
        raise ValueError(f"batch sizes must be positive; got {list(batches)}")
    built, not_built = [], {}
    for entry in models:
        for batch in ([int(b) for b in batches] if isinstance(entry, str) else [None]):
            try:
                built.append(entry if batch is None else bundle_model(entry, batch))
            except bundle_zoo.FixedBatch as error:
                if 1 not in batches:  # the model would be missing altogether
                    raise
                not_built[f"{entry} batch {batch}"] = str(error)
    models = built
    os.makedirs(out_dir, exist_ok=True)
    try:
        unknown = sorted(set(variants) - set(gpu_bench.VARIANTS))
        if unknown:
            raise ValueError(f"unknown variants {unknown}: use {', '.join(gpu_bench.VARIANTS)}")
        variants = ["fp32"] + [v for v in gpu_bench.VARIANTS if v in variants and v != "fp32"]
        manifest = _build(out_dir, models, target, kind, python, weight_seed, cuda_graph,
                          progress, tvm_pipeline and kind == "cuda", variants)
        manifest["not_built"] = not_built
    except BaseException:  # nothing half-written stays behind
        shutil.rmtree(out_dir, ignore_errors=True)
        raise
    manifest["build_s"] = round(time.perf_counter() - began, 1)  # loading the models too
    _write_manifest(out_dir, manifest)  # the size counts it (about 1 MiB), less this field
    size = manifest["bytes"] = folder_bytes(out_dir)
    _write_manifest(out_dir, manifest)
    if size > MAX_BUNDLE_BYTES:
        raise RuntimeError(f"bundle {out_dir} is {size / 2**20:.1f} MiB, over the 64 MiB a "
                           "call to the GPU host takes; build fewer models per bundle")
    return manifest


def _build(out_dir, models, target, kind, python, weight_seed, cuda_graph, progress,
           tvm_pipeline, variants) -> dict:
    manifest = {"device": "cuda" if kind == "cuda" else "cpu", "target": str(target.export()),
                "built": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "models": {},
                "runtime": runtime_packages(out_dir, python if kind == "cuda" else None)}
    manifest["runtime"]["bytes"] = folder_bytes(out_dir)
    modes = [(False, True)] + ([(True, True)] if kind == "cuda" and cuda_graph else [])

    def builds(variant):
        extra = [(False, False)] if tvm_pipeline and variant in TVM_PIPELINE_VARIANTS else []
        return modes + extra

    steps = [(m, v, b) for m in models for v in variants for b in builds(v)]
    bar = progress_bar(total=len(steps), desc="bundle", unit="library", disable=not progress)
    for model in models:
        folder = _safe_name(model.name)
        os.makedirs(os.path.join(out_dir, folder), exist_ok=True)
        # photos compress about 4x (few distinct values); np.load reads either form
        np.savez_compressed(os.path.join(out_dir, folder, "inputs.npz"), **model.data)
        shapes = gpu_bench.weight_shapes(model)
        record = manifest["models"][model.name] = {
            "weights": [[name, list(shape)] for name, shape in shapes.items()],
            "weight_seed": weight_seed, "inputs": f"{folder}/inputs.npz",
            "torch": model.torch, "notes": list(model.notes), "variants": {}}
        for variant in variants:
            bar.set_postfix_str(f"{model.name} {variant}")
            try:
                record["variants"].update(_variant_libraries(out_dir, folder, model, variant,
                                                             target, builds(variant)))
            except Exception as error:
                if variant not in OPTIONAL_VARIANTS:
                    raise
                lines = [line for line in str(error).splitlines() if line.strip()]
                record.setdefault("skipped", {})[variant] = (
                    f"{type(error).__name__}: {lines[-1].strip() if lines else ''}"[:300])
            bar.update(len(builds(variant)))
        if model.weight_table is not None:
            _record_weights(out_dir, folder, model, record)
        record["bytes"] = folder_bytes(os.path.join(out_dir, folder))
    bar.close()
    shutil.copy(bundle_runner.__file__, os.path.join(out_dir, "bundle_runner.py"))
    shutil.copy(cuda_loader.__file__, os.path.join(out_dir, "cuda_loader.py"))
    return manifest


def _write_manifest(out_dir: str, manifest: dict) -> None:
    with open(os.path.join(out_dir, bundle_runner.MANIFEST), "w", encoding="utf-8") as handle:
        json.dump(manifest, handle, indent=1)


def _safe_name(name: str) -> str:
    return re.sub("[^A-Za-z0-9._-]+", "_", name.replace(":", "_"))


def _variant_libraries(out_dir, folder, model, variant, target, builds) -> dict:
    """Convert ``model`` to ``variant``, lift its weights (a registry export), compile and
    export each of ``builds``; the manifest entry of each library, by variant name."""
    start = time.perf_counter()
    mod = gpu_bench.variant_module(model, variant, target)
    params = [{"name": p.name, "dtype": str(p.ty.dtype)} for p in mod["main"].params]
    lifted = {}
    if model.weight_table is not None:
        mod, params, embedded = bundle_zoo.lift_weights(mod, model.weight_table)
        lifted["embedded_constants"] = embedded
        weights = sum("weight" in p for p in params)
        if weights:
            lifted.update(num_input=len(params) - weights, transform=bundle_zoo.TRANSFORM)
    convert_s = time.perf_counter() - start
    entries = {}
    for graph, ours in builds:
        name = variant + (CUDA_GRAPH if graph else "") + ("" if ours else TVM_PIPELINE)
        library = f"{folder}/{_safe_name(name.replace(':', '-'))}.so"
        start = time.perf_counter()
        gpu_bench.compile_module(mod, target, graph, relay_amp_schedules=ours
                                 ).export_library(os.path.join(out_dir, library))
        entries[name] = {
            "library": _gzip(out_dir, library), "base": variant.split(":")[0],
            "mode": ("cuda_graph" if graph else "vm") + ("" if ours else "_tvm_pipeline"),
            "params": params, **lifted, "convert_s": convert_s,
            "compile_s": time.perf_counter() - start}
    return entries


def _record_weights(out_dir: str, folder: str, model, record: dict) -> None:
    """The manifest's weights of a registry export: the table's tensors that some variant
    takes, and where the runner gets them (a ``file`` source is written here)."""
    used = list(dict.fromkeys(p["weight"] for entry in record["variants"].values()
                              for p in entry["params"] if "weight" in p))
    arrays = model.weight_table.arrays
    record["weights"] = [[name, list(arrays[name].shape)] for name in used]
    source = dict(model.weight_source)
    if source["kind"] == "file":
        source["path"] = f"{folder}/weights.npz"
        np.savez_compressed(os.path.join(out_dir, source["path"]),
                            **{name: arrays[name] for name in used})
    elif source["kind"] == "transformers":  # the host checks what it rebuilds against these
        source["sha256"] = {name: bundle_runner.sha256(arrays[name]) for name in used}
    record["weight_source"] = source


def _gzip(out_dir: str, library: str) -> str:
    """Compress an exported library in place (CUDA source compresses about 8x); the runner
    decompresses it before loading."""
    path = os.path.join(out_dir, library)
    with open(path, "rb") as source, gzip.open(path + ".gz", "wb", compresslevel=9) as target:
        shutil.copyfileobj(source, target)
    os.remove(path)
    return library + ".gz"


def folder_bytes(folder: str) -> int:
    """Total size of the files under ``folder``."""
    return sum(os.path.getsize(os.path.join(root, name))
               for root, _, names in os.walk(folder) for name in names)
