"""Step 1b, kernel boundaries (:mod:`relay_amp.kernel_plan`), on small functions with a GPU's
kernel settings: which values FuseOps keeps in one kernel, which cross a boundary in low
precision, which residual streams keep float32, and the mode each follow op gets from how its
inputs arrive; then the structural tests of the conversion at kernel boundaries."""

import numpy as np
import pytest
from cases import Chain, PostNorm, Residual
from helpers import convert_checked, random_inputs, run_module
from stages import CUDA, DTYPES, Stages
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R

from relay_amp.kinds import Mode


@I.ir_module
class Ranked:
    @R.function
    def main(x: R.Tensor((4, 16), "float32"), w: R.Tensor((16, 16), "float32")):
        with R.dataflow():
            a = R.matmul(x, w)
            p = R.nn.softmax(a, axis=-1)
            q = R.reshape(p, (64,))
            i = R.argsort(q)
            m = R.max(p)
            R.output(i, m)
        return (i, m)


def names(values):
    return sorted(value.name for value in values)


def codes(kernels, stages, name):
    return [reason.code for reason in kernels.reasons.get(stages.var(name), ())]


@pytest.mark.parametrize("dtype", DTYPES)
def test_values_between_kernels_are_stored_low(dtype):
    """relu joins the first matmul's kernel (in float32 registers); its result and the second
    matmul's cross a kernel boundary in low precision; softmax is a mixed kernel."""
    stages = Stages(Chain, dtype, CUDA)
    kernels = stages.kernels()
    a, b = stages.var("a"), stages.var("b")
    assert (a, b) in kernels.fused and len(kernels.fused) == 1
    assert names(kernels.stored_low) == ["b", "c"]
    assert kernels.modes == {b: Mode.ORIGINAL}
    assert codes(kernels, stages, "b") == ["in_float32_registers"]
    assert kernels.boundary_read(stages.var("c"), stages.var("d"))
    assert not kernels.residuals and not kernels.absorbed


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_centring_normalization_forms_the_residual_add(dtype):
    """Each residual add feeding a layer_norm is formed inside the layer_norm's kernel; the
    stream between them (``n``, centred and added to) keeps float32, the dot products' results
    cross in low precision."""
    stages = Stages(PostNorm, dtype, CUDA)
    kernels = stages.kernels()
    assert {add.name: norm.name for add, norm in kernels.absorbed.items()} == {"s": "n",
                                                                               "r": "o"}
    assert codes(kernels, stages, "s") == codes(kernels, stages, "r") == ["absorbed_add"]
    assert names(kernels.residuals) == ["n"] and codes(kernels, stages, "n") == [
        "residual_added"]
    assert names(kernels.stored_low) == ["y", "z"]


def test_an_uncentred_residual_stream_is_stored_low_unless_asked_not_to():
    """A stream no normalization centres is stored low and added in float32 registers (the
    GPU default); with ``low_precision_residuals=False`` it keeps float32."""
    stages = Stages(Residual, "float16", CUDA)
    kernels = stages.kernels()
    assert names(kernels.stored_low) == ["r", "s"] and not kernels.residuals
    assert codes(kernels, stages, "r") == ["in_float32_registers", "residual_low"]
    assert codes(kernels, stages, "s") == ["widened_in_kernel"]
    stages = Stages(Residual, "float16", CUDA, low_precision_residuals=False)
    kernels = stages.kernels()
    assert names(kernels.stored_low) == ["s"] and names(kernels.residuals) == ["r"]
    assert codes(kernels, stages, "r") == ["in_float32_registers", "residual_added"]


def test_what_a_ranking_op_reads_keeps_float32():
    stages = Stages(Ranked, "float16", CUDA)
    kernels = stages.kernels()
    assert "ranked" in codes(kernels, stages, "q")
    assert stages.var("q") not in kernels.stored_low


def test_the_kernel_plan_is_frozen():
    stages = Stages(Chain, "float16", CUDA)
    kernels = stages.kernels()
    with pytest.raises(AttributeError):
        kernels.stored_low.add(stages.var("a"))
    with pytest.raises(TypeError):
        kernels.modes[stages.var("a")] = Mode.LOW


# ------------------------------------------------------------------ the conversion at boundaries
def test_converting_again_with_cuda_defaults_changes_nothing():
    """A converted module holds explicit casts; with kernel boundaries on, a view that only feeds
    such a cast must not make its producer store low precision (a float16 → float32 → float16
    round trip on the second conversion)."""
    builder = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 4), "float32"))
    w = relax.Var("w", relax.TensorType((4, 4), "float32"))
    with builder.function("main", [x, w]):
        with builder.dataflow():
            image = builder.emit(relax.op.reshape(x, (1, 4, 1, 1)))
            conv = builder.emit(relax.op.nn.conv2d(
                image, relax.const(np.ones((4, 4, 1, 1), "float32"))))
            flat = builder.emit(relax.op.reshape(conv, (1, 4)))
            pair = builder.emit(relax.Tuple([x, flat]))
            out = builder.emit_output(relax.op.matmul(
                builder.emit(relax.TupleGetItem(pair, 1)), w))
        builder.emit_func_output(out)
    for dtype in DTYPES:
        convert_checked(builder.get(), dtype, target=CUDA)  # asserts idempotence


def test_kernel_boundary_cleanup_keeps_every_binding_name_in_the_report():
    """Dataflow outputs become DataflowVars under their own names: the report still names the
    binding of each op (TVM's CanonicalizeBindings would fold ``gv = lv`` into ``gv = matmul``)."""

    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((2, 4), "float32"), w: R.Tensor((4, 4), "float32")):
            with R.dataflow():
                lv = R.matmul(x, w)
                gv = lv
                R.output(gv)
            return gv

    for keep_io in (True, False):  # with float32 I/O the matmul is a kernel that rounds x, w
        new, report = convert_checked(Before, "float16", target=CUDA, keep_io_dtypes=keep_io)
        calls = {b.var.name for b in new["main"].body.blocks[0].bindings
                 if isinstance(b.value, relax.Call) and b.value.op.name in (
                     "relax.matmul", "relax.call_tir")}
        assert calls == {"lv"} and report.find("lv").op == "matmul"


def test_a_boundary_copy_its_reader_did_not_take_is_dropped():
    """concat reads a float32 parameter too, so it computes in float32 and reads the matmul's
    result as it is: the low-precision copy planned for the boundary would be a dead cast."""
    builder = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 4), "float32"))
    w = relax.Var("w", relax.TensorType((4, 4), "float32"))
    with builder.function("main", [x, w]):
        with builder.dataflow():
            product = builder.emit(relax.op.matmul(x, w))
            joined = builder.emit(relax.op.concat([x, product], axis=1))
            halves = builder.emit(relax.op.split(joined, 2, axis=1))
            out = builder.emit_output(relax.TupleGetItem(halves, 0))
        builder.emit_func_output(out)
    new, _ = convert_checked(builder.get(), "float16", target=CUDA)
    bindings = new["main"].body.blocks[0].bindings
    read = set()
    relax.analysis.post_order_visit(new["main"], lambda e: read.add(e.name)
                                    if isinstance(e, relax.Var) else None)
    casts = [b.var.name for b in bindings
             if isinstance(b.value, relax.Call) and b.value.op.name == "relax.astype"]
    assert casts and all(name in read for name in casts)


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_float32_result_another_kernel_reads_is_not_rounded(dtype):
    """A result the function returns in float32 that a second kernel also reads (an encoder's
    last layer_norm and its pooled mean) is written in float32, not stored low for the reader
    and widened for the result."""
    builder = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 8, 32), "float32"))
    gamma = relax.Var("gamma", relax.TensorType((32,), "float32"))
    beta = relax.Var("beta", relax.TensorType((32,), "float32"))
    with builder.function("main", [x, gamma, beta]):
        with builder.dataflow():
            normed = builder.emit(relax.op.nn.layer_norm(x, gamma, beta, axes=[-1]))
            pooled = builder.emit(relax.op.mean(normed, axis=[1]))
            result = builder.emit_output(relax.Tuple([normed, pooled]))
        builder.emit_func_output(result)
    mod = builder.get()
    converted, report = convert_checked(mod, dtype, target=CUDA)
    assert report.find(normed.name).reason("mixed_kernel").values["writes"].startswith(
        "float32")
    inputs = random_inputs(mod, seed=3)
    expected = run_module(mod, inputs)
    got = run_module(converted, inputs)
    for want, have in zip(expected, got):
        np.testing.assert_allclose(np.asarray(have), np.asarray(want), rtol=1e-5, atol=1e-5)


@I.ir_module
class SmallScores:
    """``c`` (a column of scores) crosses a kernel boundary to two elementwise readers that
    make results; it is computed from the wide ``a``, so its dot product is no small head."""

    @R.function
    def main(x: R.Tensor((256, 256), "float32"), w: R.Tensor((256, 256), "float32"),
             v: R.Tensor((256, 1), "float32")):
        with R.dataflow():
            a = R.matmul(x, w)
            b = R.matmul(a, w)
            c = R.matmul(a, v)
            s = R.sigmoid(c)
            t = R.tanh(c)
            R.output(b, s, t)
        return (b, s, t)


@I.ir_module
class WideScores:
    """As :class:`SmallScores`, with the scores as wide as the features: a copy of ``c`` in
    low precision saves a large share of the function's bytes."""

    @R.function
    def main(x: R.Tensor((256, 256), "float32"), w: R.Tensor((256, 256), "float32")):
        with R.dataflow():
            a = R.matmul(x, w)
            b = R.matmul(a, w)
            c = R.matmul(a, w)
            s = R.sigmoid(c)
            t = R.tanh(c)
            R.output(b, s, t)
        return (b, s, t)


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_small_value_that_feeds_a_result_keeps_float32(dtype):
    """The scores ``c`` feed the results ``s`` and ``t`` through elementwise ops and their low
    copy would save 1.5 KiB of about 2 MiB: stored float32, with the reason; ``a``, which feeds
    the results only through dot products, is stored low. On inputs where nothing else
    rounds, ``s`` is then float32's exactly; with the results' budget at 0 (the rule off) ``c``
    is stored low too, and ``s`` moves."""
    from relay_amp.policy import DEFAULT_RESULT_BUDGET

    stages = Stages(SmallScores, dtype, CUDA)
    kernels = stages.kernels()
    assert names(kernels.stored_low) == ["a"]
    reason = kernels.reasons[stages.var("c")][-1]
    assert reason.code == "feeds_result"
    assert reason.values["saving"] == 256 * 2 * 3  # 2 bytes an element, written once, read twice
    assert 0 < reason.values["share"] < DEFAULT_RESULT_BUDGET
    assert reason.values["budget"] == DEFAULT_RESULT_BUDGET
    assert "feeds a function result" in reason.text()

    # x, w in {-1, 0, 1} and v seven-bit multiples of 1/1024: exact in float16 and bfloat16,
    # and every product and sum exact in float32, so only a rounding of c (about 12 bits) can
    # move the result s
    rng = np.random.default_rng(3)
    inputs = [rng.integers(-high, high + 1, size=shape).astype("float32") * scale
              for shape, high, scale in (((256, 256), 1, 1), ((256, 256), 1, 1),
                                         ((256, 1), 127, 1 / 1024))]
    expected = run_module(SmallScores, inputs)[1]
    kept = run_module(convert_checked(SmallScores, dtype, target=CUDA)[0], inputs)[1]
    np.testing.assert_array_equal(kept, expected)
    assert names(Stages(SmallScores, dtype, CUDA, result_budget=0.0).kernels().stored_low) \
        == ["a", "c"]
    rounded = run_module(convert_checked(SmallScores, dtype, target=CUDA, result_budget=0.0)[0],
                         inputs)[1]
    assert np.abs(rounded - expected).max() > 0


def test_a_wide_value_that_feeds_a_result_is_stored_low():
    """Keeping the wide scores float32 would cost more than the results' budget of the
    function's bytes: they are stored low, as every other value between kernels."""
    stages = Stages(WideScores, "float16", CUDA)
    kernels = stages.kernels()
    assert names(kernels.stored_low) == ["a", "c"]
    assert "feeds_result" not in codes(kernels, stages, "c")


def _importer_kernel_between_matmuls(compute, name):
    """matmul, a ``call_tir`` of an elementwise PrimFunc (as TVM's ONNX importer writes a clip
    or HardSwish's max and min), a multiply, then another matmul and a mean (as a
    squeeze-and-excitation block reads a HardSwish)."""
    from tvm import te

    builder = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((64, 64), "float32"))
    w = relax.Var("w", relax.TensorType((64, 64), "float32"))
    with builder.function("main", [x, w]):
        with builder.dataflow():
            h = builder.emit(relax.op.matmul(x, w))
            c = builder.emit_te(lambda a: te.compute(a.shape, lambda i, j: compute(a[i, j])), h,
                                primfunc_name_hint=name)
            m = builder.emit(relax.op.multiply(h, c))
            y = builder.emit(relax.op.matmul(m, w))
            z = builder.emit(relax.op.mean(m, axis=[1], keepdims=True))
            out = builder.emit_output(relax.op.add(y, z))
        builder.emit_func_output(out)
    return builder.get()


def _clip(value):
    import tvm
    from tvm import te

    return te.max(te.min(value, tvm.tirx.const(6.0, "float32")), tvm.tirx.const(0.0, "float32"))


@pytest.mark.parametrize("dtype", DTYPES)
def test_an_importer_kernel_that_selects_among_its_inputs_is_stored_low(dtype):
    """A PrimFunc whose every store picks a loaded value or a constant (max, min) rounds
    nothing: its result fits the low dtype where its input does, so the multiply it feeds is
    stored in low precision once, for the matmul as for the mean (no float32 copy for the
    matmul to round in its own kernel), with no cast kernel."""
    from relay_amp.builds.gpu_cost import gpu_cost

    mod = _importer_kernel_between_matmuls(_clip, "clip")
    new, report = convert_checked(mod, dtype, target=CUDA, low_precision_inputs=["w"])
    rows = {r.op: r for r in report.rows}  # the second matmul's
    assert [x.code for x in rows["call_tir"].reasons] == ["unknown_op", "selects_inputs"]
    assert rows["matmul"].input_dtypes[0] == dtype  # the multiply's result, stored low
    assert gpu_cost(new, CUDA).casts == 0
    inputs = random_inputs(mod)
    reference = run_module(mod, inputs)[0]
    got = run_module(new, [inputs[0], inputs[1].astype(dtype)])[0]
    error = np.linalg.norm(got - reference) / np.linalg.norm(reference)
    assert error < {"float16": 2e-3, "bfloat16": 2e-2}[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
def test_an_importer_kernel_that_computes_stays_float32(dtype):
    """``exp`` in a PrimFunc is not a selection: its result's range is not its inputs', so the
    multiply it feeds is kept in float32 for the matmul, which rounds it in its own kernel."""
    from tvm import te

    mod = _importer_kernel_between_matmuls(te.exp, "exp_kernel")
    _, report = convert_checked(mod, dtype, target=CUDA, low_precision_inputs=["w"])
    rows = {r.op: r for r in report.rows}  # the second matmul's
    assert [x.code for x in rows["call_tir"].reasons] == ["unknown_op"]
    assert rows["matmul"].input_dtypes[0] == "float32"


@pytest.mark.parametrize("dtype", DTYPES)
def test_an_importer_kernel_reads_a_stored_value_through_a_cast_in_its_kernel(dtype):
    """A ReLU read by a matmul and by an importer's ``exp`` kernel is stored in low precision
    once; the kernel widens it inside itself, and its row says so."""
    from tvm import te

    builder = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((64, 64), "float32"))
    w = relax.Var("w", relax.TensorType((64, 64), "float32"))
    with builder.function("main", [x, w]):
        with builder.dataflow():
            r = builder.emit(relax.op.nn.relu(relax.op.matmul(x, w)))
            c = builder.emit_te(lambda a: te.compute(a.shape, lambda i, j: te.exp(a[i, j])), r,
                                primfunc_name_hint="exp_kernel")
            out = builder.emit_output(relax.op.add(relax.op.matmul(r, w), c))
        builder.emit_func_output(out)
    _, report = convert_checked(builder.get(), dtype, target=CUDA, low_precision_inputs=["w"])
    rows = {r.op: r for r in report.rows}
    assert [x.code for x in rows["call_tir"].reasons] == ["unknown_op", "reads_stored_low"]
    assert rows["nn.relu"].output_dtype == f"float32+{dtype}"
