"""Convolutions in NHWC on aarch64 and on x86 with AVX2 or AVX-512: the layout the register
tiles of :mod:`relay_amp.builds.neon_tiles` and :mod:`relay_amp.builds.x86_tiles` read.

A convolution in NCHW (GluonCV's, PyTorch's exports) reduces over input channels that lie a
whole feature map apart, and its lanes are output pixels: its weight is the scalar operand, and
its innermost axis is a 3-wide kernel row. In NHWC with HWIO weights the lanes are output
channels (contiguous in the weight) and each output pixel's input channels are contiguous: the
register tile of XNNPACK's and ONNX Runtime's kernels. TVM's ``ConvertLayout`` rewrites the
convolutions and the elementwise ops around them, transposing only where a layout meets an op
that keeps its own; the weights are then transposed once, at build time.
"""

from __future__ import annotations

import tvm
import tvm_ffi

from ..relax_utils import TVM_ERRORS, last_line, mutate_functions

#: What ``relax.transform.ConvertLayout`` asks for: NHWC data, HWIO weights. A transposed
#: convolution would follow its input into NHWC, for which TVM 0.27 has no kernel ("CodeGenVM
#: cannot emit this Relax operator": ppocrv4_det): it keeps NCHW, transposed around, and the
#: convolutions around it still take NHWC (center_net_resnet18_v1b_voc's tiles in NCHW took
#: 0.9 s each to build, 3.5 x TVM's).
LAYOUTS = {"relax.nn.conv2d": ["NHWC", "HWIO"], "relax.nn.conv2d_transpose": ["NCHW", "IOHW"]}


def nhwc_convolutions(rule_log=None) -> tvm.transform.Pass:
    """The pass: convolutions in :data:`LAYOUTS`, weights transposed at build time.

    Parameters
    ----------
    rule_log : relay_amp.builds.schedule_rules.RuleLog, optional
        Where TVM's ``ConvertLayout`` raises, the module keeps its layouts and the log says so.

    Returns
    -------
    tvm.transform.Pass
    """
    from tvm import relax

    @tvm.transform.module_pass(opt_level=0, name="relay_amp.nhwc_convolutions")
    def _convert(mod, context):
        before, convolutions = _followers(mod)
        if not convolutions:  # a transformer: ConvertLayout would take a second for nothing
            return _elementwise_in_place(mod, lower_ops=False, rule_log=rule_log)
        try:  # on a copy: inside a pass TVM rewrites the module it is given in place
            converted = relax.transform.ConvertLayout(LAYOUTS)(
                tvm.IRModule(dict(mod.functions_items()), attrs=mod.attrs))
        except TVM_ERRORS as err:  # TVM's own errors: the convolutions keep their layout
            if rule_log is not None:
                rule_log.raised("<relax: nhwc_convolutions>", "ConvertLayout", last_line(err))
            return mod
        unlowered = sorted(op for op, seen in _followers(converted)[0].items()
                           if seen != before.get(op))
        if unlowered:  # an op that follows its input's layout, with no NHWC kernel in TVM
            if rule_log is not None:
                rule_log.raised("<relax: nhwc_convolutions>", "ConvertLayout",
                                f"{', '.join(unlowered)} would become NHWC, which TVM does not "
                                "lower: NCHW kept")
            return mod
        # the weights' transposes stay: a pass that packs a weight reads through its
        # transpose (one copy, not two), and numpy_layout_constants folds the rest
        return _elementwise_in_place(converted, lower_ops=True, rule_log=rule_log)

    return _convert


def _followers(mod) -> tuple[dict, bool]:
    """The ``data_layout`` values of each op other than the convolutions of :data:`LAYOUTS`,
    and whether one of those convolutions is called.
    One whose layout the conversion changes follows its input (a transposed convolution), and
    TVM 0.27 has no NHWC kernel for it: "CodeGenVM cannot emit this Relax operator"
    (ppocrv4_det on aarch64)."""
    from tvm import relax

    found, convolutions = {}, []

    def visit(expr):
        if not (isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op)):
            return
        if expr.op.name in LAYOUTS:
            convolutions.append(expr.op.name)
        elif hasattr(expr.attrs, "data_layout"):
            found.setdefault(expr.op.name, set()).add(str(expr.attrs.data_layout))

    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return found, bool(convolutions)


def _elementwise_block(func):
    """``(schedule, block)``: the block of ``func``, its stages inlined into it, where it
    computes each output element from the same element of its inputs (or from 0-d ones, a
    clip's bounds). TVM's frontends write some elementwise ops as kernels of their own (ONNX's
    Clip), which ``ConvertLayout`` cannot see into. None for any other kernel."""
    from tvm import s_tir

    if not isinstance(func, tvm.tirx.PrimFunc):
        return None
    try:
        sch = s_tir.Schedule(func)
        *stages, block_rv = sch.get_child_blocks(sch.get_sblock("root"))
        for stage in stages:  # a sigmoid's negative and exp, computed in its block
            sch.compute_inline(stage)
    except (s_tir.ScheduleError, *TVM_ERRORS):
        return None
    block = sch.get(block_rv)
    loops = sch.get_loops(block_rv)
    variables = [iv.var for iv in block.iter_vars]
    if len(loops) != len(variables) or any(int(iv.iter_type) != 0 for iv in block.iter_vars):
        return None
    (write,) = block.writes
    for region in (write, *block.reads):
        ranges = region.region
        if not ranges:
            continue
        if len(ranges) != len(variables) or not all(
                r.min.same_as(v) and int(r.extent) == 1 for r, v in zip(ranges, variables)):
            return None
    return sch, block_rv


def _transposed_alike(call, args, permuted):
    """The axes every argument of ``call`` is a transpose by (``permuted``: each one's
    ``(value, axes)`` or None), each of the output's shape; None if some tensor argument is
    not such a transpose (0-d ones aside)."""
    from tvm import relax

    if not all(isinstance(e.ty, relax.TensorType) and e.ty.ndim >= 0
               for e in (call, *args)) or call.ty.shape is None:
        return None  # several outputs, unknown shapes, non-tensor arguments
    found = [p for p in permuted if p is not None]
    if not found or any(p[1] != found[0][1] for p in found) or any(
            a.ty.ndim != 0 and (p is None or not tvm_ffi.structural_equal(
                a.ty.shape, call.ty.shape)) for p, a in zip(permuted, args)):
        return None
    return found[0][1]


def _lowered(call, legalize):
    """``(call_tir, kernel)``: ``call`` as its op's ``FLegalize`` writes it, built apart (the
    kernel joins the module only if it is used); None if it is not one ``call_tir``."""
    from tvm import relax

    scratch = relax.BlockBuilder()
    try:
        lowered = scratch.normalize(legalize(scratch, call))
    except TVM_ERRORS:
        return None
    if not (isinstance(lowered, relax.Call) and lowered.op.same_as(tvm.ir.Op.get("relax.call_tir"))
            and len(lowered.args) == 2):
        return None
    return lowered, scratch.get()[lowered.args[0]]


def _elementwise_in_place(mod, lower_ops: bool, rule_log=None):
    """``mod`` with each kernel that is elementwise (:func:`_elementwise_block`) and reads a
    transpose of a value computing on the value itself, in its layout, the transpose moved
    after it; two transposes that undo each other then vanish. ``ConvertLayout`` wraps such a
    kernel in transposes back to NCHW and again to NHWC (MobileNetV2's ReLU6, each a
    transpose, a max, a min and a transpose: 40 % of its x86 time, sampled). A cast of a
    transpose (what a float16 conversion puts between such a kernel and the next convolution)
    is moved after it the same way. With ``lower_ops`` an op call is lowered to its kernel to
    be moved too: ``ConvertLayout`` has no layout rule for some (a leaky ReLU: darknet53's
    every activation between two transposes), and keeps others in NCHW after them (the
    residual sums of those activations). ``rule_log`` gets what was moved, by op or kernel."""
    from tvm import relax, s_tir

    permute = tvm.ir.Op.get("relax.permute_dims")
    call_tir = tvm.ir.Op.get("relax.call_tir")
    astype = tvm.ir.Op.get("relax.astype")

    moved_calls: dict = {}  # op or kernel -> calls computed in their input's layout

    @relax.expr_functor.mutator
    class InPlace(relax.PyExprMutator):
        def _permuted(self, expr):
            """``(value, axes)`` where ``expr`` is bound to ``permute_dims(value, axes)``."""
            bound = self.lookup_binding(expr) if isinstance(expr, relax.Var) else expr
            if isinstance(bound, relax.Call) and bound.op.same_as(permute) \
                    and bound.attrs.axes is not None:
                return bound.args[0], [int(a) for a in bound.attrs.axes]
            return None

        def visit_call_(self, call):
            call = super().visit_call_(call)
            if call.op.same_as(permute) and call.attrs.axes is not None:
                inner = self._permuted(call.args[0])
                axes = [int(a) for a in call.attrs.axes]
                if inner is not None and [inner[1][a] for a in axes] == list(range(len(axes))):
                    return inner[0]
                return call
            if call.op.same_as(astype):  # a conversion's cast between two transposes
                inner = self._permuted(call.args[0])
                if inner is None:
                    return call
                cast = self.builder_.emit(relax.op.astype(inner[0], call.attrs.dtype))
                return relax.op.permute_dims(cast, inner[1])
            if isinstance(call.op, tvm.ir.Op) and not call.op.same_as(call_tir):
                return self._lowered_in_place(call) if lower_ops else call
            if len(call.args) != 2:
                return call
            moved = self._in_place(call, self.builder_.get()[call.args[0]])
            return call if moved is None else moved

        def _lowered_in_place(self, call):
            """``call`` of an op whose tensor arguments are transposes by the same axes (a
            leaky ReLU, which ``ConvertLayout`` has no layout rule for; the sum of two), lowered
            to its kernel and moved in place when that kernel is elementwise."""
            legalize = call.op.get_attr("FLegalize")
            tensors = [a for a in call.args if not isinstance(a.ty, tvm.ir.PrimType)]
            permuted = [self._permuted(a) for a in tensors]
            if legalize is None or call.op.name in LAYOUTS or not any(permuted):
                return call  # most calls: no transpose read, nothing to normalize
            call = self.builder_.normalize(call)
            if _transposed_alike(call, tensors, permuted) is None:
                return call
            lowered = _lowered(call, legalize)
            moved = None if lowered is None else self._in_place(*lowered, name=call.op.name)
            return call if moved is None else moved

        def _in_place(self, call, func, name=None):
            if not isinstance(call.args[1], relax.Tuple):
                return None
            args = list(call.args[1].fields)
            permuted = [self._permuted(a) for a in args]
            axes = _transposed_alike(call, args, permuted)
            block = None if axes is None else _elementwise_block(func)
            if block is None:
                return None
            sch, block_rv = block
            shape = call.ty.shape
            inverse = [axes.index(j) for j in range(len(axes))]
            moved = tvm.tirx.IndexMap.from_func(
                lambda *i: [i[inverse[j]] for j in range(len(axes))], ndim=len(axes))
            try:
                sch.transform_block_layout(block_rv, moved)
                for n, arg in enumerate(args):
                    if arg.ty.ndim != 0:
                        sch.transform_layout(block_rv, ("read", n), moved)
                sch.transform_layout(block_rv, ("write", 0), moved)
            except (s_tir.ScheduleError, *TVM_ERRORS):
                return None
            name = name or call.args[0].name_hint
            moved_calls[name] = moved_calls.get(name, 0) + 1
            gvar = self.builder_.add_func(sch.mod["main"], call.args[0].name_hint + "_moved")
            out = relax.TensorType([shape[a] for a in inverse], call.ty.dtype)
            value = self.builder_.emit(relax.call_tir(
                gvar, [p[0] if p is not None else a for p, a in zip(permuted, args)], out))
            return relax.op.permute_dims(value, axes)

    # the transposes the kernels no longer read
    result = relax.transform.DeadCodeElimination()(mutate_functions(InPlace(mod)))
    if rule_log is not None and moved_calls:
        rule_log.scheduled("<relax: nhwc_convolutions>", "nhwc_convolutions", tuple(
            f"{name} computed in its input's layout, the transposes around it dropped "
            f"({count} call{'s' if count > 1 else ''})" for name, count in moved_calls.items()))
    return result


__all__ = ["LAYOUTS", "nhwc_convolutions"]
