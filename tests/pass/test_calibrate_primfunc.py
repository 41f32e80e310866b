"""Calibration and the paired run keep PrimFuncs that call_tir refers to."""

import numpy as np
from tvm import relax, topi

import relay_amp
from relay_amp import fallback


def _with_prim_func():
    x = relax.Var("x", relax.TensorType((2, 8), "float32"))
    w = relax.Var("w", relax.TensorType((8, 8), "float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x, w]):
        with builder.dataflow():
            lv = builder.emit(relax.op.matmul(x, w), name_hint="lv")
            lv1 = builder.emit_te(topi.clip, lv, 0.0, 6.0, name_hint="lv1")  # a call_tir
            gv = builder.emit_output(relax.op.matmul(lv1, w), name_hint="gv")
        builder.emit_func_output(gv)
    return builder.get()


def test_calibrate_and_local_errors_with_call_tir():
    mod = _with_prim_func()
    batch = [np.ones((2, 8), "float32"), np.full((8, 8), 0.5, "float32")]
    calibration = relay_amp.calibrate(mod, [batch])
    assert calibration.observed_max("main", "lv1") == 4.0  # clip(8 * 0.5, 0, 6)
    errors = fallback.local_errors(mod, [batch], ["lv", "gv"], "float16")
    assert set(errors) == {"lv", "gv"} and all(e < 1e-3 for e in errors.values())
