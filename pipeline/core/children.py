"""Child processes that never outlive the deploy that started them: on Linux the kernel sends the child
SIGKILL when its parent dies (PR_SET_PDEATHSIG), however the parent died (SIGKILL included).

`run_job` is how a stage hands heavy native work to a child (TensorRT engine builds, AOTInductor compiles), and
`serve_job` the child's side of it:
a crash, a hang or process-wide state (loggers, stdout, compiler caches) stays in the child, and the stage
can run in a worker thread of the deploy while the child works (Executor background stages)."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pipeline
from pipeline.core.files import write_bytes_atomic

PR_SET_PDEATHSIG = 1


STOPPING = {signal.SIGINT, signal.SIGTERM}


def popen_tied(command: list[str], **kwargs: Any) -> subprocess.Popen:
    """subprocess.Popen whose child is killed when this process dies (Linux); elsewhere a plain Popen.

    The child starts with SIGINT and SIGTERM unblocked: a signal mask survives fork and exec, and a thread
    that blocks them (a Ray worker's task thread does) would start a child that a Ctrl-C can never stop."""
    if sys.platform.startswith("linux"):
        parent = os.getpid()
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved before the fork, only called after it

        # runs in the child between fork and exec: only a pre-resolved prctl, the signal mask, getppid and
        # _exit, no lock a thread of the parent could hold at the fork (background stages launch children
        # from a worker thread)
        def die_with_parent() -> None:
            prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPPING)
            if os.getppid() != parent:  # the parent died before the request took effect
                os._exit(1)

        kwargs["preexec_fn"] = die_with_parent
    return subprocess.Popen(command, **kwargs)


@dataclass
class JobOutcome:
    """What a child job left: its JSON result (None when it died without one), exit code (None: timed out
    and stopped), output lines and wall time."""

    result: dict[str, Any] | None
    returncode: int | None
    lines: list[str]
    wall_s: float
    command: list[str]

    def death(self, timeout_s: float | None, what: str, timeout_key: str) -> str:
        """Why the child left no result, as one sentence."""
        if self.returncode is None:
            return f"the {what} exceeded {timeout_key} ({timeout_s:g} s) and was stopped"
        return (
            f"the {what} process {how_it_ended(self.returncode)} without a result (native crash?); "
            f"last output: {last_lines(self.lines)}"
        )


def how_it_ended(returncode: int) -> str:
    """'exited with 7', or 'was killed by signal 9': the verb phrase after 'the worker process'."""
    return f"was killed by signal {-returncode}" if returncode < 0 else f"exited with {returncode}"


def exit_text(returncode: int) -> str:
    """'exit code 7', or 'signal 11: segmentation fault' (the name where the OS has one): what a user whose own
    code ended the process needs, to tell a crash from an exit."""
    if returncode >= 0:
        return f"exit code {returncode}"
    number = -returncode
    try:
        name = signal.strsignal(number) or ""
    except ValueError:
        name = ""
    return f"signal {number}: {name[:1].lower()}{name[1:]}" if name else f"signal {number}"


def last_lines(lines: list[str]) -> str:
    """A dead child's last output lines, on one line (what it said before it died)."""
    return " | ".join(lines[-5:]) or "no output"


def python(*args: str) -> list[str]:
    """The command line of a Python child of the tool. With -P, Python does not put the working folder first on
    the child's import path, where a user's own pipeline.py would shadow the tool (child_env puts this checkout
    first and the working folder last instead)."""
    return [sys.executable, "-P", *args]


def child_env(folder: str | None = None, **extra: str) -> dict[str, str]:
    """This process's environment for a child started by `python(...)`: this checkout first on its import
    path, then the caller's PYTHONPATH, then the folder the child runs in (`folder`, else this process's
    working folder: a model's module there imports in the child as it did in the tool)."""
    root = str(Path(pipeline.__file__).resolve().parent.parent)
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH"), folder or os.getcwd()) if p)
    return {**os.environ, **extra, "PYTHONPATH": path}


class Cancelled(BaseException):
    """The run a job belongs to is stopping (`cancel` was set): its child was killed. Not an Exception, so that
    no stage records it as a failure of its own (a resumed deploy then builds the variant again)."""


POLL_S = 0.2  # how often a job with a `cancel` event looks at it


def run_job(
    module: str,
    job: dict[str, Any],
    tmp: Path,
    timeout_s: float | None,
    report: Callable[[str], None] = print,
    cancel: threading.Event | None = None,
    env: dict[str, str] | None = None,
) -> JobOutcome:
    """Run `python -m <module> JOB.json` (the job must name its `result` file), streaming output lines to
    `report`; kill it on timeout, on an exception in the waiting thread (Ctrl-C in the main thread), when
    `cancel` is set (the run stops while a background stage waits here: raises Cancelled once the child is
    gone), and when this process dies. `env`: variables set for the child beside this process's own."""
    job_path = tmp / "job.json"
    job_path.write_text(json.dumps(job))
    command = python("-m", module, str(job_path))
    start = time.perf_counter()
    proc = popen_tied(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=child_env(**(env or {}))
    )
    lines: list[str] = []
    pump = threading.Thread(target=_pump, args=(proc, lines, report), daemon=True)
    pump.start()
    try:
        returncode = _wait(proc, timeout_s, cancel)
    except BaseException:  # Ctrl-C, an error here, or the run stopping: the child must not go on without us
        proc.kill()
        proc.wait()
        raise
    if returncode is None:  # past its timeout
        proc.kill()
        proc.wait()
    pump.join(timeout=10)
    result_path = Path(job["result"])
    result = json.loads(result_path.read_text()) if returncode is not None and result_path.is_file() else None
    return JobOutcome(result, returncode, lines, round(time.perf_counter() - start, 3), command[1:])


def _wait(proc: subprocess.Popen, timeout_s: float | None, cancel: threading.Event | None) -> int | None:
    """The child's exit code, or None once it has run for timeout_s; raises Cancelled when `cancel` is set."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
        step = left if cancel is None or (left is not None and left < POLL_S) else POLL_S
        try:
            return proc.wait(timeout=step)
        except subprocess.TimeoutExpired:
            if cancel is not None and cancel.is_set():
                raise Cancelled(f"{' '.join(proc.args[1:3])}: the run is stopping") from None
            if deadline is not None and time.monotonic() >= deadline:
                return None


def _pump(proc: subprocess.Popen, lines: list[str], report: Callable[[str], None]) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line.rstrip("\n"))
        report(line.strip())


def serve_job(
    argv: list[str] | None, module: str, tag: str, build: Callable[[dict[str, Any]], dict[str, Any]]
) -> int:
    """The child's side of run_job (`python -m <module> JOB.json`): read the job, build, write the JSON result
    atomically where the job says; exit 0 when the result is ok, 1 when not, 2 on a wrong command line."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(f"usage: python -m {module} JOB.json", file=sys.stderr)
        return 2
    job = json.loads(Path(args[0]).read_text())
    result = build(job)
    write_bytes_atomic(Path(job["result"]), json.dumps(result, indent=1).encode())
    if not result["ok"]:
        print(f"[{tag}] failed: {result['error']}", file=sys.stderr, flush=True)
    return 0 if result["ok"] else 1
