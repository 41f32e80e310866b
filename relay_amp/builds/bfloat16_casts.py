"""float32 to bfloat16 casts on CPUs, rounded with the value bound once.

TVM's ``BF16ComputeLegalize`` writes a ``Cast("bfloat16", x)`` as round-to-nearest-even on
``x``'s bits, ``(bits + ((bits >> 16) & 1) + 0x7FFF) >> 16``, with ``x`` written out twice. Where
``x`` is an epilogue folded into a convolution's tile (a bias and a SiLU, whose ``exp``
:mod:`relay_amp.builds.fast_math` binds with nested ``Let``), TVM's ``VectorizeLoop`` then meets
those ``Let`` twice and fails ("Let cannot bind the same var to two different values":
yolov8n_320's bfloat16 build on aarch64). :func:`rounded_bfloat16_casts` writes each such cast
with TVM's own rounding and ``x``'s bits bound once, so there is nothing left for the
legalization to expand: the same bits as TVM's cast.
"""

from __future__ import annotations

import tvm

from ..relax_utils import mutate_functions


def _round(x):
    from tvm import te, tirx

    def u32(value):
        return tirx.const(value, "uint32")

    def rounded(*i):
        bits = tirx.Var("bits", "uint32")
        even = (bits + ((bits >> u32(16)) & u32(1)) + u32(0x7FFF)) >> u32(16)
        return tirx.Let(bits, tirx.reinterpret("uint32", x(*i)),
                        tirx.reinterpret("bfloat16", even.astype("uint16")))

    return te.compute(x.shape, rounded, name="cast")


def rounded_bfloat16_casts() -> tvm.transform.Pass:
    """The pass: each ``relax.astype`` of a float32 tensor to bfloat16 computed by
    :func:`_round`."""
    from tvm import relax

    astype = tvm.ir.Op.get("relax.astype")

    @relax.expr_functor.mutator
    class Rounded(relax.PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            if not call.op.same_as(astype) or str(call.attrs.dtype) != "bfloat16" \
                    or str(call.args[0].ty.dtype) != "float32":
                return call
            return self.builder_.call_te(_round, call.args[0], primfunc_name_hint="cast")

    @tvm.transform.module_pass(opt_level=0, name="relay_amp.rounded_bfloat16_casts")
    def _rewrite(mod, context):
        return mutate_functions(Rounded(mod))

    return _rewrite


__all__ = ["rounded_bfloat16_casts"]
