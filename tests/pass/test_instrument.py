"""The one instrumentation loop: bindings after each binding, parameters first, and the
debug guards, calibration and local errors built on it."""

import ast
import pathlib

import numpy as np
import tvm
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R

import relay_amp
from relay_amp import execution
from relay_amp.instrument import instrument, returning_stats


@I.ir_module
class Mixed:
    @R.function
    def main(x: R.Tensor((4,), "float32")):
        y = R.multiply(x, x)
        with R.dataflow():
            z = R.add(y, x)
            w = R.negative(z)
            R.output(w)
        return w


def test_probes_see_every_binding_and_parameter_and_their_stats_come_back():
    seen = []

    def largest(binding, bind):
        seen.append(binding.var.name)
        return [bind(R.max(binding.var), f"max_{binding.var.name}", visible=True)]

    def param_sum(param, bind):
        return [bind(R.sum(param), f"sum_{param.name}", visible=True)]

    func = Mixed["main"]
    blocks, stats = instrument(func, largest, param_sum)
    assert seen == ["y", "z", "w"]
    assert [s.name for s in stats] == ["sum_x", "max_y", "max_z", "max_w"]
    assert [type(b) for b in blocks] == [relax.BindingBlock, relax.BindingBlock,
                                         relax.DataflowBlock]
    probe = execution.with_function(Mixed, "main", returning_stats(func, blocks, stats))
    probe = relax.transform.Normalize()(probe)
    relax.analysis.well_formed(probe)
    x = np.array([1, -2, 3, 0.5], "float32")
    result = relay_amp.compile_module(probe)["main"](tvm.runtime.tensor(x))
    np.testing.assert_allclose(result[0].numpy(), -(x * x + x))
    got = [float(result[1][i].numpy()) for i in range(4)]
    assert got == [x.sum(), (x * x).max(), (x * x + x).max(), (-(x * x + x)).max()]
    tvm.ir.assert_structural_equal(Mixed["main"], func)  # the function itself is unchanged


def test_guards_calibration_and_local_errors_use_the_one_loop():
    package = pathlib.Path(relay_amp.__file__).parent
    for module in ("calibrate.py", "fallback.py", "finish.py"):
        tree = ast.parse((package / module).read_text())
        imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                    and node.module == "instrument" for alias in node.names}
        assert "instrument" in imported, module
        assert "BlockBuilder()" not in (package / module).read_text(), module
