from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.core.artifacts import ArtifactRecord
from tests.stage_env import StageEnv
from tests.unit.runners.tiny_artifacts import export_onnx, export_torchscript, tiny_context


@pytest.fixture(scope="session")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("runners")


@pytest.fixture(scope="session")
def ctx(workdir: Path) -> StageEnv:
    return tiny_context(workdir, intra_op_threads=1)


@pytest.fixture(scope="session")
def onnx_artifact(ctx: StageEnv, workdir: Path) -> ArtifactRecord:
    return export_onnx(ctx, workdir / "model.onnx")


@pytest.fixture(scope="session")
def torchscript_artifact(ctx: StageEnv, workdir: Path) -> ArtifactRecord:
    return export_torchscript(ctx, workdir / "model.ts")


@pytest.fixture(scope="session")
def feeds(ctx: StageEnv) -> dict:
    return ctx.dataset().feeds_at({"batch": 3, "sequence": 12})
