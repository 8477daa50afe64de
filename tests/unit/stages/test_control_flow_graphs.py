"""The ONNX precision stages on a graph with Loop and If bodies (EmbeddingBag, as the exporter writes it):
ONNX Runtime's float16 converter appends the Casts around a blocked node in a body to the main graph and
leaves a body's returned constant float32, and its dynamic quantizer orders nodes without the names bodies
capture; each graph the stages keep must load, run and agree with the eager model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from pipeline.core.artifacts import ArtifactRecord
from pipeline.recipe.loader import load
from tests.stage_env import StageEnv
from tests.unit.stages.onnx_fixtures import dynamo_export, reference, run_onnx

BAGS = Path(__file__).resolve().parents[2] / "recipes" / "bags.yaml"


def _env(folder: Path) -> StageEnv:
    return StageEnv(load(BAGS, []).recipe, BAGS.parent, folder)


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> ArtifactRecord:
    folder = tmp_path_factory.mktemp("bags")
    ctx = _env(folder)
    return dynamo_export(ctx, folder / "model.onnx", ctx.dataset().feeds_at({"batch": 4}))


def _bodies(model: onnx.ModelProto) -> int:
    return sum(n.op_type in ("Loop", "If") for n in model.graph.node)


@pytest.mark.parametrize(
    "stage, variant, bound",
    [
        ("fp16", "onnx-fp16", 2e-3),
        ("optimize_onnx_fp16", "onnx-optimized-fp16", 2e-3),
        ("int8_dynamic", "onnx-int8-dynamic", 5e-2),
    ],
)
def test_a_graph_with_loop_and_if_bodies_converts_and_agrees(
    stage: str, variant: str, bound: float, source: ArtifactRecord, tmp_path: Path
) -> None:
    assert _bodies(onnx.load(str(source.path))) >= 2  # the exporter's Loop per EmbeddingBag
    ctx = _env(tmp_path)
    out = ctx.run_named(stage, {"onnx-fp32": source}, variants=[variant]).outputs[0]
    model = onnx.load(str(tmp_path / out.path))
    onnx.checker.check_model(model)
    feeds = ctx.dataset().feeds_at({"batch": 8})
    got, want = run_onnx(tmp_path / out.path, feeds)["click"], reference(ctx, feeds)["click"]
    assert got.dtype == np.float32 and np.abs(got - want).max() < bound
