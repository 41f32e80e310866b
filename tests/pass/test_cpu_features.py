"""relay_amp.builds.cpu_features: LLVM's answer, asked once per target and feature."""

import tvm

from relay_amp.builds import cpu_features
from relay_amp.builds.cpu_features import cpu_has

TARGETS = [{"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon", "+bf16"]},
           {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "neoverse-n1"},
           {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "znver3"},
           {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "sapphirerapids"}]
FEATURES = ("bf16", "fp16fml", "fullfp16", "avx2", "avx512f", "avx512fp16")


def test_answers_are_llvms_for_each_target_and_feature():
    for spec in TARGETS:
        target = tvm.target.Target(spec)
        for feature in FEATURES:
            expected = bool(tvm.target.codegen.llvm_cpu_has_features(feature, target))
            assert cpu_has(feature, target) is expected, (spec, feature)
            assert cpu_has(feature, spec) is expected, (spec, feature)  # a dict as well


def test_the_same_question_reaches_llvm_once(monkeypatch):
    asked = []
    real = tvm.target.codegen.llvm_cpu_has_features

    def counting(feature, target):
        asked.append(feature)
        return real(feature, target)

    monkeypatch.setattr(tvm.target.codegen, "llvm_cpu_has_features", counting)
    cpu_features._has.cache_clear()
    target = tvm.target.Target({"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "znver3"})
    answers = {cpu_has("avx2", target) for _ in range(5)}
    assert answers == {True} and asked == ["avx2"]
    assert cpu_has("avx512f", target) is False and asked == ["avx2", "avx512f"]
    other = tvm.target.Target({"kind": "llvm", "mtriple": "x86_64-linux-gnu",
                               "mcpu": "sapphirerapids"})
    assert cpu_has("avx512f", other) is True and asked == ["avx2", "avx512f", "avx512f"]
