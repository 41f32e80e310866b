"""Fallback search benchmark: relay_amp's sensitivity search vs segment bisection, per model."""

from __future__ import annotations

import os

import numpy as np

from .. import fallback
from ..builds.pipeline import compile_module
from ..execution import agreement, run
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


def measure(name: str, dtype: str = "float16", max_bisection: int = 60,
            methods=("relay_amp", "relay_amp_local", "bisection")) -> dict:
    """The searches on one model, at a tolerance of half the calibrated conversion's error:
    relay_amp's (bindings ranked by their effect on the outputs), the same search ranked by
    local error (its earlier method), and segment bisection."""
    from ..calibrate import calibrate

    mod, batches = load(name)
    reference = [o for b in batches for o in run(compile_module(mod), b)]
    converted, report = convert(mod, dtype, calibration=calibrate(mod, batches))
    baseline_error = agreement(reference,
                               [o for b in batches for o in run(compile_module(converted), b)])
    tolerance = baseline_error.relative_l2 / 2
    row = {"model": name, "dtype": dtype, "low_bindings": len(report.converted),
           "full_conversion_error": baseline_error.relative_l2, "tolerance": tolerance}
    for method, ranking in (("relay_amp", "effect"), ("relay_amp_local", "local")):
        if method not in methods:
            continue
        try:
            _, found = fallback.auto_mixed_precision(mod, batches, tolerance, dtype=dtype,
                                                     max_evaluations=30, ranking=ranking)
            row[method] = {**found.search.to_dict(),
                           "low_mac_fraction": found.low_precision_mac_fraction()}
        except RuntimeError as err:
            row[method] = {"met": False, "message": str(err)}
    if "bisection" in methods:
        row["bisection"] = fallback.bisect_fallback(mod, batches, tolerance, dtype=dtype,
                                                    max_evaluations=max_bisection).to_dict()
    return row


#: The table's columns: a row's key and its heading.
METHODS = (("relay_amp", "relay_amp (output effect)"),
           ("relay_amp_local", "relay_amp ranked by local error"),
           ("bisection", "bisection"))


def table(rows) -> str:
    """Markdown: per model and method, met / float32 ops / evaluations / seconds (and the
    float32 share of the MACs where recorded)."""
    methods = [(key, title) for key, title in METHODS if any(key in row for row in rows)]
    lines = ["| model | low-precision ops | full-conversion error | tolerance | "
             + " | ".join(f"{title}: met / fp32 ops / evaluations / s" for _, title in methods)
             + " |", "|---|---|---|---|" + "---|" * len(methods)]
    for row in rows:
        cells = []
        for key, _ in methods:
            result = row.get(key, {})
            if "evaluations" in result:
                cell = (f"{'yes' if result['met'] else 'no'} / {len(result['fp32_bindings'])} / "
                        f"{result['evaluations']} / {result['seconds']:.0f}")
                if result.get("total_macs"):
                    cell += f" ({100 * result['fp32_macs'] / result['total_macs']:.1f}% MACs)"
                cells.append(cell)
            else:
                cells.append(f"no: {result.get('message', 'not run')[:60]}")
        lines.append(f"| {row['model']} | {row['low_bindings']} | "
                     f"{row['full_conversion_error']:.3g} | {row['tolerance']:.3g} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines)
