"""Real artifacts of the tiny test encoder (tests/models/tiny.py), exported the plain way for runner tests:
ONNX through the TorchScript-based exporter, TorchScript through torch.jit.trace."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import torch

from pipeline.core.artifacts import ArtifactRecord
from pipeline.recipe.loader import load
from tests.stage_env import StageEnv

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "tiny.yaml"


def tiny_context(workdir: Path, **benchmark: object) -> StageEnv:
    """The tiny recipe with a run context, with benchmark settings replaced where given."""
    recipe = load(RECIPE, []).recipe
    if benchmark:
        recipe = recipe.model_copy(update={"benchmark": recipe.benchmark.model_copy(update=benchmark)})
    return StageEnv(recipe, RECIPE.parent, workdir)


def _examples(ctx: StageEnv) -> tuple[torch.Tensor, ...]:
    feeds = ctx.dataset().feeds_at({"batch": 2, "sequence": 16})
    return tuple(torch.from_numpy(feeds[s.name]) for s in ctx.recipe.inputs)


def record(name: str, path: Path, kind: str, precision: str = "fp32") -> ArtifactRecord:
    digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "0" * 64
    return ArtifactRecord(name=name, path=path, kind=kind, precision=precision, sha256=digest, stage="test")


def export_onnx(ctx: StageEnv, path: Path, output_names: list[str] | None = None) -> ArtifactRecord:
    inputs = [s.name for s in ctx.recipe.inputs]
    outputs = output_names or list(ctx.recipe.outputs)
    axes = {name: {0: "batch", 1: "sequence"} for name in inputs}
    axes.update({outputs[0]: {0: "batch", 1: "sequence"}, outputs[1]: {0: "batch"}})
    torch.onnx.export(
        ctx.model().module,
        _examples(ctx),
        str(path),
        input_names=inputs,
        output_names=outputs,
        dynamic_axes=axes,
        opset_version=17,
        dynamo=False,
    )
    return record("onnx-fp32", path, "onnx")


def export_torchscript(ctx: StageEnv, path: Path) -> ArtifactRecord:
    with torch.inference_mode(False), torch.no_grad():
        traced = torch.jit.trace(ctx.model().module, _examples(ctx))
    traced.save(str(path))
    return record("torchscript-fp32", path, "torchscript")


def expected(ctx: StageEnv, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The eager module's outputs, computed directly (not through a runner)."""
    with torch.no_grad():
        out = ctx.model().module(*(torch.from_numpy(feeds[s.name]) for s in ctx.recipe.inputs))
    return {name: t.numpy() for name, t in zip(ctx.recipe.outputs, out, strict=True)}


def planned_matrix(ctx: StageEnv, artifacts: dict[str, ArtifactRecord], folder: Path) -> ArtifactRecord:
    """The matrix of work the validate stage would hand the benchmark for these artifacts on this host
    (pipeline/bench/matrix.py, offered through the validate stage's own `offer`), written and recorded as
    report:matrix."""
    import json

    from pipeline.bench.hosts import HostTiming
    from pipeline.bench.matrix import Matrix
    from pipeline.core import host
    from pipeline.core.variants import REFERENCE
    from pipeline.inputs.specs import RunnerSettings
    from pipeline.runners.registry import reference_runners
    from pipeline.stages.validate import offer

    settings = RunnerSettings.from_recipe(ctx.recipe)
    matrix = Matrix(HostTiming.from_recipe(ctx.recipe), host.has_cuda())
    matrix.offer(REFERENCE, [(r.runtime, r.io) for r in reference_runners(settings, ctx.model)])
    matrix.plan(REFERENCE)
    for record_ in artifacts.values():
        offer(matrix, record_, settings)
    for name in artifacts:
        if name not in matrix.not_run:
            matrix.plan(name)
    path = folder / "matrix.json"
    path.write_text(json.dumps(matrix.report(list(artifacts))))
    return record("report:matrix", path, "report", None)
