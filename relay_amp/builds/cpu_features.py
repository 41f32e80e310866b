"""Whether an ``llvm`` target's CPU has a feature, asked once per target and feature.

``tvm.target.codegen.llvm_cpu_has_features`` builds an LLVM target machine on every call (about
0.2 ms); a CPU build asks a few features for each of its kernels, 438 times for resnet18_v2.
"""

from __future__ import annotations

import functools

import tvm


@functools.lru_cache(maxsize=256)
def _has(feature: str, target_json: str) -> bool:
    return bool(tvm.target.codegen.llvm_cpu_has_features(feature, tvm.target.Target(
        target_json)))


def cpu_has(feature: str, target) -> bool:
    """Whether the ``llvm`` target ``target`` (its ``mcpu`` and ``mattr``) has ``feature``
    (an LLVM feature name: ``avx512f``, ``fp16fml``, ``bf16``...)."""
    target = target if isinstance(target, tvm.target.Target) else tvm.target.Target(target)
    return _has(feature, str(target))


__all__ = ["cpu_has"]
