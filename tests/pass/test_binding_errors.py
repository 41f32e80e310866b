"""``relay_amp.binding_errors.binding_errors``: each binding of a converted module against float32,
matched by name; what cannot be matched is named with the reason, never guessed at."""

import numpy as np
import pytest
from tvm import relax

import relay_amp
from relay_amp.binding_errors import binding_errors
from relay_amp.builds.pipeline import compile_module
from relay_amp.execution import agreement, run


def _module(second: str = "scaled"):
    """``x * 3`` then ``sqrt(that * that)``, a split in between; ``second`` names the product."""
    op = relax.op
    builder = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 8), "float32"))
    with builder.function("main", [x]):
        with builder.dataflow():
            tripled = builder.emit(op.multiply(x, relax.const(3.0, "float32")), "tripled")
            parts = builder.emit(op.split(tripled, 2, axis=1), "parts")
            scaled = builder.emit(op.multiply(tripled, tripled), second)
            out = builder.emit_output(op.sqrt(scaled))
        builder.emit_func_output(out)
    return builder.get(), parts


def test_each_binding_against_float32_by_name():
    mod, _ = _module()
    batches = [[np.random.default_rng(i).uniform(-2, 2, (2, 8)).astype("float32")]
               for i in range(2)]
    converted, _ = relay_amp.convert(mod, "float16")
    errors, unmatched = binding_errors(mod, converted, batches)
    assert list(errors) == ["tripled", "scaled", "gv"]  # execution order; the split is a tuple
    assert unmatched == {"parts": "not a float tensor"}
    assert all(0 <= e.relative_l2 < 2e-3 and e.nonfinite == 0 for e in errors.values())
    outputs = [run(compile_module(m), b) for m in (mod, converted) for b in batches]
    whole = agreement([o for out in outputs[:2] for o in out], [o for out in outputs[2:]
                                                               for o in out])
    assert errors["gv"].relative_l2 == pytest.approx(whole.relative_l2, rel=1e-6, abs=1e-12)
    assert errors["gv"].max_abs == pytest.approx(whole.max_abs, rel=1e-6)


def test_a_renamed_binding_is_named_not_guessed():
    mod, _ = _module()
    renamed, _ = _module(second="product")
    batch = [np.ones((2, 8), "float32")]
    errors, unmatched = binding_errors(mod, renamed, [batch])
    assert "renamed, split or removed" in unmatched["scaled"]
    assert errors["gv"].relative_l2 == 0.0 and errors["tripled"].max_abs == 0.0


def test_an_overflow_is_an_infinite_error():
    mod, _ = _module()
    converted, _ = relay_amp.convert(mod, "float16", policy=relay_amp.Policy("float16")
                                     .include("scaled"))
    errors, _ = binding_errors(mod, converted, [[np.full((2, 8), 300.0, "float32")]])
    overflowed = [name for name, e in errors.items() if e.nonfinite]
    assert overflowed and all(errors[n].relative_l2 == np.inf for n in overflowed)
