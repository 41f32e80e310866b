"""A kernel's constant tensors of one shape passed as one stacked constant
(relay_amp.builds.stacked_constants): which kernels change, how they read the stack, their
outputs, and a batch norm's kernel with one argument fewer."""

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import tirx as T

import relay_amp
from relay_amp.builds.constants import array
from relay_amp.builds.schedule_rules import RuleLog
from relay_amp.builds.stacked_constants import MAX_ELEMENTS, stacked_constants

SHAPE = (1, 4, 4, 16)


@T.prim_func(private=True, s_tir=True)
def affine(x: T.Buffer((1, 4, 4, 16), "float32"), scale: T.Buffer((1, 1, 1, 16), "float32"),
           shift: T.Buffer((1, 1, 1, 16), "float32"), out: T.Buffer((1, 4, 4, 16), "float32")):
    scaled = T.sblock_alloc_buffer((1, 4, 4, 16))
    shifted = T.sblock_alloc_buffer((1, 4, 4, 16))
    for n, h, w, c in T.grid(1, 4, 4, 16):
        with T.sblock("scale"):
            vn, vh, vw, vc = T.axis.remap("SSSS", [n, h, w, c])
            scaled[vn, vh, vw, vc] = x[vn, vh, vw, vc] * scale[0, 0, 0, vc]
    for n, h, w, c in T.grid(1, 4, 4, 16):
        with T.sblock("shift"):
            vn, vh, vw, vc = T.axis.remap("SSSS", [n, h, w, c])
            shifted[vn, vh, vw, vc] = scaled[vn, vh, vw, vc] + shift[0, 0, 0, vc]
    for n, h, w, c in T.grid(1, 4, 4, 16):
        with T.sblock("relu"):
            vn, vh, vw, vc = T.axis.remap("SSSS", [n, h, w, c])
            out[vn, vh, vw, vc] = T.max(shifted[vn, vh, vw, vc], T.float32(0))


@T.prim_func(private=True, s_tir=True)
def affine_stacked(x: T.Buffer((1, 4, 4, 16), "float32"),
                   scale: T.Buffer((2, 1, 1, 1, 16), "float32"),
                   out: T.Buffer((1, 4, 4, 16), "float32")):
    scaled = T.sblock_alloc_buffer((1, 4, 4, 16))
    shifted = T.sblock_alloc_buffer((1, 4, 4, 16))
    for n, h, w, c in T.grid(1, 4, 4, 16):
        with T.sblock("scale"):
            vn, vh, vw, vc = T.axis.remap("SSSS", [n, h, w, c])
            T.reads(x[vn, vh, vw, vc], scale[0, 0, 0, 0, vc])
            T.writes(scaled[vn, vh, vw, vc])
            scaled[vn, vh, vw, vc] = x[vn, vh, vw, vc] * scale[0, 0, 0, 0, vc]
    for n, h, w, c in T.grid(1, 4, 4, 16):
        with T.sblock("shift"):
            vn, vh, vw, vc = T.axis.remap("SSSS", [n, h, w, c])
            T.reads(scaled[vn, vh, vw, vc], scale[1, 0, 0, 0, vc])
            T.writes(shifted[vn, vh, vw, vc])
            shifted[vn, vh, vw, vc] = scaled[vn, vh, vw, vc] + scale[1, 0, 0, 0, vc]
    for n, h, w, c in T.grid(1, 4, 4, 16):
        with T.sblock("relu"):
            vn, vh, vw, vc = T.axis.remap("SSSS", [n, h, w, c])
            out[vn, vh, vw, vc] = T.max(shifted[vn, vh, vw, vc], T.float32(0))


def _constants(seed: int, size: int = 16):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((1, 1, 1, size)).astype("float32") for _ in range(2)]


def affines(calls: int = 1, variable_shift: bool = False):
    """``x`` through the ``affine`` kernel ``calls`` times, each call with its own constants;
    with ``variable_shift``, the last call's shift is a function input."""
    x = relax.Var("x", relax.TensorType(SHAPE, "float32"))
    params = [x]
    if variable_shift:
        params.append(relax.Var("shift", relax.TensorType((1, 1, 1, 16), "float32")))
    builder = relax.BlockBuilder()
    kernel = builder.add_func(affine, "affine")
    with builder.function("main", params):
        with builder.dataflow():
            value = x
            for n in range(calls):
                scale, shift = _constants(n)
                shift = params[-1] if variable_shift and n == calls - 1 else relax.const(shift)
                value = builder.emit(relax.call_tir(
                    kernel, [value, relax.const(scale), shift],
                    relax.TensorType(SHAPE, "float32")))
            out = builder.emit_output(value)
        builder.emit_func_output(out)
    return builder.get()


def executable_module(mod, target):
    """``mod`` through relay_amp's Relax pipeline for ``target``: its scheduled kernels."""
    with tvm.target.Target(target):
        return relay_amp.cpu_pipeline(target)(mod)


def _kernels(mod):
    return {gvar.name_hint: func for gvar, func in mod.functions_items()
            if isinstance(func, tvm.tirx.PrimFunc)}


def _calls(mod):
    found = []
    relax.analysis.post_order_visit(mod["main"], lambda e: found.append(e) if isinstance(
        e, relax.Call) and isinstance(e.op, tvm.ir.Op) and e.op.name == "relax.call_tir"
        else None)
    return found


def test_a_kernels_two_constants_become_one_stacked_constant():
    """The kernel takes its scale and shift as one ``(2, 1, 1, 1, 16)`` buffer, under its own
    name, and reads row 0 where it read the scale, row 1 where it read the shift; each call
    passes its own stack of the two."""
    before = affines(calls=2)
    after = stacked_constants()(before)
    assert sorted(_kernels(after)) == ["affine"]
    tvm.ir.assert_structural_equal(_kernels(after)["affine"], affine_stacked)
    for n, call in enumerate(_calls(after)):
        args = call.args[1].fields
        assert len(args) == 2
        np.testing.assert_array_equal(array(args[1]), np.stack(_constants(n)))


def test_a_constant_that_some_call_does_not_pass_is_not_stacked():
    """The last call's shift is a function input: the kernel keeps its three parameters and
    every call its arguments."""
    before = affines(calls=2, variable_shift=True)
    after = stacked_constants()(before)
    tvm.ir.assert_structural_equal(_kernels(after)["affine"], _kernels(before)["affine"])
    assert [len(c.args[1].fields) for c in _calls(after)] == [3, 3]


def test_constants_of_other_shapes_or_over_the_size_limit_are_not_stacked():
    """A ``(1, 1, 1, n)`` scale beside a ``(1, 1, 1, 1)`` shift is not a stack; neither are
    two constants of more than ``MAX_ELEMENTS`` elements."""
    big = MAX_ELEMENTS + 1

    @T.prim_func(private=True, s_tir=True)
    def kernel(x: T.Buffer((big,), "float32"), a: T.Buffer((big,), "float32"),
               b: T.Buffer((big,), "float32"), c: T.Buffer((1,), "float32"),
               out: T.Buffer((big,), "float32")):
        for i in range(big):
            with T.sblock("k"):
                vi = T.axis.remap("S", [i])
                out[vi] = x[vi] * a[vi] + b[vi] + c[0]

    x = relax.Var("x", relax.TensorType((big,), "float32"))
    builder = relax.BlockBuilder()
    gvar = builder.add_func(kernel, "kernel")
    ones = np.ones(big, "float32")
    with builder.function("main", [x]):
        with builder.dataflow():
            out = builder.emit_output(relax.call_tir(
                gvar, [x, relax.const(ones), relax.const(ones), relax.const(ones[:1])],
                relax.TensorType((big,), "float32")))
        builder.emit_func_output(out)
    before = builder.get()
    after = stacked_constants()(before)
    assert len(_kernels(after)["kernel"].params) == 5


@pytest.mark.parametrize("calls", [1, 3])
def test_the_outputs_are_the_plain_builds_to_one_rounding(calls):
    """relay_amp's CPU build on the host, which stacks the constants, against TVM's: every
    output within a rounding of each product (TVM's build rounds it, relay_amp's kernel
    multiplies and adds in one FMA), a NaN or infinity where TVM's has it. The stacked kernel
    is still one loop of vectors: inlining the scale into the shift makes one read of both
    rows of the stack, which the elementwise rule reads along the last axis all the same."""
    mod = affines(calls=calls)
    x = np.random.default_rng(1).standard_normal(SHAPE).astype("float32")
    x.flat[:3] = [np.nan, -0.0, np.inf]
    target = relay_amp.host_target()
    outputs = []
    for schedules in (True, False):
        log = RuleLog()
        executable = tvm.compile(mod, target=tvm.target.Target(target),
                                 relax_pipeline=relay_amp.cpu_pipeline(target, schedules, log))
        if schedules:  # FuseOps makes the calls one kernel, its constants one stack
            kernels = {k: r for k, r in log.rules.items() if not k.startswith("<relax:")}
            assert set(kernels.values()) == {"Elementwise"}, log.rules
            (kernel,) = [f for f in _kernels(executable_module(mod, target)).values()]
            assert "T.vectorized" in kernel.script() and "sblock_alloc_buffer" not in \
                kernel.script(), kernel
            stack = ", ".join(str(n) for n in range(1, 2 * calls + 1))
            lines = [s.text() for s in log.schedules if s.kernel == "<relax: stacked_constants>"]
            assert any(f"constants {stack} passed as one stacked constant" in line
                       for line in lines), lines
        vm = relax.VirtualMachine(executable, tvm.cpu())
        outputs.append(vm["main"](tvm.runtime.tensor(x)).numpy())
    # TVM's build rounds the product before the sum; the inlined kernel is one FMA
    scaled = np.abs(x * np.prod([c[0] for c in map(_constants, range(calls))], axis=0))
    finite = np.isfinite(outputs[1]) & np.isfinite(scaled)
    np.testing.assert_array_equal(outputs[0][~finite], outputs[1][~finite])
    assert np.all(np.abs(outputs[0][finite] - outputs[1][finite])
                  <= calls * 2.0**-23 * (scaled + np.abs(outputs[1]))[finite])


def test_a_convolutions_batch_norm_kernel_takes_one_stack():
    """A convolution, an inference batch norm and a ReLU, built for the host: the fused
    kernel takes the norm's scale and shift as one stack (which
    :mod:`relay_amp.builds.kernel_constants` then passes with the weight), and its outputs
    match TVM's build within float32 rounding of reordered sums."""
    rng = np.random.default_rng(2)
    x = relax.Var("x", relax.TensorType((1, 8, 8, 8), "float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            conv = builder.emit(relax.op.nn.conv2d(
                x, relax.const(rng.standard_normal((16, 8, 3, 3)).astype("float32")),
                padding=1))
            norm = builder.emit(relax.op.nn.batch_norm(
                conv, *(relax.const(rng.random(16).astype("float32") + 0.5) for _ in range(4)),
                axis=1, training=False))
            out = builder.emit_output(relax.op.nn.relu(builder.emit(relax.TupleGetItem(norm, 0))))
        builder.emit_func_output(out)
    mod = builder.get()
    target = relay_amp.host_target()
    log = RuleLog()
    lowered = relay_amp.cpu_pipeline(target, True, log)(mod)
    (convolution,) = [name for name in _kernels(lowered) if "conv2d" in name]
    lines = [s.text() for s in log.schedules if s.kernel == "<relax: stacked_constants>"]
    assert any(f"{convolution}: constants 2, 3 passed as one stacked constant" in line
               for line in lines), lines
    data = rng.standard_normal((1, 8, 8, 8)).astype("float32")
    outputs = []
    for schedules in (True, False):
        executable = tvm.compile(mod, target=tvm.target.Target(target),
                                 relax_pipeline=relay_amp.cpu_pipeline(target, schedules))
        vm = relax.VirtualMachine(executable, tvm.cpu())
        outputs.append(vm["main"](tvm.runtime.tensor(data)).numpy())
    np.testing.assert_allclose(outputs[0], outputs[1], rtol=1e-5, atol=1e-5)


@T.prim_func(private=True, s_tir=True)
def peeks(x: T.Buffer((16,), "float32"), a: T.Buffer((16,), "float32"),
          b: T.Buffer((16,), "float32"), out: T.Buffer((16,), "float32")):
    for i in range(16):
        with T.sblock("k"):
            vi = T.axis.remap("S", [i])
            T.reads(x[vi], a[0:16], b[vi])
            T.writes(out[vi])
            out[vi] = x[vi] * a[vi] + b[vi] + T.call_extern("float32", "peek", a.data)


def test_a_kernel_that_passes_a_constants_address_on_keeps_it_and_says_why():
    """The kernel hands ``a``'s memory to a function: it keeps both parameters, and the
    report says why the two constants were not stacked."""
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
    after = stacked_constants(log)(builder.get())
    tvm.ir.assert_structural_equal(_kernels(after)["peeks"], peeks)
    assert [s.text() for s in log.schedules] == [
        "<relax: stacked_constants>: scheduled by stacked_constants (peeks: constants 1, 2 not "
        "stacked: the kernel uses one other than by reading its elements)"]
