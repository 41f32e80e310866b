"""Test layers: ``pass/`` tests the pass and imports no harness; ``cli/`` the user's command;
``eval/`` the evaluation harness (sweep, benchmarks, GPU bundle, conformance, goldens of its
models); ``house/`` the layout rules and the README. Markers: ``zoo`` (needs the model zoo),
``gpu`` (needs a CUDA GPU), ``slow`` (a minute or more)."""

import pathlib
import sys

import pytest

# the modules both test layers import (cases.py, helpers.py, stages.py, cuda_checks.py); a test
# file imports no other test file across layers
HERE = pathlib.Path(__file__).parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))


@pytest.fixture(params=["float16", "bfloat16"])
def dtype(request):
    return request.param
