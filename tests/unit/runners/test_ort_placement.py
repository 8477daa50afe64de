"""Where ONNX Runtime places a graph's nodes decides which providers the graph is offered to: real sessions,
real profiles. This CPU build has only the CPU provider, so asked for CUDA every node lands on the CPU; the GPU
test asks the CUDA provider about a dynamically quantized graph on the H200."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper

from pipeline.check import graph_check
from pipeline.runners import onnxruntime_runner
from pipeline.runners.ort_placement import declined_reason, off_provider
from pipeline.runners.registry import declined_runtimes, runners_for
from pipeline.toolchain.ort_recurrent import recurrent_ops
from tests.zoo.models import RecurrentTagger

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


def _recurrent_graph(path: Path) -> onnx.ModelProto:
    """An LSTM at the top, a GRU in an If's branch and an RNN in a model-local function: every place a graph
    can hold a node (the graph is only read, never run)."""
    body = helper.make_graph(
        [helper.make_node("GRU", ["x", "w", "r"], ["z"], hidden_size=4)],
        "body",
        [],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)],
    )
    function = helper.make_function(
        "local",
        "step",
        ["x", "w", "r"],
        ["y"],
        [helper.make_node("RNN", ["x", "w", "r"], ["y"], hidden_size=4)],
        [helper.make_opsetid("", 17)],
    )
    nodes = [
        helper.make_node("LSTM", ["x", "w", "r"], ["y"], hidden_size=4),
        helper.make_node("If", ["c"], ["z"], then_branch=body, else_branch=body),
        helper.make_node("step", ["x", "w", "r"], ["s"], domain="local"),
    ]
    graph = helper.make_graph(
        nodes,
        "rnn",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("x", "w", "r")]
        + [helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "z", "s")],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("local", 1)]
    model = helper.make_model(graph, opset_imports=opsets, functions=[function])
    onnx.save(model, path)
    return model


def test_recurrent_nodes_are_found_in_subgraphs_and_local_functions(tmp_path: Path) -> None:
    _recurrent_graph(tmp_path / "rnn.onnx")
    assert recurrent_ops(tmp_path / "rnn.onnx") == ["GRU", "LSTM", "RNN"]


def test_a_graph_with_recurrent_nodes_is_not_offered_the_cuda_provider_and_no_session_is_made(
    ctx, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Releasing a CUDA session that ran the recurrent tagger's LSTM and GRU aborted the process on an H100: its
    graph is read for recurrent nodes before any session is made, the reports say why, and the optimizer's
    graph check loads no CUDA session of it either."""
    path = tmp_path / "tagger.onnx"
    torch.onnx.export(
        RecurrentTagger().eval(),
        (torch.rand(2, 16, 12),),
        str(path),
        input_names=["features"],
        output_names=["tags", "scores", "temperature"],
        dynamic_axes={"features": {0: "batch", 1: "sequence"}},
        opset_version=17,
        dynamo=False,
    )
    sessions: list = []
    real = ort.InferenceSession

    def recorded(*args, providers=None, **kwargs):  # noqa: ANN001, ANN202
        sessions.append(providers)
        return real(*args, providers=providers, **kwargs)

    monkeypatch.setattr(ort, "InferenceSession", recorded)
    monkeypatch.setattr(onnxruntime_runner, "cuda_provider_available", lambda: True)
    reason = onnxruntime_runner.cuda_declined(path, ctx.settings)
    assert reason is not None and "releasing a CUDA session that ran recurrent nodes" in reason, reason
    assert "this graph has GRU, LSTM," in reason and f"{ort.__version__} is installed" in reason
    assert sessions == []
    monkeypatch.setattr(graph_check, "cuda_provider", lambda: True)
    graph_check.check_graph(onnx.load(str(path)), every_provider=True)
    assert sessions == [graph_check.CPU_PROVIDERS]  # never the CUDA provider
