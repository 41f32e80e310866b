"""The pure parts of the aarch64 peers benchmark (``relay_amp.eval.arm_peers``,
``scripts/bench_arm_peers.py``): the steady-state arithmetic, the least of several processes,
the mix and the table. They run without the emulator; the float16 hint needs the peers'
folder (``scripts/arm/setup_peers.sh``) for LiteRT's flatbuffer schema and skips without it."""

import pytest

from relay_amp.eval import arm_peers


def test_steady_state_is_the_least_long_minus_the_least_short_over_k():
    short = [{"fmla .4s": 100, "yield": 50, "ldr q": 10},
             {"fmla .4s": 100, "yield": 20, "ldr q": 10}]
    long = [{"fmla .4s": 1100, "yield": 900, "ldr q": 210},
            {"fmla .4s": 1100, "yield": 40, "ldr q": 210, "isb": 5}]
    kinds = arm_peers.steady_state(short, long, runs=10)
    # the least processes: short total 130, long total 1355
    assert kinds == {"fmla .4s": 100.0, "yield": 2.0, "ldr q": 20.0, "isb": 0.5}
    assert sum(kinds.values()) == (1355 - 130) / 10


def test_steady_state_keeps_a_kind_counted_less_in_the_longer_process_and_drops_equal_ones():
    kinds = arm_peers.steady_state([{"add x": 10, "mov x": 7}], [{"add x": 4, "mov x": 7}], 2)
    assert kinds == {"add x": -3.0}


@pytest.mark.parametrize("runs", [0, -1])
def test_steady_state_needs_a_run(runs):
    with pytest.raises(ValueError, match="runs"):
        arm_peers.steady_state([{"a": 1}], [{"a": 2}], runs)


def test_least_takes_the_process_with_the_smallest_total():
    assert arm_peers.least([{"a": 5, "b": 5}, {"a": 9}, {"b": 12}]) == {"a": 9}
    with pytest.raises(ValueError):
        arm_peers.least([])


def test_mix_counts_spin_kinds_apart_from_work():
    mix = arm_peers.mix({"fmla .4s": 40.0, "fmla .8h": 8.0, "yield": 3.0, "isb": 2.0,
                         "mrs x": 1.0, "ldr q": 6.0, "str q": 2.0})
    assert (mix["fma .4s"], mix["fma .8h"], mix["spin"]) == (40.0, 8.0, 6.0)
    assert (mix["load"], mix["store"], mix["total"]) == (6.0, 2.0, 62.0)


def test_protocol_says_how_it_counts():
    assert str(arm_peers.Protocol(1, 10, 3)) == "(N+10 − N)/10, N=1, min of 3"


def _cell(runtime, precision, total, error=None, **extra):
    mix = dict.fromkeys(arm_peers.MIX_COLUMNS, 0)
    mix["fma .4s"] = total / 2
    return {"runtime": runtime, "precision": precision, "status": "ok", "total": total,
            "mix": mix, "error_vs_peer_float32": error, **extra}


def test_table_gives_ratios_to_the_peers_float32_and_float16():
    rows = {"m": {"model": "m", "cells": [
        _cell("LiteRT/XNNPACK", "float32", 20e6, 0.0),
        _cell("LiteRT/XNNPACK", "float16", 10e6, 2.5e-3),
        _cell("relay_amp", "float32", 18e6, 3.9e-7),
        _cell("relay_amp", "float16-acc16", 15e6, 5e-3),
        {"runtime": "relay_amp", "precision": "bfloat16", "status": "error",
         "message": "EmulatorError: SIGILL"}]},
        "broken": {"model": "broken", "error": "TimeoutError: ", "cells": []}}
    lines = arm_peers.table(rows, ["m", "missing", "broken"]).splitlines()
    assert lines[0].startswith("| model | runtime | precision | instructions (M) | "
                               "÷ peer float32 | ÷ peer float16 |")
    assert lines[2] == ("| m | LiteRT/XNNPACK | float32 | 20.0 | 1.00 |  | 10.0 | 0 | 0 | 0 | 0 "
                        "| 0 | (reference) |")
    assert lines[3].startswith("| m | LiteRT/XNNPACK | float16 | 10.0 | 0.50 | 1.00 |")
    assert lines[4].startswith("| m | relay_amp | float32 | 18.0 | 0.90 |  |")
    assert lines[4].endswith("| 3.9e-07 |")
    assert lines[5].startswith("| m | relay_amp | float16-acc16 | 15.0 | 0.75 | 1.50 |")
    assert lines[6] == "| m | relay_amp | bfloat16 | fails: EmulatorError: SIGILL |"
    assert lines[7].startswith("| broken | fails: TimeoutError")
    assert len(lines) == 8


def test_table_without_a_peer_count_leaves_the_ratio_empty():
    rows = {"m": {"model": "m", "cells": [
        {"runtime": "ONNX Runtime", "precision": "float32", "status": "error",
         "message": "RuntimeError: segfault"},
        _cell("relay_amp", "float32", 5e6, None, error_note="3 reference outputs but 2")]}}
    lines = arm_peers.table(rows, ["m"]).splitlines()
    assert lines[2] == "| m | ONNX Runtime | float32 | fails: RuntimeError: segfault |"
    assert lines[3].startswith("| m | relay_amp | float32 | 5.0 |  |  |")
    assert lines[3].endswith("| 3 reference outputs but 2 |")


def test_versions_reads_the_dist_info_folders(tmp_path):
    (tmp_path / "site" / "ai_edge_litert-1.4.0.dist-info").mkdir(parents=True)
    (tmp_path / "site" / "onnxruntime-1.19.2.dist-info").mkdir()
    assert arm_peers.versions(tmp_path) == {"ai-edge-litert": "1.4.0", "onnxruntime": "1.19.2"}
    assert arm_peers.versions(tmp_path / "absent") == {}


def test_missing_names_the_setup_script(tmp_path):
    assert "scripts/arm/setup_peers.sh" in arm_peers.missing(tmp_path)


def test_peer_command_runs_the_runner_on_the_one_cpu_model(tmp_path):
    command = arm_peers.peer_command("litert", "m.tflite", "in.npz", 11, "out.npz",
                                     "counts", tmp_path)
    assert command[:3] == ["qemu-aarch64", "-cpu", "max,sve=off"]
    assert command[-6:] == [str(arm_peers.RUNNER), "litert", "m.tflite", "in.npz", "11",
                            "out.npz"]


def test_float16_hint_is_model_metadata_xnnpack_reads(tmp_path):
    reason = arm_peers.missing()
    if reason and not (arm_peers.PEERS_DIR / "site" / "ai_edge_litert").is_dir():
        pytest.skip(reason)
    tflite = pytest.importorskip("tflite")
    from relay_amp.eval import models

    loaded = models.load("iris_landmark")  # its folder lives as long as it does
    source = loaded.extra["tflite_path"]
    hinted = arm_peers.with_float16_hint(source, tmp_path / "hinted.tflite")
    model = tflite.Model.GetRootAsModel(open(hinted, "rb").read(), 0)
    metadata = {model.Metadata(i).Name().decode():
                bytes(model.Buffers(model.Metadata(i).Buffer()).DataAsNumpy()).decode()
                for i in range(model.MetadataLength())}
    assert metadata[arm_peers.FLOAT16_METADATA[0]] == arm_peers.FLOAT16_METADATA[1]
    original = tflite.Model.GetRootAsModel(open(source, "rb").read(), 0)
    assert model.SubgraphsLength() == original.SubgraphsLength()
    assert model.Subgraphs(0).OperatorsLength() == original.Subgraphs(0).OperatorsLength()
