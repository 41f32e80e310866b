"""The sweep scaled out: models in parallel processes (``--jobs``), a deterministic split for
many machines (``--shard``) and one table merged from the parts (``--merge``)."""

import json
import os
import time

import pytest

from relay_amp.eval import commands, shards, sweep
from relay_amp.eval.models import REGISTRY

#: Four registry names the fake children below measure (any four would do: nothing is loaded).
NAMES = ["resnet18_v1", "alexnet", "vgg11", "squeezenet1.1"]


def fake_worker(name, dtypes, path, workdir, calibrated, target, batches=None, gpu_cost=True,
                policy=None):
    """A child process's work, without a model: a row made from the name alone (with the
    times its work began and ended) after a short sleep; ``CRASH`` in the environment names a
    model whose child dies, ``HANG`` one that never ends."""
    if name == os.environ.get("HANG"):
        time.sleep(600)
    if os.environ.get("EXPECT_THREADS"):  # a child sees its share of the cores
        for variable in sweep.THREAD_VARIABLES:
            if os.environ.get(variable) != os.environ["EXPECT_THREADS"]:
                return  # no row: the sweep marks it a crash
    row = {"model": name, "task": REGISTRY[name].task, "notes": [], "batches": 1,
           "began": time.time(),
           "fp32": {"status": "ok", "latency_ms": 1.0},
           "variants": {v: {"status": "ok", "relative_l2": 1e-3 * (1 + len(name) % 3 + i),
                            "convert_s": 0.1, "latency_ms": 2.0}
                        for i, v in enumerate(sweep.variant_names(dtypes))}}
    if name == os.environ.get("CRASH"):  # dies after float32, before its variants
        with open(path, "w", encoding="utf-8") as handle:
            json.dump({**row, "variants": {}}, handle)
        os._exit(3)
    time.sleep(float(os.environ.get("SLEEP", "1.5")))
    row["ended"] = time.time()
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(row, handle)


@pytest.fixture
def fake_children(monkeypatch):
    monkeypatch.setattr(sweep, "_worker", fake_worker)
    monkeypatch.setattr(sweep, "plot_errors", lambda *args, **kwargs: None)
    return monkeypatch


class _InProcess:
    """A stand-in for a spawned process that does its work at start, for tests of what the
    sweep does with the rows (the tests above spawn real children)."""

    exitcode = 0

    def __init__(self, target, args):
        self.target, self.args = target, args

    def start(self):
        self.target(*self.args)

    def join(self, timeout=None):
        pass

    def is_alive(self):
        return False


@pytest.fixture
def in_process(fake_children):
    import multiprocessing

    class Context:
        Process = _InProcess

    fake_children.setattr(multiprocessing, "get_context", lambda method: Context)
    fake_children.setenv("SLEEP", "0")
    return fake_children


def _table_without_timings(results):
    rows = sweep.flat_rows(results)
    return [{k: v for k, v in row.items() if k not in (*sweep.TIMED_COLUMNS, "concurrency")}
            for row in rows]


# ------------------------------------------------------------------------------ --jobs
def test_jobs_run_models_at_once_and_mark_their_timings(tmp_path, fake_children):
    fake_children.setenv("EXPECT_THREADS", str(max(1, (os.cpu_count() or 1) // 2)))
    results = sweep.run_sweep(NAMES, ("float16",), str(tmp_path), progress=False, jobs=2)
    models = results["models"]
    assert sorted(models) == sorted(NAMES)
    assert all(models[n]["fp32"]["status"] == "ok" for n in NAMES)
    spans = sorted((models[n]["began"], models[n]["ended"]) for n in NAMES)
    overlaps = [max(b1, b2) < min(e1, e2) for (b1, e1), (b2, e2) in zip(spans, spans[1:])]
    assert sum(overlaps) >= 2  # the children ran two at a time, never three
    assert not any(max(spans[i][0], spans[i + 2][0]) < min(spans[i][1], spans[i + 2][1])
                   for i in range(len(spans) - 2))
    assert all(results["models"][n]["concurrency"] == 2 for n in NAMES)
    assert results["meta"]["jobs"] == 2
    text = open(os.path.join(tmp_path, "results.md"), encoding="utf-8").read()
    assert "| 0.1* | 2* |" in text  # convert_s and latency_ms taken under load say so
    assert "timings marked * (convert_s, compile_s, latency_ms) of 4 models" in text


def test_one_job_measures_alone_and_marks_nothing(tmp_path, in_process):
    results = sweep.run_sweep(NAMES[:2], ("float16",), str(tmp_path), progress=False, jobs=1)
    assert [results["models"][n]["concurrency"] for n in NAMES[:2]] == [1, 1]
    text = open(os.path.join(tmp_path, "results.md"), encoding="utf-8").read()
    assert "*" not in sweep.markdown_table(results) and "timings marked" not in text


def test_a_crash_or_a_timeout_costs_one_row(tmp_path, fake_children):
    fake_children.setenv("CRASH", "alexnet")
    fake_children.setenv("HANG", "vgg11")
    fake_children.setenv("SLEEP", "0")
    fake_children.setenv("EXPECT_THREADS", str(max(1, (os.cpu_count() or 1) // 2)))
    results = sweep.run_sweep(NAMES, ("float16",), str(tmp_path), timeout_s=20.0, progress=False,
                              jobs=2)
    models = results["models"]
    assert models["alexnet"]["fp32"]["status"] == "ok"  # written, then the child died
    assert models["alexnet"]["variants"]["tvm:float16"] == {
        "status": "crash", "message": "process exited with code 3"}
    assert models["vgg11"]["fp32"]["status"] == "timeout"
    assert models["resnet18_v1"]["fp32"]["status"] == "ok"
    assert models["squeezenet1.1"]["variants"]["relay_amp:float16"]["status"] == "ok"
    on_disk = json.load(open(os.path.join(tmp_path, "results.json"), encoding="utf-8"))
    assert sorted(on_disk["models"]) == sorted(NAMES)


def test_progress_line_names_the_model_status_and_load():
    row = {"fp32": {"status": "ok"}, "variants": {"relay_amp:float16": {"status": "timeout"}},
           "wall_s": 12.4, "concurrency": 2}
    assert sweep.progress_line("alexnet", row) == (
        "alexnet: float32 ok, relay_amp:float16 timeout (12 s, 2 models at once)")


def test_default_jobs_fits_cores_and_memory(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    monkeypatch.setattr(sweep, "_available_memory_gib", lambda: 24.0)
    assert sweep.default_jobs() == int(24.0 // sweep.MODEL_MEMORY_GIB)
    monkeypatch.setattr(sweep, "_available_memory_gib", lambda: 1.0)
    assert sweep.default_jobs() == 1
    monkeypatch.setattr(sweep, "_available_memory_gib", lambda: None)
    assert sweep.default_jobs() == 16
    with pytest.raises(ValueError, match="at least 1"):
        list(sweep.measure_parallel(["alexnet"], ("float16",), 10.0, jobs=0))


# ------------------------------------------------------------------------------ --shard
def test_shards_cover_every_model_once_and_balance_their_cost():
    names = list(REGISTRY)
    costs = {name: 10.0 + 7 * (i % 9) for i, name in enumerate(names)}
    for count in (1, 2, 3, 7):
        parts = [shards.shard_names(names, i, count, costs) for i in range(1, count + 1)]
        assert sorted(n for part in parts for n in part) == sorted(names)
        for part in parts:  # each part keeps the selection's order
            assert part == [n for n in names if n in part]
        loads = [sum(costs[n] for n in part) for part in parts]
        assert max(loads) - min(loads) <= max(costs.values())
        assert parts == [shards.shard_names(names, i, count, costs) for i in range(1, count + 1)]
    equal = [shards.shard_names(names, i, 4) for i in range(1, 5)]
    assert max(map(len, equal)) - min(map(len, equal)) <= 1


def test_unknown_costs_count_as_the_median_of_the_known():
    costs = {"a": 100.0, "b": 1.0, "c": 1.0}
    first, second = (shards.shard_names(["a", "b", "c", "d"], i, 2, costs) for i in (1, 2))
    assert first == ["a"] and second == ["b", "c", "d"]


@pytest.mark.parametrize("text", ["", "2", "0/2", "3/2", "1/0", "a/b", "1/2/3"])
def test_bad_shards_are_refused(text):
    with pytest.raises(ValueError, match="--shard"):
        shards.parse_shard(text)


def test_model_costs_come_from_wall_time_or_the_timed_columns():
    results = {"models": {"a": {"wall_s": 30.0},
                          "b": {"load_s": 1.0, "fp32": {"compile_s": 2.0},
                                "variants": {"x": {"convert_s": 3.0, "compile_s": 4.0}}},
                          "c": {"fp32": {"status": "import error"}}}}
    assert shards.model_costs(results) == {"a": 30.0, "b": 10.0}


# ------------------------------------------------------------------------------ --merge
def test_two_shards_merged_give_the_table_of_one_run(tmp_path, fake_children):
    fake_children.setenv("SLEEP", "0")
    fake_children.setenv("EXPECT_THREADS", str(max(1, (os.cpu_count() or 1) // 2)))
    one = sweep.run_sweep(NAMES, ("float16", "bfloat16"), str(tmp_path / "one"),
                          progress=False, jobs=2)
    fake_children.delenv("EXPECT_THREADS")
    import multiprocessing

    class Context:  # the shards' children in this process: the rows are what is compared
        Process = _InProcess

    fake_children.setattr(multiprocessing, "get_context", lambda method: Context)
    folders = []
    for index in (1, 2):
        folder = str(tmp_path / f"shard{index}")
        part = shards.shard_names(NAMES, index, 2)
        assert part and len(part) < len(NAMES)
        sweep.run_sweep(part, ("float16", "bfloat16"), folder, progress=False, jobs=1,
                        shard=f"{index}/2")
        folders.append(folder)
    merged = shards.merge_results(folders)
    assert list(merged["models"]) == [n for n in REGISTRY if n in NAMES]
    assert _table_without_timings(merged) == _table_without_timings(
        {"models": {n: one["models"][n] for n in merged["models"]}})
    assert sweep.summary_lines(merged)[:5] == sweep.summary_lines(one)[:5]
    assert commands.main(["sweep", "--merge", *folders, "--out", str(tmp_path / "m")]) == 0
    written = json.load(open(tmp_path / "m" / "results.json", encoding="utf-8"))
    assert sorted(written["models"]) == sorted(NAMES)
    assert written["meta"]["merged_from"] == [os.path.abspath(f) for f in folders]
    assert (tmp_path / "m" / "results.md").exists() and (tmp_path / "m" / "results.csv").exists()


def test_merge_refuses_rows_measured_differently(tmp_path, in_process, capsys):
    a, b, c = (str(tmp_path / x) for x in "abc")
    sweep.run_sweep(["alexnet"], ("float16",), a, progress=False)
    sweep.run_sweep(["vgg11"], ("float16",), b, progress=False, batches=4)
    sweep.run_sweep(["alexnet"], ("float16",), c, progress=False)
    with pytest.raises(shards.MixedSettingsError, match="batches_requested=4"):
        shards.merge_results([a, b])
    with pytest.raises(shards.MixedSettingsError, match="alexnet is in both"):
        shards.merge_results([a, c])
    merged = shards.merge_results([a, b], allow_mixed=True)
    assert sorted(merged["models"]) == ["alexnet", "vgg11"]
    assert merged["meta"]["mixed_settings"]
    assert commands.main(["sweep", "--merge", a, b, "--out", str(tmp_path / "m")]) == 2
    assert "--allow-mixed" in capsys.readouterr().err
    assert commands.main(["sweep", "--merge", a, str(tmp_path / "none"), "--out",
                          str(tmp_path / "m")]) == 2
    assert "no results.json" in capsys.readouterr().err
    row = json.load(open(os.path.join(a, "results.json"), encoding="utf-8"))["models"]["alexnet"]
    assert row["code_version"] == sweep.code_version() and row["dtypes"] == ["float16"]


def test_sweep_command_runs_its_shard_balanced_by_an_earlier_run(tmp_path, monkeypatch, capsys):
    calls = []

    def fake_run_sweep(names, dtypes, out, timeout, force, **options):
        calls.append((names, options["jobs"], options["shard"]))
        return {"models": {}}

    monkeypatch.setattr(sweep, "run_sweep", fake_run_sweep)
    earlier = tmp_path / "earlier.json"
    earlier.write_text(json.dumps({"models": {"vgg11": {"wall_s": 100.0},
                                              "alexnet": {"wall_s": 1.0},
                                              "resnet18_v1": {"wall_s": 1.0}}}))
    argv = ["sweep", "--models", "alexnet,resnet18_v1,vgg11", "--quiet", "--jobs", "2",
            "--balance-from", str(earlier)]
    assert commands.main([*argv, "--shard", "1/2"]) == 0
    assert commands.main([*argv, "--shard", "2/2"]) == 0
    assert calls == [(["vgg11"], 2, "1/2"), (["alexnet", "resnet18_v1"], 2, "2/2")]
    assert commands.main([*argv, "--shard", "3/2"]) == 2
    assert "1 <= I <= N" in capsys.readouterr().err
    assert commands.main([*argv, "--jobs", "0"]) == 2
