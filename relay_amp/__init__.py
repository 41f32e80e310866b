"""relay_amp: mixed-precision (float16 / bfloat16) conversion for Apache TVM Relax modules.

>>> import relay_amp
>>> mod, report = relay_amp.convert(mod, "float16")          # doctest: +SKIP
>>> seq = tvm.transform.Sequential([relay_amp.ToMixedPrecision("bfloat16")])  # doctest: +SKIP

This package is the pass and only the pass (runtime dependencies: tvm, numpy, ml_dtypes). The
evaluation harness (model-zoo sweep, benchmarks, conformance, fuzzing, GPU bundle, the
``relay-amp`` command) is :mod:`relay_amp.eval`, which imports the pass and never the reverse.
"""

from .builds import DecomposeAttention, GpuCost, codegen, cpu_pipeline, cuda_pipeline, gpu_cost
from .builds.pipeline import compile_module
from .calibrate import Calibration, calibrate
from .execution import Agreement, agreement, host_target, run
from .fallback import auto_mixed_precision, bisect_fallback
from .op_registry import Category
from .policy import Policy, amp_config, current_policy
from .report import BindingRecord, Report
from .targets import TargetCaps, UnsupportedDtypeError, target_caps
from .transform import ToMixedPrecision, convert

__version__ = "0.1.0"

# Importing relay_amp registers no TVM callback: relay_amp's CUDA builds (cuda_pipeline,
# builds.build) turn on relay_amp.builds.codegen.cuda's source hook; tvm.compile users call
# relay_amp.codegen.cuda.enable() (relay_amp.codegen is relay_amp.builds.codegen).

__all__ = [
    "ToMixedPrecision", "convert", "Report", "BindingRecord", "Policy", "Category",
    "amp_config", "current_policy", "TargetCaps", "target_caps", "UnsupportedDtypeError",
    "Calibration", "calibrate", "auto_mixed_precision", "bisect_fallback", "GpuCost", "gpu_cost",
    "Agreement", "agreement", "compile_module", "host_target", "run", "cuda_pipeline",
    "cpu_pipeline", "DecomposeAttention", "codegen",
]
