"""``relay-amp convert`` and ``relay-amp report`` through the command line.

Tiny models are built here (an ONNX graph with onnx.helper, a TFLite flatbuffer with the tflite
package's builders, a torch.export program), so every conversion compiles in seconds. The
command runs in subprocesses, started together so that they share the machine's cores:

- real conversions: ONNX for CUDA with images, ``--tolerance`` and ``--fp32-ops``; TFLite for this
  CPU with an ``.npz``; ``.pt2`` with a symbolic batch for ``llvm``; the ``--policy`` round trip;
- bad arguments: every case runs ``relay_amp.cli.main`` in its own forked process of one
  ``python`` subprocess (importing TVM costs seconds, forking does not), with its own exit code,
  stdout and stderr; one case also runs through ``python -m relay_amp.cli``.
"""

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from relay_amp.cli import arguments, calibration_data, convert
from relay_amp.cli import report as saved_report

pytestmark = pytest.mark.zoo  # the model zoo: pip install -r requirements.txt

REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "relay_amp.cli"]
OUTPUTS = {"model.so", "report.md", "report.json", "policy.json"}

try:
    import torch
except ImportError:  # torch is in requirements.txt; without it the .pt2 cases skip
    torch = None


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


# ------------------------------------------------------------------------------ tiny models
def onnx_model(path, symbolic: bool = False) -> None:
    """Conv (3->4, 3x3) + ReLU + global average pool + MatMul (4->5) + Softmax, 1x3x8x8 input
    named ``input.1`` (a name TVM's importer renames), batch symbolic if ``symbolic``."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.normal(0, 0.3, (4, 3, 3, 3)).astype(np.float32), "w"),
               numpy_helper.from_array(rng.normal(0, 0.1, (4,)).astype(np.float32), "b"),
               numpy_helper.from_array(rng.normal(0, 0.3, (4, 5)).astype(np.float32), "fc")]
    nodes = [helper.make_node("Conv", ["input.1", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("GlobalAveragePool", ["r"], ["p"]),
             helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("MatMul", ["f", "fc"], ["m"]),
             helper.make_node("Softmax", ["m"], ["out"], axis=1)]
    dims = ["batch", 3, 8, 8] if symbolic else [1, 3, 8, 8]
    graph = helper.make_graph(
        nodes, "tiny", [helper.make_tensor_value_info("input.1", TensorProto.FLOAT, dims)],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [dims[0], 5])], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))


def tflite_model(path, seed: int = 0) -> None:
    """A TFLite file: CONV_2D (3->4, 3x3, SAME, fused ReLU) then SOFTMAX, on a 1x8x8x3 float32
    input named ``input``, written with the tflite package's flatbuffer builders."""
    import flatbuffers
    import tflite

    rng = np.random.default_rng(seed)
    b = flatbuffers.Builder(4096)

    def vector(start, items, prepend):
        start(b, len(items))
        for item in reversed(items):
            prepend(item)
        return b.EndVector()

    def ints(start, values):
        return vector(start, list(values), b.PrependInt32)

    def offsets(start, values):
        return vector(start, list(values), b.PrependUOffsetTRelative)

    buffers = []
    for data in (None, rng.normal(0, 0.3, (4, 3, 3, 3)).astype(np.float32).tobytes(),
                 rng.normal(0, 0.1, (4,)).astype(np.float32).tobytes()):
        vec = b.CreateByteVector(data) if data is not None else None
        tflite.BufferStart(b)
        if vec is not None:
            tflite.BufferAddData(b, vec)
        buffers.append(tflite.BufferEnd(b))
    tensors = []
    for name, shape, buffer in (("input", (1, 8, 8, 3), 0), ("weight", (4, 3, 3, 3), 1),
                                ("bias", (4,), 2), ("conv", (1, 8, 8, 4), 0),
                                ("probs", (1, 8, 8, 4), 0)):
        name_offset = b.CreateString(name)
        shape_offset = ints(tflite.TensorStartShapeVector, shape)
        tflite.TensorStart(b)
        tflite.TensorAddShape(b, shape_offset)
        tflite.TensorAddType(b, tflite.TensorType.FLOAT32)
        tflite.TensorAddBuffer(b, buffer)
        tflite.TensorAddName(b, name_offset)
        tensors.append(tflite.TensorEnd(b))
    tflite.Conv2DOptionsStart(b)
    tflite.Conv2DOptionsAddPadding(b, tflite.Padding.SAME)
    tflite.Conv2DOptionsAddStrideW(b, 1)
    tflite.Conv2DOptionsAddStrideH(b, 1)
    tflite.Conv2DOptionsAddDilationWFactor(b, 1)
    tflite.Conv2DOptionsAddDilationHFactor(b, 1)
    tflite.Conv2DOptionsAddFusedActivationFunction(b, tflite.ActivationFunctionType.RELU)
    conv_options = tflite.Conv2DOptionsEnd(b)
    tflite.SoftmaxOptionsStart(b)
    tflite.SoftmaxOptionsAddBeta(b, 1.0)
    softmax_options = tflite.SoftmaxOptionsEnd(b)
    operators = []
    for index, (inputs, outputs, kind, options) in enumerate((
            ([0, 1, 2], [3], tflite.BuiltinOptions.Conv2DOptions, conv_options),
            ([3], [4], tflite.BuiltinOptions.SoftmaxOptions, softmax_options))):
        ins = ints(tflite.OperatorStartInputsVector, inputs)
        outs = ints(tflite.OperatorStartOutputsVector, outputs)
        tflite.OperatorStart(b)
        tflite.OperatorAddOpcodeIndex(b, index)
        tflite.OperatorAddInputs(b, ins)
        tflite.OperatorAddOutputs(b, outs)
        tflite.OperatorAddBuiltinOptionsType(b, kind)
        tflite.OperatorAddBuiltinOptions(b, options)
        operators.append(tflite.OperatorEnd(b))
    codes = []
    for code in (tflite.BuiltinOperator.CONV_2D, tflite.BuiltinOperator.SOFTMAX):
        tflite.OperatorCodeStart(b)
        tflite.OperatorCodeAddDeprecatedBuiltinCode(b, code)
        tflite.OperatorCodeAddBuiltinCode(b, code)
        tflite.OperatorCodeAddVersion(b, 1)
        codes.append(tflite.OperatorCodeEnd(b))
    tensor_vec = offsets(tflite.SubGraphStartTensorsVector, tensors)
    in_vec = ints(tflite.SubGraphStartInputsVector, [0])
    out_vec = ints(tflite.SubGraphStartOutputsVector, [4])
    op_vec = offsets(tflite.SubGraphStartOperatorsVector, operators)
    graph_name = b.CreateString("main")
    tflite.SubGraphStart(b)
    tflite.SubGraphAddTensors(b, tensor_vec)
    tflite.SubGraphAddInputs(b, in_vec)
    tflite.SubGraphAddOutputs(b, out_vec)
    tflite.SubGraphAddOperators(b, op_vec)
    tflite.SubGraphAddName(b, graph_name)
    graph = tflite.SubGraphEnd(b)
    graphs = offsets(tflite.ModelStartSubgraphsVector, [graph])
    code_vec = offsets(tflite.ModelStartOperatorCodesVector, codes)
    buffer_vec = offsets(tflite.ModelStartBuffersVector, buffers)
    tflite.ModelStart(b)
    tflite.ModelAddVersion(b, 3)
    tflite.ModelAddOperatorCodes(b, code_vec)
    tflite.ModelAddSubgraphs(b, graphs)
    tflite.ModelAddBuffers(b, buffer_vec)
    b.Finish(tflite.ModelEnd(b), file_identifier=b"TFL3")
    Path(path).write_bytes(bytes(b.Output()))


def torch_program(path) -> None:
    """A torch.export program (conv, ReLU, mean, linear, softmax) with a symbolic batch."""

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
            self.fc = torch.nn.Linear(4, 5)

        def forward(self, x):
            return torch.softmax(self.fc(self.conv(x).relu().mean(dim=(2, 3))), -1)

    torch.manual_seed(0)
    batch = torch.export.Dim("batch", max=64)
    program = torch.export.export(Tiny().eval(), (torch.randn(2, 3, 8, 8),),
                                  dynamic_shapes={"x": {0: batch}})
    torch.export.save(program, str(path))


def write_images(folder: Path) -> None:
    """Three small images of different sizes and modes (RGB PNG, grey PNG, RGB JPEG)."""
    from PIL import Image

    folder.mkdir()
    rng = np.random.default_rng(3)
    y, x = np.mgrid[0:40, 0:30]
    rgb = np.stack([x * 8, y * 6, (x + y) * 3], -1) + rng.integers(0, 30, (40, 30, 3))
    Image.fromarray(rgb.clip(0, 255).astype(np.uint8)).save(folder / "a.png")
    Image.fromarray(rng.integers(0, 255, (20, 20), dtype=np.uint8), "L").save(folder / "b.png")
    Image.fromarray(rng.integers(0, 255, (24, 32, 3), dtype=np.uint8)).save(folder / "c.jpg")
    (folder / "notes.txt").write_text("not an image: ignored")


# ------------------------------------------------------------------------------ running
class Run:
    """A command started now and waited for on first use."""

    def __init__(self, argv, timeout=600):
        self.argv = argv
        self.process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        text=True, cwd=REPO, env=_env())
        self.timeout = timeout
        self._result = None

    def result(self):
        if self._result is None:
            out, err = self.process.communicate(timeout=self.timeout)
            self._result = (self.process.returncode, out, err)
        return self._result

    def ok(self):
        code, out, err = self.result()
        assert code == 0, f"{' '.join(map(str, self.argv))}\n{err[-3000:]}"
        return out, err


#: Runs ``relay_amp.cli.main(argv)`` once per case, each in a forked child process whose
#: stdout/stderr go to files; writes the exit codes to codes.json.
FORK_RUNNER = textwrap.dedent("""
    import json, os, sys, traceback
    from relay_amp import cli
    cases_file, folder = sys.argv[1], sys.argv[2]
    codes = []
    for index, argv in enumerate(json.load(open(cases_file))):
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            for fd, name in ((1, "out"), (2, "err")):
                handle = os.open(os.path.join(folder, f"{index}.{name}"),
                                 os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
                os.dup2(handle, fd)
            try:
                code = cli.main(argv)
            except SystemExit as stop:
                code = stop.code if isinstance(stop.code, int) else 1
            except BaseException:
                traceback.print_exc()
                code = 99
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code or 0)
        codes.append(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
    json.dump(codes, open(os.path.join(folder, "codes.json"), "w"))
""")


class ForkedCases:
    """Many CLI invocations, each in its own process, for the price of one TVM import."""

    def __init__(self, folder: Path, cases: list):
        folder.mkdir()
        self.folder, self.cases = folder, cases
        (folder / "cases.json").write_text(json.dumps(cases))
        self.run = Run([sys.executable, "-c", FORK_RUNNER, str(folder / "cases.json"),
                        str(folder)])

    def results(self) -> list:
        self.run.ok()
        codes = json.loads((self.folder / "codes.json").read_text())
        return [(code, (self.folder / f"{i}.out").read_text(),
                 (self.folder / f"{i}.err").read_text()) for i, code in enumerate(codes)]


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    root = tmp_path_factory.mktemp("convert")
    onnx_model(root / "tiny.onnx")
    onnx_model(root / "tiny_sym.onnx", symbolic=True)
    tflite_model(root / "tiny.tflite")
    if torch is not None:
        torch_program(root / "tiny.pt2")
    write_images(root / "images")
    (root / "empty").mkdir()
    rng = np.random.default_rng(1)
    # three batches for the TFLite model, stacked along a new first axis
    np.savez(root / "tflite.npz", input=rng.normal(0, 1, (3, 1, 8, 8, 3)).astype(np.float32))
    np.savez(root / "wrong_name.npz", images=rng.normal(0, 1, (1, 3, 8, 8)).astype(np.float32))
    np.savez(root / "wrong_shape.npz",
             **{"input.1": rng.normal(0, 1, (1, 3, 9, 9)).astype(np.float32)})
    (root / "model.txt").write_text("not a model")
    (root / "fake.tflite").write_text("not a flatbuffer at all")
    (root / "bad_policy.json").write_text('{"dtype": "float16", "fp32_opps": []}')
    (root / "not_json.json").write_text("{dtype: float16")
    (root / "a_file").write_text("x")
    (root / "foreign").mkdir()
    (root / "foreign" / "keep.txt").write_text("someone else's file")
    return root


def _runs(work: Path) -> dict:
    onnx_cuda = [*CLI, "convert", str(work / "tiny_sym.onnx"), "--dtype", "float16",
                 "--target", "cuda -arch=sm_80", "--input", "input.1:1,3,8,8",
                 "--calibrate", str(work / "images"), "--normalize", "imagenet",
                 "--tolerance", "5e-5", "--fp32-ops", "nn.softmax", "-o", str(work / "onnx_cuda")]
    tflite_cpu = [*CLI, "convert", str(work / "tiny.tflite"), "--dtype", "float16",
                  "--target", "host", "--calibrate", str(work / "tflite.npz"), "--quiet",
                  "-o", str(work / "tflite_cpu")]
    warn = [*CLI, "convert", str(work / "tiny.onnx"), "--dtype", "float16",
            "--target", "llvm -mattr=+avx512fp16", "--calibrate", str(work / "images"),
            "--normalize", "imagenet", "--warn-above", "1e-9", "--quiet", "-o", str(work / "warn")]
    runs = {"onnx_cuda": Run(onnx_cuda), "tflite_cpu": Run(tflite_cpu), "warn": Run(warn)}
    if torch is not None:
        runs["pt2"] = Run([*CLI, "convert", str(work / "tiny.pt2"), "--dtype", "bfloat16",
                           "--target", "llvm", "--input", "x:2,3,8,8", "--quiet",
                           "-o", str(work / "pt2_llvm")])
    return runs


def bad_cases(work: Path) -> list:
    """``(argv, words the one-line message must contain)``; each must exit 2 and write nothing."""
    onnx, sym = str(work / "tiny.onnx"), str(work / "tiny_sym.onnx")
    out = str(work / "never")

    def convert_args(*args, model=onnx):
        return ["convert", model, "-o", out, "--quiet", *args]

    return [
        (convert_args("--dtype", "float16", model=str(work / "missing.onnx")), "does not exist"),
        (convert_args("--dtype", "float16", model=str(work / "model.txt")),
         "cannot tell the format"),
        (convert_args("--dtype", "float16", model=str(work / "fake.tflite")),
         "does not look like a TFLite file"),
        (convert_args("--dtype", "float16", "--target", "cuda -arch"), "-arch needs a value"),
        (convert_args("--dtype", "float16", "--target", "cdua"), "did you mean 'cuda'"),
        (convert_args("--dtype", "float16", "--target", "cuda -ach=sm_90"), "did you mean -arch"),
        (convert_args("--dtype", "float16", "--target", '{"kind": "cuda"'), "not valid JSON"),
        (convert_args("--dtype", "float16", "--target", "llvm -num-cores=many"),
         "takes an integer"),
        (convert_args("--dtype", "float16", "--fp32-ops", "nn.sofmax"),
         "did you mean 'nn.softmax'"),
        (convert_args("--dtype", "float16", "--input", "input.1:1,3,a-b,8"), "bad shape"),
        (convert_args("--dtype", "float16", "--input", "input.1:1,3,a,8"), "dimension 2 is 8"),
        (convert_args("--dtype", "float16", "--warn-above", "0"), "--warn-above 0"),
        (convert_args("--dtype", "float16", "--input", "images:1,3,8,8"),
         "its inputs are input.1"),
        (convert_args("--dtype", "float16", "--input", "input.1:batch=1..4,3,8,8",
                      "--calibrate", str(work / "wrong_shape.npz"), model=sym),
         "takes [batch=1..4,3,8,8]"),
        (convert_args("--dtype", "float16", "--input", "input:batch,8,8,3",
                      model=str(work / "tiny.tflite")), "importer takes numbers only"),
        (convert_args("--dtype", "float16", "--input", "input.1:1,3,8", model=sym),
         "has 3 dimensions"),
        (convert_args("--dtype", "float16", "--input", "input.1:2,3,8,8"),
         "does not match the model's fixed shape"),
        (convert_args("--dtype", "float8"), "use float16 or bfloat16"),
        (convert_args(), "give --dtype"),
        (convert_args("--dtype", "float16", "--tolerance", "0.01"), "add --calibrate"),
        (convert_args("--dtype", "float16", "--tolerance", "-1", "--calibrate",
                      str(work / "images")), "give a positive number"),
        (convert_args("--dtype", "float16", "--calibrate", str(work / "nowhere")),
         "does not exist"),
        (convert_args("--dtype", "float16", "--calibrate", str(work / "empty")), "no images in"),
        (convert_args("--dtype", "float16", "--calibrate", str(work / "wrong_name.npz")),
         "has no array for input(s) input.1"),
        (convert_args("--dtype", "float16", "--calibrate", str(work / "wrong_shape.npz")),
         "takes [1, 3, 8, 8]"),
        (convert_args("--dtype", "float16", "--calibrate", str(work / "images")),
         "images need --normalize"),
        (convert_args("--dtype", "float16", "--normalize", "0.5"), "bad --normalize"),
        (convert_args("--policy", str(work / "no_policy.json")), "does not exist"),
        (convert_args("--policy", str(work / "not_json.json")), "is not JSON"),
        (convert_args("--policy", str(work / "bad_policy.json")), "unknown policy keys"),
        (["convert", onnx, "--dtype", "float16", "-o", str(work / "a_file")], "is a file"),
        (["convert", onnx, "--dtype", "float16", "-o", str(work / "foreign")],
         "did not write (keep.txt)"),
        (convert_args("--dtype", "float16", "--exclude", "lv99"), "is not a binding"),
        (["convert", onnx, "--dtype", "float16"], "required: -o/--out"),
        (convert_args("--dtype", "float16", "--input", "input.1:1,3,8,8:uint8"),
         "add --normalize"),
    ]


def _exclude_after_import(work: Path) -> Run:
    return Run([*CLI, "convert", str(work / "tiny.onnx"), "--dtype", "float16",
                "--exclude", "lv,lv66", "-o", str(work / "new_parent" / "out")])


@pytest.fixture(scope="module")
def runs(work):
    """Every independent command, started at once."""
    started = _runs(work)
    started["bad"] = ForkedCases(work / "bad_cases", [argv for argv, _ in bad_cases(work)])
    started["exclude"] = _exclude_after_import(work)
    return started


@pytest.fixture(scope="module")
def onnx_cuda(runs, work):
    """The ONNX/CUDA run's outputs, read before the round-trip run replaces them."""
    out, err = runs["onnx_cuda"].ok()
    folder = work / "onnx_cuda"
    files = {p.name: p.read_bytes() for p in folder.iterdir()}
    return {"stdout": out, "stderr": err, "files": files,
            "report": json.loads(files["report.json"]),
            "policy": json.loads(files["policy.json"]),
            "accuracy": json.loads(files["accuracy.json"])}


def _no_partial_folders(folder: Path, runs: dict):
    """No command left a half-written or replaced output behind, once every command started
    beside this test has ended (a running one's partial folder is not a leftover)."""
    for run in runs.values():
        (run.run if isinstance(run, ForkedCases) else run).result()
    assert not [p.name for p in folder.iterdir() if ".partial-" in p.name or ".old-" in p.name]


# ------------------------------------------------------------------------------ conversions
def test_onnx_for_cuda_with_images_tolerance_and_fp32_ops(onnx_cuda, runs, work):
    assert set(onnx_cuda["files"]) == OUTPUTS | {"accuracy.json"}
    assert b"__global__" in onnx_cuda["files"]["model.so"]  # CUDA source for the GPU host
    report = onnx_cuda["report"]
    assert report["target"]["kind"] == "cuda" and report["target"]["arch"] == "sm_80"
    assert report["model"]["format"] == "onnx" and report["dtype"] == "float16"
    assert report["model"]["inputs"] == [{"name": "input.1", "parameter": "input_1",
                                          "shape": [1, 3, 8, 8], "dtype": "float32",
                                          "fed_as": "float32"}]
    assert report["calibration"]["kind"] == "images" and report["calibration"]["images"] == 3
    rows = {row["name"]: row for row in report["conversion"]["rows"]}
    softmax = [row for row in rows.values() if row["op"] == "nn.softmax"]
    assert softmax and all(row["compute_dtype"] == "float32" for row in softmax)
    search = report["conversion"]["search"]
    assert search["met"] and search["fp32_bindings"] and search["tolerance"] == 5e-5
    for name in search["fp32_bindings"]:
        assert "auto_mixed_precision fallback" in rows[name]["rule"]
        assert rows[name]["compute_dtype"] == "float32"
    converted = [row for row in rows.values() if row["compute_dtype"] == "float16"]
    assert converted, "the search keeps what it need not in float32 in float16"
    accuracy = onnx_cuda["accuracy"]
    assert accuracy["batches"] == 3 and accuracy["tolerance"] == 5e-5
    assert accuracy["relative_l2"] <= 5e-5 and accuracy["nonfinite"] == 0
    policy = onnx_cuda["policy"]
    assert policy["op_categories"] == {"nn.softmax": "fp32"}
    assert set(search["fp32_bindings"]) <= set(policy["exclude_names"])
    markdown = onnx_cuda["files"]["report.md"].decode()
    assert "## Accuracy-driven fallback" in markdown and "enable_cuda" in markdown
    stderr = onnx_cuda["stderr"]  # progress bars for every step
    for step in ("import tiny_sym.onnx", "calibration images", "calibrate", "search",
                 "build for cuda"):
        assert step in stderr, step
    assert "wrote" in onnx_cuda["stdout"] and "tolerance 5e-05 met" in onnx_cuda["stdout"]
    timings = report["timings_s"]  # every stage's seconds, in report.json and on stdout
    build_parts = ("build_relax_passes_s", "build_tir_passes_s", "build_codegen_s",
                   "build_export_s")
    assert set(timings) == {"import_s", "calibrate_s", "search_s", "build_s", "accuracy_s",
                            "total_s", *build_parts}
    assert sum(timings[k] for k in build_parts) <= timings["build_s"] <= timings["total_s"]
    (line,) = [line for line in onnx_cuda["stdout"].splitlines() if line.startswith("time: ")]
    assert line == saved_report.time_line(timings)
    assert re.fullmatch(r"time: import \S+ s, calibrate \S+ s, search \S+ s, build \S+ s "
                        r"\(Relax passes \S+ s, TIR passes \S+ s, code generation \S+ s, "
                        r"export \S+ s\), accuracy \S+ s, total \S+ s", line), line
    assert f"| time | {line.removeprefix('time: ')} |" in markdown
    _no_partial_folders(work, runs)


def test_tflite_for_this_cpu_with_npz_and_the_library_runs(runs, work):
    import tvm
    from tvm.relax.frontend.tflite import from_tflite

    import relay_amp

    out, err = runs["tflite_cpu"].ok()
    folder = work / "tflite_cpu"
    assert {p.name for p in folder.iterdir()} == OUTPUTS | {"accuracy.json"}
    assert err == ""  # --quiet: no progress bars, no warnings
    report = json.loads((folder / "report.json").read_text())
    assert report["accuracy_warning"] is None  # measured, within --warn-above's 0.01
    assert report["model"]["format"] == "tflite"
    storage = [r for r in report["conversion"]["rows"] if r["rule"].startswith("storage")]
    if storage:  # a CPU without AVX512-FP16: the summary says so and how to get float16 compute
        assert "compute in float32 because target llvm" in report["conversion"]["summary"]
        assert report["advice"] and report["advice"][0] in out and "+avx512fp16" in out
    assert report["model"]["inputs"][0]["shape"] == [1, 8, 8, 3]
    assert report["calibration"] == {"kind": "npz", "path": str(work / "tflite.npz"),
                                     "batches": 3}
    # every kernel's schedule, and the dot products' tiles, in report.json and report.md
    schedules = report["kernel_schedules"]
    convs = [s for s in schedules if "conv2d" in s["kernel"]]
    assert convs and all(s["rule"] == "VectorizeDotProduct" for s in convs)
    assert all(any(d.startswith("tile: ") for d in s["decisions"]) for s in convs)
    markdown = (folder / "report.md").read_text()
    assert "## Every kernel's schedule" in markdown
    assert all(f"| {s['kernel']} | {s['rule'] or 'none'} |" in markdown for s in schedules)
    accuracy = json.loads((folder / "accuracy.json").read_text())
    assert accuracy["ran_on"].startswith("the built library") and accuracy["batches"] == 3
    assert accuracy["relative_l2"] < 1e-2
    # the library loads and runs on its own, close to float32
    batch = np.load(work / "tflite.npz")["input"][0]
    vm = tvm.runtime.vm.VirtualMachine(tvm.runtime.load_module(str(folder / "model.so")),
                                       tvm.cpu())
    (got,) = relay_amp.run(vm, [batch])
    import tflite

    model = tflite.Model.GetRootAsModel((work / "tiny.tflite").read_bytes(), 0)
    imported = from_tflite(model)
    mod = imported[0] if isinstance(imported, tuple) else imported
    (want,) = relay_amp.run(relay_amp.compile_module(mod), [batch])
    assert got.shape == (1, 8, 8, 4)
    assert relay_amp.agreement([want], [got]).relative_l2 < 1e-2


def test_lost_accuracy_is_a_warning_naming_the_bindings_that_lose_it(runs, work):
    out, err = runs["warn"].ok()
    report = json.loads((work / "warn" / "report.json").read_text())
    # --quiet: no progress bars; --warn-above 1e-9: the one warning, on stderr
    assert err.strip() == report["accuracy_warning"] and "\n" not in err.strip()
    assert err.startswith("warning: accuracy lost: relative L2")
    contributors = json.loads((work / "warn" / "accuracy.json").read_text())["contributors"]
    low = {r["name"] for r in report["conversion"]["rows"]
           if "float16" in (r["compute_dtype"], *r["output_dtype"].split("+"))}
    assert contributors and {name for name, _ in contributors} <= low
    assert [e for _, e in contributors] == sorted((e for _, e in contributors), reverse=True)
    assert f"{contributors[0][0]} ({contributors[0][1]:.2g})" in err
    assert f"--exclude {contributors[0][0]}" in err
    assert "accuracy lost" in (work / "warn" / "report.md").read_text()


@pytest.mark.skipif(torch is None, reason="torch is not installed (pip install -r "
                                          "requirements.txt)")
def test_pt2_with_a_symbolic_batch_for_llvm(runs, work):
    import tvm

    import relay_amp

    out, _ = runs["pt2"].ok()
    assert "accuracy not measured: add --calibrate" in out  # no data: it says so and how
    folder = work / "pt2_llvm"
    assert {p.name for p in folder.iterdir()} == OUTPUTS  # no calibration: no accuracy.json
    report = json.loads((folder / "report.json").read_text())
    assert report["model"]["format"] == "pt2" and report["dtype"] == "bfloat16"
    assert report["model"]["inputs"][0]["shape"] == [2, 3, 8, 8]
    assert report["target"] == {"kind": "llvm"}  # no mtriple TVM's build would fill in
    assert any("symbolic dimensions bound" in note for note in report["notes"])
    ops = {row["op"] for row in report["conversion"]["rows"]}
    assert {"nn.conv2d", "matmul", "nn.softmax"} <= ops
    vm = tvm.runtime.vm.VirtualMachine(tvm.runtime.load_module(str(folder / "model.so")),
                                       tvm.cpu())
    x = np.random.default_rng(0).normal(0, 1, (2, 3, 8, 8)).astype(np.float32)
    (probabilities,) = relay_amp.run(vm, [x])
    assert probabilities.shape == (2, 5)
    np.testing.assert_allclose(probabilities.sum(-1), 1.0, rtol=1e-2)


@pytest.fixture(scope="module")
def after_onnx_cuda(onnx_cuda, work):
    """What needs the ONNX/CUDA run's output, in one forked batch: the ``--policy`` round trip
    into the same OUT, and ``relay-amp report`` on a copy of its report.json."""
    folder = work / "onnx_cuda"
    saved = work / "saved_report.json"
    saved.write_bytes(onnx_cuda["files"]["report.json"])
    cases = ForkedCases(work / "after_cases", [
        ["convert", str(work / "tiny_sym.onnx"), "--policy", str(folder / "policy.json"),
         "--target", "cuda -arch=sm_80", "--input", "input.1:1,3,8,8", "--quiet",
         "-o", str(folder)],
        ["report", str(saved), "--op", "nn.softmax"],
        ["report", str(saved), "--rule", "fallback", "--compute", "float32"],
        ["report", str(saved), "--op", "softmax"],
        ["report", str(work / "nothing.json")],
        ["report", str(work / "not_json.json")],
    ])
    return cases.results()


def test_policy_round_trip_replaces_the_earlier_output(onnx_cuda, after_onnx_cuda, runs,
                                                       work):
    """``--policy OUT/policy.json`` converts as the search did, without the search; writing to the
    same OUT replaces the earlier output as a whole."""
    code, out, err = after_onnx_cuda[0]
    assert code == 0, err
    folder = work / "onnx_cuda"
    assert {p.name for p in folder.iterdir()} == OUTPUTS  # accuracy.json went with the old run
    report = json.loads((folder / "report.json").read_text())
    assert json.loads((folder / "policy.json").read_text()) == onnx_cuda["policy"]
    before = [(r["name"], r["op"], r["compute_dtype"]) for r in
              onnx_cuda["report"]["conversion"]["rows"]]
    assert [(r["name"], r["op"], r["compute_dtype"]) for r in
            report["conversion"]["rows"]] == before
    assert report["conversion"]["search"] is None
    _no_partial_folders(work, runs)


def test_report_command_prints_and_filters(onnx_cuda, after_onnx_cuda):
    saved = onnx_cuda["report"]
    text = saved_report.format_report(saved)
    assert saved["conversion"]["summary"] in text and "binding" in text
    fp32_rule = saved_report.format_report(saved, rules=["auto_mixed_precision"])
    count = len(saved["conversion"]["search"]["fp32_bindings"])
    assert f"{count} of {len(saved['conversion']['rows'])} rows" in fp32_rule
    only = saved_report.format_report(saved, ops=["nn.softmax"])
    assert "1 of" in only and "nn.conv2d" not in only.split("rows")[-1]
    with pytest.raises(arguments.UsageError, match="did you mean nn.conv2d"):
        saved_report.format_report(saved, ops=["nn.conv2"])
    _, (code, out, err), (code2, out2, _), *errors = after_onnx_cuda
    assert code == 0 and err == "" and "nn.softmax" in out and "1 of" in out
    assert code2 == 0 and f"{count} of" in out2
    for (code, out, err), words in zip(errors, ("did you mean nn.softmax", "does not exist",
                                                "is not JSON")):
        assert code == 2 and out == "" and words in err and err.count("\n") == 1, err


# ------------------------------------------------------------------------------ bad arguments
def test_every_bad_argument_is_one_line_exit_2_and_nothing_written(runs, work):
    cases = bad_cases(work)
    results = runs["bad"].results()
    assert len(results) == len(cases) >= 10
    for (argv, words), (code, out, err) in zip(cases, results):
        assert code == 2, (argv, code, err)
        assert err.count("\n") == 1 and err.startswith("relay-amp convert:"), (argv, err)
        assert words in err, (argv, err)
        assert out == ""
    assert not (work / "never").exists()
    assert sorted(p.name for p in (work / "foreign").iterdir()) == ["keep.txt"]
    _no_partial_folders(work, runs)


def test_a_bad_argument_found_after_import_through_python_m(runs, work):
    """The entry point itself: an unknown --exclude name is found after the import; the
    command still writes nothing, not even OUT's parent folder it would have created."""
    code, stdout, stderr = runs["exclude"].result()
    assert code == 2 and stdout == ""
    last = stderr.strip().splitlines()[-1]  # progress bars before it
    assert last.startswith("relay-amp convert: --exclude 'lv66' is not a binding"), stderr
    assert "did you mean" in last
    assert not (work / "new_parent").exists()


# ------------------------------------------------------------------------------ in process
def test_a_failure_after_the_build_leaves_nothing(runs, work, monkeypatch):
    def broken(*_args, **_kwargs):
        raise arguments.ConvertFailure("accuracy run failed")

    monkeypatch.setattr(convert, "measure_accuracy", broken)
    out = work / "failed"
    options = convert.Options(model=str(work / "tiny.onnx"), out=str(out), dtype="float16",
                              calibrate=str(work / "images"), normalize="none", progress=False)
    with pytest.raises(arguments.ConvertFailure, match="accuracy run failed"):
        convert.convert_model(options)
    assert not out.exists()
    _no_partial_folders(work, runs)


def test_uint8_images_straight_in(work):
    """``--input NAME:SHAPE:uint8``: the library takes uint8 pixels, normalization folded in."""
    out = work / "uint8"
    options = convert.Options(model=str(work / "tiny.onnx"), out=str(out), dtype="float16",
                              target='{"kind": "cuda", "arch": "sm_90"}',
                              inputs=[arguments.parse_input("input.1:1,3,8,8:uint8")],
                              calibrate=str(work / "images"), normalize="imagenet",
                              progress=False)
    saved = convert.convert_model(options)
    assert saved["model"]["inputs"][0]["fed_as"] == "uint8"
    policy = json.loads((out / "policy.json").read_text())
    assert policy["input_dtypes"] == {"input_1": "uint8"}
    assert policy["input_normalization"]["input_1"]["std"][0] == pytest.approx(255 * 0.229)
    accuracy = json.loads((out / "accuracy.json").read_text())
    assert accuracy["relative_l2"] < 1e-2 and accuracy["nonfinite"] == 0
    assert any("fed as uint8" in note for note in saved["conversion"]["notes"])


def test_the_time_line_names_each_stage_and_the_parts_of_the_build():
    timings = {"import_s": 0.4123, "convert_s": 0.05, "build_s": 12.34,
               "build_relax_passes_s": 9.876, "build_tir_passes_s": 1.0,
               "build_codegen_s": 1.2, "build_export_s": 0.2, "total_s": 12.9}
    assert saved_report.time_line(timings) == (
        "time: import 0.41 s, convert 0.05 s, build 12 s (Relax passes 9.88 s, TIR passes "
        "1.00 s, code generation 1.20 s, export 0.20 s), total 13 s")
    assert saved_report.time_line({"import_s": 1, "convert_s": 2, "build_s": 3}) == (
        "time: import 1.00 s, convert 2.00 s, build 3.00 s")  # a report from before the parts


def test_target_short_forms_become_dicts():
    parse = arguments.parse_target
    assert parse("cuda -arch=sm_90")[0] == {"kind": "cuda", "arch": "sm_90"}
    assert parse("cuda --arch sm_86 -max_num_threads=512")[0] == {
        "kind": "cuda", "arch": "sm_86", "max_num_threads": 512}
    assert parse("llvm -mtriple=aarch64-linux-gnu -mattr=+fullfp16,+bf16")[0] == {
        "kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+fullfp16", "+bf16"]}
    assert parse('{"kind": "llvm", "mcpu": "skylake"}')[0] == {"kind": "llvm", "mcpu": "skylake"}
    assert parse("llvm")[0] == {"kind": "llvm"}
    assert parse("host")[0]["kind"] == "llvm" and "mcpu" in parse("host")[0]
    config, notes = parse("cuda")
    assert config["kind"] == "cuda" and config["arch"].startswith("sm_")
    assert notes and "arch" in notes[0]
    for text, words in (("cuda -arch", "needs a value"), ("llvm mcpu=x", "cannot parse"),
                        ("cuda -arch=sm_90 -arhc=1", "did you mean -arch"),
                        ("{}", "a dict with a \"kind\""), ("", "is empty"),
                        ("llvm -fast-math=perhaps", "takes true or false")):
        with pytest.raises(arguments.UsageError, match=words):
            parse(text)


def test_input_specs_and_normalization():
    assert arguments.parse_input("images:1,3,224,224") == arguments.InputSpec(
        "images", (1, 3, 224, 224))
    assert arguments.parse_input("ids:1x128:int64") == arguments.InputSpec("ids", (1, 128), "int64")
    assert arguments.parse_input("a:b:1,2") == arguments.InputSpec("a:b", (1, 2))
    for text, words in (("images", "use --input NAME:SHAPE"), ("x:1,0", "bad shape"),
                        ("x:1,2:floa32", "did you mean 'float32'"), (":1,2", "use --input")):
        with pytest.raises(arguments.UsageError, match=words):
            arguments.parse_input(text)
    assert arguments.parse_normalize("none") == "none"
    assert arguments.parse_normalize("0.5,0.25") == ((0.5,), (0.25,))
    mean, std = arguments.parse_normalize("imagenet")
    assert len(mean) == len(std) == 3
    spec = calibration_data.normalization_spec(((0.5,), (0.25,)), "NHWC", 3)
    assert spec == {"mean": [127.5] * 3, "std": [63.75] * 3, "axis": 3}
    pixels = np.full((1, 2, 2, 3), 255, np.uint8)
    np.testing.assert_allclose(calibration_data.apply_normalization(pixels, spec), 2.0)
    with pytest.raises(arguments.UsageError, match="divides by zero"):
        arguments.parse_normalize("0.5,0")


def test_an_aarch64_library_is_linked_with_the_cross_compiler_found_or_left_as_objects(
        monkeypatch):
    """The command links through ``relay_amp.builds.remote``'s compiler search: with
    ``aarch64-linux-gnu-g++`` on PATH a ``model.so``; with none, ``model.tar`` and a note that
    says how to link it on the board."""
    from relay_amp.builds import remote

    target = {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+fullfp16"]}
    monkeypatch.setattr(remote.shutil, "which", lambda name: f"/usr/bin/{name}")
    fcompile, library, note = convert._cross_compiler(target)
    assert callable(fcompile) and library == "model.so"
    assert note == "linked with aarch64-linux-gnu-g++"
    monkeypatch.setattr(remote.shutil, "which", lambda name: None)
    fcompile, library, note = convert._cross_compiler(target)
    assert fcompile is None and library == "model.tar"
    assert "tvm.runtime.load_module('model.tar')" in note
    assert convert._cross_compiler({"kind": "llvm"}) == (None, "model.so", None)
