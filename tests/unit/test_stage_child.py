"""A stage run in a child process (pipeline.stage_child): the same file as in the deploy's own process, and a
failure there raised in the deploy as the stage's, with the child's traceback."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pipeline.artifacts import ArtifactRecord
from pipeline.errors import StageError
from pipeline.stage_child import ChildRun, ChildTraceback, in_child
from pipeline.stages.base import RunContext, Stage, StageConfig, StageResult
from tests.unit.stages.onnx_fixtures import tiny_context, tiny_onnx


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> ArtifactRecord:
    return tiny_onnx(tmp_path_factory)


def test_a_stage_in_a_child_makes_the_same_file_as_in_the_deploy(
    source: ArtifactRecord, tmp_path: Path
) -> None:
    here, there = tiny_context(tmp_path / "here"), tiny_context(tmp_path / "there")
    stage = here.stage("fp16", ["onnx-fp16"])
    moved = in_child(stage, "onnx")
    assert (moved.background, moved.lane, moved.config) == (True, "onnx", stage.config)
    assert isinstance(moved.run, ChildRun) and moved.run.run is stage.run
    own = here.run(stage, {"onnx-fp32": source})
    child = there.run(moved, {"onnx-fp32": source})
    assert child.outputs == own.outputs  # the record, details included, comes back from the child
    made = (tmp_path / "there" / "model.fp16.onnx").read_bytes()
    assert made == (tmp_path / "here" / "model.fp16.onnx").read_bytes()


def _fails_in_child(ctx: RunContext, config: StageConfig, inputs: dict) -> StageResult:
    raise StageError(f"unsupported op Foo in pid {os.getpid()}", {"node": "/layer.0/Foo"})


def _dies_in_child(ctx: RunContext, config: StageConfig, inputs: dict) -> StageResult:
    print("about to die", flush=True)
    os._exit(7)


def _stage(run) -> Stage:  # noqa: ANN001 - a run function
    return in_child(Stage(name="convert", version=1, config=StageConfig(), run=run), "onnx")


def test_a_failure_in_the_child_is_the_stages_with_the_childs_traceback(tmp_path: Path) -> None:
    stage = _stage(_fails_in_child)
    with pytest.raises(StageError, match="unsupported op Foo") as caught:
        stage.run(RunContext(tmp_path), stage.config, {})
    assert f"pid {os.getpid()}" not in str(caught.value)  # it ran elsewhere
    assert caught.value.details == {"node": "/layer.0/Foo"}
    cause = caught.value.__cause__
    assert isinstance(cause, ChildTraceback) and "_fails_in_child" in str(cause)


def test_a_child_that_dies_without_a_result_says_how(tmp_path: Path) -> None:
    stage = _stage(_dies_in_child)
    with pytest.raises(RuntimeError, match="exited with 7 without a result.*about to die"):
        stage.run(RunContext(tmp_path), stage.config, {})
