"""Fallback search benchmark: relay_amp's sensitivity search vs segment bisection, per model."""

from __future__ import annotations

import os

import numpy as np

from .. import fallback
from ..execution import agreement, compile_module, run
from ..transform import convert
from .data import sample_images

LIGHT_MODELS = ("light_squeezenet", "light_shufflenet", "light_bvlc_alexnet",
                "light_inception_v1", "light_densenet121", "light_resnet50", "light_inception_v2",
                "light_zfnet512", "light_vgg19")


def load_light(name: str):
    """An ONNX ``light_*`` model (weights replaced by constants) with photo inputs."""
    import onnx

    from ..cli.frontends import import_onnx

    path = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light",
                        name + ".onnx")
    model = onnx.load(path)
    initializers = {t.name for t in model.graph.initializer}
    data = [i for i in model.graph.input if i.name not in initializers][0]
    shape = [d.dim_value or 1 for d in data.type.tensor_type.shape.dim]
    notes: list = []
    mod = import_onnx(model, {data.name: shape}, notes)
    photos = sample_images(2, shape[2]).astype(np.float32) / 255.0
    batches = [[np.ascontiguousarray(p.transpose(2, 0, 1)[None])] for p in photos]
    return mod, batches


def load(name: str):
    if name.startswith("light_"):
        return load_light(name)
    from .models import load as load_model

    loaded = load_model(name)
    return loaded.mod, loaded.batches


def measure(name: str, dtype: str = "float16", max_bisection: int = 60) -> dict:
    """Both searches on one model, at a tolerance of half the calibrated conversion's error."""
    from ..calibrate import calibrate

    mod, batches = load(name)
    reference = [o for b in batches for o in run(compile_module(mod), b)]
    converted, report = convert(mod, dtype, calibration=calibrate(mod, batches))
    baseline_error = agreement(reference,
                               [o for b in batches for o in run(compile_module(converted), b)])
    tolerance = baseline_error.relative_l2 / 2
    row = {"model": name, "dtype": dtype, "low_bindings": len(report.converted),
           "full_conversion_error": baseline_error.relative_l2, "tolerance": tolerance}
    try:
        _, found = fallback.auto_mixed_precision(mod, batches, tolerance, dtype=dtype,
                                                 max_evaluations=30)
        row["relay_amp"] = found.search.to_dict()
    except RuntimeError as err:
        row["relay_amp"] = {"met": False, "message": str(err)}
    row["bisection"] = fallback.bisect_fallback(mod, batches, tolerance, dtype=dtype,
                                                max_evaluations=max_bisection).to_dict()
    return row


def table(rows) -> str:
    lines = ["| model | low-precision ops | full-conversion error | tolerance | relay_amp: met / "
             "fp32 ops / evaluations / s | bisection: met / fp32 ops / evaluations / s |",
             "|---|---|---|---|---|---|"]
    for row in rows:
        cells = []
        for key in ("relay_amp", "bisection"):
            result = row[key]
            if "evaluations" in result:
                cells.append(f"{'yes' if result['met'] else 'no'} / "
                             f"{len(result['fp32_bindings'])} / {result['evaluations']} / "
                             f"{result['seconds']:.0f}")
            else:
                cells.append(f"no: {result.get('message', '')[:60]}")
        lines.append(f"| {row['model']} | {row['low_bindings']} | "
                     f"{row['full_conversion_error']:.3g} | {row['tolerance']:.3g} | "
                     f"{cells[0]} | {cells[1]} |")
    return "\n".join(lines)
