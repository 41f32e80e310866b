"""A CUDA compile pipeline for mixed-precision modules: TVM's own, with the changes that decide
whether a float16 model runs faster than its float32 original on a GPU.

``tvm.compile(mod, target, relax_pipeline=relay_amp.cuda_pipeline(target))`` runs TVM's CUDA
pipeline (``relax.backend.cuda.pipeline``: library dispatch, LegalizeOps, FuseOps, FuseTIR, dlight
schedules, lowering) with:

1. :func:`DecomposeAttention` before legalization. TVM legalizes ``R.nn.attention`` into one
   kernel that dlight can only give its fallback schedule, so attention is as slow in float16 as
   in float32 and accumulates q·kᵀ in the input dtype. Decomposed into two matmuls and a
   softmax, the matmuls get dlight's matmul schedules (tensor cores where the shapes allow), the
   softmax its reduction schedule, and low-precision inputs are multiplied with float32
   accumulation (``out_dtype``) and a float32 softmax.
2. :func:`SplitK` before legalization. dlight's tensor-core matmul computes one 128×128 output
   tile per thread block, so a transformer layer at batch 1 (a 128×768 output) occupies 6 of an
   H100's 132 SMs. A matmul with too few tiles and a long reduction becomes two kernels: the
   partial products over slices of K, which read both operands in place (no copy), and their
   sum, which takes the matmul's epilogue (bias, activation, cast).
3. A short-reduction rule ahead of dlight's ``Reduction`` and ``GeneralReduction``: a kernel whose
   reduction is short (a depthwise 3×3 convolution: 9 products per output) and whose output is
   large is computed one output per thread. dlight gives such a
   kernel one thread block per output (256 threads for 9 products) as soon as it has an
   elementwise epilogue, which is exactly what a converted depthwise convolution has (its cast,
   its folded batch norm).
4. dlight's matmul rule as :func:`.tensor_cores.tensor_core_matmul`: tensor cores for
   bfloat16 as well as float16, and for every spelling of the arch (``sm_90a``, which TVM gives
   an H100, fails dlight's own check and gets none).
5. :func:`.several_outputs.several_outputs_rule` after ``GeneralReduction``: a row reduction
   whose result is written twice (a layer_norm writing the residual stream in float32 and the
   next matmul's operand in float16) gets a thread block per row instead of dlight's fallback.
6. Every rule guarded (:mod:`.schedule_rules`): a rule that raises on a kernel passes it on.

Float32 modules compile with the same pipeline, so float32 and low precision are compared on
equal terms; ``relay_amp_schedules=False`` gives TVM's own pipeline and ``tensor_cores=False``
keeps matmuls off tensor cores.
"""

from __future__ import annotations

import time

import tvm
from tvm import relax

from ..relax_utils import last_line, mutate_functions
from .codegen import cuda as cuda_codegen
from .constants import numpy_elementwise_constants
from .cpu_pipeline import cpu_pipeline
from .schedule_rules import RuleLog, apply_rules
from .several_outputs import several_outputs_rule
from .tensor_cores import DLIGHT_MIN_EXTENT, arch_number, cuda_intrinsics, tensor_core_matmul

_LOW = ("float16", "bfloat16")
#: A reduction this short (product of its constant reduction extents) is done in one thread ...
SMALL_REDUCTION = 64
#: ... when the kernel has at least this many outputs to spread over threads.
MANY_OUTPUTS = 4096


# ------------------------------------------------------------------------------ attention
def _decompose(builder: relax.BlockBuilder, call: relax.Call) -> relax.Expr | None:
    """``call`` (``nn.attention`` / ``nn.attention_bias``) as matmul, softmax, matmul; None where
    the attributes are ones this does not decompose (sliding windows)."""
    attrs = call.attrs
    if getattr(attrs, "window_size", None) is not None:
        return None
    query, key, value = call.args[:3]
    bias = call.args[3] if len(call.args) > 3 else None
    dtype = str(query.ty.dtype)
    head_dim, seq, seq_kv = (query.ty.shape.values[3], query.ty.shape.values[1],
                             key.ty.shape.values[1])
    scale = attrs.scale
    if scale is None:
        if not isinstance(head_dim, tvm.tirx.IntImm):
            return None
        scale = int(head_dim) ** -0.5
    if attrs.causal_mask is not None and not all(isinstance(n, tvm.tirx.IntImm)
                                                  for n in (seq, seq_kv)):
        return None
    acc = "float32" if dtype in _LOW else dtype
    op = relax.op
    emit = builder.emit
    q = emit(op.permute_dims(query, [0, 2, 1, 3]))
    k = emit(op.permute_dims(key, [0, 2, 3, 1]))
    v = emit(op.permute_dims(value, [0, 2, 1, 3]))
    scores = emit(op.matmul(q, k, out_dtype=acc))
    scores = emit(op.multiply(scores, relax.const(float(scale), acc)))
    if bias is not None:
        scores = emit(op.add(scores, bias if str(bias.ty.dtype) == acc
                             else op.astype(bias, acc)))
    if attrs.causal_mask is None:
        probs = emit(op.nn.softmax(scores, axis=-1))
    else:
        offset = 0 if attrs.causal_mask == "TopLeft" else abs(int(seq) - int(seq_kv))
        masked = emit(op.tril(scores, offset))
        shifted = emit(op.exp(op.subtract(masked, op.max(masked, axis=-1, keepdims=True))))
        exps = emit(op.tril(shifted, offset))
        probs = emit(op.divide(exps, op.sum(exps, axis=-1, keepdims=True)))
    if acc != dtype:
        probs = emit(op.astype(probs, dtype))
    out = emit(op.matmul(probs, v, out_dtype=acc))
    if acc != dtype:
        out = emit(op.astype(out, dtype))
    return op.permute_dims(out, [0, 2, 1, 3])


_ATTENTION = {tvm.ir.Op.get("relax.nn.attention"), tvm.ir.Op.get("relax.nn.attention_bias")}


@relax.expr_functor.mutator
class _AttentionDecomposer(relax.PyExprMutator):
    def visit_call_(self, call):
        call = super().visit_call_(call)
        if isinstance(call.op, tvm.ir.Op) and call.op in _ATTENTION:
            decomposed = _decompose(self.builder_, call)
            if decomposed is not None:
                return decomposed
        return call


@tvm.transform.module_pass(opt_level=0, name="relay_amp.DecomposeAttention")
def DecomposeAttention(mod: tvm.IRModule, _context) -> tvm.IRModule:
    """Rewrite ``nn.attention`` and ``nn.attention_bias`` as permute, matmul, scale, (bias,
    causal mask,) softmax, matmul, permute; float16/bfloat16 inputs are multiplied with float32
    accumulation and go through a float32 softmax. Sliding-window attention, and a causal mask
    or default scale over symbolic extents, stay as they are."""
    return mutate_functions(_AttentionDecomposer(mod))


# ------------------------------------------------------------------------------ split-K
#: Streaming multiprocessors per CUDA arch (the largest part of each generation); others: 80.
SM_COUNT = {"sm_70": 80, "sm_75": 72, "sm_80": 108, "sm_86": 84, "sm_89": 128, "sm_90": 132,
            "sm_100": 148, "sm_120": 170}


def sm_count(target: tvm.target.Target) -> int:
    """The streaming multiprocessors of the target's arch, however it is spelled (80 where the
    arch is not in :data:`SM_COUNT`)."""
    return SM_COUNT.get(f"sm_{arch_number(target)}", 80)


#: dlight's tensor-core matmul computes a 128×128 output tile per thread block.
_TILE = 128
#: The shortest K slice: dlight puts a matmul on tensor cores only when every extent exceeds 64.
MIN_SLICE = 128


def _static(values) -> list | None:
    if not all(isinstance(v, tvm.tirx.IntImm) for v in values):
        return None
    return [int(v) for v in values]


def split_k_factor(rows: int, cols: int, depth: int, sms: int) -> int:
    """How many slices of the reduction (K) axis a ``rows×depth @ depth×cols`` matmul should be
    split into so that its 128×128 output tiles times the slices fill the GPU: 1 (no split) when
    the tiles alone fill it, else the largest power of two that keeps each slice at least
    ``MIN_SLICE`` long, divides ``depth`` and gives no more than two thread blocks per SM.
    A matmul with at most ``DLIGHT_MIN_EXTENT`` rows or columns is not computed in such tiles
    (dlight's GEMV and small-matmul schedules spread K over threads themselves: a classifier's
    head at batch 1) and is not split."""
    if min(rows, cols) <= DLIGHT_MIN_EXTENT:
        return 1
    tiles = -(-rows // _TILE) * -(-cols // _TILE)
    factor = 1
    while (tiles * factor < sms and depth % (factor * 2) == 0
           and depth // (factor * 2) >= MIN_SLICE
           and tiles * factor * 2 <= 2 * sms):
        factor *= 2
    return factor


def _k_slices(a, b, factor: int, out_dtype: str):
    """TE: the partial products of ``a @ b`` over ``factor`` slices of K, slice-major
    (``[factor, *a.shape[:-1], b.shape[1]]``), each operand read where it lies."""
    from tvm import te

    *lead, depth = a.shape
    width = depth // factor
    k = te.reduce_axis((0, width), name="k")

    def product(s, *index):
        *rows, col = index
        return te.sum(a[(*rows, s * width + k)].astype(out_dtype)
                      * b[s * width + k, col].astype(out_dtype), axis=k)

    return te.compute([factor, *lead, b.shape[1]], product, name="matmul_k_slices")


def _sum_slices(partial):
    """TE: the sum of ``partial`` over its leading axis, written out as additions (elementwise,
    so FuseOps gives it the matmul's epilogue and dlight one output per thread)."""
    from tvm import te

    def total(*index):
        value = partial[(0, *index)]
        for s in range(1, int(partial.shape[0])):
            value = value + partial[(s, *index)]
        return value

    return te.compute(partial.shape[1:], total, name="sum_k_slices")


def _split_k(builder: relax.BlockBuilder, call: relax.Call, sms: int) -> relax.Expr | None:
    """``matmul(a, b)`` with few output tiles and a long reduction as two kernels: the partial
    products over slices of K, read in place from ``a`` and ``b`` (no copy), and their sum,
    which takes the matmul's epilogue; None where it does not pay (or shapes are symbolic, or
    ``b`` is batched)."""
    a, b = call.args
    if a.ty.shape is None or b.ty.shape is None:  # a shape the importer could not infer
        return None
    a_shape, b_shape = _static(a.ty.shape.values), _static(b.ty.shape.values)
    if a_shape is None or b_shape is None or len(b_shape) != 2 or len(a_shape) < 2:
        return None
    depth, cols = b_shape
    rows = 1
    for dim in a_shape[:-1]:
        rows *= dim
    factor = split_k_factor(rows, cols, depth, sms)
    if factor == 1:
        return None
    out_dtype = str(call.attrs.out_dtype)
    if out_dtype in ("", "void", "None"):
        out_dtype = str(a.ty.dtype)
    partial = builder.emit_te(_k_slices, a, b, factor, out_dtype,
                              primfunc_name_hint="matmul_k_slices")
    return builder.call_te(_sum_slices, partial, primfunc_name_hint="sum_k_slices")


_MATMUL = tvm.ir.Op.get("relax.matmul")


@relax.expr_functor.mutator
class _SplitK(relax.PyExprMutator):
    def __init__(self, mod, sms):
        super().__init__(mod)
        self.sms = sms

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if isinstance(call.op, tvm.ir.Op) and call.op.same_as(_MATMUL):
            split = _split_k(self.builder_, call, self.sms)
            if split is not None:
                return split
        return call


def SplitK(sms: int = 132) -> tvm.transform.Pass:
    """Split the reduction axis of matmuls that have too few 128×128 output tiles to occupy
    ``sms`` streaming multiprocessors (a BERT or LLaMA layer at batch 1: 6 thread blocks for a
    128×768 output) into the partial products over K slices plus their sum
    (:func:`split_k_factor` chooses the slices). The partial products read the operands where
    they lie and are summed in the matmul's own output dtype (float32 for relay_amp's float16
    matmuls) by an elementwise kernel, into which FuseOps puts the matmul's epilogue: one launch
    more than the matmul, no copy, no standalone cast."""

    @tvm.transform.module_pass(opt_level=0, name="relay_amp.SplitK")
    def _pass(mod, _context):
        return mutate_functions(_SplitK(mod, sms))

    return _pass


# ------------------------------------------------------------------------------ schedules
def _reductions(func) -> list | None:
    """``(reduction extent, output extent)`` of each block of ``func`` that reduces, from
    dlight's own block analysis; None if an extent is not a constant or ``func`` is not
    analysable."""
    from tvm import s_tir
    from tvm.s_tir.dlight.analysis import normalize_prim_func

    infos = normalize_prim_func(s_tir.Schedule(func))
    if infos is None:
        return None
    found = []
    for info in infos:
        if not any(it.kind == "R" for it in info.iters):
            continue
        if not all(isinstance(it.dom, (int, tvm.tirx.IntImm)) for it in info.iters):
            return None
        extents = {"R": 1, "S": 1}
        for it in info.iters:
            extents["R" if it.kind == "R" else "S"] *= int(it.dom)
        found.append((extents["R"], extents["S"]))
    return found


def _small_reduction_rule():
    from tvm.s_tir import dlight as dl

    class SmallReduction(dl.gpu.Fallback):
        """One output per thread for kernels whose reductions are short (at most
        ``SMALL_REDUCTION`` products) and whose outputs are many (``MANY_OUTPUTS``); others are
        left to the rules after it."""

        def apply(self, func, target, tunable):
            if not isinstance(func, tvm.tirx.PrimFunc):
                return None
            reductions = _reductions(func)
            if (not reductions or max(r for r, _ in reductions) > SMALL_REDUCTION
                    or min(o for _, o in reductions) < MANY_OUTPUTS):
                return None
            return super().apply(func, target, tunable)

    return SmallReduction()


def _matmul_without_tensor_cores():
    from tvm.s_tir import dlight as dl

    class MatmulWithoutTensorCores(dl.gpu.Matmul):
        """dlight's Matmul rule, scheduled as for a GPU without tensor cores (the target the
        rule sees says sm_60; code generation still uses the real target)."""

        def apply(self, func, target, tunable):
            if target.kind.name == "cuda":
                config = {k: v for k, v in target.export().items() if k not in ("arch", "tag")}
                target = tvm.target.Target({**config, "arch": "sm_60"})
            return super().apply(func, target, tunable)

    return MatmulWithoutTensorCores()


# ------------------------------------------------------------------------------ modulo
#: Ops whose float16/bfloat16 form TVM's CUDA code generation refuses ("Non single or double
#: precision floating point in Mod"): truncated modulo becomes ``fmodf``/``fmod`` only.
_WIDENED = {tvm.ir.Op.get("relax.mod")}


@relax.expr_functor.mutator
class _ModuloWidener(relax.PyExprMutator):
    def visit_call_(self, call):
        call = super().visit_call_(call)
        if not (isinstance(call.op, tvm.ir.Op) and call.op in _WIDENED):
            return call
        dtype = str(call.ty.dtype) if isinstance(call.ty, relax.TensorType) else None
        if dtype not in _LOW:
            return call
        wide = [self.builder_.emit(relax.op.astype(arg, "float32")) for arg in call.args]
        return relax.op.astype(self.builder_.emit(relax.Call(call.op, wide, call.attrs)), dtype)


@tvm.transform.module_pass(opt_level=0, name="relay_amp.WidenModulo")
def WidenModulo(mod: tvm.IRModule, _context) -> tvm.IRModule:
    """Compute a float16/bfloat16 ``mod`` in float32 and round the result back (exact: the
    remainder of two low-precision values is one): CUDA has ``fmod`` for float and double
    only, and TVM's code generation fails the whole build on a half ``Mod``."""
    return mutate_functions(_ModuloWidener(mod))


def graph_rewrites(target, split_k: bool = True) -> list:
    """The Relax passes :func:`cuda_pipeline` runs ahead of TVM's: :func:`WidenModulo`,
    :func:`DecomposeAttention`, and :func:`SplitK` for the target's SMs unless ``split_k`` is
    False (what :func:`relay_amp.gpu_cost` also runs to count what the build launches)."""
    target = target if isinstance(target, tvm.target.Target) else tvm.target.Target(target)
    return [WidenModulo, DecomposeAttention] + ([SplitK(sm_count(target))] if split_k else [])


#: The name (``Pass.info.name``) of the dlight pass in TVM's CUDA legalize passes that
#: :func:`cuda_pipeline` replaces with one carrying relay_amp's schedule rules.
TVM_SCHEDULE_PASS = "ApplyDefaultSchedule"
#: The PassContext option of TVM's ``RewriteCUDAGraph`` (in the pipeline's finalize passes).
CUDA_GRAPH_OPTION = "relax.backend.use_cuda_graph"


def cuda_pipeline(target, tensor_cores: bool = True, relay_amp_schedules: bool = True,
                  split_k: bool = True, cuda_graph: bool | None = None,
                  rule_log: RuleLog | None = None):
    """TVM's CUDA compile pipeline with :func:`DecomposeAttention` and :class:`SmallReduction`
    (see the module docstring); ``relay_amp_schedules=False`` gives TVM's own pipeline.

    Parameters
    ----------
    target : tvm.target.Target or dict
        A CUDA target.
    tensor_cores : bool
        False keeps dlight's matmul rule off tensor cores (to separate what half the bytes gain
        from what tensor cores gain).
    relay_amp_schedules : bool
        False: TVM's pipeline as ``tvm.compile`` runs it (with ``tensor_cores`` honoured).
    split_k : bool
        With ``relay_amp_schedules``, also :func:`SplitK` for the target's number of SMs.
    cuda_graph : bool, optional
        Capture the static parts of each function in a CUDA graph (TVM's ``RewriteCUDAGraph``)
        and replay it, which saves a launch per kernel. None (default): what the
        ``PassContext`` option ``relax.backend.use_cuda_graph`` says where it is set, else on
        (with ``relay_amp_schedules``; TVM's own pipeline keeps TVM's default, off). On an
        H100 it measured 0-12% faster than the plain VM on the four bundle models, never
        slower (docs/GPU.md).
    rule_log : relay_amp.builds.schedule_rules.RuleLog, optional
        With ``relay_amp_schedules``, a schedule rule that raises on a kernel passes it to the
        next rule (down to dlight's ``Fallback``) instead of failing the build; this log
        records which rule raised on which kernel and which scheduled it instead. TVM's own
        pipeline (``relay_amp_schedules=False``) fails as ``tvm.compile`` does.

    Returns
    -------
    tvm.transform.Pass
        For ``tvm.compile(mod, target, relax_pipeline=...)``.

    Notes
    -----
    Matmuls and convolutions whose extents (batch aside) all exceed 64 run on tensor cores (WMMA)
    in float16 for sm_70+ and in bfloat16 for sm_80+, whatever the arch's spelling (``sm_90a``,
    the ``nvidia/nvidia-h100`` tag): :mod:`relay_amp.builds.tensor_cores`. That needs
    ``Schedule.tensorize``, which segfaults when apache-tvm 0.27.0 runs with apache-tvm-ffi
    0.1.15 (an ABI mismatch; 0.1.14 works), hence the pin in pyproject.toml.

    Running the pipeline turns on :mod:`.codegen.cuda`'s hook (CUDA sources get the
    operators for volatile half and bfloat16 values) unless it was switched off; importing
    relay_amp does not.
    """
    from tvm.relax.backend.cuda import pipeline
    from tvm.s_tir import dlight as dl

    target = target if isinstance(target, tvm.target.Target) else tvm.target.Target(target)
    if not tensor_cores:
        matmul = _matmul_without_tensor_cores()
    else:
        matmul = tensor_core_matmul() if relay_amp_schedules else dl.gpu.Matmul()
    rules = [matmul, dl.gpu.GEMV()]
    if relay_amp_schedules:  # ahead of Reduction, which takes short outer-axis sums too
        rules.append(_small_reduction_rule())
    rules += [dl.gpu.Reduction(), dl.gpu.GeneralReduction()]
    if relay_amp_schedules:  # where GeneralReduction refuses a row written more than once
        rules.append(several_outputs_rule())
    rules.append(dl.gpu.Fallback())
    # TVM's legalize passes end in dlight's ApplyDefaultSchedule with TVM's own rules; it is
    # dropped (by name, wherever it sits) for one with the rules above, which would otherwise find
    # every PrimFunc already scheduled (dlight skips those). The test
    # test_tvms_default_schedule_pass_is_replaced_exactly_once fails if TVM renames or removes it.
    legalize = [p for p in pipeline.legalize_passes(target)
                if p.info.name != TVM_SCHEDULE_PASS] + [
        apply_rules(rules, rule_log) if relay_amp_schedules else dl.ApplyDefaultSchedule(*rules)]
    # ops on constants computed in numpy: FoldConstant would compile a kernel for each
    before = [*graph_rewrites(target, split_k), numpy_elementwise_constants()] \
        if relay_amp_schedules else []

    passes = tvm.transform.Sequential(
        before + pipeline.library_dispatch_passes(target) + legalize
        + pipeline.dataflow_lower_passes(target) + pipeline.finalize_passes(target))

    @tvm.transform.module_pass(opt_level=0, name="relay_amp.cuda_pipeline")
    def _pipeline(mod, context):
        # CUDA code generation follows this pass in tvm.compile: the volatile half operators
        # hook goes on here, not when relay_amp is imported (relay_amp.builds.codegen.cuda).
        cuda_codegen.enable_for_build()
        cuda_intrinsics()  # before dlight imports TVM's, which registers all of them
        config = dict(context.config)
        if cuda_graph is not None:
            config[CUDA_GRAPH_OPTION] = cuda_graph
        elif relay_amp_schedules:
            config.setdefault(CUDA_GRAPH_OPTION, True)
        with target, tvm.transform.PassContext(
                opt_level=context.opt_level, config=config,
                required_pass=list(context.required_pass),
                disabled_pass=list(context.disabled_pass)):
            return passes(mod)

    return _pipeline


@tvm.instrument.pass_instrument
class _BuildStages:
    """Seconds a build spends in Relax passes and in TIR passes: the outermost passes, by
    whether the module they are given still holds a Relax function (``tvm.compile`` runs the
    Relax pipeline, then lowers the TIR functions alone)."""

    def __init__(self):
        self.seconds = {"relax": 0.0, "tir": 0.0}
        self.depth, self.stage, self.start = 0, None, 0.0

    def run_before_pass(self, mod, info):
        if self.depth == 0:
            self.stage = "relax" if any(isinstance(f, relax.Function)
                                        for f in mod.functions.values()) else "tir"
            self.start = time.perf_counter()
        self.depth += 1

    def run_after_pass(self, mod, info):
        self.depth -= 1
        if self.depth == 0:
            self.seconds[self.stage] += time.perf_counter() - self.start


def build(mod: tvm.IRModule, target, cuda_graph: bool | None = None, tensor_cores: bool = True,
          relay_amp_schedules: bool = True, timings: dict | None = None,
          rule_log: RuleLog | None = None):
    """``tvm.compile`` for ``target`` at ``opt_level=3``: CUDA through :func:`cuda_pipeline`
    (which turns on the CUDA source hook of :mod:`.codegen.cuda`), ``llvm`` (any CPU)
    through :func:`relay_amp.cpu_pipeline` (dot products vectorized).

    Parameters
    ----------
    mod : tvm.IRModule
        The module to compile.
    target : tvm.target.Target or dict
        Any target; CUDA takes the other arguments into account, ``llvm``
        ``relay_amp_schedules``.
    cuda_graph, tensor_cores, relay_amp_schedules
        As :func:`cuda_pipeline` (and :func:`relay_amp.cpu_pipeline`) take them.
    timings : dict, optional
        Filled with the seconds of each stage: ``relax_passes_s`` (legalization, fusion, the
        schedules: for CUDA, dlight's and the tensor intrinsics they name), ``tir_passes_s``
        (lowering the scheduled TIR) and ``codegen_s`` (the rest: the target's code and the
        VM's).
    rule_log : relay_amp.builds.schedule_rules.RuleLog, optional
        Records the schedule rules that raised on a kernel and the rule that scheduled it
        instead (:func:`cuda_pipeline`, :func:`relay_amp.cpu_pipeline`); and, for CUDA with
        ``cuda_graph`` None, a build that failed with CUDA graphs (relay_amp's default) and was
        built without them (kernel ``main``, rule ``RewriteCUDAGraph``).

    Returns
    -------
    tvm.relax.VMExecutable
        The executable (``export_library`` it, or run it in a ``relax.VirtualMachine``).
    """
    target = target if isinstance(target, tvm.target.Target) else tvm.target.Target(target)
    config = {} if cuda_graph is None else {CUDA_GRAPH_OPTION: cuda_graph}
    stages = _BuildStages() if timings is not None else None
    start = time.perf_counter()
    with tvm.transform.PassContext(opt_level=3, config=config,
                                   instruments=[stages] if stages is not None else None):
        if target.kind.name == "cuda":
            def compile_cuda(graphs):
                return tvm.compile(mod, target=target, relax_pipeline=cuda_pipeline(
                    target, tensor_cores, relay_amp_schedules, cuda_graph=graphs,
                    rule_log=rule_log))

            try:
                executable = compile_cuda(cuda_graph)
            except Exception as err:
                if cuda_graph is not None or not relay_amp_schedules:
                    raise
                # CUDA graphs are relay_amp's default, not the user's ask: TVM's
                # RewriteCUDAGraph captures a shape it defines outside the graph ("Var lv is
                # not defined") where a shape is read from a tensor at run time
                if rule_log is not None:
                    rule_log.reset()
                executable = compile_cuda(False)
                if rule_log is not None:
                    rule_log.raised("main", "RewriteCUDAGraph", last_line(err))
                    rule_log.scheduled("main", "the build without CUDA graphs")
        elif target.kind.name == "llvm":
            executable = tvm.compile(mod, target=target, relax_pipeline=cpu_pipeline(
                target, relay_amp_schedules, rule_log=rule_log))
        else:
            executable = tvm.compile(mod, target=target)
    if timings is not None:
        relax_s, tir_s = stages.seconds["relax"], stages.seconds["tir"]
        timings.update(relax_passes_s=relax_s, tir_passes_s=tir_s,
                       codegen_s=time.perf_counter() - start - relax_s - tir_s)
    return executable


def compile_module(mod: tvm.IRModule, target=None, relay_amp_schedules: bool = True):
    """Compile ``mod`` with :func:`build` and return a Relax VirtualMachine on the target's
    device: what calibration, the fallback search, the sweep, conformance and the fuzzer run.

    Parameters
    ----------
    mod : tvm.IRModule
        The module to compile.
    target : tvm.target.Target or dict, optional
        Default: this machine's CPU (:func:`relay_amp.host_target`).
    relay_amp_schedules : bool
        False: TVM's own pipeline for the target (for ``llvm``, its unscheduled loops).

    Returns
    -------
    tvm.relax.VirtualMachine
    """
    from tvm import relax

    from ..execution import host_target

    target = target or host_target()
    target = target if isinstance(target, tvm.target.Target) else tvm.target.Target(target)
    executable = build(mod, target, relay_amp_schedules=relay_amp_schedules)
    device = tvm.cpu() if target.kind.name in ("llvm", "c") else tvm.device(target.kind.name)
    return relax.VirtualMachine(executable, device)
