"""Session 29: onnxruntime's cost per trivial operation: chains of 2 and 202 Reshape, Add or Transpose nodes on a
[1, 256] tensor (graph optimisations off, one thread), fastest of 5 batches of 2,000 runs; prints microseconds per
added node.

    python bench/results/int8-blockwise/per_node.py
"""

import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper


def chain(op: str, n: int) -> ort.InferenceSession:
    constants = [
        numpy_helper.from_array(np.array([2, 128], np.int64), "s1"),
        numpy_helper.from_array(np.array([1, 256], np.int64), "s2"),
        numpy_helper.from_array(np.ones((1, 256), np.float32), "one"),
    ]
    nodes, prev = [], "x"
    for i in range(n):
        out = f"t{i}" if i < n - 1 else "y"
        if op == "Reshape":
            nodes.append(helper.make_node("Reshape", [prev, "s1" if i % 2 == 0 else "s2"], [out]))
        elif op == "Add":
            nodes.append(helper.make_node("Add", [prev, "one"], [out]))
        else:
            nodes.append(helper.make_node("Transpose", [prev], [out], perm=[1, 0]))
        prev = out
    out_shape = [1, 256] if n % 2 == 0 or op == "Add" else ([2, 128] if op == "Reshape" else [256, 1])
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)],
        constants,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.log_severity_level = 3
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def per_run(session: ort.InferenceSession) -> float:
    x = {"x": np.ones((1, 256), np.float32)}
    for _ in range(200):
        session.run(None, x)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(2000):
            session.run(None, x)
        best = min(best, (time.perf_counter() - t0) / 2000)
    return best


print("| operation | µs per added node | µs per run of a 2-node graph |\n|---|---|---|")
for op in ("Reshape", "Add", "Transpose"):
    short, long = per_run(chain(op, 2)), per_run(chain(op, 202))
    print(f"| {op} | {(long - short) / 200 * 1e6:.2f} | {short * 1e6:.1f} |")
