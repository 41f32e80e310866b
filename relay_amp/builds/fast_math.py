"""float32 sigmoid and softmax on vectors: TVM's polynomial ``fast_exp`` where LLVM would call
``expf``.

TVM lowers ``relax.sigmoid`` to ``1 / (1 + exp(-x))`` and ``relax.nn.softmax`` to sums of
``exp(x - max)`` with LLVM's ``llvm.exp`` intrinsic, which a CPU without a vector math library
(aarch64 glibc before 2.38, x86 without SVML) computes by calling ``expf`` once per element: on
aarch64 about 25 executed instructions an element, where a convolution's vector FMAs cost a
fraction of one (YOLOv8n's SiLU activations and its box decoder's softmax: 7.7 M calls, a
quarter of the model's instructions). :func:`vector_exp` writes both with an ``exp`` in
vector arithmetic instead (Cephes' ``expf``, as TVM's ``topi.fast_exp``: a range reduction and a
degree-6 polynomial, the kind of kernel ONNX Runtime's and XNNPACK's logistic and softmax
run), which LLVM vectorizes like any other arithmetic. A NaN stays a NaN, as with ``expf``.

The error: each output within ``ERROR_BOUND`` of the exact value, absolute, as TVM's own build
of the same ops (sigmoid, softmax; tests/pass/test_fast_math.py measures both).
"""

from __future__ import annotations

import tvm

from ..relax_utils import mutate_functions

#: Each sigmoid or softmax output is within this of the exact value, absolute (the sum of a
#: softmax row rounds as much in TVM's own build): 2**-21.
ERROR_BOUND = 2.0 ** -21


#: Cephes' ``expf``: beyond these ``exp`` is 0 or overflows; ``ln 2`` in two parts, the first
#: exact in float32, so ``x - n ln 2`` is exact; the polynomial of ``exp(r) - 1 - r``.
_LIMIT = 88.3762626647949
_LN2 = (0.693359375, -2.12194440e-4)
_POLYNOMIAL = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2,
               1.6666665459e-1, 5.0000001201e-1)


def _exp(x, bind: bool = True):
    """``exp`` of the tensor ``x`` in vector arithmetic: ``x = n ln 2 + r``, ``exp(r)`` by a
    polynomial, times ``2**n`` made from its bits. The clamps are selects on ``x > limit``, false
    for a NaN, so a NaN stays one (``fast_exp``'s ``max``/``min`` would make it a number).
    With ``bind``, ``x``, the clamped ``x``, ``n`` and ``r`` are each bound once (``Let``):
    written out, the polynomial holds ``x`` about 25 times, and each copy of an epilogue folded
    into a tile's write-back made TVM's TIR passes seconds slower a kernel."""
    from tvm import te

    f32 = "float32"

    def const(value):
        return tvm.tirx.const(value, f32)

    def bound(var, value, body):
        return tvm.tirx.Let(var, value, body(var)) if bind else body(value)

    def clamped(v):
        v = tvm.tirx.Select(v > const(_LIMIT), const(_LIMIT), v)
        return tvm.tirx.Select(v < const(-_LIMIT), const(-_LIMIT), v)

    def polynomial(n, r):
        p = const(_POLYNOMIAL[0])
        for c in _POLYNOMIAL[1:]:
            p = p * r + const(c)
        power = tvm.tirx.reinterpret(f32, (n.astype("int32") + 127) << 23)
        return (p * r * r + r + const(1.0)) * power

    def exp(*i):
        x_, v, n, r = (tvm.tirx.Var(name, f32) for name in ("x", "v", "n", "r"))
        return bound(x_, x(*i), lambda x_: bound(v, clamped(x_), lambda v: bound(
            n, tvm.tirx.floor(v * const(1.4426950408889634) + const(0.5)), lambda n: bound(
                r, v - n * const(_LN2[0]) - n * const(_LN2[1]), lambda r: polynomial(n, r)))))

    return te.compute(x.shape, exp, name="exp")


def _sigmoid(x, bind: bool = True):
    from tvm import te, topi

    one = tvm.tirx.const(1.0, "float32")
    e = _exp(topi.negative(x), bind)
    return te.compute(x.shape, lambda *i: one / (one + e(*i)), name="sigmoid")


def _softmax(x, axis: int, bind: bool = True):
    from tvm import topi

    shifted = topi.subtract(x, topi.max(x, axis=axis, keepdims=True))
    e = _exp(shifted, bind)
    return topi.divide(e, topi.sum(e, axis=axis, keepdims=True))


def vector_exp() -> tvm.transform.Pass:
    """The pass: each float32 ``relax.sigmoid`` and ``relax.nn.softmax`` of a module written
    with the ``exp`` of :func:`_exp`."""
    from tvm import relax

    sigmoid, softmax = tvm.ir.Op.get("relax.sigmoid"), tvm.ir.Op.get("relax.nn.softmax")

    @relax.expr_functor.mutator
    class Vector(relax.PyExprMutator):
        bind = True

        def visit_call_(self, call):
            call = super().visit_call_(call)
            if not (call.op.same_as(sigmoid) or call.op.same_as(softmax)) \
                    or str(call.args[0].ty.dtype) != "float32":
                return call
            if call.op.same_as(sigmoid):
                return self.builder_.call_te(_sigmoid, call.args[0], self.bind,
                                             primfunc_name_hint="sigmoid")
            return self.builder_.call_te(_softmax, call.args[0], int(call.attrs.axis),
                                         self.bind, primfunc_name_hint="softmax")

    @tvm.transform.module_pass(opt_level=0, name="relay_amp.vector_exp")
    def _rewrite(mod, context):
        mutator = Vector(mod)
        mutator.bind = not _has_bfloat16(mod)
        return mutate_functions(mutator)

    return _rewrite


def _has_bfloat16(mod) -> bool:
    """Whether a Relax function of ``mod`` has a bfloat16 tensor. TVM's
    ``BF16ComputeLegalize`` writes the value it rounds to bfloat16 out twice; where that value
    holds a ``Let`` (a SiLU folded into a tile's write-back before a cast), ``VectorizeLoop``
    then fails ("Let cannot bind the same var to two different values": yolov8n_320's bfloat16
    build on aarch64), so such modules get the ``exp`` written out."""
    from tvm import relax

    found = []

    def visit(expr):
        ty = getattr(expr, "ty", None)
        if isinstance(ty, relax.TensorType) and str(ty.dtype) == "bfloat16":
            found.append(expr)

    for _, func in mod.functions_items():
        if isinstance(func, relax.Function) and not found:
            relax.analysis.post_order_visit(func, visit)
    return bool(found)


__all__ = ["ERROR_BOUND", "vector_exp"]
