"""A kernel's scalar constants as immediates: what LLVM can then see.

An ONNX ``Clip`` (ReLU6 in MobileNetV2) reaches Relax as ``maximum`` and ``minimum`` with 0-d
constant tensors, and TVM's fused kernel reads each bound from a buffer parameter. For LLVM the
bound is then any value, a NaN too, so ``max(x, bound)`` stays a compare and a select on
aarch64 (``fcmgt`` and ``bif``/``bsl``: two instructions a vector). With the bound an immediate,
LLVM knows it is a number and emits ``fmaxnm``/``fminnm`` (one), which give the same result for
every ``x``. :func:`scalar_constants_inlined` specializes each ``call_tir`` whose arguments
include a 0-d floating-point constant: the kernel reads the constant's value in place of the
buffer, which it keeps as a parameter it no longer reads, so the call is unchanged but for
its callee. A value computed from the same constant is the same value, so the outputs are
the same, bit for bit.
"""

from __future__ import annotations

import tvm
from tvm import relax

from ..relax_utils import is_call_tir, mutate_functions
from .constants import array

#: The dtypes of constants read as immediates: each value is the immediate's exactly.
DTYPES = ("float32", "float16", "float64")


def _scalars(call) -> dict:
    """``{argument position: value}`` of a ``call_tir``'s 0-d floating-point constants."""
    return {n: value.item() for n, value in (
        (n, array(arg)) for n, arg in enumerate(call.args[1].fields)
        if isinstance(arg, tvm.ir.expr.GenericConst))
        if value.ndim == 0 and str(value.dtype) in DTYPES}


def _specialized(func, scalars: dict):
    """``func`` reading each of ``scalars``' parameters (by position) as its value."""
    import tvm_ffi

    params = {n: func.params[n] for n in scalars}

    def immediate(load, mutator):
        for n, param in params.items():
            if load.source.same_as(param):
                return tvm.tirx.const(scalars[n], str(load.ty.dtype))
        return mutator.default_mutate(load)

    body = tvm_ffi.structural_mutate(func.body, [(tvm.ir.expr.TensorLoad, immediate)])
    return func.with_body(body)


def _keys(mod) -> dict:
    """``{callee's name: the set of its calls' scalars}``, each as a sorted tuple."""
    keys: dict = {}

    def visit(expr):
        if is_call_tir(expr):
            keys.setdefault(expr.args[0].name_hint, set()).add(
                tuple(sorted(_scalars(expr).items())))

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return keys


def scalar_constants_inlined(rule_log=None) -> tvm.transform.Pass:
    """A Relax pass, after ``FuseTIR``: every kernel called with a 0-d floating-point constant
    reads its value as an immediate. A kernel every call of which passes the same values is
    specialized in place (its name kept: the build's report names it); one called with
    several is copied for each set of values, and dropped where nothing calls it any more.

    Parameters
    ----------
    rule_log : relay_amp.builds.schedule_rules.RuleLog, optional
        Gets each kernel specialized and its values, for the build's report.
    """

    @relax.expr_functor.mutator
    class Inlined(relax.PyExprMutator):
        def __init__(self, mod):
            super().__init__(mod)
            self.mod_ = mod
            self.keys = _keys(mod)
            self.made = {}

        def visit_call_(self, call):
            call = super().visit_call_(call)
            if not is_call_tir(call):
                return call
            scalars = _scalars(call)
            callee = call.args[0]
            func = self.mod_.functions.get(callee)
            if not scalars or not isinstance(func, tvm.tirx.PrimFunc):
                return call
            key = (callee.name_hint, tuple(sorted(scalars.items())))
            if key not in self.made:
                specialized = _specialized(func, scalars)
                if len(self.keys[callee.name_hint]) == 1:
                    self.builder_.update_func(callee, specialized)
                    self.made[key] = callee
                else:
                    self.made[key] = self.builder_.add_func(specialized, callee.name_hint)
            return relax.Call(call.op, [self.made[key], *call.args[1:]], call.attrs,
                              call.ty_args, call.span)

    @tvm.transform.module_pass(opt_level=0, name="relay_amp.scalar_constants_inlined")
    def _pass(mod, _context):
        mutator = Inlined(mod)
        inlined = mutate_functions(mutator)
        if not mutator.made:
            return mod
        if rule_log is not None:
            rule_log.scheduled(
                "<relax: scalar_constants_inlined>", "scalar_constants_inlined", tuple(
                    f"{made.name_hint}: its 0-d constants read as immediates "
                    f"({', '.join(f'{value:g}' for _, value in values)})"
                    for (_, values), made in mutator.made.items()))
        return relax.transform.DeadCodeElimination()(inlined)

    return _pass


__all__ = ["DTYPES", "scalar_constants_inlined"]
