"""Emulated aarch64 boards behind TVM's RPC tracker, the way TVM users address a pool of boards:
TVM's own tracker (``python -m tvm.exec.rpc_tracker``), two of the project's servers registered
with it under one key (``rpc_server --tracker HOST:PORT --key KEY``, the C++ side), and two
models converted for aarch64 run through it at once, each in a session the tracker gave
(``relay_amp.builds.remote.session_from``).

Needs ``bash scripts/arm/setup_emulator.sh``, as the other ``arm`` tests do, and tornado (TVM's
tracker imports it; requirements-test.txt).
"""

import gc
import socket
import subprocess
import threading
import time

import numpy as np
import pytest
import tvm
from helpers import projection
from tvm import relax

import relay_amp
from relay_amp.builds import remote
from relay_amp.eval import arm_emulator
from relay_amp.eval.arm_emulator import TARGET_FP16, ArmEmulator, RpcTracker

pytestmark = pytest.mark.arm

KEY = "relay-amp-emulated"
#: float16 with float32 accumulation against the float32 host run (tests/arm/test_arm_emulated.py)
TOLERANCE = 1e-3


def _convnet():
    """conv2d + bias + relu, twice (4 -> 8 -> 8 channels, 12x12)."""
    rng = np.random.default_rng(11)
    x = relax.Var("x", relax.TensorType((1, 4, 12, 12), "float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            h = x
            for cin, cout in ((4, 8), (8, 8)):
                w = rng.standard_normal((cout, cin, 3, 3)) / np.sqrt(cin * 9)
                b = 0.1 * rng.standard_normal((1, cout, 1, 1))
                h = builder.emit(relax.op.nn.conv2d(h, relax.const(w.astype("float32")),
                                                    padding=[1, 1]))
                h = builder.emit(relax.op.nn.relu(relax.op.add(h, relax.const(
                    b.astype("float32")))))
            out = builder.emit_output(h)
        builder.emit_func_output(out)
    return builder.get()


def _matmul():
    """(16, 64) @ (64, 32) + bias."""
    return projection(16, 64, 32, seed=12, bias_scale=0.1)


MODELS = {"convnet": _convnet, "matmul": _matmul}


@pytest.fixture(scope="module")
def tracker(emulator_available):
    """TVM's tracker, starting: it imports TVM (seconds) while the models build."""
    started = RpcTracker().start(wait=False)
    yield started
    started.stop()


@pytest.fixture(scope="module")
def libraries(tracker, tmp_path_factory):
    """Each model converted to float16 for aarch64 and linked: its library, inputs and the
    float32 model's outputs on this host."""
    folder = tmp_path_factory.mktemp("tracker_libs")
    built = {}
    for name, make in MODELS.items():
        mod = make()
        x = np.random.default_rng(0).standard_normal(
            [int(d) for d in mod["main"].params[0].ty.shape.values]).astype("float32")
        reference = relay_amp.run(relay_amp.compile_module(mod), [x])
        converted, report = relay_amp.convert(mod, "float16", target=TARGET_FP16)
        assert report.converted, f"nothing of {name} converted to float16"
        executable = tvm.compile(converted, target=tvm.target.Target(TARGET_FP16))
        lib = remote.export_for(executable, folder / f"{name}.so", TARGET_FP16)
        built[name] = (lib, [x], reference)
    return built


@pytest.fixture(scope="module")
def boards(tracker, libraries):
    """Two emulated servers registered with the tracker under KEY (each start returns once the
    tracker lists its server)."""
    tracker.wait()
    with ArmEmulator(tracker=tracker.address, key=KEY) as first, \
            ArmEmulator(tracker=tracker.address, key=KEY) as second:
        yield first, second


def test_the_tracker_lists_both_servers_under_the_key(tracker, boards):
    summary = tracker.summary()
    assert remote.servers_under(summary, KEY) == sorted(("127.0.0.1", b.port) for b in boards)
    assert summary["queue_info"][KEY]["free"] == 2, summary


def test_two_models_run_at_once_through_the_tracker(tracker, boards, libraries):
    """Two threads each take a session from the tracker and run a model in it; both sessions
    are open at once (a barrier holds them), which needs both servers: while they are, a third
    request finds none free. Outputs match the host's float32 run; afterwards each server has
    served one session and is free again."""
    both_open = threading.Barrier(3, timeout=60)
    checked = threading.Barrier(3, timeout=60)
    spans, results, errors = {}, {}, {}

    def run(name):
        try:
            lib, inputs, _ = libraries[name]
            session = remote.session_from(tracker.address, KEY, timeout=60, session_timeout=120)
            opened = time.monotonic()
            both_open.wait()
            checked.wait()
            results[name] = remote.run_remote(session, lib, inputs)
            spans[name] = (opened, time.monotonic())
            del session
        except Exception as error:  # noqa: BLE001 - the main thread reports it
            errors[name] = error
            both_open.abort()
            checked.abort()

    threads = [threading.Thread(target=run, args=(name,)) for name in MODELS]
    for thread in threads:
        thread.start()
    try:
        both_open.wait()
        with pytest.raises(remote.TrackerError, match=r"all 2 servers under key .* stayed busy"):
            remote.session_from(tracker.address, KEY, timeout=1)
        checked.wait()
    except threading.BrokenBarrierError:
        pass  # a thread failed: its error is reported below
    except BaseException:
        checked.abort()  # this thread failed before the barrier: let the threads go
        raise
    finally:
        for thread in threads:
            thread.join(120)
    assert not errors, errors

    (open_a, close_a), (open_b, close_b) = spans.values()
    assert max(open_a, open_b) < min(close_a, close_b), f"the sessions did not overlap: {spans}"
    for name, (_, _, reference) in libraries.items():
        agreement = relay_amp.agreement(reference, results[name])
        assert agreement.nonfinite == 0 and agreement.relative_l2 <= TOLERANCE, (name, agreement)
    for board in boards:
        log = board.log()
        assert "session 1: serving" in log and "session 2:" not in log, log

    gc.collect()
    deadline = time.monotonic() + 30
    while tracker.summary()["queue_info"][KEY]["free"] < 2:
        assert time.monotonic() < deadline, f"the servers did not come back: {tracker.summary()}"
        time.sleep(0.2)


def test_a_key_no_server_has_fails_within_the_timeout(tracker, boards):
    start = time.monotonic()
    with pytest.raises(remote.TrackerError,
                       match=r"no RPC server is registered under key 'no-such-board'.*"
                             rf"keys it has: '{KEY}'"):
        remote.session_from(tracker.address, "no-such-board", timeout=1)
    assert time.monotonic() - start < 10


def test_no_tracker_at_the_address_fails_at_once():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    start = time.monotonic()
    with pytest.raises(remote.TrackerError, match=rf"no RPC tracker answers at 127.0.0.1:{port}"):
        remote.session_from(f"127.0.0.1:{port}", KEY, timeout=5)
    assert time.monotonic() - start < 5


@pytest.mark.parametrize("address", ["host", "host:0", ":9190", "host:port", ("host",)])
def test_a_bad_tracker_address_is_refused(address):
    with pytest.raises(ValueError, match="expected HOST:PORT"):
        remote.parse_address(address)


@pytest.mark.parametrize("args, message", [
    (["--tracker", "127.0.0.1:9190"], "--tracker needs --key KEY"),
    (["--tracker", "127.0.0.1", "--key", KEY], "--tracker takes HOST:PORT"),
    (["--custom-addr", "10.0.0.2"], "--custom-addr needs --tracker"),
])
def test_the_server_refuses_bad_tracker_options(emulator_available, args, message):
    done = subprocess.run([arm_emulator.QEMU, "-L", arm_emulator.SYSROOT,
                           str(arm_emulator.server_path()), *args],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and message in done.stderr, done
