"""relay_amp.builds.packing: a library whose modules the assembler includes from one file loads
and computes as one TVM's own packer exports."""

import numpy as np
import pytest
import tvm
from tvm import relax

from relay_amp.builds import packing


def _executable():
    weight = np.random.default_rng(0).normal(0, 1, (64, 32)).astype("float32")
    builder = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 64), "float32"))
    with builder.function("main", [x]):
        with builder.dataflow():
            out = builder.emit_output(relax.op.matmul(x, relax.const(weight)))
        builder.emit_func_output(out)
    return tvm.compile(builder.get(), target="llvm"), weight


def test_a_library_packed_with_incbin_loads_and_computes(tmp_path, monkeypatch):
    if not packing.can_pack({"kind": "llvm"}):
        pytest.skip("no C compiler to assemble with on this machine")
    executable, weight = _executable()
    packed = []

    def spy(*args):
        packed.append(packing.pack_imports(*args))
        return packed[-1]

    executable.export_library(str(tmp_path / "ours.so"), fpack_imports=spy)
    executable.export_library(str(tmp_path / "tvms.so"))
    assert len(packed) == 1 and packed[0].endswith("devc.o")
    x = np.random.default_rng(1).normal(0, 1, (4, 64)).astype("float32")
    results = []
    for name in ("ours.so", "tvms.so"):
        vm = relax.VirtualMachine(tvm.runtime.load_module(str(tmp_path / name)), tvm.cpu())
        results.append(vm["main"](tvm.runtime.tensor(x)).numpy())
    np.testing.assert_array_equal(results[0], results[1])
    np.testing.assert_allclose(results[0], x @ weight, rtol=1e-5, atol=1e-5)


def test_only_a_library_linked_here_is_packed_so():
    assert packing.can_pack({"kind": "llvm"}) == (tvm.support.cc.get_cc() is not None)
    assert not packing.can_pack({"kind": "llvm", "mtriple": "aarch64-linux-gnu"}) or \
        tvm.target.codegen.llvm_get_system_triple().startswith("aarch64")
