"""Inference batch_norm as elementwise ops, before legalization, so that FuseOps computes it in
the kernel of the convolution it follows.

TVM's CPU pipeline legalizes ``relax.nn.batch_norm`` into a kernel of its own, which FuseOps
does not fuse with the convolution before it: one more pass over the activations, in memory.
As the elementwise ops TVM's ``DecomposeOpsForInference`` makes of it (then
``CanonicalizeBindings``, so that the tuple item the model reads is the result itself), it
joins the convolution's kernel with what follows (a clip, a relu): on mobilenetv2_1.0 on x86,
one thread, 136 -> 84 ms of kernel time (docs/PERFORMANCE.md).
"""

from __future__ import annotations

import tvm
from tvm import relax

BATCH_NORM = "relax.nn.batch_norm"


def _batch_norms(func) -> list:
    found = []

    def visit(expr):
        if (isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op)
                and expr.op.name == BATCH_NORM):
            found.append(expr)

    relax.analysis.post_order_visit(func, visit)
    return found


def inference_batch_norms() -> tvm.transform.Pass:
    """A pass: in each Relax function whose batch_norms are all inference ones
    (``training=False``), every batch_norm as elementwise ops. A training batch_norm computes
    its batch's statistics, which ``DecomposeOpsForInference`` would replace by the moving
    ones, so a function with one is left as it is.

    Returns
    -------
    tvm.transform.Pass
    """

    @tvm.transform.module_pass(opt_level=0, name="relay_amp.InferenceBatchNorms")
    def _decompose(mod, _context):
        decomposed = mod
        for gvar, func in list(mod.functions_items()):
            if not isinstance(func, relax.Function):
                continue
            norms = _batch_norms(func)
            if norms and not any(bool(call.attrs.training) for call in norms):
                decomposed = relax.transform.DecomposeOpsForInference(gvar.name_hint)(decomposed)
        if decomposed.same_as(mod):
            return mod
        return relax.transform.CanonicalizeBindings()(decomposed)

    return _decompose
