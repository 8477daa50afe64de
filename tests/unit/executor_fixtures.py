"""Stages and a deploy loop for the executor's tests (tests/unit/test_executor.py, tests/unit/test_lanes.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipeline.release.store import Store
from pipeline.run.executor import Executor
from pipeline.stages.base import Output, RunContext, Stage, StageConfig, StageResult
from pipeline.stages.record import read_records


class TextConfig(StageConfig):
    text: str


def deploy(tmp_path: Path, stages: list[Stage], version: str) -> tuple[list, Path]:
    """Run the stages against the store's latest version and publish what they made as `version`."""
    store = Store(tmp_path, "t")
    latest = store.latest()
    executor = Executor(stages, store, [(latest, read_records(latest))] if latest else [])
    work = store.new_work_dir()
    records = executor.run(RunContext(work), False, lambda s, w: None, lambda r: None)
    return records, store.publish(work, version, promote=True)


def late_checker(consumes_any: tuple[str, ...], inspect: Callable[[dict[str, Any]], list[str]]) -> Stage:
    """A takes_late stage named check (as validate): `inspect` looks at its inputs, Late ones included, and
    names what it checked, which the stage writes to its report."""

    def run(ctx: RunContext, config: TextConfig, inputs: dict) -> StageResult:
        ctx.path("check.txt").write_text(json.dumps(inspect(inputs)))
        return StageResult([Output("check.txt", "report", "report:check")])

    return Stage(
        name="check",
        version=1,
        run=run,
        config=TextConfig(text="c"),
        consumes_any=consumes_any,
        produces=("report:check",),
        takes_late=True,
    )
