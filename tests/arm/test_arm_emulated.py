"""Converted modules compiled for aarch64 run on an emulated aarch64 CPU through TVM's RPC, the
way a user runs them on a board (``relay_amp.builds.remote``: export with the cross compiler,
upload, ``load_module``, the Relax VM on the session's CPU).

Needs ``bash scripts/arm/setup_emulator.sh`` (QEMU user mode, the aarch64 cross compiler, the
RPC server): without it these tests skip, unless ``RELAY_AMP_ARM_REQUIRED=1`` (CI's arm step)
makes that a failure. Marker ``arm``; the fast lane leaves them out.
"""


import numpy as np
import pytest
import tvm
from tvm import relax

import relay_amp
from relay_amp.builds import remote
from relay_amp.eval.arm_emulator import (
    TARGET_BF16,
    TARGET_FP16,
    TARGET_FP32,
    ArmEmulator,
    EmulatorError,
    emulated_session,
)

pytestmark = pytest.mark.arm

#: float32 on the emulated CPU against the same float32 model compiled for and run on this host.
FLOAT32_TOLERANCE = 1e-5
#: Low precision against the float32 host run (relative L2 over all outputs): the project's
#: tolerances for float32 accumulation, the aarch64 default (tests/pass/test_numeric.py).
TOLERANCE = {"float16": 1e-3, "bfloat16": 1e-2}
#: relay_amp's float16 summed in blocks on the emulated CPU against the same module on this host
#: (relative L2), where the host has half-precision arithmetic (AVX512-FP16: identical on both
#: test models, 2026-11-28, on an Emerald Rapids host). A host without it (AVX2 with F16C,
#: znver3, 2026-11-29) computes the half operations in float32 and rounds less often:
#: 7.0e-4 and 7.6e-4 there, so it only bounds the difference by float16's own tolerance.
BLOCKS_HOST_TOLERANCE = 1e-4
TARGETS = {"float32": TARGET_FP32, "float16": TARGET_FP16, "bfloat16": TARGET_BF16}

_op = relax.op


class _Weights:
    """Seeded constant weights, scaled by 1/sqrt(fan-in) as an initialiser would."""

    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)

    def __call__(self, shape, fan_in=None, scale=None):
        scale = scale if scale is not None else 1.0 / np.sqrt(fan_in or shape[-1])
        return relax.const((self.rng.standard_normal(shape) * scale).astype("float32"))

    def near_one(self, shape):
        return relax.const((1.0 + 0.1 * self.rng.standard_normal(shape)).astype("float32"))


def _function(name, inputs, body):
    """One ``main`` of ``inputs`` (name, shape) whose dataflow block ``body(emit, *vars)``
    builds; returns the IRModule."""
    params = [relax.Var(n, relax.TensorType(shape, "float32")) for n, shape in inputs]
    builder = relax.BlockBuilder()
    with builder.function("main", params):
        with builder.dataflow():
            out = builder.emit_output(body(builder.emit, *params))
        builder.emit_func_output(out)
    return builder.get()


def convnet_block():
    """conv2d + bias + relu, twice (8 -> 16 -> 16 channels, 16x16)."""
    w = _Weights(1)

    def body(emit, x):
        h = x
        for cin, cout in ((8, 16), (16, 16)):
            h = emit(_op.nn.conv2d(h, w((cout, cin, 3, 3), fan_in=cin * 9), padding=[1, 1]))
            h = emit(_op.nn.relu(_op.add(h, w((1, cout, 1, 1), scale=0.1))))
        return h

    return _function("convnet", [("x", (1, 8, 16, 16))], body)


def depthwise_block():
    """Depthwise 3x3 conv + bias + relu, then pointwise 1x1 conv + bias (16 -> 32 channels)."""
    w = _Weights(2)

    def body(emit, x):
        h = emit(_op.nn.conv2d(x, w((16, 1, 3, 3), fan_in=9), padding=[1, 1], groups=16))
        h = emit(_op.nn.relu(_op.add(h, w((1, 16, 1, 1), scale=0.1))))
        h = emit(_op.nn.conv2d(h, w((32, 16, 1, 1), fan_in=16)))
        return emit(_op.add(h, w((1, 32, 1, 1), scale=0.1)))

    return _function("depthwise", [("x", (1, 16, 16, 16))], body)


def _attention(emit, w, h, seq, hidden, heads, bias):
    """Multi-head self-attention with an explicit softmax; the output projection included."""
    head = hidden // heads

    def project(t):
        t = emit(_op.matmul(t, w((hidden, hidden))))
        return emit(_op.add(t, w((hidden,), scale=0.1))) if bias else t

    def split(t):
        return emit(_op.permute_dims(_op.reshape(t, (1, seq, heads, head)), [0, 2, 1, 3]))

    q, k, v = (split(project(h)) for _ in range(3))
    scores = emit(_op.matmul(q, _op.permute_dims(k, [0, 1, 3, 2])))
    probs = emit(_op.nn.softmax(_op.multiply(scores, relax.const(head ** -0.5, "float32")),
                                axis=-1))
    context = emit(_op.matmul(probs, v))
    context = emit(_op.reshape(_op.permute_dims(context, [0, 2, 1, 3]), (1, seq, hidden)))
    return project(context)


def bert_layer(seq=16, hidden=64, heads=4, inner=256):
    """A BERT-style post-norm encoder layer: attention, add + layer_norm, GELU FFN, add +
    layer_norm."""
    w = _Weights(3)

    def body(emit, x):
        h = emit(_op.add(x, _attention(emit, w, x, seq, hidden, heads, bias=True)))
        h = emit(_op.nn.layer_norm(h, w.near_one((hidden,)), w((hidden,), scale=0.1), axes=[-1]))
        f = emit(_op.nn.gelu(_op.add(_op.matmul(h, w((hidden, inner))), w((inner,), scale=0.1))))
        f = emit(_op.add(_op.matmul(f, w((inner, hidden))), w((hidden,), scale=0.1)))
        h = emit(_op.add(h, f))
        return emit(_op.nn.layer_norm(h, w.near_one((hidden,)), w((hidden,), scale=0.1),
                                      axes=[-1]))

    return _function("bert", [("x", (1, seq, hidden))], body)


def llama_layer(seq=16, hidden=64, heads=4, inner=176):
    """A LLaMA-style pre-norm decoder layer without rotary embedding: rms_norm, attention,
    residual add, rms_norm, SiLU-gated MLP, residual add."""
    w = _Weights(4)

    def body(emit, x):
        h = emit(_op.nn.rms_norm(x, w.near_one((hidden,)), axes=[-1]))
        x = emit(_op.add(x, _attention(emit, w, h, seq, hidden, heads, bias=False)))
        h = emit(_op.nn.rms_norm(x, w.near_one((hidden,)), axes=[-1]))
        gate = emit(_op.nn.silu(_op.matmul(h, w((hidden, inner)))))
        up = emit(_op.matmul(h, w((hidden, inner))))
        return emit(_op.add(x, _op.matmul(_op.multiply(gate, up), w((inner, hidden)))))

    return _function("llama", [("x", (1, seq, hidden))], body)


MODELS = {"convnet": convnet_block, "depthwise": depthwise_block, "bert": bert_layer,
          "llama": llama_layer}
_HOST_RUNS: dict = {}


def _inputs(mod):
    rng = np.random.default_rng(0)
    return [rng.standard_normal([int(d) for d in p.ty.shape.values]).astype("float32")
            for p in mod["main"].params]


def _host_float32(name):
    """The float32 model compiled for this host and run here: inputs and outputs."""
    if name not in _HOST_RUNS:
        mod = MODELS[name]()
        inputs = _inputs(mod)
        vm = relay_amp.compile_module(mod)
        _HOST_RUNS[name] = (inputs, relay_amp.run(vm, inputs))
    return _HOST_RUNS[name]


def _build_for_arm(name, dtype, tmp_path):
    """Convert (unless float32) for the aarch64 target, compile, export with the cross
    compiler; returns the library and the conversion's report."""
    target = TARGETS[dtype]
    mod, report = MODELS[name](), None
    if dtype != "float32":
        mod, report = relay_amp.convert(mod, dtype, target=target)
    executable = tvm.compile(mod, target=tvm.target.Target(target))
    return remote.export_for(executable, tmp_path / f"{name}_{dtype}.so", target), report


@pytest.mark.parametrize("name", sorted(MODELS))
def test_float32_on_aarch64_equals_the_host_run(emulator, name, tmp_path):
    inputs, reference = _host_float32(name)
    lib, _ = _build_for_arm(name, "float32", tmp_path)
    outputs = emulator.run(lib, inputs)
    agreement = relay_amp.agreement(reference, outputs)
    assert agreement.nonfinite == 0 and agreement.relative_l2 <= FLOAT32_TOLERANCE, agreement


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_low_precision_on_aarch64_stays_near_float32(emulator, name, dtype, tmp_path):
    inputs, reference = _host_float32(name)
    lib, report = _build_for_arm(name, dtype, tmp_path)
    assert report.converted, f"nothing converted to {dtype} for {TARGETS[dtype]}"
    outputs = emulator.run(lib, inputs)
    agreement = relay_amp.agreement(reference, outputs)
    assert agreement.nonfinite == 0 and agreement.relative_l2 <= TOLERANCE[dtype], agreement


def test_fullfp16_code_on_a_cpu_without_fp16_fails_loudly(emulator, tmp_path):
    """Cortex-A53 has no FP16 arithmetic: the +fullfp16 build's ``fmla v.8h`` raises SIGILL on
    it, and the run says so instead of returning anything."""
    inputs, _ = _host_float32("convnet")
    lib, _ = _build_for_arm("convnet", "float16", tmp_path)
    with ArmEmulator(cpu="cortex-a53") as a53:
        with pytest.raises(EmulatorError, match="raised SIGILL.*instruction it lacks"):
            a53.run(lib, inputs)
        # the server outlives the session that crashed: float32 code still runs there
        float32_lib, _ = _build_for_arm("convnet", "float32", tmp_path)
        assert a53.run(float32_lib, inputs)[0].shape == (1, 16, 16, 16)


def test_the_users_call_in_a_plain_rpc_session(emulator, tmp_path):
    """``run_remote`` on a ``tvm.rpc`` session, as a user calls it with ``tvm.rpc.connect`` to
    a board (here the session of a fresh emulator)."""
    inputs, reference = _host_float32("depthwise")
    lib, _ = _build_for_arm("depthwise", "float32", tmp_path)
    with emulated_session() as session:
        assert isinstance(session, tvm.rpc.RPCSession)
        outputs = remote.run_remote(session, lib, inputs)
    assert relay_amp.agreement(reference, outputs).relative_l2 <= FLOAT32_TOLERANCE


@pytest.mark.parametrize("cpu", ["neoverse-n1", "cortex-a76", "cortex-a53"])
def test_a_build_for_a_core_runs_on_that_core(cpu, tmp_path):
    """``mcpu`` decides the path (relay_amp.targets.arm_cpu_path): built for a core with
    relay_amp's build, float16 runs under QEMU's model of that core without SIGILL and close
    to float32, float16 arithmetic where the core has it (A76, N1), float32 where not (A53)."""
    target = {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": cpu}
    inputs, reference = _host_float32("convnet")
    mod, report = relay_amp.convert(MODELS["convnet"](), "float16", target=target)
    assert bool(report.converted) == relay_amp.targets.arm_cpu_path(cpu)["features"]["fullfp16"]
    executable = relay_amp.builds.pipeline.build(mod, target)
    lib = remote.export_for(executable, tmp_path / f"convnet_{cpu}.so", target)
    with ArmEmulator(cpu=cpu) as core:
        outputs = core.run(lib, inputs)
    agreement = relay_amp.agreement(reference, outputs)
    assert agreement.nonfinite == 0 and agreement.relative_l2 <= TOLERANCE["float16"], agreement


@pytest.mark.parametrize("name", sorted(MODELS))
def test_relay_amps_bfloat16_build_runs_on_bfmmla_near_float32(counter, name, tmp_path):
    """relay_amp's ``+bf16`` build (relay_amp.builds.bfmmla, relay_amp.builds.bfdot): every
    matmul and convolution with a constant weight on ``bfmmla`` (``bfdot`` where a tile's
    rows or columns do not fit or are too few to pay: the blocks' convolutions), depthwise
    ones on ``bfmlalb``/``bfmlalt``, no float32 FMA left in the convolutions; outputs as near
    float32 as TVM's bfloat16 build's (BFMMLA's rounding of each step of four products is
    within float32's of the sums)."""
    inputs, reference = _host_float32(name)
    mod, _ = relay_amp.convert(MODELS[name](), "bfloat16", target=TARGET_BF16)
    executable = relay_amp.builds.pipeline.build(mod, TARGET_BF16)
    lib = remote.export_for(executable, tmp_path / f"{name}_bf16.so", TARGET_BF16)
    count = counter.count(lib, inputs)
    mix = count.mix()
    assert mix["bfmmla"] + mix["bfdot"] > 0, mix
    if name in ("bert", "llama"):  # the convolutions' channels are fewer than BFMMLA's 32
        assert mix["bfmmla"] > 0, mix
    assert (mix["bfmlal"] > 0) == (name == "depthwise"), mix
    if name in ("convnet", "depthwise"):
        assert mix["fma .4s"] == 0, mix
    agreement = relay_amp.agreement(reference, count.outputs)
    assert agreement.nonfinite == 0 and agreement.relative_l2 <= TOLERANCE["bfloat16"], agreement
    plain, _ = _build_for_arm(name, "bfloat16", tmp_path)
    tvms = relay_amp.agreement(reference, counter.run(plain, inputs))
    assert agreement.relative_l2 <= 1.1 * tvms.relative_l2 + 1e-6, (agreement, tvms)


@pytest.mark.parametrize("name", ["convnet", "bert"])
def test_float16_summed_in_blocks_runs_on_half_fmas_as_it_does_on_the_host(counter, name,
                                                                           tmp_path):
    """``Policy.set_accumulation_block`` (blocks of 16) for ``+fullfp16``: the blocked dot
    products run on ``fmla v.8h`` (8 multiply-accumulates each) with no scalar half FMA, and the
    emulated CPU computes what the same module computes on this host: to float32 rounding on an
    x86 with half arithmetic (it rounds each half operation where aarch64 may contract a
    multiply and an add), to float16's tolerance on one without (``BLOCKS_HOST_TOLERANCE``)."""
    inputs, reference = _host_float32(name)
    policy = relay_amp.Policy("float16")
    for op in ("matmul", "nn.conv2d"):
        policy.set_accumulation_block(op, 16)
    mod, report = relay_amp.convert(MODELS[name](), policy=policy, target=TARGET_FP16)
    dots = [row for row in report.rows if row.op in ("matmul", "nn.conv2d")]
    assert dots and all(row.reasons[-1].code == "blocked_accumulation" for row in dots)
    host = relay_amp.run(relay_amp.compile_module(mod), inputs)
    executable = relay_amp.builds.pipeline.build(mod, TARGET_FP16)
    count = counter.count(remote.export_for(executable, tmp_path / f"{name}.so", TARGET_FP16),
                          inputs)
    mix = count.mix()
    assert mix["fma h"] == 0 and 8 * mix["fma .8h"] >= 0.5 * sum(r.macs for r in dots), mix
    emulated = relay_amp.agreement(host, count.outputs)
    half_host = tvm.target.codegen.target_has_features(
        "avx512fp16", tvm.target.Target(relay_amp.host_target()))
    bound = BLOCKS_HOST_TOLERANCE if half_host else TOLERANCE["float16"]
    assert emulated.nonfinite == 0 and emulated.relative_l2 <= bound, (emulated, half_host)
    blocked = relay_amp.agreement(reference, count.outputs)
    assert blocked.relative_l2 <= TOLERANCE["float16"], blocked
