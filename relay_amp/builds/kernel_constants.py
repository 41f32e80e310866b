"""A kernel's constant tensors passed as one argument: fewer arguments to check and compile.

Every tensor a kernel takes is an argument that TVM's packed calling convention checks on each
call (its type, rank, dtype, shape, strides, device and alignment), and LLVM compiles those
checks with the kernel: 5 to 8 ms of LLVM time a tensor argument a kernel on a ``znver5``
host, where the kernel's own loop took 16 ms (docs/PERFORMANCE.md). A convolution's kernel
takes its weight and, fused after it, a bias or a batch norm's scale and shift; an ONNX
``Clip`` passes its bounds as two 0-d constants that the kernel no longer reads once they are
immediates (:mod:`relay_amp.builds.scalar_constants`).

:func:`constants_in_one_argument` (a Relax pass, after the schedule rules): where every call of
a kernel passes constant tensors of one dtype at the same argument positions, two or more, the
kernel takes one constant in their place, their values end to end (each from a multiple of 64
bytes, as TVM aligns a tensor), and declares each former parameter as a view of it
(``T.decl_buffer(shape, data=merged.data, elem_offset=...)``); its body, scheduled already,
reads the same buffers at the same addresses relative to each view. Each call passes its own
merged constant. A constant that another call passes too (one weight read by two kernels) is
left out, so that it is stored once. The kernel reads the same values, so the outputs are the
same, bit for bit. :func:`relay_amp.cpu_pipeline` runs it for every target but aarch64, where
a view's offset put loads out of reach of paired loads (docs/ARM.md).
"""

from __future__ import annotations

import numpy as np
import tvm

from ..relax_utils import constant_groups, retyped_kernels
from .constants import ALIGNMENT, array, concatenated


def _key(constant, uses: int) -> str | None:
    """A constant's dtype, None where another call passes it too (it is stored once)."""
    return str(constant.ty.dtype) if uses == 1 else None


def _static_shape(param) -> tuple | None:
    """A parameter's shape as ints; None where an extent is symbolic or its layout is not a
    plain dense one (strides, an offset)."""
    ty = param.ty
    if not all(isinstance(n, tvm.tirx.IntImm) for n in ty.shape) or len(ty.strides) \
            or not (isinstance(ty.elem_offset, tvm.tirx.IntImm) and int(ty.elem_offset) == 0):
        return None
    return tuple(int(n) for n in ty.shape)


def _offsets(shapes, dtype: str) -> tuple:
    """``(each shape's first element, the elements of them all)``, each start a multiple of
    :data:`~relay_amp.builds.constants.ALIGNMENT` bytes."""
    step = max(1, ALIGNMENT * 8 // tvm.DataType(dtype).bits)
    offsets, end = [], 0
    for shape in shapes:
        offsets.append(end)
        count = int(np.prod(shape, dtype=np.int64))
        end += -(-max(count, 1) // step) * step
    return offsets, end


def _merged(func, groups):
    """``(func taking each of groups' parameters (by position) as views of one buffer in the
    first one's place, each group's (offsets, elements) in that buffer)``, or why not: one of
    them is not a static dense buffer, or the kernel passes one's address on (``a.data``: a
    view's data is the merged buffer's, not where the view starts)."""
    import tvm_ffi

    params = list(func.params)
    shapes = {n: _static_shape(params[n]) for group in groups for n in group}
    if any(shape is None for shape in shapes.values()):
        return "one has a symbolic shape, strides or an offset"
    addressed = []
    data = tvm.ir.Op.get("tirx.buffer_data")
    tvm_ffi.structural_walk(func.body, (tvm.ir.expr.Call, lambda node: addressed.append(node)
                                        if node.op.same_as(data) and any(
                                            node.args[0].same_as(params[n]) for n in shapes)
                                        else None))
    if addressed:
        return "the kernel passes one's address on"
    views, decls, into, layouts = {}, [], {}, []
    for group in groups:
        first = params[group[0]]
        dtype = str(first.ty.dtype)
        offsets, size = _offsets([shapes[n] for n in group], dtype)
        layouts.append((offsets, size))
        index = next((str(params[n].ty.shape[0].ty.dtype) for n in group
                      if len(params[n].ty.shape)), "int64")
        merged = tvm.tirx.decl_buffer((tvm.tirx.const(size, index),), dtype,
                                      f"{first.name}_merged", layout=None)
        into[group[0]] = merged
        for n, offset in zip(group, offsets):
            param = params[n]
            view = tvm.tirx.decl_buffer(
                param.ty.shape, dtype, param.name, data=tvm.tirx.buffer_data(merged),
                elem_offset=tvm.tirx.const(offset, index), layout=param.ty.layout)
            views[n] = view
            decls.append(tvm.tirx.DeclBuffer(view, data=tvm.tirx.buffer_data(merged)))

    def var(node, mutator):
        for n, view in views.items():
            if node.same_as(params[n]):
                return view
        return mutator.default_mutate(node)

    body = _declared(tvm_ffi.structural_mutate(func.body, [(tvm.ir.expr.Var, var)]), decls)
    kept = [into.get(n, param) for n, param in enumerate(params)
            if n not in views or n in into]
    return tvm.tirx.PrimFunc(kept, body, func.ret_type, func.attrs), layouts


def _declared(body, decls):
    """``body`` with ``decls`` first: in its root block, where TVMScript puts a function's
    ``T.decl_buffer``."""
    from tvm import s_tir

    if not isinstance(body, s_tir.SBlockRealize) or len(body.block.iter_vars):
        return tvm.tirx.SeqStmt([*decls, body])
    block = body.block
    return s_tir.SBlockRealize(body.iter_values, body.predicate, s_tir.SBlock(
        [], block.reads, block.writes, block.name_hint, tvm.tirx.SeqStmt([*decls, block.body]),
        block.init, block.alloc_buffers, block.match_buffers, block.annotations))


def _arguments(args, groups, layouts) -> list:
    """The call's arguments with each group's constants as one merged constant, laid out as
    ``layouts`` (:func:`_merged`'s) says."""
    merged = {group[0]: concatenated([array(args[n]) for n in group], offsets, size)
              for group, (offsets, size) in zip(groups, layouts)}
    dropped = {n for group in groups for n in group[1:]}
    return [merged.get(n, arg) for n, arg in enumerate(args) if n not in dropped]


def constants_in_one_argument(rule_log=None) -> tvm.transform.Pass:
    """The Relax pass: every kernel that each call passes two or more constant tensors of one
    dtype, which no other call passes, takes them as one constant, its former parameters views
    of it (see the module's docstring).

    Parameters
    ----------
    rule_log : relay_amp.builds.schedule_rules.RuleLog, optional
        Gets each kernel whose constants were merged, for the build's report.

    Returns
    -------
    tvm.transform.Pass
    """

    @tvm.transform.module_pass(opt_level=0, name="relay_amp.constants_in_one_argument")
    def _pass(mod, _context):
        kernels = {gvar.name_hint: func for gvar, func in mod.functions_items()
                   if isinstance(func, tvm.tirx.PrimFunc)}
        merged, lines = {}, []
        for name, groups in sorted(constant_groups(mod, _key).items()):
            if name not in kernels:
                continue
            made = _merged(kernels[name], groups)
            if isinstance(made, str):
                lines += [f"{name}: constants {', '.join(map(str, group))} not merged: {made}"
                          for group in groups]
                continue
            merged[name] = (made[0], lambda args, groups=groups, layouts=made[1]: _arguments(
                args, groups, layouts))
            lines += [f"{name}: constants {', '.join(map(str, group))} passed as one argument"
                      for group in groups]
        if rule_log is not None and lines:
            rule_log.scheduled("<relax: constants_in_one_argument>", "constants_in_one_argument",
                               tuple(lines))
        return retyped_kernels(mod, merged) if merged else mod

    return _pass


__all__ = ["constants_in_one_argument"]
