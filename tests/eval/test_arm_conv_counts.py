"""scripts/arm_conv_counts.py: a model's distinct convolutions and matmuls, each rebuilt alone
in the layout relay_amp's aarch64 build gives it (the counting itself needs the emulator: the
arm lane's tests count the same builds)."""

import pathlib
import sys

import numpy as np
from tvm import relax

sys.path.insert(0, str(pathlib.Path(__file__).parents[2] / "scripts"))

import arm_conv_counts  # noqa: E402


def _model():
    rng = np.random.default_rng(0)
    x = relax.Var("x", relax.TensorType((1, 8, 14, 14), "float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            y = x
            for _ in range(2):  # the same shape twice
                w = relax.const(rng.standard_normal((8, 8, 3, 3)).astype("float32"))
                y = builder.emit(relax.op.nn.conv2d(y, w, padding=[1, 1]))
            w = relax.const(rng.standard_normal((16, 8, 1, 1)).astype("float32"))
            y = builder.emit(relax.op.nn.conv2d(y, w, strides=[2, 2]))
            y = builder.emit(relax.op.reshape(y, (1, 16 * 7 * 7)))
            w = relax.const(rng.standard_normal((16 * 7 * 7, 10)).astype("float32"))
            out = builder.emit_output(relax.op.matmul(y, w))
        builder.emit_func_output(out)
    return builder.get()


def test_each_distinct_shape_once_with_its_count():
    found = dict(arm_conv_counts.shapes(_model()))
    assert sorted(found.values()) == [1, 1, 2]
    square = next(key for key in found if key[2] == (8, 8, 3, 3))
    assert found[square] == 2 and square[3] == (1, 1) and square[6] == "NCHW"


def test_a_shape_is_rebuilt_in_nhwc_with_its_multiply_accumulates():
    rng = np.random.default_rng(1)
    macs = {}
    for key, _ in arm_conv_counts.shapes(_model()):
        mod, x, macs[key[2]] = arm_conv_counts.single(key, rng)
        call = mod["main"].body.blocks[0].bindings[0].value
        if key[0] == "relax.nn.conv2d":
            assert str(call.attrs.data_layout) == "NHWC" and x.shape[-1] == key[1][1]
            assert str(call.attrs.kernel_layout) == "HWIO"
    assert macs[(8, 8, 3, 3)] == 14 * 14 * 8 * 8 * 9
    assert macs[(16, 8, 1, 1)] == 7 * 7 * 16 * 8
    assert macs[(16 * 7 * 7, 10)] == 16 * 7 * 7 * 10
