from __future__ import annotations

import pytest

from pipeline.runners import registry
from pipeline.runners.base import NotRunnable
from pipeline.runners.registry import reference_runners, runners_for
from tests.unit.runners.tiny_artifacts import record


def test_every_runner_module_declares_its_family() -> None:
    assert set(registry.kinds()) == {
        "torchscript",
        "onnx",
        "onnx-packed",
        "engine",
        "exported",
        "aoti",
        "exported-packed",
        "aoti-packed",
    }
    declared = registry.runtimes()
    assert declared["onnxruntime-cuda"].on_gpu and not declared["onnxruntime-cpu"].on_gpu
    assert declared["tensorrt-rtx"].on_gpu  # no "-cuda" in its name, a GPU runtime all the same
    assert declared["torch-aoti-cuda"].mode_twins == ("torch-aoti-cuda-graph",)


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


def test_an_artifact_kind_no_runner_module_loads(ctx, workdir, monkeypatch) -> None:
    without = tuple(f for f in registry.families() if "engine" not in f.kinds)
    monkeypatch.setattr(registry, "families", lambda: without)  # as if the TensorRT module were not installed
    result = runners_for(
        record("tensorrt-rtx-fp16", workdir / "model.tensorrt-rtx.fp16.engine", "engine", "fp16"),
        ctx.settings,
    )
    assert (
        isinstance(result, NotRunnable) and "no runner in this installation loads a 'engine'" in result.reason
    )


def test_engine_is_not_runnable_without_a_gpu(ctx, workdir) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    result = runners_for(
        record("tensorrt-rtx-fp16", workdir / "model.tensorrt-rtx.fp16.engine", "engine", "fp16"),
        ctx.settings,
    )
    assert isinstance(result, NotRunnable) and result.reason


def test_an_onnx_graph_without_onnxruntime_says_what_to_install(ctx, onnx_artifact, monkeypatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # as if onnxruntime were not installed
    others = tuple(f for f in registry.families() if all(not r.opt_in for r in f.runtimes))
    monkeypatch.setattr(registry, "families", lambda: others)  # no opt-in runtime standing in for it
    result = runners_for(onnx_artifact, ctx.settings)
    assert isinstance(result, NotRunnable) and "pip install 'deploy-pipeline[cpu]'" in result.reason
