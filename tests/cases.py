"""The TVMScript modules that more than one test file converts, in one place both test layers
import (``pass/`` and ``eval/``): the pass's tests of each case, and the goldens
(tests/eval/test_golden.py) that record its conversion (:data:`GOLDEN`)."""

import numpy as np
from tvm.script import ir as I
from tvm.script import relax as R


@I.ir_module
class MatmulReluMatmulSoftmax:
    """A small float32 module with every kind of decision: dot products, a follow op, an
    accumulate op."""

    @R.function
    def main(x: R.Tensor((2, 8), "float32"), w: R.Tensor((8, 8), "float32")):
        with R.dataflow():
            lv = R.matmul(x, w)
            lv1 = R.nn.relu(lv)
            lv2 = R.matmul(lv1, w)
            gv = R.nn.softmax(lv2)
            R.output(gv)
        return gv


@I.ir_module
class Chain:
    """Matmul, relu, matmul, softmax with two weights: what the stage tests plan."""

    @R.function
    def main(x: R.Tensor((4, 8), "float32"), w: R.Tensor((8, 8), "float32"),
             v: R.Tensor((8, 8), "float32")):
        with R.dataflow():
            a = R.matmul(x, w)
            b = R.nn.relu(a)
            c = R.matmul(b, v)
            d = R.nn.softmax(c, axis=-1)
            R.output(d)
        return d


@I.ir_module
class PostNorm:
    """Two post-norm residual blocks (BERT's ``layer_norm(x + f(x))``): the first norm's result
    is the second block's residual stream and its matmul's operand."""

    @R.function
    def main(x: R.Tensor((2, 8, 16), "float32"), w: R.Tensor((16, 16), "float32"),
             g: R.Tensor((16,), "float32"), b: R.Tensor((16,), "float32")):
        with R.dataflow():
            y = R.matmul(x, w)
            s = R.add(x, y)
            n = R.nn.layer_norm(s, g, b, axes=[-1])
            z = R.matmul(n, w)
            r = R.add(n, z)
            o = R.nn.layer_norm(r, g, b, axes=[-1])
            R.output(o)
        return o


@I.ir_module
class Residual:
    """``r`` is a residual stream: ``s`` adds to it, and no normalization centres ``s``."""

    @R.function
    def main(x: R.Tensor((4, 16), "float32"), w: R.Tensor((16, 16), "float32")):
        with R.dataflow():
            a = R.matmul(x, w)
            r = R.nn.relu(a)
            y = R.matmul(r, w)
            s = R.add(y, r)
            o = R.matmul(s, w)
            R.output(o)
        return o


@I.ir_module
class BadInputsNet:
    @R.function
    def main(x: R.Tensor((2, 8), "float32"), w: R.Tensor((8, 8), "float32")):
        with R.dataflow():
            lv = R.matmul(x, w)
            lv1 = R.nn.softmax(lv)
            gv = R.matmul(lv1, w)
            R.output(gv)
        return gv


@I.ir_module
class ReduceProd:
    """ONNX's test_reduce_prod_default_axes_keepdims_example as the importer writes it."""

    @R.function
    def main(data: R.Tensor((12,), "float32")) -> R.Tensor((1,), "float32"):
        with R.dataflow():
            gv = R.prod(data, axis=None, keepdims=True)
            R.output(gv)
        return gv


@I.ir_module
class ProdAndRelu:
    @R.function
    def main(x: R.Tensor((12,), "float32")):
        with R.dataflow():
            lv = R.prod(x, axis=None, keepdims=False)
            lv1 = R.nn.relu(x)
            gv = (lv, lv1)
            R.output(gv)
        return gv


@I.ir_module
class Branchy:
    @R.function
    def main(cond: R.Tensor((), "bool"), x: R.Tensor((12,), "float32")) -> R.Tensor(
            (), "float32"):
        if cond:
            y = R.prod(x, axis=None, keepdims=False)
        else:
            y = R.max(x, axis=None, keepdims=False)
        return y


@I.ir_module
class Overflowing:
    """matmul gives values around 4e4; doubling them (8e4) overflows float16."""

    @R.function
    def main(x: R.Tensor((2, 8), "float32"), w: R.Tensor((8, 8), "float32")):
        with R.dataflow():
            lv = R.matmul(x, w)
            lv1 = R.multiply(lv, R.const(2.0, "float32"))
            lv2 = R.nn.relu(lv1)
            gv = R.matmul(lv2, R.multiply(w, R.const(1e-4, "float32")))
            R.output(gv)
        return gv


@I.ir_module
class ConvMatmul:
    @R.function
    def main(x: R.Tensor((1, 16, 16, 16), "float32"), w: R.Tensor((16, 16, 3, 3), "float32"),
             m: R.Tensor((16, 32), "float32")):
        with R.dataflow():
            lv = R.nn.conv2d(x, w, padding=[1, 1])
            lv1 = R.nn.relu(lv)
            lv2 = R.reshape(lv1, (16, 256))
            lv3 = R.matmul(R.permute_dims(lv2, [1, 0]), m)
            gv = R.multiply(lv3, lv3)
            R.output(gv)
        return gv


@I.ir_module
class Planted:
    """``a`` is the planted sensitive op: its dot products cancel (weights +-1000 plus small
    parts that float16 rounds away); every other op is benign."""

    @R.function
    def main(x: R.Tensor((4, 16), "float32"), pairs: R.Tensor((4, 16), "float32"),
             wc: R.Tensor((16, 16), "float32"), w: R.Tensor((16, 16), "float32")):
        with R.dataflow():
            a = R.matmul(pairs, wc)
            b = R.matmul(x, w)
            c = R.add(a, b)
            d = R.nn.relu(c)
            e = R.matmul(d, w)
            f = R.nn.relu(e)
            gv = R.matmul(f, w)
            R.output(gv)
        return gv


@I.ir_module
class Conv:
    @R.function
    def main(data: R.Tensor((1, 3, 16, 16), "float32"), w: R.Tensor((8, 3, 3, 3), "float32")):
        with R.dataflow():
            lv = R.nn.conv2d(data, w, padding=[1, 1])
            lv1 = R.nn.relu(lv)
            gv = R.mean(lv1, axis=[2, 3])
            R.output(gv)
        return gv


@I.ir_module
class DataBatchNorm:  # GluonCV's v2 ResNets: an inference batch_norm on the input first
    @R.function
    def main(data: R.Tensor((1, 3, 16, 16), "float32"), w: R.Tensor((8, 3, 3, 3), "float32"),
             mean: R.Tensor((3,), "float32"), var: R.Tensor((3,), "float32")):
        with R.dataflow():
            bn = R.nn.batch_norm(data, R.const(np.ones(3, "float32")),
                                 R.const(np.zeros(3, "float32")), mean, var, axis=1,
                                 training=False)
            lv = R.nn.conv2d(bn[0], w, padding=[1, 1])
            gv = R.nn.relu(lv)
            R.output(gv)
        return gv


@I.ir_module
class QDQ:
    @R.function
    def main(x: R.Tensor((1, 4, 8, 8), "float32"), w: R.Tensor((4, 4, 3, 3), "float32")):
        with R.dataflow():
            q = R.quantize(x, R.const(0.05, "float32"), R.const(0, "int8"), axis=1,
                           out_dtype="int8")
            d = R.dequantize(q, R.const(0.05, "float32"), R.const(0, "int8"), axis=1,
                             out_dtype="float32")
            c = R.nn.conv2d(d, w, padding=[1, 1])
            q2 = R.quantize(c, R.const(0.1, "float32"), R.const(0, "int8"), axis=1,
                            out_dtype="int8")
            d2 = R.dequantize(q2, R.const(0.1, "float32"), R.const(0, "int8"), axis=1,
                              out_dtype="float32")
            q3 = R.quantize(d2, R.const(0.1, "float32"), R.const(0, "int8"), axis=1,
                            out_dtype="int8")
            d3 = R.dequantize(q3, R.const(0.1, "float32"), R.const(0, "int8"), axis=1,
                              out_dtype="float32")
            q4 = R.quantize(d3, R.const(0.3, "float32"), R.const(0, "int8"), axis=1,
                            out_dtype="int8")
            gv = R.dequantize(q4, R.const(0.3, "float32"), R.const(0, "int8"), axis=1,
                              out_dtype="float32")
            R.output(gv)
        return gv


@I.ir_module
class PolicyNet:
    @R.function
    def main(x: R.Tensor((1, 8, 8, 8), "float32"), w: R.Tensor((8, 8, 3, 3), "float32"),
             dw: R.Tensor((8, 1, 3, 3), "float32")):
        with R.dataflow():
            lv = R.nn.conv2d(x, w, padding=[1, 1])
            lv1 = R.nn.relu(lv)
            lv2 = R.nn.conv2d(lv1, dw, padding=[1, 1], groups=8)
            lv3 = R.nn.softmax(lv2, axis=1)
            gv = R.nn.conv2d(lv3, w, padding=[1, 1])
            R.output(gv)
        return gv


#: Golden case name -> module: the names the goldens were recorded under
#: (``tests/eval/golden/<name>.<dtype>.<target>.txt``), the test file that tests the case and
#: its name there.
GOLDEN = {
    "test_api.MatmulReluMatmulSoftmax": MatmulReluMatmulSoftmax,
    "test_api.Small": MatmulReluMatmulSoftmax,
    "test_bad_inputs.Net": BadInputsNet,
    "test_boundary_range.Branchy": Branchy,
    "test_boundary_range.ProdAndRelu": ProdAndRelu,
    "test_boundary_range.ReduceProd": ReduceProd,
    "test_calibrate.Overflowing": Overflowing,
    "test_codegen_arm.ConvMatmul": ConvMatmul,
    "test_fallback.MatmulReluMatmulSoftmax": MatmulReluMatmulSoftmax,
    "test_fallback.Overflow": MatmulReluMatmulSoftmax,
    "test_fallback.Planted": Planted,
    "test_integer_inputs.Conv": Conv,
    "test_integer_inputs.DataBatchNorm": DataBatchNorm,
    "test_integer_inputs.QDQ": QDQ,
    "test_policy.Net": PolicyNet,
}
