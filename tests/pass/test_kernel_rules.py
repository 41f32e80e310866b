"""Step 1b's parts alone: fusion grouping (:mod:`relay_amp.fusion_groups`), then each boundary
rule (:mod:`relay_amp.kernel_rules`) applied to one binding of a small function with a GPU's
kernel settings, after the rules before it, as :class:`relay_amp.kernel_plan.KernelPlanner`
applies them."""

import dataclasses

import pytest
from cases import Chain, PostNorm, Residual
from stages import CUDA, Stages
from tvm import relax, te
from tvm.script import ir as I
from tvm.script import relax as R

from relay_amp.kernel_plan import KernelPlanner
from relay_amp.kernel_rules import (
    ComputesLow,
    CrossesBoundary,
    FeedsResult,
    FollowOpMode,
    Ranked,
    ReadsStoredLow,
    ResidualStreams,
    Site,
    StoredLow,
)
from relay_amp.kinds import FusionKind, Mode
from relay_amp.policy import DEFAULT_RESULT_BUDGET


@I.ir_module
class Silu:
    @R.function
    def main(x: R.Tensor((4, 16), "float32"), w: R.Tensor((16, 16), "float32")):
        with R.dataflow():
            a = R.matmul(x, w)
            s = R.sigmoid(a)
            m = R.multiply(a, s)
            o = R.matmul(m, w)
            R.output(o)
        return o


@I.ir_module
class Added:
    """``b`` is read only by the add ``c`` in another kernel; ``a`` joins the add's kernel."""

    @R.function
    def main(x: R.Tensor((4, 16), "float32"), p: R.Tensor((4, 16), "float32"),
             v: R.Tensor((16, 16), "float32"), w: R.Tensor((16, 16), "float32")):
        with R.dataflow():
            a = R.matmul(p, v)
            b = R.matmul(x, w)
            c = R.add(a, b)
            d = R.nn.relu(c)
            e = R.matmul(d, w)
            f = R.nn.relu(e)
            g = R.matmul(f, w)
            R.output(g)
        return g


@I.ir_module
class Centred:
    """``s`` is computed in float32 registers and centred by a normalization in another
    kernel (a subtract is no residual add the normalization forms itself)."""

    @R.function
    def main(x: R.Tensor((2, 8, 16), "float32"), w: R.Tensor((16, 16), "float32"),
             g: R.Tensor((16,), "float32"), b: R.Tensor((16,), "float32")):
        with R.dataflow():
            y = R.matmul(x, w)
            s = R.subtract(x, y)
            n = R.nn.layer_norm(s, g, b, axes=[-1])
            R.output(n)
        return n


@I.ir_module
class Sorted:
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


@I.ir_module
class Scores:
    """``c``, a column of scores, feeds the results ``s`` and ``t`` through elementwise ops."""

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


def _planner(stages):
    return KernelPlanner(stages.scope, stages.decide(), stages.context.settings,
                         stages.context.callee_kinds)


def up_to(stages, name, rule_type):
    """Step 1b of ``main`` run to where the rule of ``rule_type`` is next applied to the
    binding ``name``: the plan being built, that rule and the binding's site."""
    planner, body = _planner(stages), stages.func.body
    kernels = planner.group(body)
    rules = planner.rules(kernels, body)
    for site in planner.sites(kernels, body):
        for rule in rules:
            if site.var is stages.var(name) and isinstance(rule, rule_type):
                return kernels, rule, site
            if rule.apply(kernels, site):
                break
    raise AssertionError(f"{rule_type.__name__} is not applied to {name}")


def names(values):
    return sorted(value.name for value in values)


def codes(kernels, var):
    return [reason.code for reason in kernels.reasons.get(var, ())]


def test_the_rules_apply_in_the_order_their_reasons_are_appended():
    stages = Stages(Chain, "float16", CUDA)
    planner = _planner(stages)
    rules = planner.rules(planner.group(stages.func.body), stages.func.body)
    assert [type(rule) for rule in rules] == [FollowOpMode, CrossesBoundary, ResidualStreams,
                                              Ranked, FeedsResult, StoredLow, ComputesLow]


# ------------------------------------------------------------------------------ fusion grouping
def test_fusion_grouping_keeps_a_diamond_in_one_kernel():
    """SiLU's ``a * sigmoid(a)`` re-converges at the multiply: the matmul, the sigmoid and the
    multiply are one kernel with the matmul as its anchor; grouping decides nothing else."""
    stages = Stages(Silu, "float16", CUDA)
    kernels = _planner(stages).group(stages.func.body)
    a, s, m, o = (stages.var(n) for n in "asmo")
    assert kernels.fused == {(a, s), (a, m), (s, m)}
    assert kernels.group_kind == {a: FusionKind.ANCHOR, s: FusionKind.ELEMWISE,
                                  m: FusionKind.ANCHOR, o: FusionKind.ANCHOR}
    assert kernels.uses[a] == [s, m] and kernels.uses[o] == [None]  # None: the result
    assert not (kernels.stored_low or kernels.modes or kernels.reasons or kernels.absorbed)


def test_fusion_grouping_puts_a_residual_add_into_its_normalization():
    stages = Stages(PostNorm, "float16", CUDA)
    kernels = _planner(stages).group(stages.func.body)
    assert {add.name: norm.name for add, norm in kernels.absorbed.items()} == {"s": "n",
                                                                               "r": "o"}
    assert kernels.group_kind[stages.var("s")] == FusionKind.OPAQUE
    assert codes(kernels, stages.var("s")) == ["absorbed_add"]
    stages = Stages(PostNorm, "float16", CUDA, low_precision_residuals=True)
    kernels = _planner(stages).group(stages.func.body)
    assert not kernels.absorbed and not kernels.reasons


def test_fusion_grouping_records_the_items_of_a_tuple():
    builder = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 4), "float32"))
    w = relax.Var("w", relax.TensorType((4, 4), "float32"))
    with builder.function("main", [x, w]):
        with builder.dataflow():
            joined = builder.emit(relax.op.concat([x, relax.op.matmul(x, w)], axis=1))
            halves = builder.emit(relax.op.split(joined, 2, axis=1))
            out = builder.emit_output(relax.TupleGetItem(halves, 0))
        builder.emit_func_output(out)
    stages = Stages(builder.get(), "float16", CUDA)
    kernels = _planner(stages).group(stages.func.body)
    assert names(kernels.tuple_items[stages.var(halves.name)]) == [out.name]


# ---------------------------------------------------------------------------- the boundary rules
def test_follow_op_mode_reads_a_stored_copy_as_it_is():
    """The add is the only reader of the stored ``b``: a float32 copy would join ``b``'s
    kernel, so the add computes in low precision."""
    stages = Stages(Added, "float16", CUDA)
    kernels, rule, site = up_to(stages, "c", FollowOpMode)
    assert stages.var("b") in kernels.stored_low
    assert rule.apply(kernels, site) is False
    assert kernels.modes[site.var] == Mode.LOW
    assert [(r.code, r.values["input"]) for r in kernels.reasons[site.var]] == [
        ("arrives_low", "b")]


def test_follow_op_mode_widens_in_its_kernel_and_drops_the_copy_it_cannot_read():
    """Where the add cannot be low precision, it widens what it reads, and the copy of ``b``
    it would have had to read as it is is not stored."""
    stages = Stages(Added, "float16", CUDA)
    kernels, rule, site = up_to(stages, "c", FollowOpMode)
    decisions = kernels.decisions
    kernels = dataclasses.replace(kernels, decisions=dataclasses.replace(
        decisions, can_low={**decisions.can_low, site.var: False}))
    rule.apply(kernels, site)
    assert kernels.modes[site.var] == Mode.ORIGINAL
    assert codes(kernels, site.var) == ["widened_in_kernel"]
    assert stages.var("b") not in kernels.stored_low


@pytest.mark.parametrize("name, mode, code", [("d", Mode.LOW, "exact_arrives_low"),
                                              ("f", Mode.ORIGINAL, "in_float32_registers")])
def test_follow_op_mode_of_an_exact_op(name, mode, code):
    """``d`` reads the add that computes in low precision in its kernel; ``f`` reads a dot
    product's float32 registers."""
    stages = Stages(Added, "float16", CUDA)
    kernels, rule, site = up_to(stages, name, FollowOpMode)
    rule.apply(kernels, site)
    assert kernels.modes[site.var] == mode and codes(kernels, site.var) == [code]


def test_follow_op_mode_leaves_other_ops_alone():
    stages = Stages(Added, "float16", CUDA)
    kernels, rule, site = up_to(stages, "e", FollowOpMode)
    rule.apply(kernels, site)
    assert site.var not in kernels.modes and not codes(kernels, site.var)


@pytest.mark.parametrize("name, crosses", [("a", False), ("b", True), ("c", True),
                                           ("d", False)])
def test_crosses_boundary(name, crosses):
    """``a`` stays in the relu's kernel; ``b`` and ``c`` cross to another kernel; ``d`` is
    the function's float32 result."""
    stages = Stages(Chain, "float16", CUDA)
    kernels, rule, site = up_to(stages, name, CrossesBoundary)
    stored = set(kernels.stored_low)
    assert rule.apply(kernels, site) is False
    assert site.crosses_low is crosses and kernels.stored_low == stored  # StoredLow stores


def test_a_residual_stream_a_normalization_centres_keeps_float32():
    stages = Stages(Centred, "float16", CUDA)
    kernels, rule, site = up_to(stages, "s", ResidualStreams)
    assert site.crosses_low
    rule.apply(kernels, site)
    assert not site.crosses_low and kernels.residuals == {site.var}
    assert kernels.reasons[site.var][-1].code == "residual_centred"
    assert kernels.reasons[site.var][-1].values == {"consumer": "n", "op": "nn.layer_norm"}


def test_a_stream_added_to_where_a_normalization_centres_the_sum_keeps_float32():
    stages = Stages(PostNorm, "float16", CUDA)
    kernels, rule, site = up_to(stages, "n", ResidualStreams)
    assert site.crosses_low
    rule.apply(kernels, site)
    assert not site.crosses_low and names(kernels.residuals) == ["n"]
    assert [(r.code, r.values) for r in kernels.reasons[site.var]] == [
        ("residual_added", {"consumer": "r"})]


def test_an_uncentred_residual_stream_crosses_low_unless_asked_not_to():
    """On the GPU default (uncentred) the stream crosses in low precision and the rule names
    its adder; with ``low_precision_residuals=False`` it keeps float32; with True the rule
    says nothing."""
    stages = Stages(Residual, "float16", CUDA)
    kernels, rule, site = up_to(stages, "r", ResidualStreams)
    rule.apply(kernels, site)
    assert site.crosses_low and site.uncentred_reader is stages.var("s")
    assert not kernels.residuals and codes(kernels, site.var) == ["in_float32_registers"]

    stages = Stages(Residual, "float16", CUDA, low_precision_residuals=False)
    kernels, rule, site = up_to(stages, "r", ResidualStreams)
    rule.apply(kernels, site)
    assert not site.crosses_low and names(kernels.residuals) == ["r"]
    assert codes(kernels, site.var) == ["in_float32_registers", "residual_added"]

    stages = Stages(Residual, "float16", CUDA, low_precision_residuals=True)
    kernels, rule, site = up_to(stages, "r", ResidualStreams)
    rule.apply(kernels, site)
    assert site.crosses_low and site.uncentred_reader is None and not kernels.residuals


def test_what_a_ranking_op_reads_through_exact_ops_keeps_float32():
    stages = Stages(Sorted, "float16", CUDA)
    kernels, rule, site = up_to(stages, "q", Ranked)
    assert site.crosses_low
    rule.apply(kernels, site)
    assert not site.crosses_low
    assert [(r.code, r.values) for r in kernels.reasons[site.var]] == [
        ("in_float32_registers", {}), ("ranked", {"consumer": "i", "op": "argsort"})]
    rule.apply(kernels, Site(site.var, site.plan))  # a value that does not cross: no reason
    assert len(kernels.reasons[site.var]) == 2


def test_a_small_value_that_feeds_a_result_keeps_float32_within_the_budget():
    """The scores feed the results through elementwise ops: kept float32, and no later rule
    sees them (they are neither stored low nor computed low); a budget of 0 keeps none."""
    stages = Stages(Scores, "float16", CUDA)
    kernels, rule, site = up_to(stages, "c", FeedsResult)
    assert names(rule.kept) == ["c"] and site.crosses_low
    assert rule.apply(kernels, site) is True
    reason = kernels.reasons[site.var][-1]
    assert reason.code == "feeds_result" and reason.values["budget"] == DEFAULT_RESULT_BUDGET
    assert reason.values["saving"] == 256 * 2 * 3
    body = stages.func.body
    planner = _planner(stages)
    results = planner.result_vars(body.body)
    assert names(results) == ["b", "s", "t"]
    assert FeedsResult.measure(kernels, stages.scope.bindings(body), results, 0.0).kept == {}
    assert FeedsResult.measure(kernels, stages.scope.bindings(body), set(), 1.0).kept == {}


def test_a_value_that_crosses_low_is_stored_low():
    stages = Stages(Chain, "float16", CUDA)
    kernels, rule, site = up_to(stages, "b", StoredLow)
    rule.apply(kernels, site)
    assert site.var in kernels.stored_low and codes(kernels, site.var) == [
        "in_float32_registers"]
    kernels, rule, site = up_to(stages, "d", StoredLow)
    rule.apply(kernels, site)
    assert site.var not in kernels.stored_low


def test_an_uncentred_stream_stored_low_names_its_adder():
    stages = Stages(Residual, "float16", CUDA)
    kernels, rule, site = up_to(stages, "r", StoredLow)
    rule.apply(kernels, site)
    assert site.var in kernels.stored_low
    assert [(r.code, r.values) for r in kernels.reasons[site.var]][-1] == (
        "residual_low", {"consumer": "s", "dtype": "float16"})


@pytest.mark.parametrize("name, low", [("c", True), ("d", True), ("e", False), ("f", False)])
def test_computes_low(name, low):
    """The add and the relu after it have low modes; a dot product accumulating in float32
    and a relu in float32 registers are float32."""
    stages = Stages(Added, "float16", CUDA)
    kernels, rule, site = up_to(stages, name, ComputesLow)
    rule.apply(kernels, site)
    assert (site.var in kernels.low_values) is low


def test_an_importer_kernel_that_reads_a_stored_value_says_so():
    """A ReLU read by a matmul and by an importer's ``exp`` kernel is stored low; once every
    binding is settled, the kernel's reason says it widens it inside itself."""
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
    stages = Stages(builder.get(), "float16", CUDA, low_precision_inputs=["w"])
    planner, body = _planner(stages), stages.func.body
    kernels = planner.group(body)
    rules, sites = planner.rules(kernels, body), planner.sites(kernels, body)
    for site in sites:
        for rule in rules:
            if rule.apply(kernels, site):
                break
    callee = next(site for site in sites if site.var.name == c.name)
    assert callee.var in kernels.widening_callees and codes(kernels, callee.var) == []
    ReadsStoredLow().apply(kernels, callee)
    assert [(x.code, x.values) for x in kernels.reasons[callee.var]] == [
        ("reads_stored_low", {"input": r.name, "dtype": "float16"})]
    assert stages.var(r.name) in kernels.stored_low
