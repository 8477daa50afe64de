"""The CUDA-graph mode of ONNX Runtime, structurally on the CPU: the fixed-dims rewrite (no shape ops left, same
outputs), the session and provider options, and which artifacts get a graph runner. The GPU test runs it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from pipeline.inputs.specs import dim_sizes
from pipeline.runners import ort_cuda_graph
from pipeline.runners.ort_cuda_graph import (
    fixed_dims_file,
    graph_runners,
    graph_session_options,
    provider_options,
    runtime_shape_ops,
    weights_apart,
)


@pytest.fixture(scope="module")
def fixed(onnx_artifact) -> tuple[onnx.ModelProto, onnx.ModelProto, str]:
    model = onnx.load(str(onnx_artifact.path))
    path, folded = fixed_dims_file(weights_apart(onnx_artifact.path), {"batch": 3, "sequence": 12})
    return model, folded, str(path)


def test_the_weights_are_written_once_apart_from_the_graph(onnx_artifact, fixed) -> None:
    source = weights_apart(onnx_artifact.path)
    assert weights_apart(onnx_artifact.path) == source  # once per process
    weights = source.parent / "weights.bin"
    assert weights.stat().st_size > 0.9 * onnx_artifact.path.stat().st_size
    _, folded, path = fixed
    assert Path(path).parent == source.parent and Path(path).stat().st_size < weights.stat().st_size / 10
    assert any(t.data_location == onnx.TensorProto.EXTERNAL for t in folded.graph.initializer)


def test_fixed_dims_fold_the_shape_ops(fixed) -> None:
    model, folded, _ = fixed
    assert runtime_shape_ops(model)  # the dynamic export computes shapes at run time
    assert runtime_shape_ops(folded) == []
    for value in [*folded.graph.input, *folded.graph.output]:
        dims = [d.dim_value for d in value.type.tensor_type.shape.dim]
        assert dims[:2] == [3, 12] or dims[:1] == [3], (value.name, dims)
        assert all(not d.dim_param for d in value.type.tensor_type.shape.dim)


def test_fixed_model_computes_the_same(fixed, feeds) -> None:
    model, _, path = fixed
    options = ort_cuda_graph.session_options(1)  # the graph options refuse the CPU provider
    dynamic = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    static = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])  # weights from the file
    for a, b in zip(dynamic.run(None, feeds), static.run(None, feeds), strict=True):
        assert np.abs(a - b).max() < 1e-5


def test_session_and_provider_options() -> None:
    fp32 = {"use_tf32": "0"}  # an FP32 graph computes in FP32
    assert provider_options(1234, {}) == {**fp32, "enable_cuda_graph": "1", "user_compute_stream": "1234"}
    assert provider_options(None, {}) == {**fp32, "enable_cuda_graph": "1"}
    nhwc = {"prefer_nhwc": "1"}
    assert provider_options(None, nhwc) == {**fp32, **nhwc, "enable_cuda_graph": "1"}
    options = graph_session_options(2)
    assert options.get_session_config_entry("session.disable_cpu_ep_fallback") == "1"
    assert options.intra_op_num_threads == 2


def test_dims_of_follow_the_recipe_shapes(ctx, feeds) -> None:
    assert dim_sizes(ctx.settings.inputs, feeds) == {"batch": 3, "sequence": 12}


def test_which_artifacts_get_a_graph_runner(ctx, onnx_artifact, monkeypatch: pytest.MonkeyPatch) -> None:
    """Which artifacts, given a CUDA provider that captures them (this host has none: the GPU tests capture)."""
    monkeypatch.setattr(ort_cuda_graph, "cuda_provider_available", lambda: True)
    monkeypatch.setattr(ort_cuda_graph, "capture_refused", lambda artifact, settings: None)
    (runner,) = graph_runners(onnx_artifact, ctx.settings)
    assert (runner.runtime, runner.io, runner.cuda_graph) == ("onnxruntime-cuda-graph", "device", True)
    assert graph_runners(replace(onnx_artifact, precision="int8"), ctx.settings) == []
    settings = ctx.settings
    no_graphs = settings.model_copy(
        update={"runtime": settings.runtime.model_copy(update={"cuda_graphs": False})}
    )
    assert graph_runners(onnx_artifact, no_graphs) == []
    monkeypatch.setattr(ort_cuda_graph, "cuda_provider_available", lambda: False)
    assert graph_runners(onnx_artifact, ctx.settings) == []


def _conv_graph(path: Path, elem: int) -> Path:
    """A one-Conv ONNX graph of the given element type, saved."""
    from onnx import TensorProto, helper, numpy_helper

    dtype = np.float16 if elem == TensorProto.FLOAT16 else np.float32
    weight = numpy_helper.from_array(np.ones((4, 3, 3, 3), dtype), "w")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])],
        "conv",
        [helper.make_tensor_value_info("x", elem, ["batch", 3, 8, 8])],
        [helper.make_tensor_value_info("y", elem, ["batch", 4, 8, 8])],
        [weight],
    )
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_fp16_convolutions_ask_for_the_nhwc_kernels(tmp_path: Path, onnx_artifact) -> None:
    from pipeline.runners.ort_session import layout_options

    fp16 = _conv_graph(tmp_path / "conv.fp16.onnx", onnx.TensorProto.FLOAT16)
    fp32 = _conv_graph(tmp_path / "conv.onnx", onnx.TensorProto.FLOAT)
    assert layout_options(fp16, "fp16") == {"prefer_nhwc": "1"}
    assert layout_options(fp32, "fp32") == {}  # not measured in FP32: NCHW stays
    assert layout_options(onnx_artifact.path, "fp16") == {}  # no convolution: nothing to lay out


def test_a_graph_runner_is_made_with_its_layout(tmp_path: Path, ctx) -> None:
    fp16 = _conv_graph(tmp_path / "conv.fp16.onnx", onnx.TensorProto.FLOAT16)
    runner = ort_cuda_graph.OrtCudaGraphRunner("onnx-fp16", fp16, ctx.settings, "fp16")
    assert runner._layout == {"prefer_nhwc": "1"}
    assert ort_cuda_graph.OrtCudaGraphRunner("onnx-fp32", fp16, ctx.settings, "fp32")._layout == {}


def test_a_capture_that_fails_in_the_probe_process_comes_back_as_the_reason(ctx, onnx_artifact) -> None:
    """The probe runs in a process of its own (a failed capture can abort the process that tried it, seen on an
    H100): the recipe's settings travel to it and its failure comes back as the reason (here: no CUDA)."""
    ort_cuda_graph._REFUSED.clear()
    reason = ort_cuda_graph.capture_refused(onnx_artifact, ctx.settings)
    assert reason is not None and "cannot capture this graph in a CUDA graph" in reason, reason
    assert "CUDA" in reason.split("graph (", 1)[1], reason
