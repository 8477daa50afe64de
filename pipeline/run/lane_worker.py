"""A lane's worker: one child process that runs a lane's stages one after another while the deploy goes on with
the stages in front (pipeline/run/executor.py, Stage.lane).

A fresh interpreter (`python -m pipeline.run.lane_worker`), not a fork of the deploy: a fork of a process that has
used CUDA, OpenMP or ONNX Runtime thread pools inherits their locks in whatever state another thread held them
(the forked worker deadlocked in the ONNX export on the H200 host). It starts once per lane, imports torch while
the front goes on, and keeps one RunContext for all its stages, so the model and the data are loaded once (a
child per stage loaded them again: 5-13 s each on that host). A job is a stage's run function, config and
inputs, pickled over a socket pair; the answer is its StageResult, or its exception with the child's
traceback. The child limits its thread pools to `threads` (the stages in front keep the other cores), runs
the ONNX tools on ONNX Runtime's CPU provider (it opens a CUDA session only to check that an optimized graph
loads there, pipeline/check/graph_check.py), and exits within a fraction of a second of the deploy however the
deploy ends, or when the run stops.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from pipeline.core.children import POLL_S, Cancelled, child_env, how_it_ended, last_lines, python
from pipeline.core.files import storage_failure
from pipeline.core.user_code import contained, ignore_interrupts

Job = tuple[Any, Any, dict[str, Any]]  # (run function, config, inputs): picklable, the function by its name
PARENT_POLL_S = 0.2
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


class WorkerDied(RuntimeError):
    """The worker process ended without answering (a native crash, or killed)."""


class LaneWorker:
    """One child process that runs jobs in order. `run(key, job)` sends the job and returns what its run
    function returned in the child, or raises what it raised (with the child's traceback as a note)."""

    def __init__(self, lane: str, workdir: Path, cache_dir: Path | None, threads: int | None = None):
        self.lane = lane
        self._lock = threading.Lock()
        threads = threads or max(1, len(os.sched_getaffinity(0)) // 4)
        ours, theirs = socket.socketpair()
        command = python("-m", "pipeline.run.lane_worker", str(os.getpid()), str(theirs.fileno()))
        command += [str(threads), str(workdir), str(cache_dir or "")]
        # the child's own output, closed with the worker: its last lines say why it died
        self._output = tempfile.TemporaryFile()  # noqa: SIM115
        with theirs:
            # not popen_tied: its PR_SET_PDEATHSIG fires when the thread that started the child ends, and a
            # lane's worker outlives the job thread that may start it; the child watches its parent instead
            self._proc = subprocess.Popen(
                command,
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
                stdout=self._output,  # what the stages print belongs in their records, not the display
                stderr=subprocess.STDOUT,
                env=child_env(**dict.fromkeys(THREAD_ENV, str(threads))),
            )
        self.pid = self._proc.pid
        self._conn = Connection(ours.detach())
        self._jobs = 0

    def run(self, key: str, job: Job, cancel: threading.Event | None = None) -> Any:
        with self._lock:
            self._jobs += 1
            try:
                self._conn.send(job)
            except OSError:
                raise WorkerDied(self._died(key)) from None
            while not self._conn.poll(POLL_S):
                if cancel is not None and cancel.is_set():
                    self._proc.kill()
                    raise Cancelled(f"lane {self.lane}: {key}: the run is stopping")
                if self._proc.poll() is not None:
                    raise WorkerDied(self._died(key))
            try:
                ok, payload = self._conn.recv()
            except (EOFError, OSError):
                raise WorkerDied(self._died(key)) from None
        if ok:
            return payload
        error, child_traceback = payload
        error.add_note(f"(in the {self.lane} lane's worker process, pid {self.pid})\n{child_traceback}")
        raise error

    def alive(self) -> bool:
        return self._proc.poll() is None

    def close(self) -> None:
        """Let the child finish and reap it (killed if it does not end within 5 s, or at once if it never had
        a job: it may still be importing). Waits for a job in progress: stop() first to end it."""
        with self._lock:
            if not self._jobs:
                self._proc.kill()
            with contextlib.suppress(OSError):  # already stopped: the socket is closed
                self._conn.send(None)
            try:
                self._proc.wait(timeout=5.0)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._conn.close()
            self._output.close()

    def stop(self) -> None:
        """Kill the child now (the run is stopping): a job waiting on it ends; close() then reaps it."""
        self._proc.kill()

    def _died(self, key: str) -> str:
        how = how_it_ended(self._proc.wait())
        self._output.seek(0, os.SEEK_END)
        self._output.seek(max(0, self._output.tell() - 4000))
        output = self._output.read().decode(errors="replace").strip().splitlines()
        tail = last_lines([line.strip() for line in output])
        return f"the {self.lane} lane's worker process {how} while running {key}; last output: {tail}"


def _serve(conn: Connection, threads: int, workdir: Path, cache_dir: Path | None) -> None:
    """The child's loop: jobs until the parent sends None or goes away."""
    from pipeline.stages.base import RunContext

    _limit_threads(threads)
    ctx = RunContext(workdir, cache_dir=cache_dir)  # the model and data, loaded once for every job
    while True:
        try:
            message = conn.recv_bytes()
        except EOFError:
            return
        try:  # unpickling imports the stage's module: its failure is the job's, not the worker's
            job = pickle.loads(message)
            if job is None:
                return
            run, config, inputs = job
            with contained():  # the model's own sys.exit or KeyboardInterrupt: the stage's failure
                answer: tuple[bool, Any] = (True, run(ctx, config, inputs))
        except BaseException as exc:  # noqa: BLE001 - every error goes back to the parent
            answer = (False, (_picklable(exc), traceback.format_exc()))
        try:
            conn.send(answer)
        except Exception as exc:  # noqa: BLE001 - a result that does not pickle fails its stage, not the worker
            error = RuntimeError(f"the stage's result could not be sent back: {type(exc).__name__}: {exc}")
            conn.send((False, (error, traceback.format_exc())))


def _limit_threads(threads: int) -> None:
    """torch's intra-op pool, and every ONNX Runtime session the stages open here (INT8 calibration opens its
    own with a thread per core, spinning between runs): at most `threads` threads, none spinning."""
    import onnxruntime
    import torch

    torch.set_num_threads(threads)
    session = onnxruntime.InferenceSession
    opened = session.__init__

    def capped(self: Any, path_or_bytes: Any, sess_options: Any = None, *args: Any, **kwargs: Any) -> None:
        options = sess_options or onnxruntime.SessionOptions()
        if options.intra_op_num_threads <= 0 or options.intra_op_num_threads > threads:
            options.intra_op_num_threads = threads
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        opened(self, path_or_bytes, options, *args, **kwargs)

    session.__init__ = capped


def _picklable(exc: BaseException) -> BaseException:
    """The exception itself when it survives pickling (so the parent records its own type and message),
    else a RuntimeError with its type and message. A full or read-only disk behind it (pickling drops
    __cause__ and __context__, where storage_failure looks) comes back as that OSError, so that the parent
    stops the run (resumable) instead of recording a failed variant."""
    storage = storage_failure(exc)
    if storage is not None:
        return OSError(storage.errno, storage.strerror, storage.filename)
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001 - any pickling failure: fall back to the text
        return RuntimeError(f"{type(exc).__name__}: {exc}")


def _watch(parent: int) -> None:
    """Exit when the deploy that started this worker is gone, however it died (SIGKILL included)."""
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_S)
    os._exit(1)


def main(argv: list[str]) -> int:
    parent, fd, threads, workdir, cache_dir = argv
    ignore_interrupts()  # a Ctrl-C is the deploy's, which stops this worker: here, only code raises it
    threading.Thread(target=_watch, args=(int(parent),), daemon=True).start()
    _serve(Connection(int(fd)), int(threads), Path(workdir), Path(cache_dir) if cache_dir else None)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
