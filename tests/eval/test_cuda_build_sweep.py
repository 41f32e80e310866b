"""scripts/cuda_build_sweep.py's function on a sample: conformance cases built for sm_90 in
float32, float16 and bfloat16 (CUDA source, no GPU), a failing build recorded with TVM's error,
and the tables."""

import os

import pytest

from relay_amp.eval import conformance, cuda_builds

pytest.importorskip("onnx")


def _case(name: str) -> str:
    path = os.path.join(conformance.data_root(), "node", name)
    if not os.path.isdir(path):
        pytest.skip(f"the installed onnx has no case {name}")
    return path


@pytest.mark.parametrize("name", ["test_gemm_default_single_elem_vector_bias",
                                  "test_softmax_axis_1", "test_mod_mixed_sign_float16"])
def test_a_case_builds_for_sm90_in_every_dtype(name):
    row = conformance.run_case(_case(name), modes=(cuda_builds.CASE_MODE,),
                               dtypes=cuda_builds.DTYPES)
    assert row["outcome"] == "ok", row
    for dtype in cuda_builds.DTYPES:
        result = row["units"][f"{cuda_builds.CASE_MODE}/{dtype}"]
        assert result["outcome"] == "pass", (dtype, result)
        assert result["kernels"] >= 1 and result["rule_errors"] == []


def test_a_build_that_cuda_graphs_break_is_built_without_them():
    """ONNX's Squeeze with its axes as an input: TVM's RewriteCUDAGraph (relay_amp's default)
    captures a shape defined outside the graph; asked for explicitly, it still fails."""
    from tvm.relax.frontend.onnx import from_onnx

    from relay_amp.builds import pipeline
    from relay_amp.builds.schedule_rules import RuleLog

    model, names, inputs, _ = conformance.load_case(_case("test_squeeze"))
    mod = from_onnx(model, shape_dict={n: list(a.shape) for n, a in zip(names, inputs)})
    with pytest.raises(Exception, match="is not defined"):
        pipeline.build(mod, cuda_builds.TARGET, cuda_graph=True)
    log = RuleLog()
    executable = pipeline.build(mod, cuda_builds.TARGET, rule_log=log)
    assert [(e.kernel, e.rule, e.scheduled_by) for e in log.errors] == [
        ("main", "RewriteCUDAGraph", "the build without CUDA graphs")]
    assert "is not defined" in log.errors[0].error
    assert cuda_builds.device_source(executable) is not None


def _half_mod():
    from tvm import relax

    builder = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((6,), "float16"))
    y = relax.Var("y", relax.TensorType((6,), "float16"))
    with builder.function("main", [x, y]):
        with builder.dataflow():
            out = builder.emit_output(relax.op.mod(x, y))
        builder.emit_func_output(out)
    return builder.get()


def test_a_half_mod_is_computed_in_float32_in_one_kernel():
    result = cuda_builds.build_outcome(_half_mod())
    assert result["outcome"] == "pass", result
    assert result["kernels"] == 1  # the casts fuse into the modulo's kernel


def test_a_failed_build_keeps_tvms_error(monkeypatch):
    """Without the rewrite, TVM's CUDA code generation refuses a half ``Mod``: the sweep's row
    says so with TVM's words instead of raising."""
    from relay_amp.builds import pipeline

    monkeypatch.setattr(pipeline, "graph_rewrites", lambda target, split_k=True: [])
    result = cuda_builds.build_outcome(_half_mod())
    assert result["outcome"] == "fail" and result["cause"] == "TVM"
    assert "floating point in Mod" in result["reason"]
    assert result["rule_errors"] == []


def test_a_failed_build_names_the_kernel_that_fails():
    """TVM 0.27 legalizes ONNX's NonMaxSuppression into a CPU kernel (it calls
    ``tvm.contrib.sort.argsort``) that no GPU rule can schedule: dlight's ``Fallback`` binds it
    and lowering fails in TVM's own pipeline too (YOLOv3's builds). The row names that kernel
    and the rule; TVM's error does not."""
    from tvm import relax

    builder = relax.BlockBuilder()
    boxes = relax.Var("boxes", relax.TensorType((1, 64, 4), "float32"))
    scores = relax.Var("scores", relax.TensorType((1, 1, 64), "float32"))
    with builder.function("main", [boxes, scores]):
        with builder.dataflow():
            kept = builder.emit_output(relax.op.vision.all_class_non_max_suppression(
                boxes, scores, relax.const(10, "int64"), relax.const(0.5, "float32"),
                relax.const(0.1, "float32"), "onnx"))
        builder.emit_func_output(kept)
    result = cuda_builds.build_outcome(builder.get())
    assert result["outcome"] == "fail"
    failing = result["kernels_failing"]
    assert list(failing) == ["all_class_non_max_suppression"]
    assert failing["all_class_non_max_suppression"]["rule"] == "Fallback"
    assert "used before its definition" in failing["all_class_non_max_suppression"]["error"]


def test_the_tables_count_builds_and_name_each_failure():
    failure = {"outcome": "fail", "cause": "TVM", "reason": "build: InternalError: no | way",
               "kernels_failing": {"nms": {"rule": "Fallback", "error": "x"}},
               "rule_errors": [{"kernel": "fused_k", "rule": "GEMV", "error": "boom",
                                "scheduled_by": None}]}
    passed = {"outcome": "pass", "kernels": 2, "rule_errors": []}
    rows = [{"case": "node/a", "outcome": "ok",
             "units": {"cuda_build/float32": passed, "cuda_build/float16": failure}},
            {"case": "node/b", "outcome": "skip", "reason": "import"}]
    summary = cuda_builds.case_builds(rows, ("float32", "float16"))
    assert summary["counts"]["float32"]["pass"] == 1
    assert summary["counts"]["float16"]["fail"] == 1 and summary["skipped"] == 1
    models = cuda_builds.model_builds({"m": {"status": "ok", "builds": {"float32": passed,
                                                                         "float16": passed}},
                                       "n": {"status": "load", "reason": "no gluoncv"}},
                                      ("float32", "float16"))
    assert models["counts"]["float16"]["pass"] == 1 and models["not_loaded"][0][0] == "n"
    text = cuda_builds.summary_markdown(summary, models, ("float32", "float16"))
    assert ("| node/a | float16 | build: InternalError: no \\| way | nms (scheduled by "
            "Fallback) |") in text
    assert "fused_k: GEMV raised (boom), no later rule scheduled it" in text
    assert "Not loaded: n (no gluoncv)" in text


def test_run_cases_writes_the_rows_it_reads_back(tmp_path):
    paths = [_case("test_relu"), _case("test_abs")]
    out = str(tmp_path / "cases.jsonl")
    rows = cuda_builds.run_cases(paths, ("float16",), out, workers=1, timeout=300)
    assert [r["case"] for r in rows] == ["node/test_relu", "node/test_abs"]
    assert all(r["units"]["cuda_build/float16"]["outcome"] == "pass" for r in rows)
    again = cuda_builds.run_cases(paths, ("float16",), out, workers=1, timeout=300)
    assert again == rows
