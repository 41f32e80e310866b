"""The ``relay-amp`` command without the model zoo: where it lives, its report into a closed pipe,
the target parser every subcommand shares, progress in a log, the summary on a CPU target
without fast float16."""

import io
import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from tvm.script import ir as I
from tvm.script import relax as R

import relay_amp
from relay_amp.cli import arguments, progress

ROOT = Path(__file__).resolve().parents[2]


@I.ir_module
class Matmuls:
    @R.function
    def main(x: R.Tensor((4, 16), "float32"), w: R.Tensor((16, 16), "float32")):
        with R.dataflow():
            lv = R.matmul(x, w)
            lv1 = R.nn.relu(lv)
            gv = R.matmul(lv1, w)
            R.output(gv)
        return gv


def test_the_console_script_is_the_cli_package_not_the_harness():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["relay-amp"] == "relay_amp.cli:main"
    code = ("import sys, relay_amp.cli.convert, relay_amp.cli.report; "
            "print(sorted(m for m in sys.modules if m.startswith('relay_amp.eval')))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True)
    assert result.stdout.strip() == "[]"  # convert and report never load the harness


def _saved_report(tmp_path, copies: int) -> Path:
    converted, report = relay_amp.convert(Matmuls, "float16", target={"kind": "llvm"})
    conversion = report.to_dict()
    conversion["rows"] = conversion["rows"] * copies
    saved = {"model": {"path": "m.onnx", "format": "onnx"}, "target": {"kind": "llvm"},
             "library": "model.so", "notes": [], "conversion": conversion}
    path = tmp_path / "report.json"
    path.write_text(json.dumps(saved))
    return path


def test_report_into_a_pipe_closed_early_prints_one_line_and_no_traceback(tmp_path):
    path = _saved_report(tmp_path, copies=3000)  # far more than a pipe buffer holds
    result = subprocess.run(f"{sys.executable} -m relay_amp.cli report {path} | head -1",
                            shell=True, capture_output=True, text=True, cwd=ROOT)
    assert result.stdout.count("\n") == 1 and result.stdout.startswith("model")
    assert result.stderr == ""
    full = subprocess.run([sys.executable, "-m", "relay_amp.cli", "report", str(path)],
                          capture_output=True, text=True, cwd=ROOT)
    assert full.returncode == 0 and full.stdout.count("\n") > 3000


@pytest.mark.parametrize("dtype, x86, arm", [("float16", "+avx512fp16", "+fullfp16"),
                                             ("bfloat16", "+avx512bf16", "+bf16")])
def test_a_cpu_without_fast_low_precision_says_compute_stays_float32(dtype, x86, arm):
    _, report = relay_amp.convert(Matmuls, dtype, target={"kind": "llvm", "mcpu": "x86-64"})
    summary = report.summary()
    assert "converted 0/3 ops" in summary
    assert f"2 ops compute in float32 because target llvm x86-64 has no fast {dtype}" in summary
    _, fast = relay_amp.convert(Matmuls, dtype, target={"kind": "llvm", "mattr": [x86]})
    assert "compute in float32" not in fast.summary()
    _, arm_report = relay_amp.convert(Matmuls, dtype, target={
        "kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": [arm]})
    assert "converted 0/" not in arm_report.summary()  # the hint names working targets
    assert "compute in float32" not in arm_report.summary()


def test_llvm_keeps_the_target_as_given():
    """TVM fills in its build's default triple (``x86_64-conda-linux-gnu`` in some wheels);
    the parsed target, which the report records, holds only what was chosen."""
    assert arguments.parse_target("llvm")[0] == {"kind": "llvm"}
    assert "mtriple" not in arguments.parse_target("host")[0]


def test_sweep_takes_the_short_target_forms(tmp_path):
    """One target parser for every subcommand: ``sweep --target "cuda -arch=sm_90"`` works and a
    bad target is one line, exit 2."""
    ok = subprocess.run([sys.executable, "-m", "relay_amp.cli", "sweep", "--list",
                         "--target", "cuda -arch=sm_90"], capture_output=True, text=True, cwd=ROOT)
    assert ok.returncode == 0, ok.stderr
    bad = subprocess.run([sys.executable, "-m", "relay_amp.cli", "sweep", "--models", "x",
                          "--target", "cuda -arhc=sm_90", "--out", str(tmp_path)],
                         capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and "did you mean -arch" in bad.stderr
    assert bad.stderr.count("\n") == 1


def test_progress_in_a_log_is_lines_not_carriage_returns():
    log = io.StringIO()
    bar = progress.progress_bar(range(3), desc="models", stream=log)
    for _ in bar:
        pass
    text = log.getvalue()
    assert "\r" not in text and text.endswith("\n")
    assert text.strip().splitlines()[-1].startswith("models: 100%")
    silent = io.StringIO()
    for _ in progress.progress_bar(range(3), desc="models", stream=silent, disable=True):
        pass
    assert silent.getvalue() == ""


@pytest.mark.parametrize("text, name, shape, dtype", [
    ("serving_default_input_2:0:1,43844,1", "serving_default_input_2:0", (1, 43844, 1), None),
    ("serving_default_input_2:0:1,43844,1:float32", "serving_default_input_2:0", (1, 43844, 1),
     "float32"),
    ("a:b:c:1x8:int64", "a:b:c", (1, 8), "int64"),
    ("images:1,3,224,224", "images", (1, 3, 224, 224), None)])
def test_input_names_may_hold_colons_the_shape_is_split_from_the_right(text, name, shape, dtype):
    assert arguments.parse_input(text) == arguments.InputSpec(name, shape, dtype)


@pytest.mark.parametrize("text, words", [
    ("serving_default_input_2:0:1,0,1", "bad shape '1,0,1'"), ("x:1,a-b,3", "bad shape"),
    ("x:int64", "use --input NAME:SHAPE"), ("x:0:1,2:floa32", "did you mean 'float32'")])
def test_a_bad_input_spec_is_still_a_clear_usage_error(text, words):
    with pytest.raises(arguments.UsageError, match=words):
        arguments.parse_input(text)


def test_every_error_exit_is_one_line_with_its_code(capsys):
    assert arguments.error_exit("convert", arguments.UsageError("bad")) == 2
    assert arguments.error_exit("convert", arguments.ConvertFailure("failed")) == 1
    assert arguments.error_exit("convert", arguments.Interrupted("stopped")) == 130
    assert capsys.readouterr().err.splitlines() == [
        "relay-amp convert: bad", "relay-amp convert: failed", "relay-amp convert: stopped"]


def test_a_corrupt_model_file_is_one_error_line_not_a_traceback(tmp_path):
    for suffix, head in ((".onnx", b""), (".tflite", b"\x1c\x00\x00\x00TFL3")):
        path = tmp_path / f"model{suffix}"
        path.write_bytes(head + bytes(range(256)) * 4)  # past the format check, corrupt after
        result = subprocess.run([sys.executable, "-m", "relay_amp.cli", "convert", str(path),
                                 "-o", str(tmp_path / "out"), "--dtype", "float16", "--quiet"],
                                capture_output=True, text=True, cwd=ROOT)
        assert result.returncode in (1, 2), result.stderr  # unreadable, or TVM cannot import
        assert result.stderr.startswith("relay-amp convert: ") and result.stderr.count("\n") == 1


def test_a_tflite_file_without_the_tflite_package_is_a_clear_usage_error(tmp_path, monkeypatch):
    from relay_amp.cli import frontends
    from relay_amp.cli.arguments import UsageError

    monkeypatch.setitem(sys.modules, "tflite", None)  # import tflite raises ImportError
    with pytest.raises(UsageError, match="needs the tflite package: pip install tflite"):
        frontends.read_tflite(str(tmp_path / "model.tflite"))
