"""relay_amp.builds.pooling: a pool in NHWC runs its window outside vectors of channels, its
running result in a buffer of the kernel's own (bfloat16: computed in float32, rounded once),
the blocks after it folded into its write-back. Outputs: the plain build's, bit for bit (each
window reduced in its order)."""

import numpy as np
import pytest
import tvm
from helpers import block_loops
from tvm import relax

import relay_amp
from relay_amp.builds import pooling
from relay_amp.builds.pooling import WindowReduction
from relay_amp.builds.schedule_rules import RuleLog

NEON = {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon"]}
BF16 = {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon", "+bf16"]}
AVX512 = {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "skylake-avx512"}

#: name -> (the pool, which a 1 x 1 convolution before it puts in NHWC; its window's values)
POOLS = {
    "max5": (lambda y: relax.op.nn.max_pool2d(y, 5, 1, 2), 25),
    "max2_add_relu": (lambda y: relax.op.nn.relu(relax.op.add(
        relax.op.nn.max_pool2d(y, 2, 2), relax.const(np.linspace(-1, 1, 32, dtype="float32")
                                                    .reshape(1, 32, 1, 1)))), 4),
    "avg3": (lambda y: relax.op.nn.avg_pool2d(y, 3, 1, 1), 9),
    "mean": (lambda y: relax.op.mean(y, axis=[2, 3], keepdims=True), 64),
}


def _model(pool, channels=32, size=8):
    rng = np.random.default_rng(0)
    x = relax.Var("x", relax.TensorType((1, channels, size, size), "float32"))
    weight = rng.standard_normal((channels, channels, 1, 1)).astype("float32") / channels
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            y = builder.emit(relax.op.nn.conv2d(x, relax.const(weight)))
            out = builder.emit_output(POOLS[pool][0](y))
        builder.emit_func_output(out)
    return builder.get()


def _pool_kernel(mod, target, dtype):
    target = tvm.target.Target(target)
    if dtype != "float32":
        mod, _ = relay_amp.convert(mod, dtype, target=target)
    log = RuleLog()
    with target:
        out = relay_amp.cpu_pipeline(target, rule_log=log)(mod)
    (name,) = [s.kernel for s in log.schedules if s.rule == "WindowReduction"]
    return out[name], log


def _loops_around(func, block_name) -> list:
    """The loops around each place ``block_name`` runs, outermost first, as
    ``(extent, kind)``."""
    return block_loops(func).get(block_name, [])


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("pool", sorted(POOLS))
def test_a_pools_window_runs_outside_vectors_of_channels(pool, dtype):
    """aarch64: the reduction's innermost loop is a vector of channels (up to four registers of
    the widest dtype), the window's loops are outside it and inside the tile loop, which runs
    in order (its running result is ``local``); the blocks after the pool are folded into its
    write-back."""
    func, log = _pool_kernel(_model(pool), BF16 if dtype == "bfloat16" else NEON, dtype)
    (loops,) = _loops_around(func, _update_block(func))
    *outer, (lanes, kind) = loops
    assert kind == tvm.tirx.ForKind.VECTORIZED
    assert lanes == 16 if dtype == "float32" else lanes in (16, 32)  # 4 x 4 or 4 x 8 lanes
    window = int(np.prod([extent for extent, _ in outer[1:]]))
    assert window == POOLS[pool][1]
    assert all(k == tvm.tirx.ForKind.SERIAL for _, k in outer)
    assert "the running result local" in " ".join(
        s.text() for s in log.schedules if s.rule == "WindowReduction")


def _update_block(func) -> str:
    import tvm_ffi

    names = []
    tvm_ffi.structural_walk(func.body, lambda n: names.append(n.name_hint) if (
        isinstance(n, tvm.s_tir.SBlock) and n.name_hint.endswith("_update")) else None)
    (name,) = names
    return name


def test_on_x86_the_tiles_run_in_parallel():
    """Where a tile's sums live in registers (x86), the tile loop is parallel and the running
    result is not a ``local`` buffer, which a parallel loop would allocate once an
    iteration."""
    func, log = _pool_kernel(_model("max5"), AVX512, "float32")
    (loops,) = _loops_around(func, _update_block(func))
    assert loops[0][1] == tvm.tirx.ForKind.PARALLEL
    assert loops[-1][1] == tvm.tirx.ForKind.VECTORIZED
    assert "in parallel" in " ".join(s.text() for s in log.schedules)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("pool", sorted(POOLS))
def test_outputs_are_the_plain_builds(monkeypatch, pool, dtype):
    """On this host, through relay_amp's CPU pipeline: the plain build's outputs bit for bit
    (each window reduced in the same order; a bfloat16 maximum is exact in float32, and the
    conversion sums an average pool or a mean in float32 already)."""
    mod = _model(pool)
    target = tvm.target.Target(relay_amp.host_target())
    if dtype != "float32":
        mod, _ = relay_amp.convert(mod, dtype, target=target)
    x = np.random.default_rng(1).standard_normal((1, 32, 8, 8)).astype("float32")

    def run():
        log = RuleLog()
        executable = tvm.compile(mod, target=target,
                                 relax_pipeline=relay_amp.cpu_pipeline(target, rule_log=log))
        out = relay_amp.execution.run(relax.VirtualMachine(executable, tvm.cpu()), [x])[0]
        return out, log.rules

    ours, rules = run()
    assert "WindowReduction" in rules.values()
    monkeypatch.setattr(pooling.WindowReduction, "apply", lambda self, func, target, tunable: None)
    plain, rules = run()
    assert "WindowReduction" not in rules.values()
    np.testing.assert_array_equal(ours, plain)


def test_channels_no_vector_divides_are_passed_on():
    """Three channels: no register of lanes divides them, so the rule passes the pool on and
    says why."""
    x = relax.Var("x", relax.TensorType((1, 9, 9, 3), "float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            out = builder.emit_output(relax.op.nn.max_pool2d(x, 3, 1, 1, layout="NHWC"))
        builder.emit_func_output(out)
    (func,) = [f for f in relax.transform.LegalizeOps()(builder.get()).functions.values()
               if isinstance(f, tvm.tirx.PrimFunc)]
    from relay_amp.builds import schedule_rules

    decisions = []
    token = schedule_rules._DECISIONS.set(decisions)
    try:
        assert WindowReduction().apply(func, tvm.target.Target(NEON), False) is None
    finally:
        schedule_rules._DECISIONS.reset(token)
    assert decisions == ["no vector of registers divides the channels: left to the next rule"]
