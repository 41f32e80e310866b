"""A ReLU or clip of a value just rounded to bfloat16, applied before the rounding instead.

relay_amp's conversion runs a cheap activation in the precision of its input: after a
bfloat16 convolution with float32 sums, a ReLU6 (TFLite's, a ``clip`` of 0 and 6) reads the
sums' cast to bfloat16. TVM fuses the three into one kernel that rounds the sums and then
clips the rounded values, so the kernel does not end in its rounding, and
:func:`relay_amp.builds.bfcvtn.round_in_tile` cannot put that rounding on BFCVTN: it stays
TVM's integer rounding (``ushr``, ``and``, ``add``, ``addhn``: 4.2 M instructions of
hand_landmark_full's 65.8 M).

:func:`activations_before_rounding` (a Relax pass, before the layouts) writes
``clip(astype(x, "bfloat16"), lo, hi)`` as ``astype(clip(x, lo, hi), "bfloat16")`` where ``x``
is float32, the cast has no other reader and both bounds are bfloat16 values (a ReLU's are 0
and infinity). Rounding to nearest is monotone and leaves ``lo`` and ``hi`` as they are, so
both orders give the same value for every input but a NaN whose rounding TVM's integer
arithmetic carries into the sign (a payload of ``0x7fff8000`` or more).
"""

from __future__ import annotations

import tvm

from ..relax_utils import bfloat16_cast_source, bound_value, mutate_functions, read_counts

#: The activations moved: ``relax.clip(x, lo, hi)`` and ``relax.nn.relu(x)``.
ACTIVATIONS = ("relax.clip", "relax.nn.relu")


def _exact_bounds(call) -> bool:
    """Whether ``call``'s bounds (a clip's; a ReLU has 0) are bfloat16 values."""
    import ml_dtypes
    import numpy as np

    if call.op.name != "relax.clip":
        return True
    bounds = [bound_value(arg) for arg in call.args[1:]]
    if None in bounds:
        return False
    finite = np.array(bounds, np.float64)[np.isfinite(bounds)]
    return bool((finite.astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)
                 == finite).all())


def activations_before_rounding(rule_log=None) -> tvm.transform.Pass:
    """The Relax pass: each ReLU or clip of a float32 value's cast to bfloat16 that nothing
    else reads, with bounds bfloat16 holds, applied to the float32 value and then cast (see
    the module's docstring). Everything else is left as it is.

    Parameters
    ----------
    rule_log : relay_amp.builds.schedule_rules.RuleLog, optional
        Gets how many activations moved, for the build's report.

    Returns
    -------
    tvm.transform.Pass
    """
    from tvm import relax

    ops = {tvm.ir.Op.get(name) for name in ACTIVATIONS}

    @relax.expr_functor.mutator
    class Reordered(relax.PyExprMutator):
        def __init__(self, mod, reads):
            super().__init__(mod)
            self.reads, self.moved = reads, {}

        def visit_call_(self, call):
            call = super().visit_call_(call)
            if not (isinstance(call.op, tvm.ir.Op) and call.op in ops) \
                    or not isinstance(call.args[0], relax.Var) \
                    or self.reads.get(call.args[0], 0) != 1 or not _exact_bounds(call):
                return call
            source = bfloat16_cast_source(self.lookup_binding(call.args[0]))
            if source is None:
                return call
            self.moved[call.op.name] = self.moved.get(call.op.name, 0) + 1
            activated = self.builder_.emit(relax.Call(call.op, [source, *call.args[1:]],
                                                      call.attrs))
            return relax.op.astype(activated, "bfloat16")

    @tvm.transform.module_pass(opt_level=0, name="relay_amp.activations_before_rounding")
    def _reorder(mod, context):
        reads = {}
        for func in mod.functions.values():
            if isinstance(func, relax.Function):
                reads.update(read_counts(func))
        reordered = Reordered(mod, reads)
        out = mutate_functions(reordered)
        if rule_log is not None and reordered.moved:
            rule_log.scheduled("<relax: activations_before_rounding>", "rounding_last", (
                ", ".join(f"{n} {op.split('.')[-1]}" for op, n in reordered.moved.items())
                + " of a cast to bfloat16 applied before the rounding: the kernel ends in it,"
                " which BFCVTN can do",))
        # the casts the activations read no longer
        return relax.transform.DeadCodeElimination()(out)

    return _reorder


__all__ = ["ACTIVATIONS", "activations_before_rounding"]
