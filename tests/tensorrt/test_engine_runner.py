"""Running a built engine (needs a GPU its flavour supports): outputs match ONNX Runtime on the same feeds."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.core.artifacts import ArtifactRecord
from pipeline.inputs.specs import RunnerSettings
from pipeline.runners.tensorrt import runners_for_engine
from pipeline.toolchain.trt.flavour import (
    RTX_COMPUTE_CAPABILITIES,
    installed_flavours,
    local_compute_capability,
)

from .conftest import TINY, context, engine_stages, run, tiny_recipe


def runnable_flavour() -> tuple[str, str] | None:
    """(flavour, compute capability) that can build and run here, None when none can."""
    gpu = local_compute_capability()
    if gpu is None:
        return None
    if "tensorrt" in installed_flavours():
        return "tensorrt", gpu
    if "tensorrt-rtx" in installed_flavours() and gpu in RTX_COMPUTE_CAPABILITIES:
        return "tensorrt-rtx", gpu
    return None


pytestmark = [
    pytest.mark.tensorrt,
    pytest.mark.gpu,
    pytest.mark.skipif(
        runnable_flavour() is None,
        reason=f"no TensorRT flavour can run on this host (GPU "
        f"{local_compute_capability()}, installed {installed_flavours()})",
    ),
]


def test_engine_matches_onnxruntime(tiny_onnx, tmp_path):
    flavour, gpu = runnable_flavour()
    import onnxruntime as ort

    recipe = tiny_recipe(
        f"variants.build=[onnx-fp32, {flavour}-fp32]", f"export.tensorrt.compute_capabilities=[{gpu}]"
    )
    stage = engine_stages(recipe, TINY.parent)[f"{flavour}-fp32"]
    ctx = context(recipe, tmp_path)
    engine = next(
        o for o in run(stage, ctx, {"onnx-fp32": tiny_onnx["onnx-fp32"]}).outputs if o.kind == "engine"
    )
    artifact = ArtifactRecord(
        engine.artifact, ctx.workdir / engine.path, "engine", "fp32", "0" * 64, stage.name, engine.details
    )
    runners = runners_for_engine(artifact, RunnerSettings.from_recipe(recipe))
    assert isinstance(runners, list), runners
    assert {r.io for r in runners} == {"host", "device"} and all(r.runtime == flavour for r in runners)

    rng = np.random.default_rng(0)
    feeds = {
        "input_ids": rng.integers(1, 999, (3, 20)).astype(np.int64),
        "attention_mask": np.ones((3, 20), np.int64),
    }
    expected = ort.InferenceSession(str(tiny_onnx["onnx-fp32"].path), providers=["CPUExecutionProvider"]).run(
        None, feeds
    )
    for runner in runners:
        runner.activate()
        try:
            got = runner.infer(feeds)
            runner.prepare(feeds)
            runner.infer_prepared()
            runner.synchronize()
        finally:
            runner.deactivate()
        for name, want in zip(recipe.outputs, expected, strict=True):
            np.testing.assert_allclose(got[name], want, atol=2e-3, rtol=1e-3)
