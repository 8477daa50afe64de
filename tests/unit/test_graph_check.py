"""Rewritten graphs are checked before anything uses them: the ONNX checker (ONNX Runtime's own default-domain
ops left to ONNX Runtime), a real ONNX Runtime session, and a run beside the source graph."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from pipeline.check.graph_check import GraphRejected, check_graph


def _model(
    nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto], x_shape: list, y_shape: list
) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def linear(scale: float = 1.0) -> onnx.ModelProto:
    weight = numpy_helper.from_array(np.eye(3, dtype=np.float32) * scale, "w")
    return _model([helper.make_node("MatMul", ["x", "w"], ["y"])], [weight], [2, 3], [2, 3])


FEEDS = {"x": np.arange(6, dtype=np.float32).reshape(2, 3) + 1}


def test_a_good_rewrite_passes() -> None:
    check_graph(linear(2.0), linear(), FEEDS)  # same direction: a scaled output keeps cosine 1


def test_a_graph_onnx_runtime_cannot_load_is_rejected() -> None:
    """GPT-2's fused graph: a Gemm fed a rank-3 tensor (ONNX Runtime's shape inference refuses it)."""
    weight = numpy_helper.from_array(np.ones((3, 3), np.float32), "w")
    bad = _model([helper.make_node("Gemm", ["x", "w"], ["y"])], [weight], [1, 2, 3], [1, 2, 3])
    with pytest.raises(GraphRejected, match="ONNX Runtime could not load it"):
        check_graph(bad)


def test_a_rewrite_that_computes_something_else_is_rejected() -> None:
    weight = numpy_helper.from_array(-np.eye(3, dtype=np.float32), "w")
    flipped = _model([helper.make_node("MatMul", ["x", "w"], ["y"])], [weight], [2, 3], [2, 3])
    with pytest.raises(GraphRejected, match="departs from the source"):
        check_graph(flipped, linear(), FEEDS)


def test_onnx_runtimes_own_default_domain_ops_are_left_to_onnx_runtime() -> None:
    """T5's fused RMS norm: SimplifiedLayerNormalization in the default domain, which the ONNX checker has no
    schema for (it rejected the graph) but ONNX Runtime runs."""
    scale = numpy_helper.from_array(np.ones(3, np.float32), "scale")
    node = helper.make_node("SimplifiedLayerNormalization", ["x", "scale"], ["y"], axis=-1, epsilon=1e-6)
    model = _model([node], [scale], [2, 3], [2, 3])
    with pytest.raises(onnx.checker.ValidationError):
        onnx.checker.check_model(model)
    check_graph(model)


def test_a_graph_the_checker_rejects_is_rejected() -> None:
    broken = _model([helper.make_node("MatMul", ["x", "missing"], ["y"])], [], [2, 3], [2, 3])
    with pytest.raises(GraphRejected, match="ONNX checker"):
        check_graph(broken)
