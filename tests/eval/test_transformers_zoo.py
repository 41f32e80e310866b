"""Transformer rows: each loader at a tiny size through torch.export and TVM's importer, matched
against PyTorch; a symbolic sequence length through relay_amp; the inputs and task metrics."""


import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import tvm  # noqa: E402

import relay_amp  # noqa: E402
from relay_amp import execution  # noqa: E402
from relay_amp.eval import metrics, models, sweep  # noqa: E402
from relay_amp.eval import transformers_zoo as zoo  # noqa: E402

pytestmark = pytest.mark.zoo  # the model zoo: pip install -r requirements.txt


@pytest.fixture(scope="module")
def imported():
    """name -> (built, module, PyTorch outputs), tiny sizes, built once."""
    cache = {}

    def get(name):
        if name not in cache:
            built = zoo.build(name, tiny=True)
            cache[name] = built, zoo.to_relax(built), zoo.reference_outputs(built)
        return cache[name]

    return get


@pytest.mark.parametrize("name", list(zoo.MODELS))
def test_loader_matches_pytorch_in_tvm_float32(imported, name):
    built, mod, reference = imported(name)
    vm = relay_amp.compile_module(mod)
    for batch, expected in zip(built.batches, reference):
        outputs = execution.run(vm, batch)
        assert [o.shape for o in outputs] == [e.shape for e in expected]
        for out, ref in zip(outputs, expected):
            np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5 * np.abs(ref).max())


def test_symbolic_sequence_length_converts_and_runs(imported):
    built, mod, reference = imported("bert_base")
    length = mod["main"].params[0].ty.shape[1]
    assert isinstance(length, tvm.tirx.Var)
    assert [b[0].shape[1] for b in built.batches] == [16, 9]  # one module, two lengths
    converted, report = relay_amp.convert(mod, "float16", target=sweep.DEFAULT_TARGET)
    assert isinstance(converted["main"].params[0].ty.shape[1], tvm.tirx.Var)
    assert report.low_precision_mac_fraction() > 0.9
    vm = relay_amp.compile_module(converted)
    for batch, expected in zip(built.batches, reference):
        outputs = execution.run(vm, batch)
        agreement = execution.agreement(expected, outputs)
        assert agreement.nonfinite == 0
        assert agreement.relative_l2 < 5e-3
        assert metrics.row_cosines(expected[1], outputs[1]).min() > 0.9999


def test_unknown_model_is_a_key_error():
    with pytest.raises(KeyError, match="unknown transformer model 'bert_huge'"):
        zoo.build("bert_huge")


def test_every_transformer_row_is_registered():
    rows = {name: spec for name, spec in models.REGISTRY.items() if spec.family == "transformers"}
    assert set(rows) == set(zoo.MODELS)
    for name, spec in rows.items():
        assert spec.task == zoo.MODELS[name].task


def test_load_records_the_size_and_what_the_importer_needed(monkeypatch):
    real_build = zoo.build
    monkeypatch.setattr(zoo, "build",
                        lambda name, batches=None: real_build(name, tiny=True, batches=batches))
    loaded = models.load("gpt2_small")
    assert loaded.spec.task == "causal-lm"
    assert loaded.notes[0] == f"size: {zoo.MODELS['gpt2_small'].size}"
    assert any("attention_mask" in note for note in loaded.notes)
    assert [x.dtype for x in loaded.batches[0]] == [np.int64, np.int64]
    assert (loaded.batches[0][1] == 1).all()


# ------------------------------------------------------------------------------ inputs
def test_token_ids_are_seeded_and_skip_special_ids():
    first, again = zoo.token_ids(2, 12, 30522), zoo.token_ids(2, 12, 30522)
    assert all(np.array_equal(a, b) for a, b in zip(first, again))
    assert not np.array_equal(first[0], first[1])
    assert first[0].shape == (1, 12) and first[0].dtype == np.int64
    assert min(row.min() for row in first) >= 1000
    small = zoo.token_ids(1, 50, 100)[0]  # a vocabulary too small to skip 1000 ids
    assert small.min() >= 1 and small.max() < 100


def test_synthetic_speech_gives_whisper_features():
    audio = zoo.synthetic_speech(2.0)
    assert audio.shape == (32000,) and audio.dtype == np.float32
    assert np.abs(audio).max() == pytest.approx(0.5, rel=1e-6)
    spectrum = np.abs(np.fft.rfft(audio))
    peak_hz = np.argmax(spectrum) / 2.0  # 0.5 Hz bins
    assert 80 < peak_hz < 1000  # voiced, not noise
    features = zoo.log_mel(audio, 2.0, 80)
    assert features.shape == (1, 80, 200) and np.isfinite(features).all()
    assert features.std() > 0.1


def test_vit_pixels_are_the_sweep_photos_in_minus_one_to_one():
    pixels = zoo.vit_pixels(2, 32)
    assert pixels.shape == (2, 3, 32, 32) and pixels.dtype == np.float32
    assert -1.0 <= pixels.min() < -0.5 and 0.5 < pixels.max() <= 1.0


# ------------------------------------------------------------------------------ task metrics
def test_row_cosines():
    a = np.array([[1.0, 0.0], [1.0, 1.0], [0.0, 0.0]])
    b = np.array([[2.0, 0.0], [1.0, -1.0], [0.0, 0.0]])
    np.testing.assert_allclose(metrics.row_cosines(a, b), [1.0, 0.0, 1.0])


def test_next_token_agreement_counts_every_position():
    reference = np.zeros((1, 4, 6))
    reference[0, np.arange(4), [1, 2, 3, 4]] = 1.0
    output = reference.copy()
    output[0, 3, 5] = 2.0  # the last position now predicts token 5
    top1, top5 = metrics.next_token_agreement(reference, output)
    assert top1 == 0.75 and 0.9 < top5 < 1.0


def test_sweep_task_metrics_for_the_new_tasks():
    encoder = models.REGISTRY["bert_base"]
    hidden = np.ones((1, 3, 4))
    reference = [[hidden, np.array([[1.0, 0.0, 0.0, 0.0]])]]
    outputs = [[hidden, np.array([[1.0, 1.0, 0.0, 0.0]])]]
    result = sweep.task_metrics(encoder, reference, outputs, {})
    assert result["pooled_cosine"] == pytest.approx(2 ** -0.5)
    assert result["pooled_cosine_min"] == pytest.approx(2 ** -0.5)
    decoder = models.REGISTRY["gpt2_small"]
    logits = np.eye(5)[None]  # (1, 5 positions, 5 tokens)
    result = sweep.task_metrics(decoder, [[logits]], [[logits[:, ::-1]]], {})
    assert result["next_token_top1"] == pytest.approx(0.2)  # only the middle position agrees
    text = sweep._agreement_text({"pooled_cosine": 0.9999871, "next_token_top1": 1.0})
    assert text == "next token top1 1.000; pooled cosine 0.999987"


def test_gluon_detection_metric_ranks_boxes_and_reads_outputs_in_order():
    detector = models.REGISTRY["center_net_resnet18_v1b_voc"]
    boxes = np.array([[[0, 0, 10, 10], [20, 20, 30, 30], [40, 40, 50, 50]]], np.float32)
    scores = np.array([[0.03, 0.02, 0.01]], np.float32)  # all below any fixed threshold
    ids = np.array([[1.0, 2.0, -1.0]], np.float32)  # the third row is padding
    reference = [[scores, ids, boxes]]  # CenterNet's exported order
    moved = boxes.copy()
    moved[0, 1] += 8.0  # the second box moves off its reference
    result = sweep.task_metrics(detector, reference, [[scores, ids, moved]],
                                {"detection_outputs": [1, 0, 2]})
    assert result["detection_recall"] == 0.5
    assert result["matched_iou"] == pytest.approx(1.0)

