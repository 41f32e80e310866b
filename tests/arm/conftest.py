"""The emulated aarch64 CPU the ``arm`` tests run on: where ``scripts/arm/setup_emulator.sh``
has not run, the tests skip with what is missing, unless ``RELAY_AMP_ARM_REQUIRED=1`` (CI's arm
step) makes that a failure."""

import os

import pytest

from relay_amp.eval import arm_emulator
from relay_amp.eval.arm_emulator import ArmEmulator


def _require(count_instructions: bool = False) -> None:
    reason = arm_emulator.missing(count_instructions=count_instructions)
    if reason:
        if os.environ.get("RELAY_AMP_ARM_REQUIRED") == "1":
            pytest.fail(reason)
        pytest.skip(reason)


@pytest.fixture(scope="module")
def emulator():
    """A plain emulated CPU (QEMU's default model, every feature it emulates)."""
    _require()
    with ArmEmulator() as started:
        yield started


@pytest.fixture(scope="module")
def counter():
    """An emulated CPU that counts the instructions a run executes."""
    _require(count_instructions=True)
    with ArmEmulator(count_instructions=True) as started:
        yield started


@pytest.fixture(scope="module")
def emulator_available():
    """Nothing, where the emulator can run; else skips (or fails) as the other fixtures do."""
    _require()
