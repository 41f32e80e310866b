"""relay_amp.builds.fast_math: float32 sigmoid, softmax, erf, tanh, GELU and small powers in
vector arithmetic on CPUs, within a stated bound of the exact values, NaN kept."""

import re

import numpy as np
import pytest
import tvm
from helpers import asm_functions
from tvm import relax

import relay_amp
from relay_amp.builds.fast_math import ERROR_BOUND, vector_math

NEON = {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon"]}


def _module(op, shape, dtype="float32", **attrs):
    x = relax.Var("x", relax.TensorType(shape, dtype))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            out = builder.emit_output(op(x, **attrs))
        builder.emit_func_output(out)
    return builder.get()


def _run(mod, x):
    executable = tvm.compile(mod, target="llvm")
    return relax.VirtualMachine(executable, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()


def _exact_softmax(x):
    x = x.astype("float64")
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_sigmoid_is_within_the_bound_and_as_close_as_tvms_build():
    """Over 2**20 inputs across [-100, 100] and the limits of exp's range: every output within
    ``ERROR_BOUND`` of the exact sigmoid, and no further than TVM's own build's worst."""
    x = np.concatenate([np.linspace(-100, 100, 1 << 20), [88.3762626647949, -88.3762626647949,
                                                          -88.5, 88.5, 0.0]]).astype("float32")
    mod = _module(relax.op.sigmoid, x.shape)
    exact = 1 / (1 + np.exp(-x.astype("float64")))
    ours = np.abs(_run(vector_math()(mod), x) - exact).max()
    tvms = np.abs(_run(mod, x) - exact).max()
    assert ours <= ERROR_BOUND and ours <= tvms * 1.01, (ours, tvms)


def test_softmax_is_within_the_bound():
    x = (np.random.default_rng(0).standard_normal((512, 64)) * 10).astype("float32")
    mod = _module(relax.op.nn.softmax, x.shape, axis=-1)
    ours = np.abs(_run(vector_math()(mod), x) - _exact_softmax(x)).max()
    assert ours <= ERROR_BOUND, ours


def test_nan_and_infinities_come_out_as_from_expf():
    """A NaN stays a NaN (a clamp by max/min would make it a number), infinities saturate."""
    x = np.array([np.nan, np.inf, -np.inf, 0.0], "float32")
    sigmoid = _run(vector_math()(_module(relax.op.sigmoid, x.shape)), x)
    assert np.isnan(sigmoid[0]) and sigmoid[1] == 1.0 and 0 <= sigmoid[2] < 1e-38
    assert sigmoid[3] == 0.5
    rows = np.array([[0.0, np.nan, 1.0], [0.0, 1.0, 2.0]], "float32")
    softmax = _run(vector_math()(_module(relax.op.nn.softmax, rows.shape, axis=-1)), rows)
    assert np.isnan(softmax[0]).all() and np.isfinite(softmax[1]).all()


def test_only_float32_sigmoid_and_softmax_are_rewritten():
    for dtype, rewritten in (("float32", True), ("float16", False)):
        for op, attrs in ((relax.op.sigmoid, {}), (relax.op.nn.softmax, {"axis": -1})):
            mod = vector_math()(_module(op, (4, 8), dtype, **attrs))
            text = mod.script()
            assert ("R.sigmoid" not in text and "R.nn.softmax" not in text) == rewritten, text


def test_the_exp_reads_its_input_once():
    """The polynomial uses its argument about 25 times; written out, a sigmoid folded into a
    tile copies the expression before it that often, and TVM's TIR passes took seconds a
    kernel. Each temporary is bound once (``Let``), so the legalized kernel loads ``x`` once."""
    from tvm.relax.transform import LegalizeOps

    mod = LegalizeOps()(vector_math()(_module(relax.op.sigmoid, (4, 8))))
    (kernel,) = (f for f in mod.functions.values() if isinstance(f, tvm.tirx.PrimFunc))
    (store,) = (line for line in kernel.script().splitlines() if "exp[v_i0, v_i1] =" in line)
    assert store.count("compute[") == 1 and store.count("T.floor(") == 1, store


@pytest.mark.parametrize("op, attrs", [(relax.op.sigmoid, {}), (relax.op.nn.softmax, {"axis": 1})])
def test_aarch64_kernels_call_no_expf_and_run_on_vectors(op, attrs):
    """In ``relay_amp.cpu_pipeline``'s aarch64 build the kernel calls no ``expf`` (TVM's build
    calls it once an element) and computes the exponential in vector FMAs."""
    mod = _module(op, (1, 16, 64), **attrs)
    target = tvm.target.Target(NEON)
    for schedules, calls in ((True, False), (False, True)):
        executable = tvm.compile(mod, target=target,
                                 relax_pipeline=relay_amp.cpu_pipeline(NEON, schedules))
        asm = "\n".join(m.inspect_source("asm") for m in [executable.mod, *executable.mod.imports]
                        if m.kind == "llvm")
        kernels = "\n".join(body for name, body in asm_functions(asm).items()
                            if name.endswith("_compute_") or name.startswith("__tvm_ffi_"))
        assert bool(re.search(r"\bbl\s+expf\b", kernels)) == calls
        if schedules:
            assert re.search(r"\bfmla\s+v\d+\.4s", kernels)


def _conv_silu(dtype):
    """A convolution, a bias and a SiLU before another convolution, converted to ``dtype``
    for aarch64 with BF16 (the SiLU stays float32, its result cast for the next one)."""
    rng = np.random.default_rng(1)
    x = relax.Var("x", relax.TensorType((1, 16, 10, 10), "float32"))
    w1, w2 = (relax.const((rng.standard_normal((16, 16, 3, 3)) / 8).astype("float32"))
              for _ in range(2))
    bias = relax.const(rng.standard_normal((1, 16, 1, 1)).astype("float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            y = builder.emit(relax.op.add(relax.op.nn.conv2d(x, w1, padding=1), bias))
            y = builder.emit(relax.op.multiply(y, relax.op.sigmoid(y)))
            out = builder.emit_output(relax.op.nn.conv2d(y, w2, padding=1))
        builder.emit_func_output(out)
    if dtype == "float32":
        return builder.get()
    return relay_amp.convert(builder.get(), dtype, target=BF16)[0]


BF16 = {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon", "+bf16"]}


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_a_silu_folded_before_a_cast_builds_for_aarch64(dtype):
    """The SiLU folds into the convolution's write-back with the cast after it. TVM's
    bfloat16 legalization writes the rounded value out twice, and its vectorizer failed on the
    ``Let`` it then met twice: a module with bfloat16 tensors gets the ``exp`` written out."""
    mod = _conv_silu(dtype)
    lowered = vector_math()(mod)
    kernels = "\n".join(f.script() for f in lowered.functions.values()
                        if isinstance(f, tvm.tirx.PrimFunc))
    assert ("T.Let(" in kernels) == (dtype != "bfloat16"), kernels
    executable = tvm.compile(mod, target=tvm.target.Target(BF16),
                             relax_pipeline=relay_amp.cpu_pipeline(BF16))
    asm = "\n".join(m.inspect_source("asm") for m in [executable.mod, *executable.mod.imports]
                    if m.kind == "llvm")
    assert re.search(r"\bfmla\s+v\d+\.4s|\bbfdot\b|\bbfmlal[bt]\b", asm)


def _exact(name, x):
    from scipy.special import erf

    x = x.astype("float64")
    return {"erf": lambda: erf(x), "tanh": lambda: np.tanh(x),
            "gelu": lambda: x * 0.5 * (1 + erf(x / np.sqrt(2))),
            "gelu_tanh": lambda: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi)
                                                        * (x + 0.044715 * x ** 3))),
            "square": lambda: x ** 2, "cube": lambda: x ** 3}[name]()


TRANSCENDENTALS = {
    "erf": (relax.op.erf, "R.erf"), "tanh": (relax.op.tanh, "R.tanh"),
    "gelu": (relax.op.nn.gelu, "R.nn.gelu"), "gelu_tanh": (relax.op.nn.gelu_tanh, "R.nn.gelu"),
    "square": (lambda x: relax.op.power(x, relax.const(2.0)), "R.power"),
    "cube": (lambda x: relax.op.power(x, relax.const(3.0)), "R.power"),
}


@pytest.mark.parametrize("name", sorted(TRANSCENDENTALS))
def test_erf_tanh_gelu_and_powers_are_within_the_bound(name):
    """Over 2**20 inputs across [-20, 20]: erf and tanh within ``ERROR_BOUND`` absolute, a
    GELU within ``ERROR_BOUND * max(1, |x|)``, a power within ``ERROR_BOUND`` relative; the op
    is gone from the module (no ``erff``/``tanhf``/``powf`` call is left to LLVM)."""
    op, text = TRANSCENDENTALS[name]
    x = np.linspace(-20, 20, 1 << 20).astype("float32")
    mod = _module(op, x.shape)
    rewritten = vector_math()(mod)
    assert text not in rewritten.script()
    error = np.abs(_run(rewritten, x) - _exact(name, x))
    scale = np.maximum(1, np.abs(x)) if "gelu" in name else np.maximum(
        1, np.abs(_exact(name, x))) if name in ("square", "cube") else 1
    assert (error / scale).max() <= ERROR_BOUND, (error / scale).max()


def test_a_nan_stays_a_nan_through_erf_tanh_and_gelu():
    """TVM's fast_erf and fast_tanh clamp with max/min, which would make a NaN a number."""
    x = np.array([np.nan, np.inf, -np.inf, 0.0, 1e-30], "float32")
    for name in ("erf", "tanh", "gelu", "gelu_tanh"):
        out = _run(vector_math()(_module(TRANSCENDENTALS[name][0], x.shape)), x)
        assert np.isnan(out[0]) and out[3] == 0.0, (name, out)
        if name in ("erf", "tanh"):
            assert out[1] == 1.0 and out[2] == -1.0, (name, out)


def test_float16_powers_are_rewritten_other_float16_ops_and_exponents_not():
    """A float16 power by 2 is written as products; a float16 GELU, erf and tanh stay TVM's
    (its erf in float32, ``erff``); a power by 2.5 or by a tensor stays ``R.power``."""
    for op, text, dtype, rewritten in (
            (lambda x: relax.op.power(x, relax.const(2.0, "float16")), "R.power", "float16",
             True),
            (relax.op.nn.gelu, "R.nn.gelu", "float16", False),
            (relax.op.erf, "R.erf", "float16", False), (relax.op.tanh, "R.tanh", "float16", False),
            (lambda x: relax.op.power(x, relax.const(2.5)), "R.power", "float32", False),
            (lambda x: relax.op.power(x, x), "R.power", "float32", False)):
        mod = vector_math()(_module(op, (4, 8), dtype))
        assert (text not in mod.script()) == rewritten, mod.script()
    x = np.linspace(-8, 8, 32).astype("float16").reshape(4, 8)
    mod = _module(lambda v: relax.op.power(v, relax.const(2.0, "float16")), (4, 8), "float16")
    np.testing.assert_array_equal(_run(vector_math()(mod), x), x * x)


def test_without_polynomial_erf_and_tanh_only_those_stay_tvms():
    """``cpu_pipeline`` on aarch64 leaves erf, tanh and the GELUs to TVM; sigmoid and powers
    are still rewritten."""
    for op, text, rewritten in ((relax.op.nn.gelu, "R.nn.gelu", False),
                                (relax.op.tanh, "R.tanh", False),
                                (relax.op.sigmoid, "R.sigmoid", True),
                                (TRANSCENDENTALS["cube"][0], "R.power", True)):
        mod = vector_math(polynomial_erf_tanh=False)(_module(op, (4, 8)))
        assert (text not in mod.script()) == rewritten, mod.script()
