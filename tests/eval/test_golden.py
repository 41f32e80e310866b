"""Golden conversions: the converted module of every case below, as TVMScript, is what
``tests/eval/golden/<case>.<dtype>.<target>.txt`` holds. A restructuring of the pass must leave
them as they are, and a test failure shows the diff; a change that means to alter conversions
rewrites the files (``PYTHONPATH=tests python tests/eval/test_golden.py --update``), so the
commit shows what changed.

Cases: the shared test cases the pass's tests convert (tests/cases.py), the benchmark's synthetic
graphs, small BERT/ViT/LLaMA stacks and the sweep's default models (converted as the sweep
converts them: calibrated, uint8 input), each in float16 and bfloat16, without a target and for
CUDA. The text leaves constant values out (TVMScript's metadata), so float32 results of an MXNet
re-estimation that differ in the last bit between CPUs do not change it.
"""

import difflib
import pathlib
import sys

import cases
import pytest

import relay_amp

HERE = pathlib.Path(__file__).parent
GOLDEN = HERE / "golden"
TARGETS = {"none": None, "cuda": {"kind": "cuda", "arch": "sm_90"}}
DTYPES = ("float16", "bfloat16")


def _test_file_modules():
    for name, module in sorted(cases.GOLDEN.items()):
        yield name, module, {}


def _graphs():
    from relay_amp.eval import gpu_bench, transformer_graphs
    from relay_amp.eval.synthetic import synthetic_module

    yield "synthetic.transformer", synthetic_module("transformer", 400), {}
    yield "synthetic.convnet", synthetic_module("convnet", 400), {}
    yield "bert_encoder", gpu_bench.bert_encoder(1, 64, 2, 128, seq=16).mod, {}
    yield "vit_encoder", transformer_graphs.vit_encoder(1, 64, 2, 128, image=32, patch=16,
                                                       classes=10).mod, {}
    yield "llama_decoder", transformer_graphs.llama_decoder(1, 64, 4, 2, 128, vocab=100,
                                                            seq=16).mod, {}


def _sweep_defaults():
    from relay_amp.eval import models

    for name in models.DEFAULT_MODELS:
        loaded = models.load(name)
        integer = loaded.extra["uint8"]
        options = {"calibration": relay_amp.calibrate(loaded.mod, loaded.batches),
                   "input_dtypes": {integer["input"]: "uint8"},
                   "input_normalization": {integer["input"]: integer["normalization"]}}
        yield f"sweep.{name}", loaded.mod, options


def conversions(sources=(_test_file_modules, _graphs, _sweep_defaults)) -> dict:
    """file name -> the converted module's TVMScript (constants left out), for every case."""
    found = {}
    for source in sources:
        for name, mod, options in source():
            for target_name, target in TARGETS.items():
                for dtype in DTYPES:
                    converted, _ = relay_amp.convert(mod, dtype, target=target, **options)
                    found[f"{name}.{dtype}.{target_name}.txt"] = converted.script(
                        show_meta=False)
    return found


def _check(now: dict, recorded: dict) -> None:
    assert sorted(now) == sorted(recorded), (
        f"cases changed (new: {sorted(set(now) - set(recorded))}, gone: "
        f"{sorted(set(recorded) - set(now))}): run "
        "PYTHONPATH=tests python tests/eval/test_golden.py --update")
    changed = sorted(case for case in now if now[case] != recorded[case])
    shown = []
    for case in changed[:4]:
        diff = difflib.unified_diff(recorded[case].splitlines(), now[case].splitlines(),
                                    f"recorded/{case}", f"now/{case}", lineterm="", n=1)
        shown.extend(list(diff)[:40])
    assert not changed, (f"{len(changed)} conversions differ from tests/eval/golden: {changed}\n"
                         + "\n".join(shown))


def test_conversions_are_as_recorded():
    """The test files' modules and the generated graphs."""
    recorded = {path.name: path.read_text() for path in GOLDEN.glob("*.txt")
                if not path.name.startswith("sweep.")}
    _check(conversions((_test_file_modules, _graphs)), recorded)


@pytest.mark.zoo
@pytest.mark.slow
def test_sweep_conversions_are_as_recorded():
    """The sweep's default models, calibrated, with uint8 input."""
    recorded = {path.name: path.read_text() for path in GOLDEN.glob("sweep.*.txt")}
    _check(conversions((_sweep_defaults,)), recorded)


if __name__ == "__main__":
    if sys.argv[1:] != ["--update"]:
        sys.exit("usage: python tests/eval/test_golden.py --update")
    GOLDEN.mkdir(exist_ok=True)
    texts = conversions()
    for stale in set(p.name for p in GOLDEN.glob("*.txt")) - set(texts):
        (GOLDEN / stale).unlink()
    for name, text in texts.items():
        (GOLDEN / name).write_text(text)
    print(f"wrote {len(texts)} conversions to {GOLDEN}")
