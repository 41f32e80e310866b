"""Symbolic dimensions on the model zoo's models through ``relay-amp convert``: one library of
YOLOv8n (nudenet's 320n.onnx) with a symbolic batch runs batch 1 and 4, one of BERT-base (the
registry's, exported with ``torch.export`` and a symbolic sequence length) runs 64 and 128 tokens,
each with the outputs of the fixed-shape libraries, on this CPU. The command's ``llvm`` build
stores weights in float16 and computes in float32 (this CPU has no float16 arithmetic)."""

import json
import re

import numpy as np
import pytest
import tvm
from helpers import NVRTC, nvrtc_compile

import relay_amp
from relay_amp.cli import main

pytestmark = pytest.mark.zoo  # nudenet, torch, transformers: pip install -r requirements.txt


def _convert(tmp_path, capsys, model, out, *extra) -> dict:
    code = main(["convert", str(model), "--dtype", "float16", "--target", "llvm", "--quiet",
                 "-o", str(tmp_path / out), *extra])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return json.loads((tmp_path / out / "report.json").read_text())


def _library(folder):
    return tvm.runtime.vm.VirtualMachine(tvm.runtime.load_module(str(folder / "model.so")),
                                         tvm.cpu())


def test_one_yolov8n_library_runs_batch_1_and_4(tmp_path, capsys):
    from relay_amp.eval.models import _package_file, photo_pixels

    model = _package_file("nudenet", "320n.onnx")
    report = _convert(tmp_path, capsys, model, "sym", "--input", "images:batch=1..4,3,320,320")
    assert report["model"]["symbolic"][0]["inputs"] == ["images[0]"]
    symbolic = _library(tmp_path / "sym")
    photos = photo_pixels(4, 320, distinct=True).transpose(0, 3, 1, 2).astype(np.float32) / 255
    for batch in (1, 4):
        _convert(tmp_path, capsys, model, f"fixed{batch}", "--input", f"images:{batch},3,320,320")
        x = np.ascontiguousarray(photos[:batch])
        (got,) = relay_amp.run(symbolic, [x])
        (want,) = relay_amp.run(_library(tmp_path / f"fixed{batch}"), [x])
        assert got.shape == (batch, 22, 2100)  # 4 box coordinates and 18 classes per anchor
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)  # boxes in pixels (<= 320)


def _bert_export(tmp_path):
    """The registry's BERT-base, exported with a symbolic sequence length."""
    import torch

    from relay_amp.eval import transformers_zoo

    built = transformers_zoo.build("bert_base")
    example = tuple(torch.from_numpy(x) for x in built.batches[0])
    with torch.no_grad():
        program = torch.export.export(built.module, example, dynamic_shapes=built.dynamic_shapes)
    torch.export.save(program, str(tmp_path / "bert.pt2"))
    return tmp_path / "bert.pt2"


def test_one_bert_library_runs_64_and_128_tokens(tmp_path, capsys):
    from relay_amp.eval import transformers_zoo

    report = _convert(tmp_path, capsys, _bert_export(tmp_path), "sym", "--input",
                      "input_ids:1,seq=2..128")
    assert report["model"]["symbolic"] == [{"name": "seq", "lower": 2, "upper": 128,
                                            "inputs": ["input_ids[1]", "attention_mask[1]"],
                                            "memory_planned_for": 128}]
    symbolic = _library(tmp_path / "sym")
    vocab = 30522
    for seq in (64, 128):
        _convert(tmp_path, capsys, tmp_path / "bert.pt2", f"fixed{seq}", "--input",
                 f"input_ids:1,{seq}", "--input", f"attention_mask:1,{seq}")
        ids = transformers_zoo.token_ids(1, seq, vocab)[0]
        inputs = [ids, np.ones_like(ids)]
        got = relay_amp.run(symbolic, inputs)
        want = relay_amp.run(_library(tmp_path / f"fixed{seq}"), inputs)
        assert got[0].shape == (1, seq, 768)
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(NVRTC is None, reason="no CUDA headers or cuda-bindings for NVRTC here")
@pytest.mark.parametrize("name", ["yolov8n_320", "bert_base"])
def test_the_symbolic_cuda_library_compiles_with_nvrtc(tmp_path, name):
    """The two libraries above, built for ``cuda -arch=sm_90`` in float16: NVRTC (the GPU host's
    loader) compiles their CUDA source, whose kernels take the symbolic size as an argument."""
    from relay_amp.builds.pipeline import build
    from relay_amp.cli.arguments import parse_input
    from relay_amp.cli.frontends import import_model

    if name == "yolov8n_320":
        from relay_amp.eval.models import _package_file

        model, fmt, spec, size = _package_file("nudenet", "320n.onnx"), "onnx", \
            "images:batch=1..4,3,320,320", "batch"
    else:
        model, fmt, spec, size = _bert_export(tmp_path), "pt2", "input_ids:1,seq=2..128", "seq"
    parsed = parse_input(spec)
    imported = import_model(str(model), fmt, {parsed.name: parsed})
    target = {"kind": "cuda", "arch": "sm_90"}
    converted, _ = relay_amp.convert(imported.mod, "float16", target=target)
    (device,) = build(converted, target).mod.imports[0].imports
    source = device.inspect_source("cuda")
    signatures = re.findall(r"__global__ void __launch_bounds__\(\d+\) \w+\(([^)]*)\)", source)
    assert any(f"int64_t {size}" in signature for signature in signatures)
    assert nvrtc_compile(source, "sm_90")[:4] == b"\x7fELF"
