"""A kernel's constant tensors of one shape passed as one stacked constant: fewer arguments.

Every tensor a kernel takes is an argument that TVM's packed calling convention checks on each
call (its type, rank, dtype, shape, strides, device and alignment), and LLVM compiles those
checks with the kernel: 5 to 8 ms of LLVM time a tensor argument a kernel on a ``znver5``
host, where the kernel's own loop took 16 ms (docs/PERFORMANCE.md). A batch norm decomposed for
inference (:mod:`relay_amp.builds.batch_norm`) and fused into a convolution's kernel passes two
such constants, its scale and its shift, both ``(1, 1, 1, C)``: on resnet18_v2, 16 of its 28
kernels (a 17th takes the input's mean and scale).

:func:`stacked_constants` (a Relax pass, after ``FuseTIR``): where every call of a kernel passes
constant tensors of one shape and dtype as some of its arguments, the kernel takes them as one
constant stacked along a new first axis and reads ``stacked[j, ...]`` where it read the j-th;
each call passes its own stack. The kernel reads the same values, so the outputs are the same,
bit for bit.
"""

from __future__ import annotations

import tvm

from ..relax_utils import constant_groups, element_count, retyped_kernels
from .constants import array, const

#: The most elements a constant stacked with others may have: a batch norm's or a bias's
#: channels (a stack is a copy, made for each call).
MAX_ELEMENTS = 1 << 16


def _key(constant, _uses) -> tuple | None:
    """A stackable constant's ``(shape, dtype)``: not 0-d, at most :data:`MAX_ELEMENTS`."""
    if not len(constant.ty.shape) or element_count(constant.ty) > MAX_ELEMENTS:
        return None
    return tuple(int(d) for d in constant.ty.shape), str(constant.ty.dtype)


def _stacked(func, stacks):
    """``func`` taking each of ``stacks``' parameters (by position) as one stacked buffer, in
    the first one's place; None where the kernel uses one of them other than by reading its
    elements (its address passed to a function)."""
    import tvm_ffi

    params = list(func.params)
    into = {}  # parameter position -> (its stack's buffer, its index in the stack)
    for stack in stacks:
        first = params[stack[0]]
        count = tvm.tirx.const(len(stack), str(first.shape[0].ty.dtype))
        buffer = tvm.tirx.decl_buffer((count, *first.shape), first.dtype,
                                      f"{first.name}_stacked", layout=first.ty.layout)
        into.update({n: (buffer, j) for j, n in enumerate(stack)})

    def source(var):
        return next(((buffer, j) for n, (buffer, j) in into.items()
                     if var.same_as(params[n])), None)

    def load(node, mutator):
        node = mutator.default_mutate(node)
        found = source(node.source)
        if found is None:
            return node
        buffer, j = found
        return buffer[(tvm.tirx.const(j, str(node.indices[0].ty.dtype)), *node.indices)]

    def region(node, mutator):
        found = source(node.source)
        if found is None:
            return mutator.default_mutate(node)
        buffer, j = found
        dtype = str(node.region[0].min.ty.dtype)
        return tvm.ir.expr.TensorRegion(buffer, [tvm.ir.Range.from_min_extent(
            tvm.tirx.const(j, dtype), tvm.tirx.const(1, dtype)), *node.region], node.ty)

    body = tvm_ffi.structural_mutate(func.body, [(tvm.ir.expr.TensorLoad, load),
                                                 (tvm.ir.expr.TensorRegion, region)])
    left = []
    tvm_ffi.structural_walk(body, (tvm.ir.expr.Var, lambda node: left.append(node)
                                   if source(node) is not None else None))
    if left:
        return None
    kept = [into[n][0] if n in into and into[n][1] == 0 else param
            for n, param in enumerate(params) if n not in into or into[n][1] == 0]
    return tvm.tirx.PrimFunc(kept, body, func.ret_type, func.attrs)


def _arguments(args, stacks) -> list:
    """The call's arguments with each stack's constants as one stacked constant."""
    import numpy as np

    merged = {stack[0]: const(np.stack([array(args[n]) for n in stack])) for stack in stacks}
    dropped = {n for stack in stacks for n in stack[1:]}
    return [merged.get(n, arg) for n, arg in enumerate(args) if n not in dropped]


def stacked_constants(rule_log=None) -> tvm.transform.Pass:
    """The Relax pass: every kernel that each call passes constant tensors of one shape and
    dtype (at most :data:`MAX_ELEMENTS` elements each) takes them as one stacked constant.

    Parameters
    ----------
    rule_log : relay_amp.builds.schedule_rules.RuleLog, optional
        Gets each kernel whose constants were stacked, for the build's report.

    Returns
    -------
    tvm.transform.Pass
    """

    @tvm.transform.module_pass(opt_level=0, name="relay_amp.stacked_constants")
    def _pass(mod, _context):
        kernels = {gvar.name_hint: func for gvar, func in mod.functions_items()
                   if isinstance(func, tvm.tirx.PrimFunc)}
        stacked, lines = {}, []
        for name, stacks in sorted(constant_groups(mod, _key).items()):
            if name not in kernels:
                continue
            func = _stacked(kernels[name], stacks)
            if func is not None:
                stacked[name] = (func, lambda args, stacks=stacks: _arguments(args, stacks))
            outcome = ("passed as one stacked constant" if func is not None else
                       "not stacked: the kernel uses one other than by reading its elements")
            lines += [f"{name}: constants {', '.join(map(str, stack))} {outcome}"
                      for stack in stacks]
        if rule_log is not None and lines:
            rule_log.scheduled("<relax: stacked_constants>", "stacked_constants", tuple(lines))
        return retyped_kernels(mod, stacked) if stacked else mod

    return _pass


__all__ = ["MAX_ELEMENTS", "stacked_constants"]
