"""Symbolic dimensions through ``relay-amp convert``: a named dimension in ``--input`` (or the
model's own) stays symbolic, and one library runs every size in its range with the outputs of
fixed-shape libraries. Two tiny ONNX models: a convnet with a symbolic batch and a
transformer-like attention layer with a symbolic sequence length shared by two inputs."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tvm
from helpers import NVCC, NVRTC, asm_functions, nvcc_compile, nvrtc_compile

import relay_amp
from relay_amp.cli import arguments, main
from relay_amp.cli.arguments import InputSpec, SymbolicDim

onnx = pytest.importorskip("onnx")  # requirements-test.txt installs it

ROOT = Path(__file__).resolve().parents[2]
TARGET = "llvm"  # float32 compute, float16 storage: runs on any x86 CPU
WIDTH = 32


def _save(nodes, inputs, outputs, weights, path, opset=17) -> None:
    from onnx import helper

    graph = helper.make_graph(nodes, "m", inputs, outputs, weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.save(model, str(path))


def batch_model(path) -> None:
    """Conv (3->4) + ReLU + global average pool + MatMul (4->5) + Softmax on a
    ``batch,3,8,8`` input."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.normal(0, 0.3, (4, 3, 3, 3)).astype(np.float32), "w"),
               numpy_helper.from_array(rng.normal(0, 0.1, (4,)).astype(np.float32), "b"),
               numpy_helper.from_array(rng.normal(0, 0.3, (4, 5)).astype(np.float32), "fc")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("GlobalAveragePool", ["r"], ["p"]),
             helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("MatMul", ["f", "fc"], ["m"]),
             helper.make_node("Softmax", ["m"], ["out"], axis=1)]
    _save(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 8, 8])],
          [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", 5])], weights, path)


def attention_model(path) -> None:
    """Layer norm, single-head attention with an additive key mask, output projection and a
    residual add, on ``x`` (1, seq, 32) and ``mask`` (1, seq): both name ``seq``."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(1)

    def weight(name, shape, scale):
        return numpy_helper.from_array(rng.normal(0, scale, shape).astype(np.float32), name)

    weights = [weight("gamma", (WIDTH,), 1.0), weight("beta", (WIDTH,), 0.1),
               *(weight(n, (WIDTH, WIDTH), WIDTH ** -0.5) for n in ("wq", "wk", "wv", "wo")),
               numpy_helper.from_array(np.float32(WIDTH ** -0.5), "scale"),
               numpy_helper.from_array(np.array([1], np.int64), "axis1")]
    nodes = [helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["n"], axis=-1),
             helper.make_node("MatMul", ["n", "wq"], ["q"]),
             helper.make_node("MatMul", ["n", "wk"], ["k"]),
             helper.make_node("MatMul", ["n", "wv"], ["v"]),
             helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["q", "kt"], ["s"]),
             helper.make_node("Mul", ["s", "scale"], ["ss"]),
             helper.make_node("Unsqueeze", ["mask", "axis1"], ["m3"]),
             helper.make_node("Add", ["ss", "m3"], ["sm"]),
             helper.make_node("Softmax", ["sm"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "v"], ["a"]),
             helper.make_node("MatMul", ["a", "wo"], ["o"]),
             helper.make_node("Add", ["x", "o"], ["y"])]
    _save(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "seq", WIDTH]),
                  helper.make_tensor_value_info("mask", TensorProto.FLOAT, [1, "seq"])],
          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "seq", WIDTH])], weights,
          path)


def attention_inputs(seq: int, seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    mask = np.zeros((1, seq), np.float32)
    mask[:, seq - seq // 4:] = -1e4  # the last quarter is padding
    return [rng.normal(0, 1, (1, seq, WIDTH)).astype(np.float32), mask]


def convert(tmp_path, capsys, model, out, *extra, target=TARGET) -> dict:
    code = main(["convert", str(model), "--dtype", "float16", "--target", target, "--quiet",
                 "-o", str(tmp_path / out), *extra])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return json.loads((tmp_path / out / "report.json").read_text())


def load(folder):
    return tvm.runtime.vm.VirtualMachine(tvm.runtime.load_module(str(folder / "model.so")),
                                         tvm.cpu())


@pytest.mark.parametrize("text, shape, dtype", [
    ("images:batch,3,320,320", (SymbolicDim("batch"), 3, 320, 320), None),
    ("ids:1,seq=1..512", (1, SymbolicDim("seq", 1, 512)), None),
    ("ids:1,seq=1..512:int64", (1, SymbolicDim("seq", 1, 512)), "int64"),
    ("ids:1x128:int64", (1, 128), "int64"),
    ("x:n,seq,n", (SymbolicDim("n"), SymbolicDim("seq"), SymbolicDim("n")), None)])
def test_a_dimension_is_a_number_or_a_name_with_an_optional_range(text, shape, dtype):
    assert arguments.parse_input(text) == InputSpec(text.split(":")[0], shape, dtype)


@pytest.mark.parametrize("text, words", [
    ("x:1x3,batch", "separate the dimensions with commas only"),
    ("x:seq=8..2", "1 <= LOW <= HIGH"), ("x:seq=0..4", "1 <= LOW <= HIGH"),
    ("x:seq=1..4,seq=1..8", "two ranges"), ("x:1,2:int46", "did you mean 'int64'"),
    ("x:1,b-c", "bad shape"), ("x:int64", "use --input NAME:SHAPE")])
def test_a_bad_named_dimension_is_a_usage_error(text, words):
    with pytest.raises(arguments.UsageError, match=words):
        arguments.parse_input(text)


def test_one_name_two_ranges_across_inputs_is_a_usage_error():
    specs = [arguments.parse_input("a:seq=1..8"), arguments.parse_input("b:seq=1..16")]
    with pytest.raises(arguments.UsageError, match="two ranges"):
        arguments.symbolic_ranges(specs)
    bounded = arguments.symbolic_ranges([arguments.parse_input("a:seq=1..8"),
                                         arguments.parse_input("b:1,seq")])
    assert bounded == {"seq": (1, 8)}


def test_one_batch_library_runs_batch_1_and_4_as_fixed_shape_libraries_do(tmp_path, capsys):
    batch_model(tmp_path / "m.onnx")
    report = convert(tmp_path, capsys, tmp_path / "m.onnx", "sym", "--input",
                     "x:batch=1..8,3,8,8")
    assert report["model"]["inputs"][0]["shape"] == ["batch=1..8", 3, 8, 8]
    assert report["model"]["symbolic"] == [{"name": "batch", "lower": 1, "upper": 8,
                                            "inputs": ["x[0]"], "memory_planned_for": 8}]
    assert "`batch` 1..8 (memory planned for 8) in x[0]" in (tmp_path / "sym" / "report.md"
                                                            ).read_text()
    symbolic = load(tmp_path / "sym")
    for batch in (1, 4):
        convert(tmp_path, capsys, tmp_path / "m.onnx", f"fixed{batch}", "--input",
                f"x:{batch},3,8,8")
        x = np.random.default_rng(batch).normal(0, 1, (batch, 3, 8, 8)).astype(np.float32)
        (got,) = relay_amp.run(symbolic, [x])
        (want,) = relay_amp.run(load(tmp_path / f"fixed{batch}"), [x])
        assert got.shape == (batch, 5)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    # memory is planned for the upper bound: a larger batch is refused, not overrun
    with pytest.raises(tvm.error.InternalError, match="storage allocation failure"):
        relay_amp.run(symbolic, [np.zeros((9, 3, 8, 8), np.float32)])


def test_one_attention_library_runs_64_and_128_tokens_as_fixed_shape_libraries_do(
        tmp_path, capsys):
    attention_model(tmp_path / "a.onnx")
    report = convert(tmp_path, capsys, tmp_path / "a.onnx", "sym")  # the model's own seq
    assert [i["shape"] for i in report["model"]["inputs"]] == [[1, "seq", WIDTH], [1, "seq"]]
    assert report["model"]["symbolic"][0]["inputs"] == ["x[1]", "mask[1]"]
    matmuls = [row for row in report["conversion"]["rows"] if row["op"] == "matmul"]
    assert len(matmuls) == 6 and {row["category"] for row in matmuls} == {"storage"}
    symbolic = load(tmp_path / "sym")
    for seq in (64, 128):
        convert(tmp_path, capsys, tmp_path / "a.onnx", f"fixed{seq}", "--input",
                f"x:1,{seq},{WIDTH}", "--input", f"mask:1,{seq}")
        inputs = attention_inputs(seq)
        (got,) = relay_amp.run(symbolic, inputs)
        (want,) = relay_amp.run(load(tmp_path / f"fixed{seq}"), inputs)
        assert got.shape == (1, seq, WIDTH)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("model, specs, sizes", [
    (batch_model, lambda n: [f"x:{n},3,8,8"], (1, 4)),
    (attention_model, lambda n: [f"x:1,{n},{WIDTH}", f"mask:1,{n}"], (64, 128))])
def test_float16_compute_is_the_same_at_every_size_as_at_a_fixed_one(tmp_path, model, specs,
                                                                      sizes):
    """Converted for a CPU with float16 arithmetic (the library cannot run here: the module is
    compiled for this CPU, as the accuracy check compiles it), symbolic and fixed agree."""
    from relay_amp.cli.frontends import import_model

    model(tmp_path / "m.onnx")
    target = {"kind": "llvm", "mattr": ["+avx512fp16"]}

    def compiled(texts):
        given = {spec.name: spec for spec in map(arguments.parse_input, texts)}
        converted, report = relay_amp.convert(import_model(str(tmp_path / "m.onnx"), "onnx",
                                                           given).mod, "float16", target=target)
        assert any(row.compute_dtype == "float16" for row in report.ops)
        return relay_amp.compile_module(converted)

    symbolic = compiled([])
    for size in sizes:
        inputs = (attention_inputs(size) if model is attention_model else
                  [np.random.default_rng(size).normal(0, 1, (size, 3, 8, 8)).astype(np.float32)])
        (got,), (want,) = relay_amp.run(symbolic, inputs), relay_amp.run(compiled(specs(size)),
                                                                         inputs)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_a_dimension_the_model_names_in_two_inputs_takes_what_one_input_gives_it(tmp_path,
                                                                                 capsys):
    attention_model(tmp_path / "a.onnx")
    fixed = convert(tmp_path, capsys, tmp_path / "a.onnx", "fixed", "--input", f"x:1,64,{WIDTH}")
    assert [i["shape"] for i in fixed["model"]["inputs"]] == [[1, 64, WIDTH], [1, 64]]
    assert fixed["model"]["symbolic"] == []
    renamed = convert(tmp_path, capsys, tmp_path / "a.onnx", "renamed", "--input",
                      f"x:1,tokens=1..96,{WIDTH}")
    assert [i["shape"] for i in renamed["model"]["inputs"]] == [
        [1, "tokens=1..96", WIDTH], [1, "tokens=1..96"]]
    (out,) = relay_amp.run(load(tmp_path / "renamed"), attention_inputs(80))
    assert out.shape == (1, 80, WIDTH)


def test_calibration_and_accuracy_run_at_the_sizes_the_data_has(tmp_path, capsys):
    attention_model(tmp_path / "a.onnx")
    np.savez(tmp_path / "d.npz", **dict(zip(("x", "mask"), attention_inputs(48))))
    report = convert(tmp_path, capsys, tmp_path / "a.onnx", "cal", "--input",
                     f"x:1,seq=16..256,{WIDTH}", "--calibrate", str(tmp_path / "d.npz"))
    assert report["calibration"]["sizes"] == {"seq": 48}
    accuracy = json.loads((tmp_path / "cal" / "accuracy.json").read_text())
    assert accuracy["outputs"][0]["shape"] == [1, 48, WIDTH]
    assert 0 < accuracy["relative_l2"] < 1e-2
    assert report["model"]["symbolic"][0]["upper"] == 256


@pytest.mark.parametrize("arrays, words", [
    ({"x": (1, 8, WIDTH), "mask": (1, 9)}, "the same in every input"),
    ({"x": (1, 300, WIDTH), "mask": (1, 300)}, "size 300, outside its range 16..256")])
def test_data_that_does_not_fit_the_symbolic_dims_is_a_usage_error(tmp_path, capsys, arrays,
                                                                    words):
    attention_model(tmp_path / "a.onnx")
    np.savez(tmp_path / "d.npz", **{k: np.zeros(v, np.float32) for k, v in arrays.items()})
    code = main(["convert", str(tmp_path / "a.onnx"), "--dtype", "float16", "--quiet",
                 "--input", f"x:1,seq=16..256,{WIDTH}", "--calibrate", str(tmp_path / "d.npz"),
                 "-o", str(tmp_path / "never")])
    assert code == 2 and words in capsys.readouterr().err
    assert not (tmp_path / "never").exists()


def test_images_feed_a_symbolic_batch_but_need_a_fixed_image_size(tmp_path, capsys):
    from onnx import TensorProto, helper
    from PIL import Image

    (tmp_path / "images").mkdir()
    for i in range(3):
        Image.fromarray(np.random.default_rng(i).integers(0, 255, (20, 24, 3), np.uint8)).save(
            tmp_path / "images" / f"{i}.png")
    batch_model(tmp_path / "m.onnx")
    report = convert(tmp_path, capsys, tmp_path / "m.onnx", "img", "--calibrate",
                     str(tmp_path / "images"), "--normalize", "imagenet")
    assert report["calibration"]["batches"] == 3 and report["calibration"]["batch_size"] == 1
    assert any("calibration images fed 1 per batch" in note for note in report["notes"])
    relu = [helper.make_node("Relu", ["x"], ["y"])]
    _save(relu, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, "h", "w"])],
          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3, "h", "w"])], [],
          tmp_path / "r.onnx")
    code = main(["convert", str(tmp_path / "r.onnx"), "--dtype", "float16", "--quiet",
                 "--calibrate", str(tmp_path / "images"), "--normalize", "imagenet",
                 "-o", str(tmp_path / "never")])
    assert code == 2
    assert "symbolic image size [n,3,h,w]: images are resized to one size, give it with " \
           "--input x:n,3,N,N" in capsys.readouterr().err


def test_a_named_dim_of_a_fixed_model_dimension_is_a_usage_error(tmp_path, capsys):
    batch_model(tmp_path / "m.onnx")
    code = main(["convert", str(tmp_path / "m.onnx"), "--dtype", "float16", "--quiet",
                 "--input", "x:batch,c,8,8", "-o", str(tmp_path / "never")])
    assert code == 2
    assert "does not match the model's fixed shape" in capsys.readouterr().err


def test_the_cuda_library_of_a_symbolic_model_takes_the_size_at_run_time(tmp_path, capsys):
    """No GPU here: the library holds CUDA source whose kernels take ``seq`` as an argument
    (NVRTC compiles it on the GPU host: :func:`test_the_cuda_library_runs_64_and_128_tokens`)."""
    attention_model(tmp_path / "a.onnx")
    report = convert(tmp_path, capsys, tmp_path / "a.onnx", "cuda", "--input",
                     f"x:1,seq=1..512,{WIDTH}", target="cuda -arch=sm_90")
    assert report["library"] == "model.so" and report["target"]["kind"] == "cuda"
    assert report["model"]["symbolic"][0]["memory_planned_for"] == 512
    assert any(note.startswith("6 matmuls have a symbolic extent: relay_amp.cuda_pipeline's "
                               "split-K") for note in report["notes"])
    kernels = dict(re.findall(rb"__global__ void __launch_bounds__\(\d+\) (\w+)\(([^)]*)\)",
                              (tmp_path / "cuda" / "model.so").read_bytes()))
    assert len(kernels) >= 5
    assert all(b"int64_t seq" in signature for signature in kernels.values())


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed on this machine")
def test_the_cuda_source_of_a_symbolic_build_compiles_with_nvcc(tmp_path):
    from relay_amp.builds.pipeline import build
    from relay_amp.cli.frontends import import_model

    attention_model(tmp_path / "a.onnx")
    target = {"kind": "cuda", "arch": "sm_90"}
    converted, _ = relay_amp.convert(import_model(str(tmp_path / "a.onnx"), "onnx", {}).mod,
                                     "float16", target=target)
    (device,) = build(converted, target).mod.imports[0].imports
    status, output = nvcc_compile(device.inspect_source("cuda"), tmp_path, archs=("sm_90",))
    assert status == 0, output[-2000:]


@pytest.mark.skipif(NVRTC is None, reason="no CUDA headers or cuda-bindings for NVRTC here")
def test_the_cuda_source_of_a_symbolic_build_compiles_with_nvrtc():
    """What the GPU host's loader does with the library (``enable_cuda(tvm, "nvrtc")``), minus
    loading the cubin: NVRTC compiles every kernel, ``seq`` an argument of each."""
    import tempfile

    from relay_amp.builds.pipeline import build
    from relay_amp.cli.frontends import import_model

    with tempfile.TemporaryDirectory() as tmp:
        attention_model(Path(tmp) / "a.onnx")
        imported = import_model(str(Path(tmp) / "a.onnx"), "onnx", {})
    target = {"kind": "cuda", "arch": "sm_90"}
    converted, _ = relay_amp.convert(imported.mod, "float16", target=target)
    (device,) = build(converted, target).mod.imports[0].imports
    source = device.inspect_source("cuda")
    cubin = nvrtc_compile(source, "sm_90")
    assert cubin[:4] == b"\x7fELF"
    kernels = re.findall(r"__global__ void __launch_bounds__\(\d+\) (\w+)\(", source)
    assert len(kernels) >= 5 and all(name.encode() in cubin for name in kernels)


AARCH64 = {"kind": "llvm", "mtriple": "aarch64-linux-gnu",
           "mattr": ["+neon", "+fullfp16", "+fp16fml", "+bf16"]}


def _dot_instructions(asm: str) -> dict:
    """{kernel: the multiply-add instructions its compute function executes}, softmax's left
    out: its multiply-adds are the exponential's polynomial (``relay_amp.builds.fast_math``),
    which LLVM vectorizes over a fixed length only."""
    found = {}
    for name, body in asm_functions(asm).items():
        kinds = {k for k in ("fmlal", "bfdot", "bfmmla", "bfmlal", "fmla\tv", "fmadd")
                 if k in body}
        if "softmax" in name:
            continue
        if kinds and name.endswith("_compute_"):  # a symbolic library's shape functions have none
            found[name] = kinds
    return found


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_no_kernel_tensorizes_only_at_fixed_shapes(tmp_path, dtype):
    """Each kernel of the symbolic library is scheduled by the rule that schedules it at a
    fixed length, on CUDA and on the CPU, and on aarch64 runs its dot products on the same
    instructions (``fmlal``, ``bfmmla``): the CPU tiles pad a symbolic extent, dlight's rules take
    any size. (What the size does change, CUDA's split-K, is a note of the report: above.)"""
    from relay_amp.builds.pipeline import build
    from relay_amp.builds.schedule_rules import RuleLog
    from relay_amp.cli.frontends import import_model

    attention_model(tmp_path / "a.onnx")
    fixed = {"x": arguments.parse_input(f"x:1,64,{WIDTH}"),
             "mask": arguments.parse_input("mask:1,64")}
    for target in ({"kind": "cuda", "arch": "sm_90"}, {"kind": "llvm"}, AARCH64):
        rules, instructions = [], []
        for specs in ({}, fixed):
            mod = import_model(str(tmp_path / "a.onnx"), "onnx", specs).mod
            converted, _ = relay_amp.convert(mod, dtype, target=target)
            log = RuleLog()
            built = build(converted, target, rule_log=log)
            rules.append(log.rules)
            if target is AARCH64:
                (library,) = built.mod.imports
                instructions.append(_dot_instructions(library.inspect_source("asm")))
        assert len(rules[0]) >= 5 and rules[0] == rules[1], target
        if target is AARCH64:
            assert instructions[0] == instructions[1]
            fast = "fmlal" if dtype == "float16" else "bfmmla"
            assert sum(fast in kinds for kinds in instructions[0].values()) >= 2


@pytest.mark.gpu
@pytest.mark.skipif(not tvm.cuda(0).exist, reason="needs a CUDA GPU to run the kernels")
def test_the_cuda_library_runs_64_and_128_tokens(tmp_path, capsys):
    """On a GPU host with NVRTC: one CUDA library runs 64 and 128 tokens as the fixed-shape
    libraries do."""
    from relay_amp.cuda_loader import enable_cuda

    enable_cuda(tvm, "nvrtc")
    attention_model(tmp_path / "a.onnx")
    convert(tmp_path, capsys, tmp_path / "a.onnx", "sym", target="cuda")

    def run(folder, inputs):
        vm = tvm.runtime.vm.VirtualMachine(tvm.runtime.load_module(str(folder / "model.so")),
                                           tvm.cuda())
        return vm["main"](*[tvm.runtime.tensor(x, tvm.cuda()) for x in inputs]).numpy()

    for seq in (64, 128):
        convert(tmp_path, capsys, tmp_path / "a.onnx", f"fixed{seq}", "--input",
                f"x:1,{seq},{WIDTH}", "--input", f"mask:1,{seq}", target="cuda")
        inputs = attention_inputs(seq)
        got, want = run(tmp_path / "sym", inputs), run(tmp_path / f"fixed{seq}", inputs)
        assert got.shape == (1, seq, WIDTH)
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3)


def _script(*args) -> str:
    result = subprocess.run([sys.executable, *args], capture_output=True, text=True, check=False,
                            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_the_gpu_cost_of_a_symbolic_module_at_a_size_is_the_fixed_modules(tmp_path):
    attention_model(tmp_path / "a.onnx")
    table = _script("scripts/symbolic_gpu_cost.py", str(tmp_path / "a.onnx"), "--input",
                    f"x:1,seq=1..512,{WIDTH}", "--sizes", "seq=64,128")
    rows = re.findall(r"\| seq=(\d+) \| (\d+) / (\d+) \| ([\d.]+) / ([\d.]+) \|", table)
    assert [int(row[0]) for row in rows] == [64, 128]
    for _, kernels, fixed_kernels, megabytes, fixed_megabytes in rows:
        assert int(kernels) == int(fixed_kernels) >= 5
        assert float(megabytes) == float(fixed_megabytes) > 0
    assert float(rows[1][3]) > float(rows[0][3])  # more tokens, more bytes


def test_bench_peers_times_one_library_at_two_sizes_beside_onnx_runtime(tmp_path, capsys):
    pytest.importorskip("onnxruntime")
    attention_model(tmp_path / "a.onnx")
    convert(tmp_path, capsys, tmp_path / "a.onnx", "sym")
    out = _script("scripts/bench_peers.py", "--library", str(tmp_path / "sym"), "--sizes",
                  "seq=64,128", "--threads", "1", "--rounds", "3", "--json",
                  str(tmp_path / "rows.json"))
    rows = json.loads((tmp_path / "rows.json").read_text())["models"]
    assert [row["model"] for row in rows] == [f"a.onnx (seq={n}; one float16 library)"
                                              for n in (64, 128)]
    for row in rows:
        assert row["peer"].startswith("ONNX Runtime") and row["build_s"] is None
        assert 0 < row["relative_l2"] < 1e-2  # float16 weights against ONNX Runtime's float32
        assert row["relay_amp_ms"] > 0 and row["peer_ms"] > 0
    assert "(built by convert)" in out
