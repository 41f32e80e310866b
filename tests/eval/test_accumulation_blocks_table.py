"""scripts/accumulation_blocks.py: the per-setting table of the largest per-output error ratio
against the built-in pass, from sweep folders."""

import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).parents[2]


def _sweep(folder, errors):
    folder.mkdir()
    models = {name: {"batches": 4, "variants": {
        "relay_amp:float16": {"status": "ok", "relative_l2": max(ours),
                              "relative_l2_per_output": ours},
        "tvm:float16": {"status": "ok", "relative_l2": max(theirs),
                        "relative_l2_per_output": theirs}}}
        for name, (ours, theirs) in errors.items()}
    (folder / "results.json").write_text(json.dumps({"models": models}))
    return folder


def test_the_table_gives_each_settings_worst_output_and_which_settings_meet_it(tmp_path):
    plain = _sweep(tmp_path / "plain", {"a": ([1.0, 2.0], [2.0, 2.0]), "b": ([1.0], [1.0])})
    blocks = _sweep(tmp_path / "b16", {"a": ([1.0, 3.0], [2.0, 2.0]), "b": ([0.5], [1.0])})
    out = tmp_path / "rows.json"
    result = subprocess.run([sys.executable, "scripts/accumulation_blocks.py", f"float32={plain}",
                             f"B16={blocks}", "--json", str(out)], cwd=ROOT, capture_output=True,
                            text=True, check=True)
    lines = result.stdout.splitlines()
    assert lines[:4] == ["| model | float32 | B16 |", "|---|---:|---:|", "| a | 1.00 | 1.50 ✗ |",
                         "| b | 1.00 | 0.50 |"]
    assert lines[-1].endswith("Every model within 1.1: float32.")
    rows = json.loads(out.read_text())
    assert rows["B16"]["a"]["ratio"] == 1.5 and rows["B16"]["a"]["output"] == 1
    bad = subprocess.run([sys.executable, "scripts/accumulation_blocks.py", "nolabel"], cwd=ROOT,
                         capture_output=True, text=True, check=False)
    assert bad.returncode == 2 and "expected LABEL=FOLDER" in bad.stderr
