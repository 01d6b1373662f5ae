"""enhance/onnx_graph.py: the rewrites behind the ``onnxruntime-int8`` backend. The layout rewrites must give the
same numbers; the 8-bit blockwise products must be close to float and leave no float weight behind."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from enhance import onnx_graph  # noqa: E402
from enhance.onnx_backend import export_step  # noqa: E402
from models import Enhancer, get_config  # noqa: E402


def _session(model) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def _feed(session: ort.InferenceSession, frames: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feed = {}
    slots = next(i.shape[-1] for i in session.get_inputs() if i.name == "k_0")  # keys: [B, H, Dh, C]
    for i in session.get_inputs():
        shape = [frames if isinstance(d, str) else d for d in i.shape]
        if i.name == "mask":
            shape = [frames, slots + frames]
        feed[i.name] = (rng.standard_normal(shape) * 0.5).astype(np.float32)
    mask = feed["mask"]  # every slot and the new frames up to each: visible (a causal mask over the new ones)
    mask[:] = 0.0
    mask[:, -frames:] = np.where(np.tri(frames, dtype=bool), 0.0, -np.inf)
    return feed


def _tiny_step(tmp_path: Path, name: str, frames: int | None):
    """A tiny model's exported step with its constants folded, as quantize_graph has it before the rewrites."""
    torch.manual_seed(0)
    model = Enhancer(get_config(name)).eval()
    path = export_step(model, tmp_path / f"{name}-{frames}.onnx", frames=frames)
    onnx_graph.fold_constants(path, tmp_path / f"{name}-{frames}-folded.onnx")
    return onnx.load(str(tmp_path / f"{name}-{frames}-folded.onnx"))


@pytest.mark.parametrize("name", ["tiny", "tiny-transformer", "tiny+mae"])
def test_layout_rewrites_give_the_same_numbers_with_fewer_operations(tmp_path: Path, name: str) -> None:
    """The one-frame step: transposes of size-1 axes become reshapes, reshape chains merge; the outputs are the
    same to the last bit, and there are fewer operations (no transpose left that only moves size-1 axes)."""
    step = _tiny_step(tmp_path, name, frames=1)
    before = _session(step)
    feed = _feed(before, 1)
    want = before.run(None, feed)
    n_before = len(step.graph.node)
    counts = onnx_graph.simplify_layout(step)
    onnx.checker.check_model(step)
    assert counts["transposes as reshapes"] > 0 and counts["reshapes merged"] > 0
    assert len(step.graph.node) < n_before - counts["transposes as reshapes"] // 2
    got = _session(step).run(None, feed)
    for a, b in zip(want, got, strict=True):
        assert a.shape == b.shape and np.array_equal(a, b)
    producer = {out: node.op_type for node in step.graph.node for out in node.output}
    reshapes = [node for node in step.graph.node if node.op_type == "Reshape"]
    assert reshapes and not [n for n in reshapes if producer.get(n.input[0]) == "Reshape"]  # chains merged
    assert onnx_graph.simplify_layout(step)["transposes as reshapes"] == 0  # a second run: nothing left to do
    onnx.checker.check_model(step)


def test_layout_rewrites_leave_a_free_frame_count_step_working(tmp_path: Path) -> None:
    """With a free number of frames, shapes that depend on it are not fixed: those operations stay, and the step
    still gives its numbers for 1 and 3 frames per call."""
    step = _tiny_step(tmp_path, "tiny", frames=None)
    before = _session(step)
    onnx_graph.simplify_layout(step)
    after = _session(step)
    for frames in (1, 3):
        feed = _feed(before, frames, seed=frames)
        for a, b in zip(before.run(None, feed), after.run(None, feed), strict=True):
            assert np.array_equal(a, b)


def test_blockwise_weights_round_each_block_to_its_own_scale() -> None:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((70, 5)).astype(np.float32)  # 70 rows: 3 blocks of 32, the last one padded
    w[32:64, 1] *= 1e-3  # a quiet block keeps its precision (a per-tensor scale would round it to 0)
    w[:, 4] = 0.0
    codes, scales = onnx_graph.blockwise_weights(w, 32)
    assert codes.dtype == np.uint8 and codes.shape == (5, 3, 32) and scales.shape == (15,)
    largest = np.abs(codes.astype(int) - 128).max(
        axis=-1
    )  # each block's largest weight is code +-127 exactly
    assert np.all(largest[:4] == 127) and np.all(largest[4] == 0)
    back = (codes.astype(np.float32) - 128) * scales.reshape(5, 3, 1)
    back = back.reshape(5, 96)[:, :70].T
    step = np.repeat(scales.reshape(5, 3), 32, axis=1)[:, :70].T
    assert np.all(np.abs(back - w) <= step / 2 + 1e-7)
    assert np.abs(back[32:64, 1] - w[32:64, 1]).max() < 1e-5
    assert np.all(codes[4] == 128) and np.all(scales.reshape(5, 3)[4] == 1.0)  # zeros: code 128, scale 1
    assert np.all(codes[:, 2, 6:] == 128)  # the padding rows are zeros


def _products_graph(opset: int):
    """y = Gemm(x, A^T, b) (transB), z = per-group MatMul of y viewed as [2, 1, 24] by W [2, 24, 16], and
    u = z @ V (a plain MatMul): every kind of product the rewrite covers."""
    rng = np.random.default_rng(1)
    a = rng.standard_normal((48, 40)).astype(np.float32)  # transB: [N, K]
    b = rng.standard_normal(48).astype(np.float32)
    w = rng.standard_normal((2, 24, 16)).astype(np.float32)
    v = rng.standard_normal((16, 8)).astype(np.float32)
    nodes = [
        helper.make_node("Gemm", ["x", "A", "b"], ["y"], transB=1),
        helper.make_node("Reshape", ["y", "s"], ["y3"]),
        helper.make_node("MatMul", ["y3", "W"], ["z"]),
        helper.make_node("MatMul", ["z", "V"], ["u"]),
    ]
    constants = [
        numpy_helper.from_array(a, "A"),
        numpy_helper.from_array(b, "b"),
        numpy_helper.from_array(w, "W"),
        numpy_helper.from_array(v, "V"),
        numpy_helper.from_array(np.array([2, 1, 24], np.int64), "s"),
    ]
    graph = helper.make_graph(
        nodes,
        "products",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 40])],
        [helper.make_tensor_value_info("u", TensorProto.FLOAT, [2, 1, 8])],
        constants,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("opset", [17, 18])
def test_blockwise_int8_rewrites_every_constant_product_and_stays_close(opset: int) -> None:
    model = _products_graph(opset)
    x = np.random.default_rng(2).standard_normal((1, 40)).astype(np.float32)
    want = _session(model).run(None, {"x": x})[0]
    assert onnx_graph.blockwise_int8(model) == 3
    onnx.checker.check_model(model)
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("MatMulNBits") == 4 and "Gemm" not in ops and "MatMul" not in ops  # 1 + 2 groups + 1
    assert {t.name for t in model.graph.initializer}.isdisjoint({"A", "W", "V"})  # the float weights are gone
    got = _session(model).run(None, {"x": x})[0]
    snr = 10 * np.log10(np.sum(want**2) / np.sum((got - want) ** 2))
    assert 30.0 < snr < 80.0  # 8 bits with int8 inputs: close, and not the float numbers


def test_quantize_graph_refuses_a_graph_without_a_product(tmp_path: Path) -> None:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "none",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(tmp_path / "relu.onnx"))
    with pytest.raises(ValueError, match="no matrix product with a constant weight"):
        onnx_graph.quantize_graph(tmp_path / "relu.onnx", tmp_path / "out.onnx")
    assert not (tmp_path / "out.onnx").exists()


def _one_node_graph(node, inputs, output, constants, opset: int = 17):
    graph = helper.make_graph(
        [node],
        "one",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n, shape in inputs],
        [helper.make_tensor_value_info(output[0], TensorProto.FLOAT, output[1])],
        [numpy_helper.from_array(v, k) for k, v in constants.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def test_products_the_rewrite_does_not_cover_are_left_in_float() -> None:
    """A Gemm that scales or transposes its input, a bias that broadcasts from [1], a per-group weight [G, K, N]
    under an input that is not [G, M, K] (a broadcast MatMul), a float16 weight: each stays as it was, and the
    graph gives the same numbers."""
    rng = np.random.default_rng(3)
    w2, w3 = (
        rng.standard_normal((32, 8)).astype(np.float32),
        rng.standard_normal((2, 32, 8)).astype(np.float32),
    )
    cases = [
        (helper.make_node("Gemm", ["x", "W"], ["y"], alpha=2.0), [("x", [4, 32])], ("y", [4, 8]), {"W": w2}),
        (helper.make_node("Gemm", ["x", "W"], ["y"], transA=1), [("x", [32, 4])], ("y", [4, 8]), {"W": w2}),
        (
            helper.make_node("Gemm", ["x", "W", "b"], ["y"]),
            [("x", [4, 32])],
            ("y", [4, 8]),
            {"W": w2, "b": np.ones(1, np.float32)},
        ),
        (helper.make_node("MatMul", ["x", "W"], ["y"]), [("x", [4, 32])], ("y", [2, 4, 8]), {"W": w3}),
        (
            helper.make_node("MatMul", ["x", "W"], ["y"]),
            [("x", [3, 2, 5, 32])],
            ("y", [3, 2, 5, 8]),
            {"W": w3},
        ),
    ]
    for node, inputs, output, constants in cases:
        model = _one_node_graph(node, inputs, output, constants)
        feed = {n: rng.standard_normal(shape).astype(np.float32) for n, shape in inputs}
        want = _session(model).run(None, feed)[0]
        assert onnx_graph.blockwise_int8(model) == 0, node
        assert [n.op_type for n in model.graph.node] == [node.op_type]
        assert np.array_equal(_session(model).run(None, feed)[0], want)
    half = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])],
        "half",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [1, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [1, 8])],
        [numpy_helper.from_array(w2.astype(np.float16), "W")],
    )
    model = helper.make_model(half, opset_imports=[helper.make_opsetid("", 17)])
    assert onnx_graph.blockwise_int8(model) == 0
    onnx.checker.check_model(model)


def test_a_transpose_without_perm_reverses_its_axes() -> None:
    """No ``perm``: the axes reversed (ONNX's default); [1, 5] -> [5, 1] only moves a size-1 axis."""
    model = _one_node_graph(helper.make_node("Transpose", ["x"], ["y"]), [("x", [1, 5])], ("y", [5, 1]), {})
    x = np.arange(5, dtype=np.float32)[None]
    assert onnx_graph.simplify_layout(model)["transposes as reshapes"] == 1
    assert np.array_equal(_session(model).run(None, {"x": x})[0], x.T)


def test_graphs_with_sub_graphs_are_refused() -> None:
    """The rewrites follow names through the main graph only: an If/Loop/Scan body could read a value they
    rename or drop, so such graphs are refused, not rewritten wrongly."""
    branch = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["z"])],
        "branch",
        [],
        [helper.make_tensor_value_info("z", 1, [1, 4])],
    )
    node = helper.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=branch)
    graph = helper.make_graph(
        [node],
        "if",
        [
            helper.make_tensor_value_info("c", TensorProto.BOOL, []),
            helper.make_tensor_value_info("x", 1, [1, 4]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    for rewrite in (onnx_graph.simplify_layout, onnx_graph.blockwise_int8):
        with pytest.raises(ValueError, match="sub-graph"):
            rewrite(model)


def test_an_onnxruntime_without_8bit_kernels_is_refused_with_what_to_install(
    tmp_path: Path, monkeypatch
) -> None:
    """onnxruntime before 1.23 lacks the 8-bit MatMulNBits kernels (x86-64 from 1.22, ARM64 from 1.23) and fails
    in its own words, or only when it runs: the backend by name, an 8-bit step file and the quantiser say which
    version to install instead; the float step still runs."""
    from enhance.backends import streaming_backend
    from enhance.onnx_backend import OnnxStepper, quantize_step

    torch.manual_seed(0)
    model = Enhancer(get_config("tiny")).eval()
    float_path = export_step(model, tmp_path / "step.onnx")
    int8_path = quantize_step(float_path, tmp_path / "step-int8.onnx")
    monkeypatch.setattr(ort, "__version__", "1.20.1")
    for attempt in (
        lambda: streaming_backend(model, "onnxruntime-int8"),
        lambda: OnnxStepper(int8_path, model),
        lambda: quantize_step(float_path, tmp_path / "again.onnx"),
    ):
        with pytest.raises(ImportError, match=r"onnxruntime 1\.23 or later, found 1\.20\.1: pip install"):
            attempt()
    assert not (tmp_path / "again.onnx").exists()
    OnnxStepper(float_path, model)
    monkeypatch.setattr(ort, "__version__", "1.23.0")
    OnnxStepper(int8_path, model)
