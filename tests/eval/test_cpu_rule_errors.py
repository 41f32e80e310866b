"""The CPU build's schedule rules on squeeze-and-excitation networks: TVM's
``reverse_compute_inline`` fails its own bound check (an ``InternalError``, not a
``ScheduleError``) on the broadcast scale those networks multiply by, which made
``VectorizeDotProduct`` raise on se_resnext50_32x4d's convolutions (the kernels then lost their
tiles) and ``ReductionAlongOuterAxis`` on se_resnet18_v1's elementwise kernels."""

import pytest
import tvm

import relay_amp
from relay_amp.builds.schedule_rules import RuleLog
from relay_amp.eval import models

pytestmark = pytest.mark.zoo  # the model zoo: pip install -r requirements.txt

BF16 = {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon", "+bf16"]}


@pytest.mark.parametrize("name", ["se_resnet18_v1", "se_resnext50_32x4d"])
@pytest.mark.parametrize("target", ["host", "aarch64-bf16"])
def test_no_rule_raises_and_every_convolution_is_tiled(name, target, tmp_path):
    mod = models.load(name, str(tmp_path), batch_size=1).mod
    target = tvm.target.Target(relay_amp.host_target() if target == "host" else BF16)
    if "+bf16" in str(target):
        mod, _ = relay_amp.convert(mod, "bfloat16", target=target)
    log = RuleLog()
    with target:
        relay_amp.cpu_pipeline(target, rule_log=log)(mod)
    assert [e.text() for e in log.errors] == []
    convolutions = [s for s in log.schedules if "conv2d" in s.kernel]
    assert convolutions
    assert all(s.rule in ("VectorizeDotProduct", "BfmmlaTile") for s in convolutions), [
        s.text() for s in convolutions if s.rule not in ("VectorizeDotProduct", "BfmmlaTile")]
