"""Codegen support for converted modules: CUDA source post-processing."""

from . import cuda

__all__ = ["cuda"]
