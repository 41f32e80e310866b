"""Reasons as data: every code renders from its one template, every report row's rule is the
rendering of its reasons, and the code that needs to know why reads codes."""

import string

import numpy as np
import pytest
from tvm.script import ir as I
from tvm.script import relax as R

import relay_amp
from relay_amp.reasons import TEXT, Reason, render

CUDA = {"kind": "cuda", "arch": "sm_90"}


@I.ir_module
class Mixed:
    @R.function
    def main(x: R.Tensor((4, 8), "float32"), w: R.Tensor((8, 8), "float32")):
        with R.dataflow():
            lv = R.matmul(x, w)
            lv1 = R.add(lv, R.const(np.full((8,), 7e4, "float32")))
            lv2 = R.nn.layer_norm(lv, R.const(np.ones(8, "float32")),
                                  R.const(np.zeros(8, "float32")), axes=[-1])
            lv3 = R.call_dps_packed("my_op", (lv2,), out_ty=R.Tensor((4, 8), "float32"))
            gv = R.add(lv1, lv3)
            R.output(gv)
        return gv


def _fields(template: str) -> set:
    return {name for _, name, _, _ in string.Formatter().parse(template) if name}


@pytest.mark.parametrize("code", sorted(TEXT))
def test_every_code_renders_from_its_parameters(code):
    prefix, text = TEXT[code]
    names = _fields(text) | _fields(prefix or "")
    reason = Reason.of(code, **{name: 1.5 for name in names})
    rendered = reason.text()
    assert "{" not in rendered and rendered.endswith(reason.detail())
    assert rendered.startswith(f"{reason.prefix}: ") if prefix else rendered == reason.detail()
    assert reason.as_dict() == {"code": code, "params": {name: 1.5 for name in names}}


def test_an_unknown_code_is_an_error():
    with pytest.raises(KeyError, match="unknown reason code 'no_such_code'"):
        Reason.of("no_such_code")


@pytest.mark.parametrize("target", [None, CUDA], ids=["no-target", "cuda"])
def test_every_rule_is_the_rendering_of_its_reasons(dtype, target):
    _, report = relay_amp.convert(Mixed, dtype, target=target)
    for row in report.rows:
        assert row.reasons, row
        assert row.rule == render(row.reasons)
        assert all(reason.code in TEXT for reason in row.reasons)
    if dtype == "float16":  # 7e4 is beyond float16's range, within bfloat16's
        assert report.find("lv1").code == "constant_out_of_range"
    assert report.find("lv3").code == "unknown_op"
    assert report.unknown_ops == ["call_dps_packed"]


def test_policy_describe_lists_each_op_with_its_reason_detail():
    text = relay_amp.Policy().describe()
    decision = relay_amp.Policy().decide("matmul", "", None)
    assert decision.code == "builtin_category"
    assert f"  {decision.reasons[0].detail()}" in text.split("[low_precision_fp32_accumulate]")[1]
