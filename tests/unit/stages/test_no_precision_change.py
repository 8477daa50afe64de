"""A graph that computes in float64: the FP16 converter and both INT8 quantizers take float32 only, so their
copies are the same float64 graph. Such a copy is a failed variant, never an "fp16" or "int8" artifact that is
timed, chosen and flagged as one (a hold-out model's empty INT8 graph tied with the winner)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from pipeline.core.errors import StageError
from tests.unit.stages.onnx_fixtures import record, tiny_context


@pytest.fixture(scope="module")
def float64_graph(tmp_path_factory: pytest.TempPathFactory) -> Path:
    weights = np.random.default_rng(0).normal(size=(1, 4))
    graph = helper.make_graph(
        [
            helper.make_node("Cast", ["input_ids"], ["ids"], to=TensorProto.DOUBLE),
            helper.make_node("Unsqueeze", ["ids", "axis"], ["column"]),
            helper.make_node("MatMul", ["column", "w"], ["projected"]),
            helper.make_node("Cast", ["projected"], ["hidden"], to=TensorProto.FLOAT),
            helper.make_node("ReduceMean", ["hidden", "seq_axis"], ["pooled"], keepdims=0),
        ],
        "float64",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"])],
        [
            helper.make_tensor_value_info("hidden", TensorProto.FLOAT, ["batch", "sequence", 4]),
            helper.make_tensor_value_info("pooled", TensorProto.FLOAT, ["batch", 4]),
        ],
        [
            helper.make_tensor("w", TensorProto.DOUBLE, weights.shape, weights.ravel()),
            helper.make_tensor("axis", TensorProto.INT64, [1], [2]),
            helper.make_tensor("seq_axis", TensorProto.INT64, [1], [1]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    path = tmp_path_factory.mktemp("float64") / "model.onnx"
    onnx.save(model, path)
    return path


@pytest.mark.parametrize(
    ("stage", "variant", "message"),
    [
        ("fp16", "onnx-fp16", "no node of the converted graph computes in float16"),
        (
            "int8_dynamic",
            "onnx-int8-dynamic",
            "nothing was quantized: .*none of this graph.s 1 MatMul/Gemm node.s. has a float32 weight",
        ),
        ("int8", "onnx-int8", "nothing to quantize|quantized none of the"),
        ("int8_mixed", "onnx-int8-mixed", "nothing was quantized: ONNX Runtime's dynamic quantizer"),
    ],
)
def test_a_copy_that_changed_no_precision_fails_its_variant(
    float64_graph: Path, tmp_path: Path, stage: str, variant: str, message: str
) -> None:
    ctx = tiny_context(tmp_path, "export.int8.exclude_feed_forward=false")
    with pytest.raises(StageError, match=message):
        ctx.run_named(stage, {"onnx-fp32": record(float64_graph)}, variants=[variant])


def test_a_graph_without_matmul_or_gemm_fails_dynamic_int8_saying_so(tmp_path: Path) -> None:
    """Dynamic INT8 quantizes MatMul and Gemm weights only: a graph of convolutions gets nothing from it, and the
    reason must say the graph has no such node (not "none of its 0 nodes")."""
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1])],
        "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 2, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4, 8])],
        [helper.make_tensor("w", TensorProto.FLOAT, [4, 2, 3], np.ones(24, dtype=np.float32))],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    path = tmp_path / "conv.onnx"
    onnx.save(model, path)
    ctx = tiny_context(tmp_path)
    with pytest.raises(StageError, match="nothing was quantized: .*this graph has no MatMul or Gemm node"):
        ctx.run_named("int8_dynamic", {"onnx-fp32": record(path)}, variants=["onnx-int8-dynamic"])
