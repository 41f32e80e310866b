"""The evaluation harness: it imports the pass (:mod:`relay_amp`) and measures it; the pass never
imports it.

- :mod:`~relay_amp.eval.commands` — ``relay-amp sweep`` and ``relay-amp bench`` (the command
  itself, with ``convert`` and ``report``, is :mod:`relay_amp.cli`)
- :mod:`~relay_amp.eval.sweep` — the model-zoo accuracy sweep, one process per model, resumable
- :mod:`~relay_amp.eval.models` — the sweep's model registry and loaders (one GluonCV loader)
- :mod:`~relay_amp.eval.bench` — conversion-time, structure, CPU-latency and GPU-cost benchmarks
- :mod:`~relay_amp.eval.gpu_bench`, :mod:`~relay_amp.eval.gpu_bundle`,
  :mod:`~relay_amp.eval.bundle_runner` — build on any host, run on a GPU with TVM's runtime only
- :mod:`~relay_amp.eval.conformance`, :mod:`~relay_amp.eval.fuzz` — ONNX backend suite, fuzzing

Its extra dependencies are in the ``eval`` extra of pyproject.toml.
"""
