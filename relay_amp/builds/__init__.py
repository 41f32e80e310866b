"""The builds: what compiles the modules the pass produces, for CUDA and for CPUs.

The pass (:mod:`relay_amp.transform` and its stages) rewrites a Relax module; this package turns
a module into a library: :func:`cuda_pipeline` and :func:`cpu_pipeline` (Relax pipelines for
``tvm.compile``), :func:`~relay_amp.builds.pipeline.build` (either, by target), the CUDA source
hook (:mod:`.codegen`), tensor-core schedules (:mod:`.tensor_cores`), what a CUDA build launches
(:func:`gpu_cost`) and running a library on a board over TVM's RPC, directly or through TVM's
tracker (:mod:`.remote`). It imports the pass's ground-floor helpers (dtypes, Relax utilities,
execution), never a pass stage.
"""

from . import codegen
from .cpu_pipeline import cpu_pipeline
from .gpu_cost import GpuCost, gpu_cost
from .pipeline import DecomposeAttention, build, compile_module, cuda_pipeline

__all__ = ["codegen", "cpu_pipeline", "GpuCost", "gpu_cost", "DecomposeAttention", "build",
           "compile_module", "cuda_pipeline"]
