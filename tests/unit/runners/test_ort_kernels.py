"""ONNX Runtime's kernel registry decides which providers a graph is offered to: real registry, real graphs. On
this CPU build the CPU provider is the one to ask (it has no FP16 Add, for instance); the GPU test asks the CUDA
provider about a dynamically quantized graph on the H200."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from pipeline.runners import onnxruntime_runner
from pipeline.runners.ort_kernels import declined_reason, missing_kernels
from pipeline.runners.registry import declined_runtimes, runners_for

CPU = "CPUExecutionProvider"


def _graph(path: Path, elem: int, extra: list[onnx.NodeProto] | None = None) -> Path:
    nodes = [helper.make_node("Add", ["x", "x"], ["y"]), *(extra or [])]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", elem, [2, 3])],
        [helper.make_tensor_value_info("y", elem, [2, 3])],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("example.custom", 1)]
    onnx.save(helper.make_model(graph, opset_imports=opsets), path)
    return path


def test_a_graph_the_provider_runs_whole_misses_nothing(onnx_artifact, tmp_path: Path) -> None:
    assert missing_kernels(onnx_artifact.path, CPU) == {}  # the exported encoder
    assert missing_kernels(_graph(tmp_path / "fp32.onnx", TensorProto.FLOAT), CPU) == {}


def test_types_decide_not_only_the_op(tmp_path: Path) -> None:
    # the CPU provider registers Add for float, double and integers, not float16
    assert missing_kernels(_graph(tmp_path / "fp16.onnx", TensorProto.FLOAT16), CPU) == {"Add": 1}


def test_an_op_no_provider_knows_is_missing(tmp_path: Path) -> None:
    unknown = helper.make_node("Frobnicate", ["y"], ["z"], domain="example.custom")
    path = _graph(tmp_path / "custom.onnx", TensorProto.FLOAT, [unknown])
    assert missing_kernels(path, CPU) == {"Frobnicate": 1}


def test_the_reason_names_the_nodes() -> None:
    text = declined_reason(
        {"MatMulInteger": 36, "DynamicQuantizeLinear": 24}, "CUDAExecutionProvider", "1.31.1"
    )
    assert "DynamicQuantizeLinear ×24, MatMulInteger ×36" in text and "onnxruntime 1.31.1" in text
    assert "run them on the CPU" in text


def test_a_declined_provider_gets_no_runner_and_the_reports_say_why(
    ctx, onnx_artifact, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Wiring: where the CUDA provider is present but lacks kernels (this CPU build registers none for it),
    the graph keeps its CPU runner only and declined_runtimes gives the reason the reports carry."""
    assert declined_runtimes(onnx_artifact) == {}  # no CUDA provider here: nothing declined
    monkeypatch.setattr(onnxruntime_runner, "cuda_provider_available", lambda: True)
    runners = runners_for(onnx_artifact, ctx.settings)
    assert [r.runtime for r in runners] == ["onnxruntime-cpu"]
    (reason,) = declined_runtimes(onnx_artifact).values()
    assert "CUDAExecutionProvider has no kernel" in reason and "MatMul ×" in reason
    assert declined_runtimes(replace(onnx_artifact, kind="torchscript")) == {}


def test_integer_shape_arithmetic_is_left_out(tmp_path: Path) -> None:
    """An int64 node the provider would leave to the CPU is no reason to decline it: only nodes on data count."""
    unknown = helper.make_node("Frobnicate", ["n"], ["m"], domain="example.custom")
    graph = helper.make_graph(
        [unknown],
        "g",
        [helper.make_tensor_value_info("n", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("m", TensorProto.INT64, [2])],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("example.custom", 1)]
    path = tmp_path / "shape.onnx"
    onnx.save(helper.make_model(graph, opset_imports=opsets), path)
    assert missing_kernels(path, CPU) == {}
