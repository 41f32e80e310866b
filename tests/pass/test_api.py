"""The public API: the module pass, convert(), the report, and bad input."""

import json

import pytest
import tvm
from cases import MatmulReluMatmulSoftmax
from tvm import relax

import relay_amp

Small = MatmulReluMatmulSoftmax


def test_pass_drops_into_sequential_and_keeps_its_report(dtype):
    reports = []
    amp = relay_amp.ToMixedPrecision(dtype, on_report=reports.append)
    assert amp.info.name == "relay_amp.ToMixedPrecision"  # distinct from TVM's own pass
    mod = tvm.transform.Sequential([amp, relax.transform.LegalizeOps()])(Small)
    relax.analysis.well_formed(mod)
    assert [r.dtype for r in reports] == [dtype]
    assert reports[0].find("lv2").compute_dtype == dtype
    assert not hasattr(amp, "last_report")  # the pass keeps no state between runs
    with pytest.raises(TypeError, match="on_report must be a callable"):
        relay_amp.ToMixedPrecision(dtype, on_report="reports")
    converted, _ = relay_amp.convert(Small, dtype)
    tvm.ir.assert_structural_equal(relay_amp.ToMixedPrecision(dtype)(Small), converted)


def test_report_rows_summary_and_json(dtype):
    _, report = relay_amp.convert(Small, dtype)
    assert [r.name for r in report.rows] == ["lv", "lv1", "lv2", "gv"]
    row = report.find("lv")
    assert (row.function, row.op, row.input_dtypes) == ("main", "matmul", (dtype, dtype))
    assert (row.compute_dtype, row.accumulation_dtype) == (dtype, "float32")
    assert row.macs == 2 * 8 * 8
    assert report.summary().startswith(f"converted 3/4 ops (100.0% of MACs) to {dtype} using ")
    data = json.loads(report.to_json())
    assert data["dtype"] == dtype and len(data["rows"]) == 4
    assert data["rows"][0]["rule"].startswith("low_precision_fp32_accumulate: matmul")
    assert data["rows"][0]["reasons"][0] == {"code": "builtin_category", "params": {
        "category": "low_precision_fp32_accumulate", "op": "matmul",
        "why": data["rows"][0]["reasons"][0]["params"]["why"]}}
    assert relay_amp.BindingRecord.from_dict(data["rows"][0]) == report.rows[0]
    assert {"function", "name", "op", "input_dtypes", "compute_dtype", "accumulation_dtype",
            "output_dtype", "rule", "casts_added"} <= set(data["rows"][0])
    text = str(report)
    assert "binding" in text and "lv2" in text
    with pytest.raises(KeyError, match="nope"):
        report.find("nope")


def test_not_an_irmodule_is_a_type_error_naming_what_was_given():
    with pytest.raises(TypeError, match="got Function .*wrap a relax.Function"):
        relay_amp.convert(Small["main"])
    with pytest.raises(TypeError, match="got str"):
        relay_amp.convert("main")


@pytest.mark.parametrize("bad", ["float32", "int8", "fp16", "float64", 16])
def test_bad_dtype_lists_the_choices(bad):
    with pytest.raises(ValueError, match="'float16', 'bfloat16'"):
        relay_amp.convert(Small, bad)
    with pytest.raises(ValueError, match="'float16', 'bfloat16'"):
        relay_amp.ToMixedPrecision(bad)


def test_already_converted_module_is_not_converted_twice(dtype):
    once, first = relay_amp.convert(Small, dtype)
    twice, second = relay_amp.convert(once, dtype)
    tvm.ir.assert_structural_equal(once, twice)
    assert second.casts == 0 and second.constants_converted == 0


def test_policy_and_keywords_together_is_an_error():
    with pytest.raises(TypeError, match="not both"):
        relay_amp.convert(Small, policy=relay_amp.Policy(), fp32_ops=["matmul"])
    with pytest.raises(TypeError, match="relay_amp.Policy"):
        relay_amp.convert(Small, policy={"dtype": "float16"})


def test_low_precision_inputs_must_name_parameters():
    with pytest.raises(ValueError, match=r"\['nope'\]"):
        relay_amp.convert(Small, "float16", low_precision_inputs=["nope"])


def test_convert_pauses_the_cyclic_collector_and_restores_it(monkeypatch):
    """The collector is off while a conversion runs (its passes found nothing to free and cost
    a quarter of the time) and back as it was after, also when the conversion raises."""
    import gc

    seen = []
    original = relay_amp.transform.plan_function

    def spy(*args, **kwargs):
        seen.append(gc.isenabled())
        return original(*args, **kwargs)

    monkeypatch.setattr(relay_amp.transform, "plan_function", spy)
    assert gc.isenabled()
    relay_amp.convert(Small, "float16")
    assert seen == [False] and gc.isenabled()
    gc.disable()
    try:
        relay_amp.convert(Small, "float16")
        assert not gc.isenabled()  # a caller's choice is kept
    finally:
        gc.enable()
    with pytest.raises(ValueError):
        relay_amp.convert(Small, "float16", fp32_ops=["no.such_op"])
    assert gc.isenabled()
