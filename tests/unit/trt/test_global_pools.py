"""Which average pools are written as GlobalAveragePool for TensorRT's parser: only those whose window covers
their whole, statically known input with one output per channel; each rewrite runs as the original did."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from pipeline.toolchain.trt.global_pools import global_average_pools


def _pool(shape: list, **attrs: object) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    node = helper.make_node("AveragePool", ["x"], ["y"], **attrs)
    model = helper.make_model(
        helper.make_graph([node], "pool", [x], [y]), opset_imports=[helper.make_opsetid("", 18)]
    )
    model.ir_version = 8
    return model


def _run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


@pytest.mark.parametrize(
    "attrs",
    [
        {"kernel_shape": [1280, 1280], "strides": [1280, 1280], "ceil_mode": 1},  # EfficientNet's pooler
        {"kernel_shape": [7, 7]},  # a window exactly the map
        {"kernel_shape": [9, 9], "strides": [9, 9], "ceil_mode": 1, "count_include_pad": 1},
    ],
)
def test_a_window_over_the_whole_map_is_a_global_average(attrs: dict) -> None:
    model = _pool(["batch", 3, 7, 7], **attrs)
    x = np.random.default_rng(0).standard_normal((2, 3, 7, 7)).astype(np.float32)
    want = _run(model, x)
    assert global_average_pools(model) == 1 and model.graph.node[0].op_type == "GlobalAveragePool"
    assert np.allclose(_run(model, x), want, atol=1e-6)


@pytest.mark.parametrize(
    "shape, attrs",
    [
        ([2, 3, 7, 7], {"kernel_shape": [3, 3]}),  # a sliding window
        ([2, 3, 7, 7], {"kernel_shape": [9, 9], "pads": [1, 1, 1, 1], "ceil_mode": 1}),  # padded
        (["batch", 3, "h", "w"], {"kernel_shape": [1280, 1280], "strides": [1280, 1280], "ceil_mode": 1}),
        ([2, 3, 7, 7], {"kernel_shape": [20, 20], "strides": [1, 1], "ceil_mode": 1}),  # no output at all
    ],
)
def test_other_pools_are_left_as_they_are(shape: list, attrs: dict) -> None:
    model = _pool(shape, **attrs)
    assert global_average_pools(model) == 0 and model.graph.node[0].op_type == "AveragePool"
