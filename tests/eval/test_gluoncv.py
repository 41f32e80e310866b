"""GluonCV resnet18_v1 (Xavier init, BatchNorm re-estimated on real photos) through ONNX."""

import numpy as np
import pytest

import relay_amp
from relay_amp import execution
from relay_amp.eval import data, models
from relay_amp.eval.stats import builtin_convert

pytestmark = pytest.mark.zoo  # the model zoo: pip install -r requirements.txt


@pytest.fixture(scope="module")
def resnet18(tmp_path_factory):
    model = models.load("resnet18_v1", str(tmp_path_factory.mktemp("zoo")), batch_size=1)
    reference = execution.run(relay_amp.compile_module(model.mod), model.batches[0])
    return model, reference


def test_batchnorm_reestimation_gives_realistic_logits(resnet18):
    _, reference = resnet18
    logits = reference[0]
    assert logits.shape == (1, 1000)
    assert 0.1 < logits.std() < 100  # plain Xavier init gives ~1e-2 and below


@pytest.fixture(scope="module")
def builtin_error(resnet18):
    model, reference = resnet18
    outputs = execution.run(relay_amp.compile_module(builtin_convert(model.mod)),
                           model.batches[0])
    return execution.agreement(reference, outputs)


@pytest.mark.parametrize("dtype,tolerance", [("float16", 1e-3), ("bfloat16", 1e-2)])
def test_resnet18_agrees_with_float32(resnet18, builtin_error, dtype, tolerance):
    model, reference = resnet18
    converted, report = relay_amp.convert(model.mod, dtype)
    assert report.low_precision_mac_fraction() == pytest.approx(1.0)
    outputs = execution.run(relay_amp.compile_module(converted), model.batches[0])
    ours = execution.agreement(reference, outputs)
    print(f"resnet18_v1 {dtype}: relay_amp {ours}, TVM built-in float16 {builtin_error}")
    assert ours.nonfinite == 0
    assert ours.relative_l2 <= tolerance
    assert int(np.argmax(outputs[0])) == int(np.argmax(reference[0]))
    if dtype == "float16":
        assert ours.relative_l2 <= builtin_error.relative_l2


def test_sample_images_are_real_photos():
    batch = data.sample_images(count=3, size=64)
    assert batch.shape == (3, 64, 64, 3) and batch.dtype == np.uint8
    assert batch.std() > 20  # photos, not constant fill
    normalized = data.normalize(batch)
    assert normalized.shape == (3, 3, 64, 64) and normalized.dtype == np.float32
    with pytest.raises(ValueError, match="expected an"):
        data.normalize(batch[..., :2])


def test_every_gluoncv_model_of_the_registry_builds_without_pretrained_weights():
    """Each GluonCV net is made with ``pretrained_base=False`` where it takes the keyword (no
    backbone download) and without it where it refuses it: a ``TypeError`` from the
    classifiers, a ``Warning`` raised by darknet53."""
    model_zoo = models.import_gluoncv().model_zoo
    failed = {}
    for spec in models.REGISTRY.values():
        if spec.family != "gluoncv":
            continue
        options = {"crop_size": spec.input_size[0]} if spec.task == "segmentation" else {}
        try:
            models._gluon_net(model_zoo, spec.name, **options)
        except Exception as err:  # noqa: BLE001 - the assertion names each
            failed[spec.name] = f"{type(err).__name__}: {err}"
    assert failed == {}
