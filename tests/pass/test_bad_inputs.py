"""Bad input: each case is a clear error or a documented behaviour, and the input is untouched."""

import numpy as np
import pytest
import tvm
import tvm_ffi
from cases import BadInputsNet as Net
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

import relay_amp
from relay_amp import Policy

ERRORS = [
    # (id, call, exception, message pattern)
    ("function-not-module", lambda: relay_amp.convert(Net["main"]), TypeError, "got Function"),
    ("string-not-module", lambda: relay_amp.convert("main"), TypeError, "got str"),
    ("none-not-module", lambda: relay_amp.convert(None), TypeError, "got NoneType"),
    ("dtype-float32", lambda: relay_amp.convert(Net, "float32"), ValueError,
     "'float16', 'bfloat16'"),
    ("dtype-int8", lambda: relay_amp.convert(Net, "int8"), ValueError, "got 'int8'"),
    ("dtype-number", lambda: relay_amp.convert(Net, 16), ValueError, "got 16"),
    ("dtype-misspelled", lambda: relay_amp.convert(Net, "fp16"), ValueError, "got 'fp16'"),
    ("unknown-op", lambda: relay_amp.convert(Net, fp32_ops=["nn.sofmax"]), ValueError,
     "unknown op 'nn.sofmax' in fp32_ops; did you mean 'nn.softmax'"),
    ("unknown-op-no-match", lambda: Policy(fp32_ops=["zzz_qqq"]), ValueError,
     "unknown op 'zzz_qqq'"),
    ("op-not-string", lambda: Policy(fp32_ops=[3]), TypeError, "must be strings"),
    ("conflicting-lists", lambda: relay_amp.convert(Net, target_dtype_ops=["matmul"],
                                                     fp32_ops=["matmul"]),
     ValueError, "in both target_dtype_ops and fp32_ops"),
    ("bad-regex", lambda: Policy().exclude("lv(", regex=True), ValueError,
     "not a valid regular expression"),
    ("bad-attribute", lambda: Policy().add_condition("matmul", "dtype", ["float16"]), ValueError,
     "has no attribute 'dtype'; did you mean 'out_dtype'"),
    ("condition-not-triple", lambda: Policy(conditional_fp32_ops=[("matmul",)]), ValueError,
     "triples"),
    ("unknown-category", lambda: Policy().set_category("add", "half"), ValueError,
     "unknown category 'half'"),
    ("bad-fallback", lambda: Policy(fallback="fp32"), ValueError, "fallback must be one of"),
    ("bool-option-not-bool", lambda: Policy(cast_params_offline="no"), TypeError,
     "cast_params_offline must be True or False"),
    ("list-given-as-string", lambda: Policy(excluded_sym_names="lv"), TypeError,
     "must be a list of names"),
    ("bad-target-kind", lambda: relay_amp.convert(Net, target={"kind": "tpu"}), ValueError,
     "invalid target"),
    ("bad-target-type", lambda: relay_amp.convert(Net, target=3.5), TypeError,
     "target must be"),
    ("bf16-on-sm75", lambda: relay_amp.convert(Net, "bfloat16",
                                                target={"kind": "cuda", "arch": "sm_75"}),
     relay_amp.UnsupportedDtypeError, "cuda sm_75 has no bfloat16"),
    ("policy-and-keywords", lambda: relay_amp.convert(Net, policy=Policy(), fp32_ops=["exp"]),
     TypeError, "not both"),
    ("policy-wrong-type", lambda: relay_amp.convert(Net, policy="float16"), TypeError,
     "policy must be a relay_amp.Policy"),
    ("calibration-wrong-type", lambda: relay_amp.convert(Net, calibration=[1.0]), TypeError,
     "calibration must be a relay_amp.Calibration"),
    ("unknown-low-input", lambda: relay_amp.convert(Net, low_precision_inputs=["y"]), ValueError,
     r"low_precision_inputs names \['y'\]"),
    ("float-input-dtype", lambda: relay_amp.convert(Net, input_dtypes={"x": "float16"}),
     ValueError, "is a float dtype"),
    ("unknown-input-dtype-name", lambda: relay_amp.convert(Net, input_dtypes={"y": "uint8"}),
     ValueError, r"input_dtypes names \['y'\]"),
    ("from-dict-unknown-key", lambda: Policy.from_dict({"dtype": "float16", "ops": {}}),
     ValueError, r"unknown policy keys \['ops'\]"),
    ("amp-config-wrong-type", lambda: relay_amp.amp_config("float16").__enter__(), TypeError,
     "takes a relay_amp.Policy"),
]


@pytest.mark.parametrize("call,error,pattern", [c[1:] for c in ERRORS], ids=[c[0] for c in ERRORS])
def test_bad_input_is_a_clear_error_and_the_module_is_untouched(call, error, pattern):
    before = tvm_ffi.structural_hash(Net)
    with pytest.raises(error, match=pattern):
        call()
    assert tvm_ffi.structural_hash(Net) == before


# ---------------------------------------------------------------------------- documented behaviours
def _unchanged(mod, dtype="float16"):
    before = tvm_ffi.structural_hash(mod)
    new, report = relay_amp.convert(mod, dtype)
    assert tvm_ffi.structural_hash(mod) == before
    relax.analysis.well_formed(new)
    return new, report


def test_prim_func_only_module_is_returned_with_a_note():
    @I.ir_module
    class Prim:
        @T.prim_func
        def copy(a: T.Buffer((4,), "float32"), b: T.Buffer((4,), "float32")):
            for i in range(4):
                b[i] = a[i]

    new, report = _unchanged(Prim)
    assert new.same_as(Prim) and report.notes == [
        "the module has no Relax function: nothing was converted"]


def test_empty_function_converts_to_itself():
    @I.ir_module
    class Empty:
        @R.function
        def main(x: R.Tensor((2,), "float32")):
            return x

    new, report = _unchanged(Empty)
    tvm.ir.assert_structural_equal(new, Empty)
    assert report.rows == [] and report.summary().startswith("converted 0/0 ops")


def test_unknown_dtypes_are_left_alone():
    @I.ir_module
    class Wide:
        @R.function
        def main(x: R.Tensor((2, 4), "float64"), w: R.Tensor((4, 4), "float64")):
            with R.dataflow():
                gv = R.matmul(x, w)
                R.output(gv)
            return gv

    new, report = _unchanged(Wide)
    tvm.ir.assert_structural_equal(new, Wide)
    assert report.find("gv").reason("foreign_dtypes").values["dtypes"] == "float64"


def test_extern_calls_keep_their_dtypes():
    @I.ir_module
    class Extern:
        @R.function
        def main(x: R.Tensor((2, 4), "float32"), w: R.Tensor((4, 4), "float32")):
            with R.dataflow():
                lv = R.matmul(x, w)
                lv1 = R.call_dps_packed("my_extern_op", (lv,), out_ty=R.Tensor((2, 4), "float32"))
                gv = R.matmul(lv1, w)
                R.output(gv)
            return gv

    new, report = _unchanged(Extern)
    row = report.find("lv1")
    assert row.category == "unknown" and row.input_dtypes[0] == "float32"
    assert report.unknown_ops == ["call_dps_packed"]
    assert report.find("gv").compute_dtype == "float16"


@pytest.mark.parametrize("value,converted", [(np.nan, True), (np.inf, True), (-np.inf, True),
                                             (1e10, False), (1e-10, False)])
def test_nan_inf_and_huge_constants(value, converted):
    constant = relax.const(np.array(value, "float32"))

    @I.ir_module
    class Const:
        @R.function
        def main(x: R.Tensor((2, 4), "float32"), w: R.Tensor((4, 4), "float32")):
            with R.dataflow():
                lv = R.matmul(x, w)
                lv0 = R.nn.relu(lv)
                lv1 = R.add(lv0, constant)
                gv = R.matmul(lv1, w)
                R.output(gv)
            return gv

    _, report = _unchanged(Const)
    row = report.find("lv1")
    if converted:  # NaN and infinities exist in float16: the add may run low
        assert row.code != "constant_out_of_range"
    else:
        assert row.compute_dtype == "float32" and row.code == "constant_out_of_range"


def test_already_converted_module_is_not_converted_twice():
    once, _ = relay_amp.convert(Net, "float16")
    twice, report = _unchanged(once)
    tvm.ir.assert_structural_equal(once, twice)
    assert report.casts == 0


def test_converting_float16_output_again_to_bfloat16_leaves_float16_alone():
    once, _ = relay_amp.convert(Net, "float16")
    again, report = _unchanged(once, "bfloat16")
    assert "float16" in again.script() and report.find("lv").input_dtypes == ("float16", "float16")


def test_ill_formed_input_from_an_importer_still_converts_with_a_note():
    """TVM's ONNX importer emits an impure call_packed inside a pure function for Expand with a
    shape tensor; relay_amp converts it and says the input was not well-formed."""
    data = relax.Var("data", relax.TensorType((3, 1), "float32"))
    shape = relax.Var("new_shape", relax.TensorType((2,), "int64"))
    builder = relax.BlockBuilder()
    with builder.function("main", [data, shape]):
        with builder.dataflow():
            builder.emit(tvm.ir.Call(relax.ExternFunc("vm.builtin.tensor_to_shape"), [shape],
                                     None, [relax.ShapeType(ndim=2)]))
            out = builder.emit_output(relax.op.add(data, data))
        builder.emit_func_output(out)
    mod = builder.get()
    with pytest.raises(Exception, match="impure call"):
        relax.analysis.well_formed(mod)
    new, report = _unchanged_ill_formed(mod)
    assert any("input module is not well-formed" in note for note in report.notes)


def _unchanged_ill_formed(mod):
    before = tvm_ffi.structural_hash(mod)
    new, report = relay_amp.convert(mod, "float16", verify=True)
    assert tvm_ffi.structural_hash(mod) == before
    return new, report
