"""A kernel's 0-d constants read as immediates (relay_amp.builds.scalar_constants): which
kernels change, their outputs bit for bit, and what LLVM then emits for a clip on aarch64."""

import re

import numpy as np
import pytest
import tvm
import tvm_ffi
from helpers import asm_functions
from tvm import relax
from tvm.script import tirx as T

import relay_amp
from relay_amp.builds.scalar_constants import scalar_constants_inlined
from relay_amp.builds.schedule_rules import RuleLog

A64 = {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon"]}


@T.prim_func(private=True, s_tir=True)
def clip(x: T.Buffer((1, 8, 8, 16), "float32"), low: T.Buffer((), "float32"),
         high: T.Buffer((), "float32"), out: T.Buffer((1, 8, 8, 16), "float32")):
    for n, h, w, c in T.grid(1, 8, 8, 16):
        with T.sblock("clip"):
            vn, vh, vw, vc = T.axis.remap("SSSS", [n, h, w, c])
            out[vn, vh, vw, vc] = T.min(T.max(x[vn, vh, vw, vc], low[()]), high[()])


def clipped(bounds=((0.0, 6.0),), scalar_input=False):
    """``x`` clipped by a kernel that reads its bounds from 0-d buffers (as relay_amp's NHWC
    pass legalizes an ONNX Clip it moves: MobileNetV2's ReLU6), once per pair of ``bounds``,
    each result an output; with ``scalar_input``, a 0-d input as the last call's lower
    bound."""
    x = relax.Var("x", relax.TensorType((1, 8, 8, 16), "float32"))
    params = [x]
    if scalar_input:
        params.append(relax.Var("low", relax.TensorType((), "float32")))
    builder = relax.BlockBuilder()
    kernel = builder.add_func(clip, "clip")
    with builder.function("main", params):
        with builder.dataflow():
            outs = []
            for n, (low, high) in enumerate(bounds):
                lower = params[-1] if scalar_input and n == len(bounds) - 1 \
                    else relax.const(np.float32(low))
                outs.append(builder.emit(relax.call_tir(
                    kernel, [x, lower, relax.const(np.float32(high))],
                    relax.TensorType((1, 8, 8, 16), "float32"))))
            out = builder.emit_output(outs[0] if len(outs) == 1 else relax.Tuple(outs))
        builder.emit_func_output(out)
    return builder.get()


def _fused(mod):
    return relax.transform.LegalizeOps()(mod)


def _kernels(mod):
    return {gvar.name_hint: func for gvar, func in mod.functions_items()
            if isinstance(func, tvm.tirx.PrimFunc)}


def _scalar_loads(func) -> list:
    found = []
    tvm_ffi.structural_walk(func.body, lambda node: found.append(node) if isinstance(
        node, tvm.ir.expr.TensorLoad) and len(node.indices) == 0 else None)
    return found


def _immediates(func) -> list:
    found = []
    tvm_ffi.structural_walk(func.body, lambda node: found.append(float(node.value)) if isinstance(
        node, tvm.tirx.FloatImm) else None)
    return found


def test_a_kernel_reads_its_scalar_constants_as_immediates():
    """One clip: its kernel reads 0 and 6 as immediates, no 0-d buffer, under the name it had;
    the call still passes the constants, which the kernel keeps as parameters."""
    before = _fused(clipped())
    after = scalar_constants_inlined()(before)
    assert sorted(_kernels(after)) == sorted(_kernels(before))
    assert _scalar_loads(_kernels(before)["clip"])
    for name, func in _kernels(after).items():
        assert not _scalar_loads(func), name
        assert len(func.params) == len(_kernels(before)[name].params)
    assert {value for func in _kernels(after).values() for value in _immediates(func)} \
        >= {0.0, 6.0}


def test_a_kernel_called_with_several_values_gets_one_copy_for_each():
    """Two clips with different bounds call the same kernel: each call gets a copy with its
    own values, the shared kernel dropped; a 0-d *input* is not a constant, and its call keeps
    the kernel that reads it (the other call gets a copy)."""
    mod = _fused(clipped(bounds=((0.0, 6.0), (-1.0, 1.0))))
    after = scalar_constants_inlined()(mod)
    reads = [sorted(_immediates(f)) for f in _kernels(after).values()]
    assert len(reads) == 2 and not any(_scalar_loads(f) for f in _kernels(after).values())
    assert sorted(reads) == [[-1.0, 1.0], [0.0, 6.0]], reads
    mixed = scalar_constants_inlined()(_fused(clipped(bounds=((0.0, 6.0), (0.0, 6.0)),
                                                      scalar_input=True)))
    assert sum(bool(_scalar_loads(f)) for f in _kernels(mixed).values()) == 1


@pytest.mark.parametrize("bounds", [((0.0, 6.0),), ((0.0, 6.0), (-1.0, 1.0))],
                         ids=["relu6", "two-clips"])
def test_the_outputs_are_the_plain_builds_bit_for_bit(bounds):
    """relay_amp's CPU build of the clips against TVM's, on the host, with NaN and signed
    zeros among the inputs: every output equal, bit for bit."""
    mod = clipped(bounds=bounds)
    x = np.random.default_rng(0).standard_normal((1, 8, 8, 16)).astype("float32") * 8
    x.flat[:4] = [np.nan, -0.0, 0.0, np.inf]
    outputs = []
    for schedules in (True, False):
        target = relay_amp.host_target()
        executable = tvm.compile(mod, target=tvm.target.Target(target),
                                 relax_pipeline=relay_amp.cpu_pipeline(target, schedules))
        vm = relax.VirtualMachine(executable, tvm.cpu())
        result = vm["main"](tvm.runtime.tensor(x))
        outputs.append([result.numpy()] if hasattr(result, "numpy")
                       else [r.numpy() for r in result])
    for ours, plain in zip(*outputs, strict=True):
        np.testing.assert_array_equal(ours.view(np.uint32), plain.view(np.uint32))


def test_the_build_report_names_each_kernel_and_its_values():
    """``cpu_pipeline``'s rule log: the pass's line names the kernel and the values it reads."""
    log = RuleLog()
    tvm.compile(clipped(), target=tvm.target.Target(A64),
                relax_pipeline=relay_amp.cpu_pipeline(A64, rule_log=log))
    texts = [s.text() for s in log.schedules if s.kernel == "<relax: scalar_constants_inlined>"]
    assert any("scheduled by scalar_constants_inlined (clip: its 0-d constants read as "
               "immediates (0, 6))" in text for text in texts), texts


def test_a_clip_is_fmaxnm_and_fminnm_on_aarch64():
    """With the bounds immediates, LLVM emits one ``fmaxnm`` and one ``fminnm`` a vector for
    the clip, where a bound read from a buffer took a compare and a select each (``fcmgt``,
    ``bif``/``bsl``)."""
    executable = tvm.compile(clipped(), target=tvm.target.Target(A64),
                             relax_pipeline=relay_amp.cpu_pipeline(A64))
    lib = executable.mod.imports[0] if executable.mod.imports else executable.mod
    code = "\n".join(asm_functions(lib.inspect_source("asm")).values())
    assert re.search(r"\bfmaxnm\s+v\d+\.4s", code) and re.search(r"\bfminnm\s+v\d+\.4s", code)
    assert not re.search(r"\bfcmgt\s+v\d+\.4s", code)


def test_each_module_pass_keeps_its_own_line_in_the_report():
    """An ONNX Conv, Clip and Conv: the NHWC pass moves the clip and the scalar-constants pass
    specializes its kernel, and the build's report keeps both lines (both were once filed
    under one name, and the second was dropped)."""
    from onnx import TensorProto, helper, numpy_helper
    from tvm.relax.frontend.onnx import from_onnx

    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.random(shape, dtype=np.float32), name)
               for name, shape in (("w", (16, 8, 3, 3)), ("w2", (8, 16, 3, 3)))]
    bounds = [numpy_helper.from_array(np.array(v, "float32"), n) for n, v in (("lo", 0), ("hi", 6))]
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1]),
         helper.make_node("Clip", ["y", "lo", "hi"], ["z"]),
         helper.make_node("Conv", ["z", "w2"], ["o"], pads=[1, 1, 1, 1])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 8, 8])],
        [helper.make_tensor_value_info("o", TensorProto.FLOAT, [1, 8, 8, 8])], weights + bounds)
    mod = from_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]))
    log = RuleLog()
    tvm.compile(mod, target=tvm.target.Target(A64),
                relax_pipeline=relay_amp.cpu_pipeline(A64, rule_log=log))
    lines = {s.kernel: s.text() for s in log.schedules if s.kernel.startswith("<relax:")}
    assert "computed in its input's layout" in lines["<relax: nhwc_convolutions>"], lines
    assert "immediates (0, 6)" in lines["<relax: scalar_constants_inlined>"], lines
