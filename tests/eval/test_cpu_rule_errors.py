"""The CPU build's schedule rules raise on no registry kernel. TVM's ``reverse_compute_inline``
fails its own bound check (an ``InternalError``, not a ``ScheduleError``) on some broadcasts:
the scale squeeze-and-excitation networks multiply by made ``VectorizeDotProduct`` raise on
se_resnext50_32x4d's convolutions (the kernels then lost their tiles) and
``ReductionAlongOuterAxis`` on se_resnet18_v1's elementwise kernels and on
llama_smollm_135m's RMSNorm; ``Elementwise`` raised on kernels written as loops with no root
block (ssd_300_vgg16_atrous_voc's)."""

import pytest
import tvm

import relay_amp
from relay_amp.builds.schedule_rules import RuleLog
from relay_amp.eval import models, transformers_zoo

pytestmark = pytest.mark.zoo  # the model zoo: pip install -r requirements.txt

BF16 = {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon", "+bf16"]}


@pytest.mark.parametrize("name", ["se_resnet18_v1", "se_resnext50_32x4d", "llama_smollm_135m",
                                  "ssd_300_vgg16_atrous_voc"])
@pytest.mark.parametrize("target", ["host", "aarch64-bf16"])
def test_no_rule_raises_and_every_dot_product_is_tiled(name, target, tmp_path):
    if models.get_spec(name).family == "transformers":
        mod = transformers_zoo.to_relax(transformers_zoo.build(name))
    else:
        mod = models.load(name, str(tmp_path), batch_size=1).mod
    target = tvm.target.Target(relay_amp.host_target() if target == "host" else BF16)
    if "+bf16" in str(target):
        mod, _ = relay_amp.convert(mod, "bfloat16", target=target)
    log = RuleLog()
    with target:
        relay_amp.cpu_pipeline(target, rule_log=log)(mod)
    assert [e.text() for e in log.errors] == []
    convolutions = [s for s in log.schedules if "conv2d" in s.kernel
                    or ("matmul" in s.kernel and "softmax" not in s.kernel)]
    assert convolutions
    assert all(s.rule in ("VectorizeDotProduct", "BfmmlaTile") for s in convolutions), [
        s.text() for s in convolutions if s.rule not in ("VectorizeDotProduct", "BfmmlaTile")]
