"""Where ONNX Runtime places a graph's nodes decides which providers the graph is offered to: real sessions,
real profiles. This CPU build has only the CPU provider, so asked for CUDA every node lands on the CPU; the GPU
test asks the CUDA provider about a dynamically quantized graph on the H200."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from pipeline.runners import onnxruntime_runner, ort_placement
from pipeline.runners.ort_placement import declined_reason, off_provider, recurrent_ops
from pipeline.runners.registry import declined_runtimes, runners_for

CPU, CUDA = "CPUExecutionProvider", "CUDAExecutionProvider"


def test_a_graph_the_provider_runs_whole_has_nothing_off_it(ctx, onnx_artifact) -> None:
    assert off_provider(onnx_artifact.path, CPU, ctx.settings) == {}


def test_data_nodes_off_the_provider_are_counted_by_op(ctx, onnx_artifact) -> None:
    """Asked for a provider this build lacks, ONNX Runtime runs everything on the CPU: the encoder's matrix
    products, normalizations, and the rest that computes on activations, are off it."""
    off = off_provider(onnx_artifact.path, CUDA, ctx.settings)
    model = onnx.load(str(onnx_artifact.path))
    assert off["MatMul"] == sum(n.op_type == "MatMul" for n in model.graph.node)
    assert "Shape" not in off  # shape arithmetic is left out


def test_shape_arithmetic_alone_is_never_a_reason(ctx, tmp_path: Path) -> None:
    nodes = [helper.make_node("Shape", ["input_ids"], ["s"]), helper.make_node("Mul", ["s", "s"], ["y"])]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"])],
        [helper.make_tensor_value_info("y", TensorProto.INT64, [2])],
    )
    path = tmp_path / "shape.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    assert off_provider(path, CUDA, ctx.settings) == {}


def test_the_reason_names_the_nodes() -> None:
    text = declined_reason({"MatMulInteger": 36, "DynamicQuantizeLinear": 24}, CUDA, "1.31.1")
    assert "DynamicQuantizeLinear ×24, MatMulInteger ×36" in text and "onnxruntime 1.31.1" in text
    assert "would run on the CPU" in text


def test_a_declined_provider_gets_no_runner_and_the_reports_say_why(
    ctx, onnx_artifact, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Wiring: where the CUDA provider counts as present but ONNX Runtime runs the graph's data nodes elsewhere
    (on this CPU build: all of them), the graph keeps its CPU runner and declined_runtimes says why."""
    assert "onnxruntime-cuda" not in declined_runtimes(onnx_artifact, ctx.settings)  # no CUDA provider here
    monkeypatch.setattr(onnxruntime_runner, "cuda_provider_available", lambda: True)
    runners = runners_for(onnx_artifact, ctx.settings)
    assert [r.runtime for r in runners if r.runtime.startswith("onnxruntime")] == ["onnxruntime-cpu"]
    reason = declined_runtimes(onnx_artifact, ctx.settings)["onnxruntime-cuda"]
    assert f"off {CUDA}" in reason and "MatMul ×" in reason
    assert declined_runtimes(replace(onnx_artifact, kind="torchscript"), ctx.settings) == {}


def test_a_graph_with_recurrent_nodes_is_not_offered_the_cuda_provider_and_no_session_is_made(
    ctx, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Releasing a CUDA session that ran LSTM and GRU nodes aborted the process on an H100: the graph is read
    for recurrent nodes (a subgraph's too) before any session is made, and the reports say why."""
    lstm = helper.make_node("LSTM", ["x", "w", "r"], ["y"], hidden_size=4)
    body = helper.make_graph(
        [helper.make_node("GRU", ["x", "w", "r"], ["z"], hidden_size=4)],
        "body",
        [],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)],
    )
    branch = helper.make_node("If", ["c"], ["z"], then_branch=body, else_branch=body)
    graph = helper.make_graph(
        [lstm, branch],
        "rnn",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("x", "w", "r")]
        + [helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "z")],
    )
    path = tmp_path / "rnn.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    assert recurrent_ops(path) == ["GRU", "LSTM"]
    monkeypatch.setattr(onnxruntime_runner, "cuda_provider_available", lambda: True)
    sessions: list = []
    monkeypatch.setattr(onnxruntime_runner, "load_onnxruntime", lambda: sessions.append(1) or ort)
    monkeypatch.setattr(ort_placement, "off_provider", lambda *args: sessions.append(args) or {})
    reason = onnxruntime_runner.cuda_declined(path, ctx.settings)
    assert reason is not None and "releasing a CUDA session that ran recurrent nodes" in reason, reason
    assert "this graph has GRU and LSTM" in reason and f"onnxruntime {ort.__version__}" in reason
    assert all(s == 1 for s in sessions)  # the version asked, no placement session made
