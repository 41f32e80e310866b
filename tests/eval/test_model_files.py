"""A loaded model's files live in a folder that goes with it: a model's ONNX export is up to
hundreds of MB, and folders left behind filled this machine's disk."""

import gc
import os

import pytest

from relay_amp.eval import models

pytestmark = pytest.mark.zoo


def test_a_models_temporary_folder_goes_with_it():
    loaded = models.load("iris_landmark")
    folder = loaded.folder.name
    assert os.path.isdir(folder)
    del loaded
    gc.collect()
    assert not os.path.exists(folder)


def test_a_folder_the_caller_gives_is_the_callers(tmp_path):
    loaded = models.load("resnet18_v1", str(tmp_path), batch_size=1)
    path = loaded.extra["onnx_path"]
    assert loaded.folder is None and os.path.dirname(path) == str(tmp_path)
    del loaded
    gc.collect()
    assert os.path.exists(path)
