"""Rewrites of an exported step's ONNX graph for the ``onnxruntime-int8`` backend (:func:`enhance.onnx_backend.
quantize_step` runs them in this order):

1. :func:`fold_constants`: onnxruntime's pre-processing without its symbolic shape inference (which gives up on
   the step's free frame count). The fused weights that the step computes in the graph (Q/K/V with the competition
   score, the pre-encoder's conv weights reshaped for one product) become constants, so that step 2 sees them.
2. :func:`blockwise_int8`: every matrix product with a constant weight becomes onnxruntime's ``MatMulNBits``
   (``com.microsoft``) with 8-bit weights, symmetric, one scale per block of ``block_size`` input rows of each
   output column. The per-mechanism (batched) products are split into one product per mechanism, since
   ``MatMulNBits`` takes a 2-D weight. With ``accuracy_level`` 4, onnxruntime quantises each product's input to
   int8 per block as it runs and multiplies in int8 (VNNI/AVX-512/AVX2 on x86-64, dot-product instructions on
   ARM64; its 8-bit kernels are in onnxruntime 1.23 and later).
3. :func:`simplify_layout`: where the shapes are fixed (the one-frame step), a transpose that only moves axes of
   size 1 is a reshape, and a chain of reshapes is one; the graph computes the same numbers with fewer operations
   (onnxruntime runs each with a fixed cost, which is most of a one-frame step's time).

Session 29 measured (``bench/README.md``, "int8 weights per block"): blockwise 8-bit weights are about 9 dB
closer to the float32 output than onnxruntime's per-tensor dynamic quantisation, which this replaces, at about
the same speed per 16-ms hop (1.01-1.02x; 1.05-1.07x with 32-ms chunks).

Graphs with sub-graphs (If/Loop/Scan) are refused: the rewrites follow names through the main graph only.
"""

from __future__ import annotations

import os
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

BLOCK_SIZE = 32  # input rows per weight scale: 32 is the closest to float of 32, 64 and 128 (session 29)
MS_DOMAIN = "com.microsoft"
NEEDS_ONNXRUNTIME = (1, 23)  # the first release with 8-bit MatMulNBits kernels on both x86-64 and ARM64


def onnxruntime_too_old() -> str | None:
    """The installed onnxruntime's version when it is older than :data:`NEEDS_ONNXRUNTIME` (None: new enough)."""
    import re

    import onnxruntime

    version = onnxruntime.__version__
    numbers = tuple(int(n) for n in re.findall(r"\d+", version)[:2])
    return version if numbers < NEEDS_ONNXRUNTIME else None


def require_8bit_kernels() -> None:
    """Raise ImportError, saying what to install, when onnxruntime cannot run 8-bit ``MatMulNBits``."""
    old = onnxruntime_too_old()
    if old is not None:
        need = ".".join(map(str, NEEDS_ONNXRUNTIME))
        raise ImportError(
            f"8-bit weights per block (the onnxruntime-int8 step) need onnxruntime {need} or later, found {old}: "
            f"pip install -U 'onnxruntime>={need}'"
        )


def fold_constants(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
    """``src`` with its constant sub-graphs folded, written to ``dst``."""
    from onnxruntime.quantization.shape_inference import quant_pre_process

    quant_pre_process(str(src), str(dst), skip_symbolic_shape=True)


def blockwise_weights(w: np.ndarray, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """A weight ``w`` [K, N] (y = x @ w) as ``MatMulNBits`` stores it with 8 bits: the codes [N, blocks,
    block_size] (uint8, the value + 128; K padded with zeros to whole blocks) and the scales [N * blocks]
    (float32, each block's largest magnitude / 127; a block of zeros gets 1)."""
    k, n = w.shape
    blocks = -(-k // block_size)
    padded = np.zeros((blocks * block_size, n), np.float32)
    padded[:k] = w
    per_block = padded.T.reshape(n, blocks, block_size)
    scale = np.abs(per_block).max(axis=-1) / 127.0
    scale[scale == 0] = 1.0
    codes = np.clip(np.round(per_block / scale[..., None]), -127, 127) + 128
    return codes.astype(np.uint8), scale.astype(np.float32).reshape(-1)


def blockwise_int8(model: Any, block_size: int = BLOCK_SIZE) -> int:
    """Rewrite ``model`` (an ``onnx.ModelProto``) in place: each ``MatMul`` or ``Gemm`` (alpha = beta = 1, A not
    transposed) whose weight is a constant becomes ``MatMulNBits`` with 8-bit blockwise weights (a ``Gemm``'s bias
    goes along); a ``MatMul`` by a constant [G, K, N] (the per-mechanism products) becomes a ``Split`` of its
    input into the G mechanisms, G of them and a ``Concat``. Returns how many products were rewritten; the float
    weights they no longer use are dropped."""
    from onnx import TensorProto, helper, numpy_helper

    _refuse_subgraphs(model)
    graph = model.graph
    inputs = {
        i.name for i in graph.input
    }  # an initializer that is also an input can be overridden: not constant
    constants = {t.name: t for t in graph.initializer if t.name not in inputs}
    ranks = _dims(model)  # each value's dimensions (None where not fixed), for the per-group products' inputs
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 17)
    nodes: list[Any] = []
    rewritten = 0

    def product(a: str, w: np.ndarray, out: str, name: str, bias: str | None = None) -> Any:
        codes, scales = blockwise_weights(w, block_size)
        qname, sname = f"{name}_codes", f"{name}_scales"
        graph.initializer.extend(
            [numpy_helper.from_array(codes, qname), numpy_helper.from_array(scales, sname)]
        )
        inputs = [a, qname, sname] + (["", "", bias] if bias else [])  # zero points and g_idx left out
        k, n = w.shape
        return helper.make_node(
            "MatMulNBits", inputs, [out], name=name, domain=MS_DOMAIN,
            K=k, N=n, bits=8, block_size=block_size, accuracy_level=4,
        )  # fmt: skip

    for node in graph.node:
        weight = constants.get(node.input[1]) if node.op_type in ("MatMul", "Gemm") else None
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        plain = (
            attrs.get("alpha", 1.0) == 1.0 and attrs.get("beta", 1.0) == 1.0 and not attrs.get("transA", 0)
        )
        if weight is None or not plain or weight.data_type != TensorProto.FLOAT:
            nodes.append(node)
            continue
        w = numpy_helper.to_array(weight)
        if w.ndim == 2 and attrs.get("transB", 0):
            w = w.T
        bias = node.input[2] if node.op_type == "Gemm" and len(node.input) > 2 and node.input[2] else None
        bias_ok = bias is None or (bias in constants and list(constants[bias].dims) == [w.shape[-1]])
        by_group = ranks.get(node.input[0])  # the per-group form needs the input [G, M, K] (M may be free)
        if w.ndim == 2 and bias_ok:
            nodes.append(product(node.input[0], w, node.output[0], f"{node.output[0]}_q8", bias))
        elif (
            w.ndim == 3
            and node.op_type == "MatMul"
            and by_group is not None
            and len(by_group) == 3
            and by_group[0] == w.shape[0]
        ):
            groups = w.shape[0]
            parts = [f"{node.output[0]}_group{g}" for g in range(groups)]
            outs = [f"{node.output[0]}_group{g}_out" for g in range(groups)]
            split = {"num_outputs": groups} if opset >= 18 else {}
            nodes.append(
                helper.make_node(
                    "Split", [node.input[0]], parts, name=f"{node.output[0]}_split", axis=0, **split
                )
            )
            nodes += [
                product(parts[g], w[g], outs[g], f"{node.output[0]}_group{g}_q8") for g in range(groups)
            ]
            nodes.append(
                helper.make_node("Concat", outs, [node.output[0]], name=f"{node.output[0]}_concat", axis=0)
            )
        else:
            nodes.append(node)
            continue
        rewritten += 1
    del graph.node[:]
    graph.node.extend(nodes)
    if not any(o.domain == MS_DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))
    _drop_unused(model)
    return rewritten


def _refuse_subgraphs(model: Any) -> None:
    """These rewrites follow names through the main graph only: a graph with If/Loop/Scan bodies (which read
    outer names) is refused rather than rewritten wrongly. The exported steps have none."""
    from onnx import AttributeProto

    for node in model.graph.node:
        if any(a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS) for a in node.attribute):
            raise ValueError(f"{node.op_type} node {node.name!r} has a sub-graph: not supported here")


def _dims(model: Any) -> dict[str, list[int | None]]:
    """Every value's dimensions where shape inference knows its rank, by name (None for a free dimension)."""
    from onnx import shape_inference

    inferred = shape_inference.infer_shapes(model)
    dims: dict[str, list[int | None]] = {t.name: list(t.dims) for t in inferred.graph.initializer}
    for value in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]:
        tensor = value.type.tensor_type
        if tensor.HasField("shape"):
            dims[value.name] = [d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim]
    return dims


def _static_shapes(model: Any) -> dict[str, list[int]]:
    """Every value of ``model`` whose shape ONNX shape inference fixes, by name (not empty ones: a 0 in a
    ``Reshape``'s shape means "as in the input")."""
    fixed = {name: d for name, d in _dims(model).items() if None not in d and 0 not in d}
    return {name: [int(n) for n in d if n is not None] for name, d in fixed.items()}


def simplify_layout(model: Any) -> dict[str, int]:
    """Rewrite ``model`` in place, where shape inference fixes the shapes involved: a ``Transpose`` whose
    permutation keeps the order of the axes longer than 1 becomes a ``Reshape`` (the same elements in the same
    order); each ``Reshape`` gets its output shape as a constant and reads the input of a ``Reshape`` before it
    (Reshape(Reshape(x)) = Reshape(x)); a ``Reshape`` to the shape it already has is dropped (its readers read its
    input). Exact: the same numbers, fewer operations. Returns the counts of each rewrite."""
    from onnx import helper, numpy_helper

    _refuse_subgraphs(model)
    shapes = _static_shapes(model)
    graph = model.graph
    existing = {t.name for t in graph.initializer}

    def shape_constant(shape: list[int]) -> str:
        name = "layout_shape_" + ("x".join(map(str, shape)) or "scalar")  # the same name holds the same shape
        if name not in existing:
            existing.add(name)
            graph.initializer.append(numpy_helper.from_array(np.array(shape, np.int64), name))
        return name

    kinds = (
        "transposes as reshapes",
        "reshapes merged",
        "identity reshapes dropped",
        "unused operations dropped",
    )
    counts: Counter[str] = Counter(dict.fromkeys(kinds, 0))
    nodes = list(graph.node)
    for i, node in enumerate(nodes):
        if node.op_type != "Transpose" or node.input[0] not in shapes or node.output[0] not in shapes:
            continue
        rank = len(shapes[node.input[0]])
        perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), list(range(rank))[::-1])
        moved = [axis for axis in perm if shapes[node.input[0]][axis] != 1]
        if moved == sorted(moved):
            target = shape_constant(shapes[node.output[0]])
            nodes[i] = helper.make_node("Reshape", [node.input[0], target], list(node.output), name=node.name)
            counts["transposes as reshapes"] += 1
    producer = {out: node for node in nodes for out in node.output}
    for node in nodes:
        if node.op_type != "Reshape" or node.output[0] not in shapes:
            continue
        node.input[1] = shape_constant(shapes[node.output[0]])
        before = producer.get(node.input[0])
        while before is not None and before.op_type == "Reshape":
            node.input[0] = before.input[0]
            counts["reshapes merged"] += 1
            before = producer.get(node.input[0])
    outputs = {o.name for o in graph.output}
    renamed: dict[str, str] = {}
    kept = []
    for node in nodes:
        for k, name in enumerate(node.input):
            node.input[k] = renamed.get(name, name)
        reshape = node.op_type == "Reshape" and node.output[0] not in outputs
        if reshape and _same_shape(shapes, node.input[0], node.output[0]):
            renamed[node.output[0]] = node.input[0]
            counts["identity reshapes dropped"] += 1
            continue
        kept.append(node)
    del graph.node[:]
    graph.node.extend(kept)
    counts["unused operations dropped"] = _drop_unused(model)
    return dict(counts)


def _same_shape(shapes: dict[str, list[int]], a: str, b: str) -> bool:
    return a in shapes and shapes[a] == shapes.get(b)


def _drop_unused(model: Any) -> int:
    """Remove the operations whose outputs nothing reads (and the constants nothing reads); returns how many
    operations went."""
    graph = model.graph
    needed = {o.name for o in graph.output}
    alive = []
    for node in reversed(graph.node):
        if any(out in needed for out in node.output):
            alive.append(node)
            needed.update(node.input)
    dropped = len(graph.node) - len(alive)
    alive.reverse()
    del graph.node[:]
    graph.node.extend(alive)
    constants = [t for t in graph.initializer if t.name in needed]
    del graph.initializer[:]
    graph.initializer.extend(constants)
    return dropped


def quantize_graph(
    src: str | os.PathLike[str], dst: str | os.PathLike[str], block_size: int = BLOCK_SIZE
) -> None:
    """Steps 1-3 of this module: ``src`` (a float step from :func:`enhance.onnx_backend.export_step`) with 8-bit
    blockwise weights, written to ``dst`` (not atomically: the caller's temporary path)."""
    import onnx

    require_8bit_kernels()
    with tempfile.TemporaryDirectory() as tmp:
        folded = Path(tmp) / "folded.onnx"
        fold_constants(src, folded)
        model = onnx.load(str(folded))
    if not blockwise_int8(model, block_size):
        raise ValueError(f"{src}: no matrix product with a constant weight to quantise")
    simplify_layout(model)
    onnx.checker.check_model(model)
    onnx.save(model, str(dst))
