"""The accuracy search ranks bindings by their effect on the outputs, not by their local error.

The model is of the kind where that matters: a constant-Q front end (convolutions with fixed
windowed sinusoids, a magnitude, a log, a normalisation over time) and a small CNN with sigmoid
outputs per frame. Rounding the front end's operands breaks the windows' cancellation in the
quiet bins; its local error is the smallest of the model's, and the log and the normalisation
amplify it into a percent-level output error."""

import numpy as np
import pytest
from tvm import relax

import relay_amp
from relay_amp.builds.pipeline import compile_module
from relay_amp.execution import agreement, run
from relay_amp.fallback import local_errors, output_effects

SAMPLES, BINS, KERNEL, HOP = 4096, 48, 256, 64


def constant_q_cnn(seed=0):
    """A float32 module: audio ``(1, 1, SAMPLES)`` → per-frame sigmoid scores ``(1, F, 8)``."""
    rng = np.random.default_rng(seed)
    t = np.arange(KERNEL) / 16000.0
    freqs = 55.0 * 2 ** (np.arange(BINS) / 12.0)
    window = np.hanning(KERNEL) / KERNEL
    cos = (np.cos(2 * np.pi * freqs[:, None] * t) * window).astype("float32")[:, None, :]
    sin = (np.sin(2 * np.pi * freqs[:, None] * t) * window).astype("float32")[:, None, :]
    w1 = (rng.standard_normal((16, 1, 3, 3)) * 0.3).astype("float32")
    w2 = (rng.standard_normal((32, 16, 3, 3)) * 0.1).astype("float32")
    w3 = (rng.standard_normal((32, 32, 3, 3)) * 0.08).astype("float32")
    dense = (rng.standard_normal((32, 8)) * 3.0).astype("float32")
    op = relax.op
    builder = relax.BlockBuilder()
    audio = relax.Var("audio", relax.TensorType((1, 1, SAMPLES), "float32"))
    with builder.function("main", [audio]):
        with builder.dataflow():
            real = builder.emit(op.nn.conv1d(audio, relax.const(cos), strides=HOP), "real")
            imag = builder.emit(op.nn.conv1d(audio, relax.const(sin), strides=HOP), "imag")
            power = builder.emit(op.add(op.multiply(real, real), op.multiply(imag, imag)))
            log = builder.emit(op.log(op.add(op.sqrt(power), relax.const(1e-7, "float32"))))
            centred = builder.emit(op.subtract(log, op.mean(log, axis=[2], keepdims=True)))
            variance = builder.emit(op.mean(op.multiply(centred, centred), axis=[2],
                                            keepdims=True))
            spectrum = builder.emit(op.divide(centred, op.sqrt(
                op.add(variance, relax.const(1e-5, "float32")))))
            h = builder.emit(op.reshape(spectrum, (1, 1, BINS, -1)))
            for weight in (w1, w2, w3):
                h = builder.emit(op.nn.relu(op.nn.conv2d(h, relax.const(weight), padding=1)))
            frames = builder.emit(op.permute_dims(op.mean(h, axis=[2]), [0, 2, 1]))
            scores = builder.emit_output(op.sigmoid(op.matmul(frames, relax.const(dense))))
        builder.emit_func_output(scores)
    return builder.get()


def tones(count, seed=1):
    """Batches of two tones on the bins' pitches over a faint noise floor."""
    rng = np.random.default_rng(seed)
    t = np.arange(SAMPLES) / 16000.0
    batches = []
    for _ in range(count):
        pitch = 55.0 * 2 ** (rng.integers(0, BINS, 2) / 12.0)
        signal = 0.5 * np.sin(2 * np.pi * pitch[0] * t) + 0.2 * np.sin(2 * np.pi * pitch[1] * t)
        signal += 1e-4 * rng.standard_normal(SAMPLES)
        batches.append([signal.astype("float32")[None, None, :]])
    return batches


@pytest.fixture(scope="module")
def model():
    mod = constant_q_cnn()
    batches = tones(4)
    vm = compile_module(mod)
    reference = [out for batch in batches for out in run(vm, batch)]
    return mod, batches, reference


def _error(mod, batches, reference):
    vm = compile_module(mod)
    return agreement(reference, [out for batch in batches for out in run(vm, batch)]).relative_l2


@pytest.mark.parametrize("dtype, tolerance", [("float16", 1e-3), ("bfloat16", 1e-2)])
def test_the_search_keeps_the_front_end_and_the_macs_low(model, dtype, tolerance):
    mod, batches, reference = model
    converted, _ = relay_amp.convert(mod, dtype)
    assert _error(converted, batches, reference) > 5 * tolerance  # silent without the search
    found, report = relay_amp.auto_mixed_precision(mod, batches, tolerance, dtype=dtype)
    search = report.search
    assert search.met and _error(found, batches, reference) <= tolerance
    assert sorted(search.fp32_bindings) == ["imag", "real"]
    assert report.low_precision_mac_fraction() >= 0.9
    assert search.fp32_macs == sum(report.find(n).macs for n in ("real", "imag"))
    assert 0 < search.fp32_macs / search.total_macs < 0.1
    assert [name for name, _ in search.contributors[:2]] == search.fp32_bindings
    assert search.evaluations <= 4
    assert "2 binding(s) kept in float32 (3.5% of MACs)" in search.explain()
    row = report.find("real")
    assert row.code == "search_fallback" and f"alone in {dtype}" in row.rule


def test_effects_rank_what_local_errors_rank_last(model):
    mod, batches, _ = model
    converted, report = relay_amp.convert(mod, "float16")
    names = [r.name for r in report.converted]
    effects = output_effects(mod, batches[:2], names, "float16")
    local = local_errors(mod, batches[:2], names, "float16")
    assert set(effects) == set(names) == set(local)
    by_effect = sorted(names, key=lambda n: -effects[n])
    by_local = sorted(names, key=lambda n: -local[n])
    assert set(by_effect[:2]) == {"real", "imag"}
    assert set(by_local[-2:]) == {"real", "imag"}  # the local error points the other way
    assert min(effects["real"], effects["imag"]) > 10 * max(effects[n] for n in by_effect[2:])


def test_effects_leave_the_module_alone_and_measure_an_overflow(model):
    mod, batches, _ = model
    before = mod["main"]
    assert output_effects(mod, batches[:1], [], "float16") == {}
    big = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4,), "float32"))
    with big.function("main", [x]):
        with big.dataflow():
            scaled = big.emit(relax.op.multiply(x, relax.const(1e4, "float32")), "scaled")
            squared = big.emit(relax.op.multiply(scaled, scaled), "squared")
            out = big.emit_output(relax.op.sqrt(squared))
        big.emit_func_output(out)
    effects = output_effects(big.get(), [[np.full(4, 3.0, "float32")]], ["scaled", "squared"],
                             "float16")
    assert effects["squared"] == np.inf and effects["scaled"] < 1e-3
    assert mod["main"].same_as(before)


def test_ranked_by_local_error_the_same_search_keeps_the_macs_in_float32(model):
    mod, batches, _ = model
    _, report = relay_amp.auto_mixed_precision(mod, batches, 1e-3, ranking="local")
    assert report.search.method == "local error" and report.search.contributors == []
    assert report.low_precision_mac_fraction() < 0.5  # what the effect ranking avoids
    assert "local float16 error" in report.find("real").rule
    with pytest.raises(ValueError, match="ranking"):
        relay_amp.auto_mixed_precision(mod, batches, 1e-3, ranking="global")
