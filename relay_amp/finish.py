"""Step 4 of the algorithm (stated in :mod:`relay_amp.transform`): finish. Where
``low_precision_boundaries`` holds, dataflow outputs that no other block and not the result
reads become internal and casts nothing reads are dropped; with ``verify`` the output is checked
with ``well_formed``; with ``debug_guard`` a NaN/Inf check follows every low-precision result;
the report gets its rows, notes and cast count."""

from __future__ import annotations

import tvm
from tvm import relax

from .dtypes import is_floating
from .execution import with_function
from .instrument import instrument
from .op_registry import op_info
from .relax_utils import TVM_ERRORS, op_name
from .report import Report, ReportBuilder


def finish(mod: tvm.IRModule, new_mod: tvm.IRModule, jobs, report: ReportBuilder,
           constants_converted: int, verify: bool, debug_guard: bool):
    """Step 4: the converted module and its report.

    Parameters
    ----------
    mod : tvm.IRModule
        The module as steps 1-3 read it (to tell whether an ill-formed output was ill-formed
        before).
    new_mod : tvm.IRModule
        The rewritten module.
    jobs : sequence of relay_amp.resolve.FunctionJob
        The functions converted, with their kernel settings.
    report : relay_amp.report.ReportBuilder
        The conversion's report.
    constants_converted : int
        Float32 constants converted at conversion time.
    verify, debug_guard : bool
        As for :func:`relay_amp.convert`.

    Returns
    -------
    (tvm.IRModule, relay_amp.Report)
    """
    for job in jobs:
        if job.context.settings.low_precision_boundaries:
            new_mod = with_function(new_mod, job.name,
                                    internalize_dataflow_outputs(new_mod[job.name]))
    output_problem = _well_formed_problem(new_mod) if verify else None
    if output_problem is not None:
        input_problem = _well_formed_problem(mod)
        if input_problem is None:  # relay_amp never makes a well-formed module ill-formed
            relax.analysis.well_formed(new_mod)
        report.note(f"the input module is not well-formed ({input_problem}); the output has "
                    "the same problem")
    if debug_guard:
        new_mod = add_debug_guards(new_mod, report.report)
        relax.analysis.well_formed(new_mod)
        report.note("debug_guard: every low-precision result is checked for NaN/Inf")
    return new_mod, report.finish(constants_converted)


def _well_formed_problem(mod: tvm.IRModule) -> str | None:
    try:
        relax.analysis.well_formed(mod)
    except TVM_ERRORS as err:  # TVM raises InternalError/ValueError with the reason
        lines = str(err).strip().splitlines()
        return lines[-1][:200] if lines else type(err).__name__
    return None


@relax.expr_functor.mutator
class _Internalize(relax.PyExprMutator):
    """Turns the dataflow outputs in ``internal`` into DataflowVars, names unchanged, and drops
    the bindings in ``dead``."""

    def __init__(self, internal, dead):
        super().__init__()
        self.internal, self.dead = internal, dead

    def visit_var_binding_(self, binding):
        var = binding.var
        if var.__chandle__() in self.dead:
            return
        value = self.visit_expr(binding.value)
        if var.__chandle__() in self.internal:
            new = relax.DataflowVar(var.name, value.ty)
            self.set_var_remap(var, new)
            var = new
        self.builder_.emit_normalized(relax.VarBinding(var, value))


def internalize_dataflow_outputs(func: relax.Function) -> relax.Function:
    """``func`` with every dataflow-block output that no other block and not the result reads
    made a DataflowVar (names kept), and every cast that nothing reads dropped. A float32 result
    that left its block only to be cast for the signature then stays inside it, and FuseOps
    fuses the cast into the kernel that computes it; a low-precision copy planned for a kernel
    boundary that its reader did not take (it computes in float32 after all) costs no kernel."""
    body = func.body
    if not isinstance(body, relax.SeqExpr):
        return func
    readers: dict = {}  # var handle -> the blocks (or -1, the result) that read it

    def reads(expr, where):
        relax.analysis.post_order_visit(expr, lambda e: readers.setdefault(
            e.__chandle__(), set()).add(where) if isinstance(e, relax.Var) else None)

    for index, block in enumerate(body.blocks):
        for binding in block.bindings:
            reads(binding.value, index)
    reads(body.body, -1)
    internal, dead = set(), set()
    for index, block in enumerate(body.blocks):
        if not isinstance(block, relax.DataflowBlock):
            continue
        for binding in block.bindings:
            var, value = binding.var, binding.value
            read_by = readers.get(var.__chandle__(), set())
            if (not read_by and type(binding) is relax.VarBinding
                    and isinstance(value, tvm.ir.Call) and op_info(op_name(value)).is_cast):
                dead.add(var.__chandle__())
            elif type(binding) is relax.VarBinding and type(var) is relax.Var and (
                    read_by <= {index}):
                internal.add(var.__chandle__())
    return _Internalize(internal, dead).visit_expr(func) if internal or dead else func


def add_debug_guards(mod: tvm.IRModule, report: Report) -> tvm.IRModule:
    """After each low-precision binding, assert that its value is finite.

    The guarded functions become non-dataflow and impure (``assert_op`` has an effect); the
    assertion message names the binding, its op and dtype.
    """
    guarded = {(r.function, r.name): r for r in report.rows if r.compute_dtype == report.dtype}
    mod = relax.transform.ToNonDataflow()(mod)
    updated = {}
    for gvar, func in mod.functions_items():
        if not isinstance(func, relax.Function):
            continue
        name = gvar.name_hint

        def guard(binding, bind, name=name):
            row = guarded.get((name, binding.var.name))
            ty = binding.var.ty
            value = binding.value
            stored = (isinstance(value, tvm.ir.Call) and op_info(op_name(value)).is_cast
                      and isinstance(ty, relax.TensorType)
                      and str(ty.dtype) == report.dtype and isinstance(value.args[0], relax.Var))
            if not (row or stored) or not isinstance(ty, relax.TensorType) or not is_floating(
                    ty.dtype):
                return []
            if row is not None:
                what = f"binding {binding.var.name} ({row.op}, computed in {row.compute_dtype})"
            else:
                what = f"the {report.dtype} copy of {value.args[0].name}"
            finite_each = bind(relax.op.isfinite(binding.var), "guard_finite")
            bad = bind(relax.op.logical_not(finite_each), "guard_bad")
            flags = bind(relax.op.astype(bad, "int32"), "guard_int")
            count = bind(relax.op.max(flags), "guard_any")
            finite = bind(relax.op.equal(count, relax.const(0, "int32")), "guard_ok")
            message = f"relay_amp debug_guard: {what} in {name} produced NaN or Inf"
            bind(relax.op.assert_op(finite, [], message), "guard")
            return []

        blocks, _ = instrument(func, guard)
        body = relax.SeqExpr(blocks, func.body.body)
        updated[gvar] = relax.Function(func.params, body, func.ret_ty, False, func.attrs)
    for gvar, func in updated.items():
        mod = with_function(mod, gvar.name_hint, func)
    return relax.transform.Normalize()(mod)
