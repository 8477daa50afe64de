"""A stage's work in a child process, so that it can run in a background lane beside the stages in front.

On a GPU host the ONNX exports and conversions run this way while validation checks what is already built
(pipeline.plan): in a worker thread of the deploy they would share its interpreter lock with the front and
change process-wide state under it (stdout and logging captured into the stage's log, warning filters), so
they run in `python -m pipeline.stage_child JOB.json`. The job is a pickle of the stage's run function (a
module-level function), its config and inputs, and the work folder; the child runs them with a context of its
own (same work folder, cache and release; the model and data loaded there) and pickles back the StageResult,
or the exception with the child's traceback. The stage's fingerprint is unchanged: where it runs is not what
it makes."""

from __future__ import annotations

import pickle
import sys
import tempfile
import traceback
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pipeline.artifacts import ArtifactRecord
from pipeline.children import run_job, serve_job
from pipeline.errors import StageError
from pipeline.stages.base import RunContext, RunFunction, Stage, StageConfig, StageResult
from pipeline.store import write_bytes_atomic

MODULE = "pipeline.stage_child"


def in_child(stage: Stage, lane: str) -> Stage:
    """The same stage, run in a child process in the background, on `lane`."""
    return replace(stage, run=ChildRun(stage.run, stage.name), background=True, lane=lane)


class ChildTraceback(Exception):
    """Where a stage failed in its child process: the cause of the exception raised again in the deploy, so
    that the stage's error log shows the child's frames."""


@dataclass(frozen=True)
class ChildRun:
    """A stage's run function, called in a child process."""

    run: RunFunction
    name: str

    def __call__(
        self, ctx: RunContext, config: StageConfig, inputs: dict[str, ArtifactRecord]
    ) -> StageResult:
        with tempfile.TemporaryDirectory(prefix=f"stage-{self.name}-") as tmp:
            folder = Path(tmp)
            payload = {
                "run": self.run,
                "config": config,
                "inputs": {name: replace(record, value=None) for name, record in inputs.items()},
                "workdir": ctx.workdir,
                "cache_dir": ctx.cache_dir,
                "release": ctx.release,
            }
            (folder / "payload.pkl").write_bytes(pickle.dumps(payload))
            job = {
                "payload": str(folder / "payload.pkl"),
                "outcome": str(folder / "outcome.pkl"),
                "result": str(folder / "result.json"),
            }
            outcome = run_job(MODULE, job, folder, None, lambda line: None, cancel=ctx.cancel)
            if outcome.result is None:
                raise RuntimeError(outcome.death(None, f"{self.name} stage", ""))
            returned = pickle.loads(Path(job["outcome"]).read_bytes())
        if isinstance(returned, StageResult):
            return returned
        error, where = returned
        raise error from ChildTraceback(where)


def _outcome(job: dict[str, Any]) -> dict[str, Any]:
    """Run the pickled stage; pickle what it returned or raised (an exception that does not pickle is sent as a
    StageError with its type and message)."""
    payload = pickle.loads(Path(job["payload"]).read_bytes())
    ctx = RunContext(payload["workdir"], cache_dir=payload["cache_dir"], release=payload["release"])
    try:
        returned: Any = payload["run"](ctx, payload["config"], payload["inputs"])
        data, summary = pickle.dumps(returned), {"ok": True}
    except Exception as exc:  # the deploy decides what a failure means (a variant's, or a bug)
        where = traceback.format_exc()
        try:
            data = pickle.dumps((exc, where))
            pickle.loads(data)
        except Exception:  # noqa: BLE001 - an exception class that cannot be rebuilt from its pickle
            data = pickle.dumps((StageError(f"{type(exc).__name__}: {exc}"), where))
        summary = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    write_bytes_atomic(Path(job["outcome"]), data)
    return summary


def main(argv: list[str] | None = None) -> int:
    return serve_job(argv, MODULE, "stage", _outcome)


if __name__ == "__main__":
    sys.exit(main())
