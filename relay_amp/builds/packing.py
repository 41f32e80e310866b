"""Exporting a library without holding its constants several times over.

``export_library`` embeds the executable's serialized modules (the VM's bytecode and every
constant: a converted model's weights) in the library. TVM's default packer builds an LLVM module
holding the bytes as one constant array and emits it as an object file, which holds the weights
about four more times in memory at once (the serialized bytes, LLVM's constant, the object
file's section, its output buffer). :func:`pack_imports` writes the same bytes once to a file in
the export's workspace and has the assembler include them (``.incbin``): one transient copy, in
the size of the converted weights. The symbol and the bytes are the ones TVM's packers write
(``__tvm_ffi__library_bin``: the length as 8 little-endian bytes, then the modules), so the
library loads as any other.
"""

from __future__ import annotations

import os
import subprocess
import sys

#: The symbol TVM's loader reads the packed modules from (``runtime.ModulePackImportsToC``).
SYMBOL = "__tvm_ffi__library_bin"


def can_pack(target: dict) -> bool:
    """Whether :func:`pack_imports` serves an export for ``target``: a library linked here
    (Linux, no cross compiler: no ``mtriple`` other than this machine's)."""
    import tvm

    if not sys.platform.startswith("linux") or tvm.support.cc.get_cc() is None:
        return False
    triple = target.get("mtriple") if target.get("kind") == "llvm" else None
    here = tvm.target.codegen.llvm_get_system_triple().split("-")[0]
    return triple is None or triple.split("-")[0] == here


def pack_imports(module, is_system_lib: bool, symbol_prefix: str, workspace_dir: str) -> str:
    """``fpack_imports`` for ``export_library``: the serialized imports of ``module`` as an
    object file assembled from a file with ``.incbin``.

    Parameters
    ----------
    module : tvm.runtime.Module
        The module being exported (a Relax VM executable's).
    is_system_lib : bool
        A system library names its symbol with ``symbol_prefix``: the C packer TVM has serves
        it instead.
    symbol_prefix : str
    workspace_dir : str
        The export's temporary folder, where the files are written.

    Returns
    -------
    str
        The path of the file for the linker.
    """
    import numpy as np
    from tvm.runtime import _ffi_api
    from tvm.support import cc

    if is_system_lib or symbol_prefix:
        path = os.path.join(workspace_dir, f"{symbol_prefix}devc.c")
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(_ffi_api.ModulePackImportsToC(module, is_system_lib, symbol_prefix))
        return path
    blob = os.path.join(workspace_dir, "devc.bin")
    packed = _ffi_api.ModulePackImportsToTensor(module)  # length prefix and modules
    size = int(packed.shape[0])
    np.from_dlpack(packed).tofile(blob)
    del packed
    source = os.path.join(workspace_dir, "devc.s")
    with open(source, "w", encoding="utf-8") as handle:
        handle.write(f"""\t.section .rodata
\t.globl {SYMBOL}
\t.type {SYMBOL}, @object
\t.p2align 4
{SYMBOL}:
\t.incbin "{blob}"
\t.size {SYMBOL}, {size}
\t.section .note.GNU-stack,"",@progbits
""")
    obj = os.path.join(workspace_dir, "devc.o")
    result = subprocess.run([cc.get_cc(), "-c", source, "-o", obj], capture_output=True,
                            text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"assembling the library's modules failed: {result.stderr.strip()}")
    os.remove(blob)
    return obj


__all__ = ["SYMBOL", "can_pack", "pack_imports"]
