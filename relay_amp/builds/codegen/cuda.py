"""Make TVM-generated CUDA compile when it does arithmetic on ``volatile`` half values.

Cross-thread reductions over ``volatile`` shared memory produce expressions such as
``volatile half + volatile half``, for which ``cuda_fp16.h`` and ``cuda_bf16.h`` declare no
operators (the error of TVM's "Relay Automatic FP16 Downcasting" RFC). This module adds the
missing free operators for ``__half`` and ``__nv_bfloat16`` (arithmetic, comparisons, compound
assignment) plus explicit volatile load/store helpers, through TVM's
``tvm_callback_cuda_postproc(code, target)`` hook:

* the declarations are injected only into sources that use volatile half or bfloat16 values,
  written in any declaration form (qualifiers and storage classes in any order, arrays,
  pointers, casts), after TVM's own preamble and before the first kernel;
* injection is idempotent (a marker and an include guard);
* a callback registered before relay_amp keeps running first: relay_amp chains, never replaces;
* importing relay_amp registers nothing. relay_amp's CUDA builds turn the hook on:
  :func:`relay_amp.cuda_pipeline` (so ``tvm.compile(mod, target,
  relax_pipeline=relay_amp.cuda_pipeline(target))``) and :func:`.pipeline.build` with a
  CUDA target (the ``relay-amp convert`` command and the GPU bundle build through it), unless
  :func:`disable` or ``volatile_half_operators(False)`` switched it off;
* whoever compiles converted modules with ``tvm.compile(mod, target)`` and TVM's own pipeline
  calls :func:`enable` first (or compiles inside ``with volatile_half_operators():``);
  :func:`disable` and :func:`is_enabled` do the rest.

Once registered, the hook stays TVM's ``tvm_callback_cuda_postproc`` for the process (the
callback it chained to may be anyone's, so it is never unregistered); switched off, it only
passes the source through that earlier callback, as if relay_amp had not registered.

The declarations use only ``__device__`` functions and the CUDA math headers, so the patched
source compiles under nvcc and NVRTC alike.
"""

from __future__ import annotations

import contextlib
import re
import threading

import tvm

MARKER = "// relay_amp: volatile half/bfloat16 operators"
CALLBACK = "tvm_callback_cuda_postproc"

_TYPES = {
    # dtype: (CUDA type, header guard, arithmetic prefix, raw storage type)
    "float16": ("__half", "__CUDA_FP16_H__", "__h", "unsigned short"),
    "bfloat16": ("__nv_bfloat16", "__CUDA_BF16_H__", "__h", "unsigned short"),
}
_TYPE_NAMES = {"float16": ("half", "__half"), "bfloat16": ("__nv_bfloat16", "nv_bfloat16")}
#: A run of declaration specifiers: cv-qualifiers, storage classes, CUDA memory spaces and the
#: low-precision type names, in any order (``volatile __shared__ half``, ``half volatile``,
#: ``(volatile const __nv_bfloat16*)``, ``static __shared__ volatile half buf[32]``).
_SPECIFIERS = re.compile(
    r"(?:\b(?:volatile|const|static|extern|register|__shared__|__device__|__constant__|"
    r"__managed__|__restrict__|half|__half|__nv_bfloat16|nv_bfloat16)\b\s*)+")


def _uses_volatile(code: str, dtype: str) -> bool:
    """Whether ``code`` declares or casts to a volatile value of ``dtype``'s CUDA type."""
    names = _TYPE_NAMES[dtype]
    for match in _SPECIFIERS.finditer(code):
        words = match.group().split()
        if "volatile" in words and any(name in words for name in names):
            return True
    return False


def _declarations(dtype: str) -> str:
    ctype, guard, _, raw = _TYPES[dtype]
    suffix = "HALF" if dtype == "float16" else "BF16"
    as_value = "__ushort_as_half" if dtype == "float16" else "__ushort_as_bfloat16"
    as_raw = "__half_as_ushort" if dtype == "float16" else "__bfloat16_as_ushort"
    lines = [f"#if defined({guard}) && !defined(RELAY_AMP_VOLATILE_{suffix})",
             f"#define RELAY_AMP_VOLATILE_{suffix}",
             f"__device__ __forceinline__ {ctype} relay_amp_load(const volatile {ctype}& x) {{",
             f"  return {as_value}(*reinterpret_cast<const volatile {raw}*>(&x));",
             "}",
             f"__device__ __forceinline__ void relay_amp_store(volatile {ctype}& x, {ctype} v) {{",
             f"  *reinterpret_cast<volatile {raw}*>(&x) = {as_raw}(v);",
             "}"]
    for op, func in (("+", "__hadd"), ("-", "__hsub"), ("*", "__hmul"), ("/", "__hdiv")):
        lines.append(
            f"__device__ __forceinline__ {ctype} operator{op}(const volatile {ctype}& a, "
            f"const volatile {ctype}& b) {{ "
            f"return {func}(relay_amp_load(a), relay_amp_load(b)); }}")
        lines.append(
            f"__device__ __forceinline__ volatile {ctype}& operator{op}=(volatile {ctype}& a, "
            f"const volatile {ctype}& b) {{ relay_amp_store(a, {func}(relay_amp_load(a), "
            f"relay_amp_load(b))); return a; }}")
    for op, func in (("==", "__heq"), ("!=", "__hne"), ("<", "__hlt"), ("<=", "__hle"),
                     (">", "__hgt"), (">=", "__hge")):
        lines.append(
            f"__device__ __forceinline__ bool operator{op}(const volatile {ctype}& a, "
            f"const volatile {ctype}& b) {{ "
            f"return {func}(relay_amp_load(a), relay_amp_load(b)); }}")
    lines.append(f"__device__ __forceinline__ {ctype} operator-(const volatile {ctype}& a) "
                 f"{{ return __hneg(relay_amp_load(a)); }}")
    lines.append(f"#endif  // RELAY_AMP_VOLATILE_{suffix}")
    return "\n".join(lines)


def needed(code: str) -> list[str]:
    """The low-precision dtypes whose volatile operators ``code`` needs (and lacks)."""
    return [dtype for dtype in _TYPES
            if f"RELAY_AMP_VOLATILE_{'HALF' if dtype == 'float16' else 'BF16'}" not in code
            and _uses_volatile(code, dtype)]


def patch_source(code: str) -> str:
    """``code`` with the operators it needs declared before its first kernel (idempotent)."""
    dtypes = needed(code)
    if not dtypes:
        return code
    block = "\n".join([MARKER] + [_declarations(d) for d in dtypes]) + "\n"
    match = re.search(r'^(?:extern "C" )?__global__', code, flags=re.M)
    if match is None:
        return code + "\n" + block
    return code[:match.start()] + block + "\n" + code[match.start():]


class _Hook:
    """The callback registered with TVM; it chains to the one registered before it."""

    def __init__(self):
        self.enabled = False
        self.switched_off = False  # by disable(): relay_amp's builds leave it off
        self.previous = None
        self.registered = False
        self.lock = threading.RLock()

    def __call__(self, code, target=None):
        if self.previous is not None:
            try:
                code = self.previous(code, target)
            except TypeError:  # an older one-argument callback
                code = self.previous(code)
        return patch_source(str(code)) if self.enabled else code

    def register(self) -> None:
        """Register (once), chaining to the callback registered before."""
        with self.lock:
            if not self.registered:
                current = tvm.get_global_func(CALLBACK, allow_missing=True)
                if current is not None:
                    self.previous = current
                tvm.register_global_func(CALLBACK, self, override=True)
                self.registered = True


_HOOK = _Hook()


def enable() -> None:
    """Register (once) and switch on the post-processing hook, for every CUDA build after it
    (``tvm.compile`` with TVM's own pipeline included)."""
    with _HOOK.lock:
        _HOOK.register()
        _HOOK.enabled, _HOOK.switched_off = True, False


def enable_for_build() -> None:
    """What relay_amp's CUDA builds call: :func:`enable`, unless :func:`disable` (or
    ``volatile_half_operators(False)``) switched the hook off. Idempotent."""
    with _HOOK.lock:
        if not _HOOK.switched_off:
            enable()


def disable() -> None:
    """Switch the hook off, for relay_amp's builds too; a callback it chains to keeps running."""
    with _HOOK.lock:
        _HOOK.enabled, _HOOK.switched_off = False, True


def is_enabled() -> bool:
    """Whether generated CUDA sources get the volatile operators."""
    return _HOOK.enabled and _HOOK.registered


@contextlib.contextmanager
def volatile_half_operators(enabled: bool = True):
    """Enable (or disable) the hook inside a ``with`` block, restoring the previous state."""
    with _HOOK.lock:
        before = (_HOOK.enabled, _HOOK.switched_off)
        (enable if enabled else disable)()
    try:
        yield
    finally:
        with _HOOK.lock:
            _HOOK.enabled, _HOOK.switched_off = before
