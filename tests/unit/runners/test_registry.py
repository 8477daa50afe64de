from __future__ import annotations

import sys

import pytest

from pipeline.runners.base import NotRunnable
from pipeline.runners.registry import RUNNERS, reference_runners, runners_for
from tests.unit.runners.tiny_artifacts import record


def test_kinds_are_an_explicit_table() -> None:
    assert set(RUNNERS) == {"torchscript", "onnx", "engine", "exported", "aoti"}


def test_onnx_and_torchscript_dispatch(ctx, onnx_artifact, torchscript_artifact) -> None:
    onnx = runners_for(onnx_artifact, ctx.settings)
    script = runners_for(torchscript_artifact, ctx.settings)
    assert [r.runtime for r in onnx][0] == "onnxruntime-cpu"
    assert [r.runtime for r in script][0] == "torchscript-cpu"
    assert all(r.artifact == "onnx-fp32" for r in onnx)


def test_reference_is_torch_fp32_on_the_cpu_first(ctx) -> None:
    runners = reference_runners(ctx.settings, ctx.model)
    assert (runners[0].artifact, runners[0].runtime, runners[0].io) == ("torch-fp32", "torch-cpu", "host")


def test_unknown_kind_is_not_runnable(ctx, workdir) -> None:
    result = runners_for(record("weird", workdir / "x.bin", "tflite"), ctx.settings)
    assert isinstance(result, NotRunnable) and "tflite" in result.reason


def test_engine_without_a_tensorrt_runner_module(ctx, workdir, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pipeline.runners.tensorrt", None)  # as if the module were not installed
    result = runners_for(
        record("tensorrt-rtx-fp16", workdir / "model.tensorrt-rtx.fp16.engine", "engine", "fp16"),
        ctx.settings,
    )
    assert isinstance(result, NotRunnable) and "pipeline.runners.tensorrt" in result.reason


def test_engine_is_not_runnable_without_a_gpu(ctx, workdir) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    result = runners_for(
        record("tensorrt-rtx-fp16", workdir / "model.tensorrt-rtx.fp16.engine", "engine", "fp16"),
        ctx.settings,
    )
    assert isinstance(result, NotRunnable) and result.reason
