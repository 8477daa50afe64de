"""Pre-flight's model check in a child process (`python -m pipeline.preflight.model_child FD`): importing the user's
module, building the model and running it (preflight's entrypoint check, then model_check.model_problems) is
the user's code, which may hang, call os._exit or crash the interpreter. In a child, a hang is stopped after
`model.build_timeout_s` and a death is a located user error on the model's key; the tool lives on to say so.

The child inherits stdout and stderr, so what the model prints goes where it went when the check ran in the
tool (under --json, the CLI has pointed stdout at stderr for the whole command). It ignores SIGINT: a Ctrl-C is
the parent's, which kills the child, so a KeyboardInterrupt in the child was raised by the model's code. The
job (the validated recipe, pickled, and the parent's import path) comes on stdin; the child writes one JSON
object a line to the pipe FD: the phase it enters, then its findings, or the traceback of a bug of its own."""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any

from pipeline.core.children import PR_SET_PDEATHSIG, child_env, exit_text, popen_tied, python
from pipeline.core.errors import Problem
from pipeline.core.packages import installed, on_import_path
from pipeline.core.user_code import contained
from pipeline.recipe.loader import LoadedRecipe

if TYPE_CHECKING:
    from pipeline.recipe import EntrypointSource

EXIT_GRACE_S = 5.0  # how long a child that answered may take to exit before it is killed
# Test hook: the same checks and messages in this process, without a child's start-up of torch (3 s each): the
# bad-input table runs a hundred recipes in-process; the child's isolation is tested through the real command.
IN_PROCESS = "PIPELINE_TEST_MODEL_CHECK_INPROCESS"


@dataclass
class Findings:
    """What the child found: problems of importing the entrypoint's module, and of building and running the
    model (kept apart so that pre-flight lists them where it always has)."""

    entrypoint: list[Problem] = field(default_factory=list)
    model: list[Problem] = field(default_factory=list)
    # output -> kind (accuracy.output_kind), when the model ran
    outputs: dict[str, str] = field(default_factory=dict)


def check_model(loaded: LoadedRecipe, data_ok: bool, build: bool) -> Findings:
    """Run pre-flight's checks of the model's code in a child, within `model.build_timeout_s`. build=False:
    only import the entrypoint's module (the recipe has problems that building the model would trip on)."""
    job = {"recipe": loaded.recipe, "path": loaded.path, "data_ok": data_ok, "build": build}
    if os.environ.get(IN_PROCESS) == "1":
        answer: dict[str, Any] = {"findings": _findings(job, lambda phase: None)}
    else:
        answer = _run_child({**job, "sys_path": list(sys.path)}, loaded.recipe.model.build_timeout_s)
    if "bug" in answer:
        raise RuntimeError(f"the pre-flight model check failed in its child process:\n{answer['bug']}")
    if "findings" not in answer:
        death = [_death_problem(loaded, answer)]
        return Findings(entrypoint=death) if answer.get("phase") == "import" else Findings(model=death)
    found = answer["findings"]
    return Findings(
        [loaded.problem(key, message) for key, message in found["entrypoint"]],
        [loaded.problem(key, message) for key, message in found["model"]],
        dict(found.get("outputs") or {}),
    )


def _death_problem(loaded: LoadedRecipe, answer: dict[str, Any]) -> Problem:
    """The child ended without findings: what it was doing, and how it ended or that it ran out of time."""
    from pipeline.preflight.model_check import source_key

    recipe = loaded.recipe
    what = _phase_text(recipe, answer.get("phase"))
    if answer["returncode"] is None:
        limit = recipe.model.build_timeout_s
        return loaded.problem(
            source_key(recipe), f"{what} did not finish within model.build_timeout_s ({limit} s)"
        )
    return loaded.problem(
        source_key(recipe), f"{what} killed its process ({exit_text(answer['returncode'])})"
    )


def _phase_text(recipe: Any, phase: str | None) -> str:
    from pipeline.recipe import EntrypointSource

    if phase == "import" and isinstance(recipe.model, EntrypointSource):
        return f"importing '{recipe.model.entrypoint.partition(':')[0]}'"
    return "building or running the model"


# ---------------------------------------------------------------- the parent's side


def _run_child(job: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """The child's last answer (`findings` or `bug`), or `returncode` (None: timed out) and the last `phase`
    it entered when it left none. Killed on timeout, on Ctrl-C here, and when this process dies."""
    read_fd, write_fd = os.pipe()
    forked = _fork_safe()
    try:
        proc: Any = _fork(job, read_fd, write_fd) if forked else _spawn(write_fd)
    except BaseException:
        os.close(read_fd)
        raise
    finally:
        os.close(write_fd)
    answers = _Answers(os.fdopen(read_fd, "rb"))
    try:
        if not forked:
            _send(proc, job)
        answered = answers.done.wait(timeout_s)
    except BaseException:  # Ctrl-C, or an error here: the child must not go on without us
        proc.kill()
        proc.wait()
        raise
    return _reaped(proc, answers, answered)


class _Process:
    """Whether this process began as a command of the CLI before torch was imported (allow_fork): then no torch
    op can have run before pre-flight, so no OpenMP pool exists whose locks a fork would copy. A process that
    had torch before the CLI ran (a test runner, a notebook) may have run ops: a fork of it can deadlock in
    the child's first parallel region, so it gets a fresh interpreter."""

    fork_allowed = False


def allow_fork() -> None:
    """Called by the CLI first thing: a fork may serve the model check if torch is not imported yet."""
    _Process.fork_allowed = "torch" not in sys.modules


def _fork_safe() -> bool:
    """A fork of this process may run the check: the CLI started it fresh (_Process), torch is imported now (a
    deploy has imported its stages: the fork spares the child importing it again, 3 s of every deploy), and no
    other thread runs (a fork copies the locks other threads hold; pre-flight runs before the deploy starts
    any). Otherwise a fresh interpreter."""
    return (
        _Process.fork_allowed
        and "torch" in sys.modules
        and threading.active_count() == 1
        and hasattr(os, "fork")
    )


def _spawn(write_fd: int) -> subprocess.Popen:
    return popen_tied(
        python("-m", "pipeline.preflight.model_child", str(write_fd)),
        stdin=subprocess.PIPE,
        pass_fds=[write_fd],
        env=child_env(),
    )


class _Forked:
    """A forked child as the parent's side handles a Popen: wait with a timeout, and kill."""

    def __init__(self, pid: int):
        self.pid = pid
        self.returncode: int | None = None

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
            elif deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"model check {self.pid}", timeout or 0)
            else:
                time.sleep(0.02)
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)


def _fork(job: dict[str, Any], read_fd: int, write_fd: int) -> _Forked:
    """The check in a fork of this process: the same code as main(), with the job in memory. The child dies
    with the parent (PR_SET_PDEATHSIG) and leaves by os._exit, so nothing of the parent's runs at its exit."""
    pid = os.fork()
    if pid:
        return _Forked(pid)
    code = 1
    try:
        os.close(read_fd)
        _die_with_parent()
        with os.fdopen(write_fd, "w") as out:
            code = _serve(job, out)
    finally:
        os._exit(code)


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _send(proc: subprocess.Popen, job: dict[str, Any]) -> None:
    assert proc.stdin is not None
    try:
        with proc.stdin:
            pickle.dump(job, proc.stdin)
    except BrokenPipeError:  # it died before reading the job: its exit code says how
        pass


def _reaped(proc: subprocess.Popen, answers: _Answers, answered: bool) -> dict[str, Any]:
    """Wait for the child to end (a bounded grace once it answered or closed its pipe), kill it otherwise."""
    try:
        returncode: int | None = proc.wait(EXIT_GRACE_S if answered else 0)
    except subprocess.TimeoutExpired:
        returncode = None
        proc.kill()
        proc.wait()
    answers.reader.join(EXIT_GRACE_S)
    if answers.final is not None:
        return answers.final
    return {"returncode": returncode, "phase": answers.phase}


class _Answers:
    """Reads the child's lines in a thread: `done` is set at its final answer or when the pipe closes."""

    def __init__(self, stream: IO[bytes]):
        self.phase: str | None = None
        self.final: dict[str, Any] | None = None
        self.done = threading.Event()
        self.reader = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self.reader.start()

    def _read(self, stream: IO[bytes]) -> None:
        with stream:
            for line in stream:
                try:
                    message = json.loads(line)
                except ValueError:
                    continue
                if "phase" in message:
                    self.phase = message["phase"]
                else:
                    self.final = message
                    break
        self.done.set()


# ---------------------------------------------------------------- the child's side


def _findings(job: dict[str, Any], enter: Callable[[str], None]) -> dict[str, Any]:
    """(key, message) pairs: the parent locates them in the recipe (the child has no YAML positions); and
    under `outputs` each output's kind, when the model ran."""
    from pipeline.core.user_code import UserCodeExit
    from pipeline.preflight.model_check import model_problems, source_key
    from pipeline.recipe import EntrypointSource

    loaded = LoadedRecipe(job["recipe"], job["path"], {}, (), lambda loc, key=False: "")
    found: dict[str, list[Problem]] = {"entrypoint": [], "model": []}
    kinds: dict[str, str] = {}
    phase = "import" if isinstance(loaded.recipe.model, EntrypointSource) else "model"
    try:
        with contained():
            if phase == "import":
                enter(phase)
                found["entrypoint"] = entrypoint_problems(loaded, loaded.recipe.model)
            if job["build"] and not found["entrypoint"]:
                phase = "model"
                enter(phase)
                found["model"] = model_problems(loaded, job["data_ok"], kinds)
    except UserCodeExit as exc:  # where the checks do not catch it themselves (a package's __init__)
        message = f"{_phase_text(loaded.recipe, phase)}: {exc}"
        found["entrypoint" if phase == "import" else "model"] = [
            loaded.problem(source_key(loaded.recipe), message)
        ]
    answer: dict[str, Any] = {
        part: [(p.key, p.message) for p in problems] for part, problems in found.items()
    }
    return answer | {"outputs": kinds}


def _write(out: IO[str], message: dict[str, Any]) -> None:
    out.write(json.dumps(message) + "\n")
    out.flush()


def _serve(job: dict[str, Any], out: IO[str]) -> int:
    """The child's work: phases, then the findings (or the traceback of a bug of the check itself)."""
    from pipeline.core.user_code import ignore_interrupts

    ignore_interrupts()
    try:
        answer: dict[str, Any] = {"findings": _findings(job, lambda phase: _write(out, {"phase": phase}))}
    except Exception:  # noqa: BLE001 - a bug of the check itself: its traceback goes to the parent
        answer = {"bug": traceback.format_exc()}
    sys.stdout.flush()  # what the model printed lands before the parent may kill this process
    sys.stderr.flush()
    _write(out, answer)
    return 0


def main(argv: list[str]) -> int:
    with os.fdopen(int(argv[0]), "w") as out:
        job = pickle.load(sys.stdin.buffer)
        sys.path[:] = job["sys_path"]  # the user's modules import as they did in the parent
        return _serve(job, out)


def _import_hint(loaded: LoadedRecipe, module_name: str) -> str:
    """Where the module is, when it sits beside the recipe: the pipeline imports from where it is run and from
    PYTHONPATH (as Python does), not from the recipe's folder, so a module beside a recipe run from elsewhere
    is the usual cause."""
    top = module_name.split(".")[0]
    folder = loaded.path.parent.resolve()
    if not on_import_path(str(folder)) and ((folder / f"{top}.py").is_file() or (folder / top).is_dir()):
        return (
            f": it is in the recipe's folder, which is not on Python's import path; run `python -m pipeline` "
            f"from {folder}, or add that folder to PYTHONPATH"
        )
    return ": it is not on Python's import path (the folder `python -m pipeline` runs from, and PYTHONPATH)"


def entrypoint_problems(loaded: LoadedRecipe, src: EntrypointSource) -> list[Problem]:
    """The entrypoint's module imports and has the factory. Importing runs the user's code: pre-flight calls
    this in its model check's child process (pipeline/preflight/model_child.py), never in the tool's."""
    module_name, _, factory = src.entrypoint.partition(":")
    # only the top-level package is looked up without importing it: a missing submodule, or a package whose
    # own import fails, is said by the import below, with Python's own message
    if not installed(module_name.split(".")[0]):
        return [
            loaded.problem(
                "model.entrypoint", f"cannot import module '{module_name}'{_import_hint(loaded, module_name)}"
            )
        ]
    try:
        with contained():
            module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - the user's module failing to import is the user's to fix
        return [
            loaded.problem(
                "model.entrypoint", f"importing '{module_name}' failed: {type(exc).__name__}: {exc}"
            )
        ]
    if not callable(getattr(module, factory, None)):
        return [loaded.problem("model.entrypoint", f"module '{module_name}' has no callable '{factory}'")]
    return []


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
