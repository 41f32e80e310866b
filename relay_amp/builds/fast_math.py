"""float32 sigmoid, softmax, GELU, tanh, erf and small integer powers on vectors: polynomials
where LLVM would call ``expf``, ``erff``, ``tanhf`` or ``powf`` once an element.

TVM lowers ``relax.sigmoid`` to ``1 / (1 + exp(-x))`` and ``relax.nn.softmax`` to sums of
``exp(x - max)`` with LLVM's ``llvm.exp`` intrinsic, which a CPU without a vector math library
(aarch64 glibc before 2.38, x86 without SVML) computes by calling ``expf`` once per element: on
aarch64 about 25 executed instructions an element, where a convolution's vector FMAs cost a
fraction of one (YOLOv8n's SiLU activations and its box decoder's softmax: 7.7 M calls, a
quarter of the model's instructions). :func:`vector_math` writes both with an ``exp`` in
vector arithmetic instead (Cephes' ``expf``, as TVM's ``topi.fast_exp``: a range reduction and a
degree-6 polynomial, the kind of kernel ONNX Runtime's and XNNPACK's logistic and softmax
run), which LLVM vectorizes like any other arithmetic. A NaN stays a NaN, as with ``expf``.

The same holds for ``erf`` (TVM lowers ``relax.nn.gelu`` to it: BERT's and ViT's feed-forward
layers; measured on this x86 host, 20 ns an element,
as long as the matmul before it) and ``tanh`` (GPT-2's GELU, 6 ns): TVM's own ``fast_erf`` and
``fast_tanh`` (Eigen's rational polynomials) compute them in vector arithmetic (0.4 and 0.5 ns),
a NaN kept a NaN. A ``power`` by a constant 2 or 3 (GPT-2's GELU, LLaMA's RMSNorm) becomes
its products, as ``pow`` is (10 ns an element).

The error: each output within ``ERROR_BOUND`` of the exact value, absolute, as TVM's own build
of the same ops (sigmoid, softmax; tests/pass/test_fast_math.py measures both); a GELU within
``ERROR_BOUND`` times ``max(1, |x|)``.
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


def _nan_kept(x, fast):
    """``fast(x)`` where ``x`` is a number, ``x`` where it is a NaN: TVM's ``fast_erf`` and
    ``fast_tanh`` clamp their argument with max/min, which makes a NaN a number."""
    from tvm import te

    y = fast(x)
    return te.compute(x.shape, lambda *i: tvm.tirx.Select(
        tvm.tirx.isnan(x(*i)), x(*i), y(*i)), name=f"{y.op.name}_nan_kept")


def _erf(x):
    from tvm import topi

    return _nan_kept(x, topi.fast_erf)


def _tanh(x):
    from tvm import topi

    return _nan_kept(x, topi.fast_tanh)


def _gelu(x):
    """``x (1/2 + erf(x / sqrt 2) / 2)`` as TVM legalizes a float32 ``relax.nn.gelu``, its erf
    by :func:`_erf`."""
    from tvm import te, topi

    erf = _erf(topi.multiply(x, tvm.tirx.const(0.5 ** 0.5, x.dtype)))
    half = tvm.tirx.const(0.5, x.dtype)
    return te.compute(x.shape, lambda *i: x(*i) * (half + erf(*i) * half), name="gelu")


def _gelu_tanh(x):
    """TVM's ``relax.nn.gelu_tanh`` with :func:`_tanh`."""
    from tvm import te

    def c(value):
        return tvm.tirx.const(value, x.dtype)

    inner = te.compute(x.shape, lambda *i: c((2.0 / 3.141592653589793) ** 0.5) * x(*i) * (
        c(1.0) + c(0.044715) * x(*i) * x(*i)), name="gelu_tanh_inner")
    t = _tanh(inner)
    return te.compute(x.shape, lambda *i: c(0.5) * x(*i) * (c(1.0) + t(*i)), name="gelu_tanh")


def _power(x, exponent: int):
    from tvm import te

    def product(*i):
        value = x(*i)
        for _ in range(exponent - 1):
            value = value * x(*i)
        return value

    return te.compute(x.shape, product, name=f"power_{exponent}")


#: The integer exponents a ``power`` by a constant is written out as products for.
PRODUCT_EXPONENTS = (2, 3)


def _scalar_exponent(mutator, call) -> int | None:
    """The exponent of ``relax.power(x, c)`` where ``c`` is a constant scalar (through the
    bindings of ``mutator``) in :data:`PRODUCT_EXPONENTS` that broadcasts to ``x``'s shape;
    else None."""
    from .constants import constant_value

    value = constant_value(mutator, call.args[1])
    if value is None or value.size != 1 or value.ndim > len(call.args[0].ty.shape) \
            or str(call.ty.dtype) != str(call.args[0].ty.dtype):
        return None
    exponent = float(value.reshape(()))
    return int(exponent) if exponent in PRODUCT_EXPONENTS else None


def vector_math(polynomial_erf_tanh: bool = True) -> tvm.transform.Pass:
    """The pass: each float32 ``relax.sigmoid`` and ``relax.nn.softmax`` of a module written
    with the ``exp`` of :func:`_exp`; each float32 ``relax.erf``, ``relax.tanh``,
    ``relax.nn.gelu`` and ``relax.nn.gelu_tanh`` with TVM's ``fast_erf`` and ``fast_tanh``;
    each float32 or float16 ``relax.power`` by a constant 2 or 3 as products. A float16 GELU
    keeps TVM's ``erff`` in float32: written with ``fast_erf`` its float32 polynomial, folded
    into a matmul's write-back, ran as scalar FMAs on aarch64 (not looked into further).

    Parameters
    ----------
    polynomial_erf_tanh : bool
        False: erf, tanh and the GELUs are left to TVM (``cpu_pipeline`` on aarch64, where a
        float32 GELU's polynomial folded into a matmul's write-back ran as 704 scalar
        ``fmadd`` in a BERT layer's kernel: as many instructions as ``erff``'s calls, not
        measured further).

    Returns
    -------
    tvm.transform.Pass
    """
    from tvm import relax

    # op name -> the TE function and its arguments after the tensor, None to keep the op
    forms = {"sigmoid": lambda mutator, call: (_sigmoid, mutator.bind),
             "nn.softmax": lambda mutator, call: (_softmax, int(call.attrs.axis), mutator.bind),
             "power": lambda mutator, call: (
                 None if (exponent := _scalar_exponent(mutator, call)) is None
                 else (_power, exponent))}
    if polynomial_erf_tanh:
        forms.update({"erf": lambda *_: (_erf,), "tanh": lambda *_: (_tanh,),
                      "nn.gelu": lambda *_: (_gelu,), "nn.gelu_tanh": lambda *_: (_gelu_tanh,)})
    ops = [(tvm.ir.Op.get(f"relax.{name}"), name) for name in forms]

    @relax.expr_functor.mutator
    class Vector(relax.PyExprMutator):
        bind = True

        def visit_call_(self, call):
            call = super().visit_call_(call)
            name = next((name for op, name in ops if call.op.same_as(op)), None)
            dtypes = ("float32", "float16") if name == "power" else ("float32",)
            form = forms[name](self, call) if name is not None \
                and str(call.args[0].ty.dtype) in dtypes else None
            if form is None:
                return call
            return self.builder_.call_te(form[0], call.args[0], *form[1:],
                                         primfunc_name_hint=name.replace("nn.", ""))

    @tvm.transform.module_pass(opt_level=0, name="relay_amp.vector_math")
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


__all__ = ["ERROR_BOUND", "PRODUCT_EXPONENTS", "vector_math"]
