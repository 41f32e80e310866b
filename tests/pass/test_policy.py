"""The policy: precedence layers, serialization, validation, amp_config and target defaults."""

import json

import numpy as np
import pytest
import tvm
from cases import PolicyNet as Net
from helpers import convert_checked
from tvm.script import ir as I
from tvm.script import relax as R

import relay_amp
from relay_amp import Policy, amp_config
from relay_amp.targets import target_caps


def compute(report, name):
    return report.find(name).compute_dtype


# ----------------------------------------------------------------------------- precedence
def test_builtin_defaults_without_target(dtype):
    _, report = relay_amp.convert(Net, dtype)
    assert [compute(report, n) for n in ("lv", "lv2", "lv3", "gv")] == [
        dtype, dtype, "float32", dtype]
    assert report.find("lv").reason("builtin_category").values["category"] == (
        "low_precision_fp32_accumulate")


def test_target_defaults_override_builtin_defaults():
    _, report = relay_amp.convert(Net, "float16", target={"kind": "cuda", "arch": "sm_50"})
    row = report.find("lv")
    assert row.category == "storage" and row.compute_dtype == "float32"
    assert row.reason("target_storage_only").values["target"] == "cuda sm_50"


def test_user_op_lists_override_target_defaults():
    policy = Policy("float16").low_precision("nn.conv2d")
    _, report = relay_amp.convert(Net, policy=policy, target={"kind": "cuda", "arch": "sm_50"})
    assert compute(report, "lv") == "float16"
    # the deciding layer is the user's list; with kernel boundaries (a GPU target) the rule goes
    # on to say that the convolution rounds its float32 operands in its own kernel
    assert report.find("lv").rule.startswith(
        "low_precision_fp32_accumulate: nn.conv2d is in the user's "
        "set_category(low_precision_fp32_accumulate); ")
    assert report.find("lv").codes == ("user_category", "narrowing_kernel")


def test_conditional_rules_override_user_op_lists():
    policy = Policy("float16").low_precision("nn.conv2d").add_condition("nn.conv2d", "groups", [8])
    _, report = relay_amp.convert(Net, policy=policy)
    assert compute(report, "lv") == "float16"
    assert compute(report, "lv2") == "float32"
    assert report.find("lv2").rule == "fp32: conditional rule nn.conv2d groups in [8]"


def test_binding_rules_override_conditional_rules():
    policy = (Policy("float16").add_condition("nn.conv2d", "groups", [8])
              .include("lv2").exclude("g.", regex=True))
    _, report = relay_amp.convert(Net, policy=policy)
    assert compute(report, "lv2") == "float16"
    assert report.find("lv2").rule == "float16: included by name 'lv2'"
    assert compute(report, "gv") == "float32"
    assert report.find("gv").rule == "fp32: excluded by pattern 'g.'"
    both = Policy("float16").include("lv").exclude("lv")
    _, report = relay_amp.convert(Net, policy=both)
    assert report.find("lv").rule == "fp32: excluded by name 'lv'"  # exclusion beats inclusion


def test_range_safety_overrides_every_layer():
    big = tvm.relax.const(np.full((4, 4), 7.0e4, "float32"))

    @I.ir_module
    class Big:
        @R.function
        def main(x: R.Tensor((2, 4), "float32")):
            with R.dataflow():
                gv = R.matmul(x, big)
                R.output(gv)
            return gv

    policy = Policy("float16").include("gv")
    _, report = relay_amp.convert(Big, policy=policy)
    assert report.find("gv").compute_dtype == "float32"
    assert report.find("gv").rule == "fp32: constant 7e+04 exceeds float16 max 65504"
    _, report = relay_amp.convert(Big, policy=policy.with_dtype("bfloat16"))
    assert report.find("gv").compute_dtype == "bfloat16"


def test_user_override_changes_the_converted_module(dtype):
    """A structural check: fp32_ops moves relu's consumer conv to float32."""

    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((1, 4, 8, 8), "float32"), w: R.Tensor((4, 4, 3, 3), "float32")):
            with R.dataflow():
                lv = R.nn.conv2d(x, w, padding=[1, 1])
                gv = R.nn.conv2d_transpose(lv, w, padding=[1, 1])
                R.output(gv)
            return gv

    @I.ir_module
    class Expected:
        @R.function
        def main(x: R.Tensor((1, 4, 8, 8), "float32"), w: R.Tensor((4, 4, 3, 3), "float32")):
            with R.dataflow():
                x1 = R.astype(x, dtype)
                w1 = R.astype(w, dtype)
                lv = R.nn.conv2d(x1, w1, padding=[1, 1], out_dtype="float32")
                gv = R.nn.conv2d_transpose(lv, w, padding=[1, 1])
                R.output(gv)
            return gv

    new, _ = convert_checked(Before, dtype, fp32_ops=["nn.conv2d_transpose"])
    tvm.ir.assert_structural_equal(new, Expected)


def test_conditional_rule_on_clip_bounds():
    @I.ir_module
    class Clip:
        @R.function
        def main(x: R.Tensor((2, 8), "float32"), w: R.Tensor((8, 8), "float32")):
            with R.dataflow():
                lv = R.matmul(x, w)
                lv1 = R.clip(lv, 0.0, 6.0)
                gv = R.matmul(lv1, w)
                R.output(gv)
            return gv

    _, report = relay_amp.convert(Clip, "float16")
    assert compute(report, "lv1") == "float16"


def test_accumulation_dtype_per_op(dtype):
    policy = Policy(dtype).set_accumulation_dtype("nn.conv2d", dtype)
    new, report = relay_amp.convert(Net, policy=policy)
    row = report.find("lv")
    assert (row.compute_dtype, row.accumulation_dtype) == (dtype, dtype)
    conv = next(b.value for b in new["main"].body.blocks[0].bindings if b.var.name == "lv")
    assert str(conv.attrs.out_dtype) == dtype


def test_accumulate_category_from_user_list(dtype):
    policy = Policy(dtype).accumulate("nn.relu")
    _, report = relay_amp.convert(Net, policy=policy)
    row = report.find("lv1")
    assert row.category == "accumulate" and row.output_dtype == f"float32+{dtype}"


# ----------------------------------------------------------------------------- serialization
def test_json_round_trip_and_describe():
    policy = (Policy("bfloat16", fp32_ops=["nn.softmax"], widest_dtype_ops=["add"],
                     conditional_fp32_ops=[("nn.conv2d", "groups", [32])],
                     excluded_sym_names=["lv7"], cast_params_offline=False,
                     keep_io_dtypes=False, fallback="storage")
              .accumulate("mean").set_accumulation_dtype("matmul", "bfloat16")
              .include("lv1[0-9]", regex=True))
    again = Policy.from_json(policy.to_json())
    assert again == policy and again.to_dict() == policy.to_dict()
    data = json.loads(policy.to_json())
    assert data["op_categories"] == {"add": "follow", "mean": "accumulate", "nn.softmax": "fp32"}
    text = policy.describe()
    assert "[fp32]" in text and "nn.softmax" in text and "[conditional fp32 rules]" in text
    assert "nn.conv2d groups in [32]" in text


def test_from_dict_rejects_unknown_keys():
    with pytest.raises(ValueError, match="unknown policy keys \\['colour'\\]"):
        Policy.from_dict({"colour": "red"})
    with pytest.raises(TypeError, match="takes a dict"):
        Policy.from_dict("float16")


# ----------------------------------------------------------------------------- validation
def test_unknown_op_suggests_close_names():
    with pytest.raises(ValueError, match="unknown op 'nn.conv2' in fp32_ops; did you mean "
                                         "'nn.conv2d'"):
        Policy(fp32_ops=["nn.conv2"])


def test_op_in_two_lists_names_both():
    with pytest.raises(ValueError, match="'nn.softmax' is in both target_dtype_ops and fp32_ops"):
        Policy(target_dtype_ops=["nn.softmax"], fp32_ops=["relax.nn.softmax"])


def test_bad_regex_has_its_own_message():
    with pytest.raises(ValueError, match="pattern '\\[lv' is not a valid regular expression"):
        Policy().exclude("[lv", regex=True)


def test_bad_attribute_name_has_its_own_message():
    with pytest.raises(ValueError, match="op 'nn.conv2d' has no attribute 'group'; did you mean "
                                         "'groups'"):
        Policy(conditional_fp32_ops=[("nn.conv2d", "group", [32])])
    with pytest.raises(ValueError, match="triples"):
        Policy(conditional_fp32_ops=[("nn.conv2d", "groups")])


def test_non_float_target_dtype_has_its_own_message():
    with pytest.raises(ValueError, match="dtype must be one of 'float16', 'bfloat16'; got 'int8'"):
        Policy("int8")


def test_bad_category_and_bool_and_list_types():
    with pytest.raises(ValueError, match="unknown category 'fast'"):
        Policy().set_category("add", "fast")
    with pytest.raises(TypeError, match="keep_io_dtypes must be True or False"):
        Policy(keep_io_dtypes="yes")
    with pytest.raises(TypeError, match="fp32_ops must be a list of names"):
        Policy(fp32_ops="nn.softmax")


# ----------------------------------------------------------------------------- amp_config
def test_amp_config_nests_and_restores():
    assert relay_amp.current_policy() is None
    with amp_config(dtype="bfloat16", fp32_ops=["nn.conv2d"]) as outer:
        assert relay_amp.current_policy() is outer
        with amp_config(Policy("float16")) as inner:
            assert relay_amp.current_policy() is inner
            _, report = relay_amp.convert(Net)
            assert report.dtype == "float16"
        assert relay_amp.current_policy() is outer
        mod = relay_amp.ToMixedPrecision()(Net)
        convs = [b.value for b in mod["main"].body.blocks[0].bindings
                 if "conv2d" in str(getattr(b.value, "op", ""))]
        assert all(str(c.args[0].ty.dtype) == "float32" for c in convs)
        _, report = relay_amp.convert(Net)
        assert report.dtype == "bfloat16"
    assert relay_amp.current_policy() is None
    with pytest.raises(RuntimeError):
        with amp_config(dtype="float16"):
            raise RuntimeError("boom")
    assert relay_amp.current_policy() is None


def test_pass_built_inside_amp_config_keeps_that_policy():
    reports = []
    with amp_config(dtype="bfloat16"):
        amp = relay_amp.ToMixedPrecision(on_report=reports.append)
    amp(Net)
    assert reports[-1].dtype == "bfloat16"


def test_pass_context_cannot_carry_the_policy():
    """Why amp_config keeps its own thread-local stack (relay_amp/policy.py, above _CONFIG): a
    PassContext takes only config keys registered in C++, and TVM 0.27 gives Python no way to
    register one. If this fails, TVM has changed: carry the policy in the PassContext instead."""
    import re

    import tvm_ffi

    key = "relay_amp.policy"
    assert key not in tvm.transform.PassContext.list_configs()
    for value in (Policy("bfloat16").to_json(), Policy("bfloat16").to_dict()):
        with pytest.raises(AttributeError, match=f"Invalid config option '{key}'"):
            tvm.transform.PassContext(config={key: value})
    registration = re.compile(r"(?i)regist\w*(config|option)|(config|option)\w*regist")
    assert not [name for name in tvm_ffi.registry.list_global_func_names()
                if registration.search(name)]
    assert not [name for name in dir(tvm.ir.transform) if registration.search(name)]
    # and nothing to hang it on: a PassContext takes no Python attributes
    with pytest.raises(AttributeError):
        tvm.transform.PassContext.current().relay_amp_policy = Policy("bfloat16")


def test_amp_config_survives_a_pass_context_entered_inside():
    with amp_config(dtype="bfloat16") as policy:
        with tvm.transform.PassContext(opt_level=3):
            assert relay_amp.current_policy() is policy
    assert relay_amp.current_policy() is None


# ----------------------------------------------------------------------------- MXNet keywords
def test_mxnet_keywords_in_constructor_and_convert():
    _, report = relay_amp.convert(Net, "float16", target_dtype_ops=["nn.softmax"],
                                  fp32_ops=["nn.conv2d_transpose"], widest_dtype_ops=["add"],
                                  conditional_fp32_ops=[("nn.conv2d", "groups", [8])],
                                  excluded_sym_names=["gv"], cast_params_offline=True)
    assert compute(report, "lv3") == "float16"
    assert compute(report, "lv2") == "float32"
    assert compute(report, "gv") == "float32"


# ----------------------------------------------------------------------------- targets
@pytest.mark.parametrize("target,fp16,bf16", [
    ({"kind": "cuda", "arch": "sm_50"}, False, False),
    ({"kind": "cuda", "arch": "sm_75"}, True, False),
    ({"kind": "cuda", "arch": "sm_80"}, True, True),
    ({"kind": "cuda", "arch": "sm_90"}, True, True),
    ({"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon", "+fullfp16"]},
     True, False),
    ({"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon"]}, False, False),
    ({"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "neoverse-v1"}, True, True),
    ({"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "znver3"}, False, False),
    ({"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "cooperlake"}, False, True),
    ({"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mattr": ["+avx512bf16"]}, False, True),
    ({"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "sapphirerapids"}, True, True),
])
def test_target_capabilities(target, fp16, bf16):
    caps = target_caps(tvm.target.Target(target))
    assert (caps.fp16_compute, caps.bf16_compute) == (fp16, bf16)


@pytest.mark.parametrize("arch,expected", [("sm_50", "storage"), ("sm_75", "float16"),
                                           ("sm_80", "float16"), ("sm_90", "float16")])
def test_cuda_defaults_per_arch(arch, expected):
    _, report = relay_amp.convert(Net, "float16", target={"kind": "cuda", "arch": arch})
    row = report.find("lv")
    assert (row.category if expected == "storage" else row.compute_dtype) == expected


def test_bfloat16_before_sm80_is_an_error_naming_the_arch_unless_fallback():
    with pytest.raises(relay_amp.UnsupportedDtypeError, match="cuda sm_75 has no bfloat16"):
        relay_amp.convert(Net, "bfloat16", target={"kind": "cuda", "arch": "sm_75"})
    _, report = relay_amp.convert(Net, "bfloat16", target={"kind": "cuda", "arch": "sm_75"},
                                  fallback="storage")
    assert report.find("lv").category == "storage"


def test_x86_without_avx512fp16_stores_weights_low_and_computes_float32():
    weight = tvm.relax.const(np.full((8, 8), 0.5, "float32"))

    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((2, 8), "float32")):
            with R.dataflow():
                gv = R.matmul(x, weight)
                R.output(gv)
            return gv

    target = {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "znver3"}
    new, report = relay_amp.convert(Before, "float16", target=target)
    row = report.find("gv")
    assert row.compute_dtype == "float32" and row.category == "storage"
    assert row.reason("target_storage_only").values == {
        "target": "llvm znver3 (x86_64-linux-gnu)", "dtype": "float16", "op": row.op}
    binding = new["main"].body.blocks[0].bindings[0]
    assert str(binding.value.args[0].ty.dtype) == "float16"  # the weight constant
    assert report.constants_converted == 1
    sapphire = {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "sapphirerapids"}
    _, report = relay_amp.convert(Before, "float16", target=sapphire)
    row = report.find("gv")
    assert (row.compute_dtype, row.accumulation_dtype) == ("float16", "float32")
    instruction = row.reason("target_float32_accumulation").values["instruction"]
    assert instruction == "vfmadd*sh / vfmadd*ph"


def test_target_from_context_and_function_attribute():
    with tvm.target.Target({"kind": "cuda", "arch": "sm_50"}):
        _, report = relay_amp.convert(Net, "float16")
    assert report.find("lv").category == "storage"
    annotated = tvm.IRModule({"main": Net["main"].with_attr(
        "target", tvm.target.Target({"kind": "cuda", "arch": "sm_50"}))})
    _, report = relay_amp.convert(annotated, "float16")
    assert report.find("lv").category == "storage"


def test_bad_target_is_a_clear_error():
    with pytest.raises(ValueError, match="invalid target"):
        relay_amp.convert(Net, "float16", target={"kind": "no-such-kind"})
    with pytest.raises(TypeError, match="target must be"):
        relay_amp.convert(Net, "float16", target=42)


@pytest.mark.parametrize("target, limitation", [
    ({"kind": "cuda", "arch": "sm_75"},
     "sm_75 has no bfloat16 arithmetic (CUDA has it from sm_80)"),
    ({"kind": "cuda"}, "sm_50 has no bfloat16 arithmetic"),  # TVM's default arch here
    ({"kind": "rocm", "mcpu": "gfx908"}, "gfx908 has no bfloat16 arithmetic"),
    ({"kind": "opencl"}, "TVM's opencl code generator has no bfloat16 type: it stores bfloat16 "
                         "as 16-bit integers and computes in float32"),
    ({"kind": "metal"}, "TVM's metal code generator has no bfloat16 type"),
    ({"kind": "webgpu"}, "TVM's webgpu code generator has no bfloat16 type"),
])
def test_a_bfloat16_refusal_names_the_targets_own_limitation(target, limitation):
    with pytest.raises(relay_amp.UnsupportedDtypeError) as caught:
        relay_amp.convert(Net, "bfloat16", target=target)
    assert limitation in str(caught.value)
    assert "CUDA" not in str(caught.value) or target["kind"] == "cuda"


def test_a_shader_target_this_tvm_cannot_build_says_so(monkeypatch):
    import tvm

    vulkan = tvm.target.Target({"kind": "vulkan"})
    if tvm.get_global_func("target.build.vulkan", allow_missing=True) is None:  # the PyPI wheel
        assert relay_amp.target_caps(vulkan).bf16_limitation == (
            "this TVM build has no vulkan code generator (target.build.vulkan)")
    monkeypatch.setattr(tvm, "get_global_func", lambda name, allow_missing=False: print)
    assert relay_amp.target_caps(vulkan).bf16_limitation.startswith(
        "TVM's vulkan code generator has no bfloat16 type")


def test_the_result_budget_is_a_policy_setting():
    """The share of bytes that result feeders may keep float32 (reason ``feeds_result``): a
    share from 0 to 1 or None (the default), in the JSON, and resolved in the kernel settings."""
    from relay_amp.policy import DEFAULT_RESULT_BUDGET
    from relay_amp.targets import kernel_settings

    policy = Policy("float16", result_budget=0.01)
    assert Policy.from_json(policy.to_json()) == policy
    assert Policy.from_json(policy.to_json()).result_budget == 0.01
    assert Policy().to_dict()["result_budget"] is None
    cuda = {"kind": "cuda", "arch": "sm_90"}
    assert kernel_settings(Policy(), tvm.target.Target(cuda)).result_budget \
        == DEFAULT_RESULT_BUDGET
    assert kernel_settings(policy, tvm.target.Target(cuda)).result_budget == 0.01
    for bad in (-0.1, 1.5, "0.1", True):
        with pytest.raises(ValueError, match="result_budget"):
            Policy(result_budget=bad)
