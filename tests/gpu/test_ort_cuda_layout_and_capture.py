"""ONNX Runtime's CUDA provider on graphs beyond the transformer: a convolutional network in FP16 runs with the
provider's NHWC kernels and still matches the model, and a recurrent network (whose CUDA sessions aborted the
process when released, seen on an H100) is not offered the CUDA provider, with the reason, and runs on the CPU."""

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


def test_a_recurrent_graph_is_not_offered_the_cuda_provider_and_runs_on_the_cpu(tmp_path: Path) -> None:
    """Releasing a CUDA session that ran this graph's LSTM and GRU aborted the process on an H100 (9 of 11 runs),
    and its capture in a CUDA graph failed: no CUDA session is made for it, the reports say why, and its CPU
    runner still matches the model."""
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
    reason = declined_runtimes(artifact, settings).get("onnxruntime-cuda")
    assert reason and "releasing a CUDA session that ran recurrent nodes" in reason, reason
    runners = runners_for(artifact, settings)
    assert not [r for r in runners if r.runtime.startswith("onnxruntime-cuda")]
    (cpu,) = [r for r in runners if r.runtime == "onnxruntime-cpu"]
    cpu.activate()
    try:
        got = cpu.infer({"features": features.numpy()})["tags"]
    finally:
        cpu.deactivate()
    assert np.abs(got - expected).max() < 1e-3
