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


def _exp(x):
    """``exp`` of the tensor ``x`` in vector arithmetic: ``x = n ln 2 + r``, ``exp(r)`` by a
    polynomial, times ``2**n`` made from its bits. The clamps are selects on ``x > limit``, false
    for a NaN, so a NaN stays one (``fast_exp``'s ``max``/``min`` would make it a number).
    ``x``, the clamped ``x``, ``n`` and ``r`` are each bound once (``Let``): written out, the
    polynomial holds ``x`` about 25 times, and each copy of an epilogue folded into a tile's
    write-back made TVM's TIR passes seconds slower a kernel."""
    from tvm import te

    f32 = "float32"

    def const(value):
        return tvm.tirx.const(value, f32)

    def exp(*i):
        x_, v, n, r = (tvm.tirx.Var(name, f32) for name in ("x", "v", "n", "r"))
        clamped = tvm.tirx.Select(x_ > const(_LIMIT), const(_LIMIT), x_)
        clamped = tvm.tirx.Select(clamped < const(-_LIMIT), const(-_LIMIT), clamped)
        p = const(_POLYNOMIAL[0])
        for c in _POLYNOMIAL[1:]:
            p = p * r + const(c)
        power = tvm.tirx.reinterpret(f32, (n.astype("int32") + 127) << 23)
        body = (p * r * r + r + const(1.0)) * power
        body = tvm.tirx.Let(r, v - n * const(_LN2[0]) - n * const(_LN2[1]), body)
        body = tvm.tirx.Let(n, tvm.tirx.floor(v * const(1.4426950408889634) + const(0.5)), body)
        body = tvm.tirx.Let(v, clamped, body)
        return tvm.tirx.Let(x_, x(*i), body)

    return te.compute(x.shape, exp, name="exp")


def _sigmoid(x):
    from tvm import te, topi

    one = tvm.tirx.const(1.0, "float32")
    e = _exp(topi.negative(x))
    return te.compute(x.shape, lambda *i: one / (one + e(*i)), name="sigmoid")


def _softmax(x, axis: int):
    from tvm import topi

    shifted = topi.subtract(x, topi.max(x, axis=axis, keepdims=True))
    e = _exp(shifted)
    return topi.divide(e, topi.sum(e, axis=axis, keepdims=True))


def vector_exp() -> tvm.transform.Pass:
    """The pass: each float32 ``relax.sigmoid`` and ``relax.nn.softmax`` of a module written
    with the ``exp`` of :func:`_exp`."""
    from tvm import relax

    sigmoid, softmax = tvm.ir.Op.get("relax.sigmoid"), tvm.ir.Op.get("relax.nn.softmax")

    @relax.expr_functor.mutator
    class Vector(relax.PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            if not (call.op.same_as(sigmoid) or call.op.same_as(softmax)) \
                    or str(call.args[0].ty.dtype) != "float32":
                return call
            if call.op.same_as(sigmoid):
                return self.builder_.call_te(_sigmoid, call.args[0],
                                             primfunc_name_hint="sigmoid")
            return self.builder_.call_te(_softmax, call.args[0], int(call.attrs.axis),
                                         primfunc_name_hint="softmax")

    @tvm.transform.module_pass(opt_level=0, name="relay_amp.vector_exp")
    def _rewrite(mod, context):
        return mutate_functions(Vector(mod))

    return _rewrite


__all__ = ["ERROR_BOUND", "vector_exp"]
