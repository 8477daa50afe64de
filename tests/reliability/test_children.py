"""Child processes (TensorRT engine builds, AOTInductor compiles) die with the deploy that started them, however it
died, and a run that stops early kills its background stage's child before it returns."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.core.children import run_job
from pipeline.release.store import Store
from pipeline.run.executor import Executor
from pipeline.stages.base import BACKGROUND, Output, RunContext, Stage, StageConfig, StageResult
from pipeline.stages.record import read_records
from tests.reliability.conftest import ROOT

PARENT = """
import sys, time
from pipeline.core.children import popen_tied
child = popen_tied([sys.executable, "-c", "import time; time.sleep(120)"])
print(child.pid, flush=True)
time.sleep(120)
"""


def _alive(pid: int) -> bool:
    """Running (not gone, not a zombie waiting for a reaper that a container's init may never be)."""
    status = Path(f"/proc/{pid}/status")
    try:
        state = next(line for line in status.read_text().splitlines() if line.startswith("State:"))
    except (FileNotFoundError, ProcessLookupError, StopIteration):
        return False
    return "Z" not in state.split()[1]


def test_a_child_dies_when_its_parent_is_killed() -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        child = int(parent.stdout.readline())
        assert _alive(child)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 10
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child), "the child outlived its killed parent"
    finally:
        parent.kill()
        parent.wait()
        if _alive(child):
            os.kill(child, signal.SIGKILL)


# ---------------------------------------------------------------- a stopping run stops its background children


class _Config(StageConfig):
    pass


def _sleepy(tmp: Path) -> Stage:
    """A background stage whose work is a child that sleeps a minute (as an AOTInductor compile takes one)."""

    def run(ctx: RunContext, config: StageConfig, inputs: dict) -> StageResult:
        job = {"result": str(tmp / "result.json"), "pid": str(tmp / "pid"), "sleep_s": 60}
        run_job("tests.reliability.sleepy_job", job, tmp, None, lambda line: None, cancel=ctx.cancel)
        ctx.path("late.txt").write_text("written after the run had stopped")
        return StageResult([Output("late.txt", "aoti", "aoti", "fp32")])

    return Stage(name="BG", version=1, config=_Config(), run=run, produces=("aoti",), placement=BACKGROUND)


def _stopping(tmp: Path, error: BaseException) -> Stage:
    """A stage in front that stops the run (Ctrl-C, or a bug) once the background child is running."""

    def run(ctx: RunContext, config: StageConfig, inputs: dict) -> StageResult:
        deadline = time.monotonic() + 30
        while not (tmp / "pid").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        raise error

    return Stage(name="FRONT", version=1, config=_Config(), run=run, produces=("a",), critical=True)


@pytest.mark.parametrize("error", [KeyboardInterrupt(), RuntimeError("a bug in a stage")], ids=repr)
def test_a_stopping_run_kills_its_background_child_before_it_returns(
    tmp_path: Path, error: BaseException
) -> None:
    store = Store(tmp_path / "root", "t")
    work = store.new_work_dir()
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    executor = Executor([_sleepy(job_dir), _stopping(job_dir, error)], store, [])
    started = time.monotonic()
    with pytest.raises(type(error)):
        executor.run(RunContext(work), False, lambda s, w: None, lambda r: None)
    assert time.monotonic() - started < 20  # not the child's minute
    pid = int((job_dir / "pid").read_text())
    assert not _alive(pid), "the background child outlived the stopped run"
    assert not (work / "late.txt").exists()  # nothing written into the work folder after the run stopped
    assert "BG" not in [r.name for r in read_records(work)]  # not remembered as a failure for a resume
