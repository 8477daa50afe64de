"""One (recipe, target) deploy as a Ray task: the worker runs `python -m pipeline deploy … --json` as a child
tied to it, so a deploy on a node runs exactly as a person runs it there, and dies with its worker (a worker
killed mid-deploy leaves only the deploy's work folder, never a version; Ray then runs the task again)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.core.children import child_env, popen_tied, python
from pipeline.core.files import write_json_atomic

if TYPE_CHECKING:
    from pipeline.fleet.seed import Seed

WAIT_S = 0.2  # between checks for a cancel and the deploy's deadline
STOP_S = 60.0  # how long a deploy asked to stop (Ctrl-C on the driver, a timeout) may take to leave cleanly


@dataclass(frozen=True)
class Job:
    target: str
    recipe: str  # the recipe file
    sets: tuple[str, ...]  # every override: the recipe entry's, the target's, the store's root
    promote: bool
    cwd: str  # where the driver runs: model entrypoints are imported from there, as for a local deploy
    timeout_s: float
    state: str  # the fleet run's folder for attempt files (the test that kills a worker reads them)
    gpu: bool = False  # the target asks for a GPU; a CPU target's deploy sees none, even on a GPU node
    seed: Seed | None = None  # store: copy — the shared store's state, for a deploy into the node's scratch

    def environment(self) -> dict[str, str]:
        """The deploy's environment: the worker's, with this checkout first and the driver's folder last on the
        import path (children.child_env: the tool is not shadowed by a pipeline.py there, the model's module
        imports from there), and every GPU hidden from a CPU target (Ray leaves
        CUDA_VISIBLE_DEVICES alone for a task that holds no GPU, so its deploy would otherwise build and time
        GPU variants and sign off the GPU's figures under a CPU label)."""
        env = child_env(folder=self.cwd)
        if not self.gpu:
            env["CUDA_VISIBLE_DEVICES"] = ""
        return env

    @property
    def key(self) -> str:
        return f"{self.target}__{Path(self.recipe).stem}"

    def command(self) -> list[str]:
        command = python("-m", "pipeline", "deploy", self.recipe, "--json", "-q")
        for override in self.sets:
            command += ["--set", override]
        return command + (["--promote"] if self.promote else [])


def run_job(job: Job) -> dict[str, Any]:
    """The deploy's JSON document and how it ended; runs in a Ray worker."""
    attempt = _attempt(job)
    started = time.monotonic()
    with tempfile.TemporaryFile() as stdout, tempfile.TemporaryFile() as stderr:
        proc = popen_tied(
            job.command(),
            cwd=job.cwd,
            env=job.environment(),
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
        )
        timed_out = False
        try:
            _note(job, attempt, deploy_pid=proc.pid)
            # short waits: ray.cancel raises KeyboardInterrupt here between two of them (a single long wait
            # would not see it until the deploy ended)
            while proc.poll() is None:
                if time.monotonic() - started > job.timeout_s:
                    timed_out = True
                    _stop(proc)
                    break
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=WAIT_S)
        except BaseException:
            # ray.cancel's KeyboardInterrupt, or a failure here: the deploy publishes nothing
            _stop(proc)
            raise
        out = _read(stdout)
        tail = _read(stderr).strip().splitlines()[-8:]
    document = None
    with contextlib.suppress(ValueError):
        document = json.loads(out) if out else None
    return {
        "target": job.target,
        "recipe": job.recipe,
        "exit_code": proc.returncode,
        "timed_out": timed_out,
        "error": f"the deploy ran past the fleet's timeout_s ({job.timeout_s:g} s) and was stopped"
        if timed_out
        else None,
        "document": document,
        "stderr_tail": tail,
        "attempt": attempt,
        "seconds": round(time.monotonic() - started, 1),
        "node": os.uname().nodename,
    }


def _read(file: Any) -> str:
    file.seek(0)
    return file.read().decode(errors="replace")


def _stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=STOP_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _attempt(job: Job) -> int:
    """This run's attempt number for the job (1, then 2 after a worker died), noted with the worker's pid."""
    folder = Path(job.state)
    folder.mkdir(parents=True, exist_ok=True)
    attempt = len(list(folder.glob(f"{job.key}.attempt-*.json"))) + 1
    _note(job, attempt)
    return attempt


def _note(job: Job, attempt: int, deploy_pid: int | None = None) -> None:
    note = {"worker_pid": os.getpid(), "deploy_pid": deploy_pid, "node": os.uname().nodename}
    write_json_atomic(Path(job.state) / f"{job.key}.attempt-{attempt}.json", note)
