"""One peer runtime running one model ``runs`` times (:mod:`relay_amp.eval.arm_peers`).

Runs under the emulated aarch64 Python of scripts/arm/setup_peers.sh, which has numpy and the
peers only (no relay_amp, no TVM):

    python3.11 arm_peer_runner.py litert|onnxruntime MODEL INPUTS.npz RUNS OUTPUTS.npz

The inputs (``arr_0``, ``arr_1``, ... in the model's input order) are set once, the model runs
``runs`` times on one thread, and the last run's outputs are saved in the model's output order.
"""

import sys

import numpy as np


def litert(model: str, inputs: list, runs: int) -> list:
    """LiteRT's interpreter (its default XNNPACK delegate) on one thread."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=model, num_threads=1)
    interpreter.allocate_tensors()
    for detail, array in zip(interpreter.get_input_details(), inputs):
        interpreter.set_tensor(detail["index"], array)
    for _ in range(runs):
        interpreter.invoke()
    return [interpreter.get_tensor(d["index"]) for d in interpreter.get_output_details()]


def onnxruntime(model: str, inputs: list, runs: int) -> list:
    """ONNX Runtime's CPU provider on one thread, no spinning."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    feed = {i.name: array for i, array in zip(session.get_inputs(), inputs)}
    outputs = []
    for _ in range(runs):
        outputs = session.run(None, feed)
    return outputs


def main(argv: list) -> int:
    peer, model, inputs_path, runs, outputs_path = argv
    with np.load(inputs_path) as saved:
        inputs = [saved[f"arr_{i}"] for i in range(len(saved.files))]
    outputs = {"litert": litert, "onnxruntime": onnxruntime}[peer](model, inputs, int(runs))
    np.savez(outputs_path, *[np.asarray(o) for o in outputs])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
