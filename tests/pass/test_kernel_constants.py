"""A kernel's constant tensors passed as one argument (relay_amp.builds.kernel_constants):
which kernels change, how they read the merged constant, their outputs, and a batch norm's
convolution with two arguments fewer."""

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import tirx as T

import relay_amp
from relay_amp.builds.constants import array
from relay_amp.builds.kernel_constants import constants_in_one_argument
from relay_amp.builds.neon_tiles import is_aarch64
from relay_amp.builds.schedule_rules import RuleLog

SHAPE = (1, 4, 4, 16)


@T.prim_func(private=True, s_tir=True)
def affine(x: T.Buffer((1, 4, 4, 16), "float32"), scale: T.Buffer((1, 1, 1, 16), "float32"),
           bound: T.Buffer((), "float32"), shift: T.Buffer((3,), "float32"),
           out: T.Buffer((1, 4, 4, 16), "float32")):
    for n, h, w, c in T.grid(1, 4, 4, 16):
        with T.sblock("affine"):
            vn, vh, vw, vc = T.axis.remap("SSSS", [n, h, w, c])
            out[vn, vh, vw, vc] = T.max(
                x[vn, vh, vw, vc] * scale[0, 0, 0, vc] + shift[vc % 3], bound[()])


@T.prim_func(private=True, s_tir=True)
def affine_merged(x: T.Buffer((1, 4, 4, 16), "float32"),
                  scale_merged: T.Buffer((48,), "float32"),
                  out: T.Buffer((1, 4, 4, 16), "float32")):
    scale = T.decl_buffer((1, 1, 1, 16), data=scale_merged.data)
    bound = T.decl_buffer((), data=scale_merged.data, elem_offset=16)
    shift = T.decl_buffer((3,), data=scale_merged.data, elem_offset=32)
    for n, h, w, c in T.grid(1, 4, 4, 16):
        with T.sblock("affine"):
            vn, vh, vw, vc = T.axis.remap("SSSS", [n, h, w, c])
            T.reads(x[vn, vh, vw, vc], scale[0, 0, 0, vc], shift[vc % 3], bound[()])
            T.writes(out[vn, vh, vw, vc])
            out[vn, vh, vw, vc] = T.max(
                x[vn, vh, vw, vc] * scale[0, 0, 0, vc] + shift[vc % 3], bound[()])


def _constants(seed: int) -> list:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((1, 1, 1, 16)).astype("float32"),
            np.array(-0.5 - seed, "float32"), rng.standard_normal(3).astype("float32")]


def _module(kernel, calls: int, constants=_constants, variable_last: bool = False):
    """``x`` through ``kernel`` ``calls`` times, each call with its own ``constants(n)``; with
    ``variable_last``, the last call's last constant is a function input."""
    x = relax.Var("x", relax.TensorType(SHAPE, "float32"))
    params = [x]
    last_shape = constants(0)[-1].shape
    if variable_last:
        params.append(relax.Var("last", relax.TensorType(last_shape, "float32")))
    builder = relax.BlockBuilder()
    gvar = builder.add_func(kernel, "kernel")
    with builder.function("main", params):
        with builder.dataflow():
            value = x
            for n in range(calls):
                args = [relax.const(c) if isinstance(c, np.ndarray) else c
                        for c in constants(n)]
                if variable_last and n == calls - 1:
                    args[-1] = params[-1]
                value = builder.emit(relax.call_tir(gvar, [value, *args],
                                                    relax.TensorType(SHAPE, "float32")))
            out = builder.emit_output(value)
        builder.emit_func_output(out)
    return builder.get()


def _kernels(mod):
    return {gvar.name_hint: func for gvar, func in mod.functions_items()
            if isinstance(func, tvm.tirx.PrimFunc)}


def _calls(mod):
    found = []
    relax.analysis.post_order_visit(mod["main"], lambda e: found.append(e) if isinstance(
        e, relax.Call) and isinstance(e.op, tvm.ir.Op) and e.op.name == "relax.call_tir"
        else None)
    return found


def _run(mod, *inputs):
    executable = tvm.compile(mod, target=tvm.target.Target(relay_amp.host_target()))
    vm = relax.VirtualMachine(executable, tvm.cpu())
    return vm["main"](*(tvm.runtime.tensor(x) for x in inputs)).numpy()


def test_a_kernels_constants_become_views_of_one_argument():
    """The kernel takes its scale, 0-d bound and shift as one buffer, each former parameter a
    view of it, in order, each from a multiple of 64 bytes (16 float32 elements); each call
    passes its own values there, zeros between them."""
    after = constants_in_one_argument()(_module(affine, calls=2))
    tvm.ir.assert_structural_equal(_kernels(after)["kernel"], affine_merged)
    for n, call in enumerate(_calls(after)):
        args = call.args[1].fields
        assert len(args) == 2
        scale, bound, shift = _constants(n)
        expected = np.zeros(48, "float32")
        expected[:16], expected[16], expected[32:35] = scale.ravel(), bound, shift
        np.testing.assert_array_equal(array(args[1]), expected)


@pytest.mark.parametrize("calls", [1, 3])
def test_the_outputs_are_the_unmerged_kernels_bit_for_bit(calls):
    """The same module built with and without the pass (TVM's pipeline, which schedules
    neither): the same outputs, NaN and infinity included."""
    before = _module(affine, calls=calls)
    x = np.random.default_rng(1).standard_normal(SHAPE).astype("float32")
    x.flat[:3] = [np.nan, -0.0, np.inf]
    np.testing.assert_array_equal(_run(constants_in_one_argument()(before), x),
                                  _run(before, x))


def test_a_constant_that_some_call_does_not_pass_is_left_out():
    """The last call's shift is a function input: the scale and the bound are merged, the
    shift stays a parameter of its own, and the outputs do not change."""
    before = _module(affine, calls=2, variable_last=True)
    after = constants_in_one_argument()(before)
    params = _kernels(after)["kernel"].params
    assert [tuple(int(n) for n in p.ty.shape) for p in params] == [SHAPE, (32,), (3,), SHAPE]
    assert [len(c.args[1].fields) for c in _calls(after)] == [3, 3]
    x = np.random.default_rng(2).standard_normal(SHAPE).astype("float32")
    shift = np.float32([0.25, -1, 2])
    np.testing.assert_array_equal(_run(after, x, shift), _run(before, x, shift))


def test_a_constant_another_call_passes_too_is_stored_once():
    """Both calls pass the same scale object: it stays an argument of its own (merged into
    each call's constant it would be stored twice); the bound and the shift are merged."""
    scale = relax.const(_constants(0)[0])
    after = constants_in_one_argument()(_module(
        affine, calls=2, constants=lambda n: [scale, *_constants(n)[1:]]))
    params = _kernels(after)["kernel"].params
    assert [tuple(int(n) for n in p.ty.shape) for p in params] == [
        SHAPE, (1, 1, 1, 16), (32,), SHAPE]
    assert all(call.args[1].fields[1].same_as(scale) for call in _calls(after))


@T.prim_func(private=True, s_tir=True)
def mixed(x: T.Buffer((1, 4, 4, 16), "float32"), scale: T.Buffer((16,), "float32"),
          index: T.Buffer((16,), "int32"), out: T.Buffer((1, 4, 4, 16), "float32")):
    for n, h, w, c in T.grid(1, 4, 4, 16):
        with T.sblock("k"):
            vn, vh, vw, vc = T.axis.remap("SSSS", [n, h, w, c])
            out[vn, vh, vw, vc] = x[vn, vh, vw, index[vc]] * scale[vc]


def test_constants_of_two_dtypes_are_not_merged_together():
    """A float32 scale and an int32 index: no dtype has two constants, the kernel keeps them."""
    before = _module(mixed, calls=1, constants=lambda n: [
        np.ones(16, "float32"), np.arange(16, dtype="int32")[::-1].copy()])
    after = constants_in_one_argument()(before)
    tvm.ir.assert_structural_equal(_kernels(after)["kernel"], _kernels(before)["kernel"])


@T.prim_func(private=True, s_tir=True)
def peeks(x: T.Buffer((16,), "float32"), a: T.Buffer((16,), "float32"),
          b: T.Buffer((16,), "float32"), out: T.Buffer((16,), "float32")):
    for i in range(16):
        with T.sblock("k"):
            vi = T.axis.remap("S", [i])
            T.reads(x[vi], a[0:16], b[vi])
            T.writes(out[vi])
            out[vi] = x[vi] * a[vi] + b[vi] + T.call_extern("float32", "peek", b.data)


def test_a_kernel_that_passes_a_constants_address_on_keeps_it_and_says_why():
    """The kernel hands ``b``'s memory to a function, whose view would start where the merged
    buffer does: it keeps both parameters, and the report says why."""
    x = relax.Var("x", relax.TensorType((16,), "float32"))
    builder = relax.BlockBuilder()
    gvar = builder.add_func(peeks, "peeks")
    ones = np.ones(16, "float32")
    with builder.function("main", [x]):
        with builder.dataflow():
            out = builder.emit_output(relax.call_tir(
                gvar, [x, relax.const(ones), relax.const(ones)],
                relax.TensorType((16,), "float32")))
        builder.emit_func_output(out)
    log = RuleLog()
    after = constants_in_one_argument(log)(builder.get())
    tvm.ir.assert_structural_equal(_kernels(after)["peeks"], peeks)
    assert [s.text() for s in log.schedules] == [
        "<relax: constants_in_one_argument>: scheduled by constants_in_one_argument (peeks: "
        "constants 1, 2 not merged: the kernel passes one's address on)"]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_a_convolutions_batch_norm_kernel_takes_its_constants_as_one_argument(dtype):
    """A convolution, an inference batch norm and a ReLU, built by relay_amp's CPU pipeline
    for the host: the fused kernel takes the input, one constant (the weight, the norm's
    scale and shift) and the output, the report says so (on an aarch64 host the pass does not
    run: the weight and the stack stay two arguments), and the outputs are TVM's build's
    within float32 rounding of reordered sums (float16: within twice float16's rounding of the
    largest output)."""
    rng = np.random.default_rng(2)
    x = relax.Var("x", relax.TensorType((1, 8, 8, 8), dtype))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            conv = builder.emit(relax.op.nn.conv2d(
                x, relax.const(rng.standard_normal((16, 8, 3, 3)).astype(dtype)), padding=1))
            norm = builder.emit(relax.op.nn.batch_norm(
                conv, *(relax.const(rng.random(16).astype(dtype) + 0.5) for _ in range(4)),
                axis=1, training=False))
            out = builder.emit_output(relax.op.nn.relu(builder.emit(relax.TupleGetItem(norm, 0))))
        builder.emit_func_output(out)
    mod = builder.get()
    target = relay_amp.host_target()
    log = RuleLog()
    lowered = relay_amp.cpu_pipeline(target, True, log)(mod)
    (convolution,) = [(name, f) for name, f in _kernels(lowered).items() if "conv2d" in name]
    merges = not is_aarch64(tvm.target.Target(target))
    assert len(convolution[1].params) == (3 if merges else 4), convolution[1]
    lines = [s.text() for s in log.schedules
             if s.kernel == "<relax: constants_in_one_argument>"]
    assert merges == any(f"{convolution[0]}: constants 1" in line
                         and "passed as one argument" in line for line in lines), lines
    data = rng.standard_normal((1, 8, 8, 8)).astype(dtype)
    outputs = []
    for schedules in (True, False):
        executable = tvm.compile(mod, target=tvm.target.Target(target),
                                 relax_pipeline=relay_amp.cpu_pipeline(target, schedules))
        vm = relax.VirtualMachine(executable, tvm.cpu())
        outputs.append(vm["main"](tvm.runtime.tensor(data)).numpy().astype("float32"))
    # float16: each build rounds its own partial sums to float16, about 2**-8 of the largest
    tolerance = 1e-5 if dtype == "float32" else 2.0**-7 * np.abs(outputs[1]).max()
    np.testing.assert_allclose(outputs[0], outputs[1], rtol=tolerance, atol=tolerance)


def test_an_aarch64_build_keeps_its_constants_apart():
    """For aarch64 the pass does not run (a view's offset took paired loads out of reach):
    the convolution's kernel of a cross build keeps its weight and its bias apart."""
    rng = np.random.default_rng(3)
    x = relax.Var("x", relax.TensorType((1, 8, 8, 8), "float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            conv = builder.emit(relax.op.nn.conv2d(
                x, relax.const(rng.standard_normal((16, 8, 3, 3)).astype("float32")),
                padding=1))
            out = builder.emit_output(relax.op.add(conv, relax.const(
                rng.standard_normal((1, 16, 1, 1)).astype("float32"))))
        builder.emit_func_output(out)
    target = tvm.target.Target({"kind": "llvm", "mtriple": "aarch64-linux-gnu",
                                "mattr": ["+neon"]})
    log = RuleLog()
    with target:
        lowered = relay_amp.cpu_pipeline(target, True, log)(builder.get())
    (convolution,) = [f for name, f in _kernels(lowered).items() if "conv2d" in name]
    assert len(convolution.params) == 4, convolution
    assert not [s for s in log.schedules if s.kernel == "<relax: constants_in_one_argument>"]
