"""ONNX Runtime's CUDA provider on graphs beyond the transformer: a convolutional network in FP16 runs with the
provider's NHWC kernels and still matches the model, and a recurrent network whose graph ONNX Runtime cannot
capture in a CUDA graph (its LSTM, seen on an H100 in the GPU zoo) is not offered that runtime, with the reason,
while its plain CUDA rows still run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.inputs.specs import RunnerSettings
from pipeline.recipe.loader import load
from pipeline.runners.registry import declined_runtimes, runners_for
from tests.unit.runners.tiny_artifacts import record
from tests.unit.stages.onnx_fixtures import lowest_cosine
from tests.zoo.models import RecurrentTagger, ResNet

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
ZOO = Path(__file__).resolve().parents[1] / "zoo" / "recipes"


def _needs_cuda_provider() -> None:
    from pipeline.runners.onnxruntime_runner import cuda_provider_available

    if not cuda_provider_available():
        pytest.skip("onnxruntime has no CUDA provider here")


def _settings(recipe: str) -> RunnerSettings:
    return RunnerSettings.from_recipe(load(ZOO / recipe).recipe)


def _export(model: torch.nn.Module, example: torch.Tensor, path: Path, names: list[str], axes: dict) -> None:
    """The legacy exporter, dynamic along the axes named (the first entry is the input)."""
    torch.onnx.export(
        model,
        (example,),
        str(path),
        input_names=[next(iter(axes))],
        output_names=names,
        dynamic_axes=axes,
        opset_version=17,
        dynamo=False,
    )


def test_an_fp16_cnn_runs_on_the_nhwc_kernels_and_matches_the_model(tmp_path: Path) -> None:
    _needs_cuda_provider()
    torch.manual_seed(0)
    model = ResNet().eval()
    images = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        expected = model(images).numpy()
    path = tmp_path / "model.fp16.onnx"
    _export(model.half(), images.half(), path, ["logits"], {"x": {0: "batch"}, "logits": {0: "batch"}})
    artifact = record("onnx-fp16", path, "onnx", precision="fp16")
    settings = _settings("resnet.yaml")
    cuda = [r for r in runners_for(artifact, settings) if r.runtime.startswith("onnxruntime-cuda")]
    assert {r.runtime for r in cuda} == {"onnxruntime-cuda", "onnxruntime-cuda-graph"}
    feeds = {"x": images.half().numpy()}
    for runner in cuda:
        runner.activate()
        try:
            got = runner.infer(feeds)["logits"].astype(np.float32)
            assert runner.details["cuda_layout"] == "nhwc", runner.details
        finally:
            runner.deactivate()
        assert lowest_cosine(got, expected) > 0.999, runner.runtime


def test_a_graph_onnx_runtime_cannot_capture_is_declined_with_the_reason(tmp_path: Path) -> None:
    _needs_cuda_provider()
    torch.manual_seed(0)
    model = RecurrentTagger().eval()
    features = torch.rand(2, 16, 12) * 2 - 1
    with torch.no_grad():
        expected = model(features)[0].numpy()
    path = tmp_path / "model.onnx"
    axes = {"features": {0: "batch", 1: "sequence"}, "tags": {0: "batch", 1: "sequence"}}
    axes["scores"] = {0: "batch", 1: "sequence"}
    _export(model, features, path, ["tags", "scores", "temperature"], axes)
    artifact = record("onnx-fp32", path, "onnx")
    settings = _settings("recurrent.yaml")
    reason = declined_runtimes(artifact, settings).get("onnxruntime-cuda-graph")
    assert reason and "cannot capture this graph in a CUDA graph" in reason, reason
    runners = runners_for(artifact, settings)
    assert "onnxruntime-cuda-graph" not in {r.runtime for r in runners}
    (plain,) = [r for r in runners if r.runtime == "onnxruntime-cuda" and r.io == "device"]
    plain.activate()
    try:
        got = plain.infer({"features": features.numpy()})["tags"]
    finally:
        plain.deactivate()
    assert np.abs(got - expected).max() < 1e-3
