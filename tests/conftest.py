"""Test layers: ``pass/`` tests the pass and imports no harness; ``cli/`` the user's command;
``eval/`` the evaluation harness (sweep, benchmarks, GPU bundle, conformance, goldens of its
models); ``house/`` the layout rules and the README. Markers: ``zoo`` (needs the model zoo),
``gpu`` (needs a CUDA GPU), ``slow`` (a minute or more)."""

import pathlib
import sys

import pytest

# helpers.py and stages.py here, and the pass tests' module-level modules, which the goldens
# and the harness's tests of the same graphs read
HERE = pathlib.Path(__file__).parent
for folder in (HERE, HERE / "pass"):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))


@pytest.fixture(params=["float16", "bfloat16"])
def dtype(request):
    return request.param
