"""relay_amp.eval.isolation.measure_each: one process per model, rows kept as they come."""

import json

from relay_amp.eval.isolation import measure_each


def _measure(name, suffix):
    if name == "bad":
        raise ValueError("cannot measure bad")
    return {"model": name, "value": name + suffix}


def _failed(name, message):
    return {"model": name, "error": message}


def test_rows_are_measured_once_failures_cost_their_row(tmp_path):
    out = tmp_path / "rows.json"
    out.write_text(json.dumps({"models": {"kept": {"model": "kept", "value": "old"}}}))
    rows = measure_each(["kept", "a", "bad"], _measure, str(out), 120, _failed, ("!",),
                        header={"target": "x"})
    assert rows["kept"] == {"model": "kept", "value": "old"}
    assert rows["a"] == {"model": "a", "value": "a!"}
    assert rows["bad"]["error"].startswith("ValueError: cannot measure bad")
    assert json.loads(out.read_text()) == {"target": "x", "models": rows}
