"""A lane's worker: one process, forked from the deploy, that runs a lane's stages one after another while the
deploy goes on with the stages in front (pipeline/executor.py, Stage.lane).

Forked, not spawned: the child starts with everything the deploy has loaded (torch, transformers, the model,
the tokenized data), which a fresh interpreter took 5-13 s per stage to load again on the H200 host. It is
forked once per lane, from the deploy's main thread between stages, and runs only CPU work (ONNX exports and
conversions): a child forked after the parent used CUDA must not touch the GPU, and these stages never do (their
ONNX Runtime sessions use the CPU provider). It limits its own thread pools to a quarter of the CPUs, so that the
stages in front keep the rest, and it dies with the deploy (PR_SET_PDEATHSIG) or when the run stops.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection, Pipe
from typing import Any

from pipeline.children import POLL_S, PR_SET_PDEATHSIG, Cancelled

Job = Callable[[], Any]  # what the child runs: a stage's run with its config and inputs bound


class WorkerDied(RuntimeError):
    """The worker process ended without answering (a native crash, or killed)."""


class LaneWorker:
    """One forked child that runs jobs in order. `run(key, inputs)` sends the job key and its inputs, and
    returns what `handler(key, inputs)` returned in the child, or raises what it raised (with the child's
    traceback as a note)."""

    def __init__(self, lane: str, handler: Callable[[str, Any], Any], threads: int | None = None):
        self.lane = lane
        self._lock = threading.Lock()
        parent, child = Pipe()
        self.pid = os.fork()
        if self.pid == 0:  # the child: never returns
            parent.close()
            _serve(child, handler, threads or max(1, (os.cpu_count() or 4) // 4))
        child.close()
        self._conn = parent

    def run(self, key: str, inputs: Any, cancel: threading.Event | None = None) -> Any:
        with self._lock:
            self._conn.send((key, inputs))
            while not self._conn.poll(POLL_S):
                if cancel is not None and cancel.is_set():
                    self.stop()
                    raise Cancelled(f"lane {self.lane}: {key}: the run is stopping")
                if not self._alive():
                    raise WorkerDied(f"the {self.lane} lane's worker process ended while running {key}")
            try:
                ok, payload = self._conn.recv()
            except EOFError:
                raise WorkerDied(f"the {self.lane} lane's worker process ended while running {key}") from None
        if ok:
            return payload
        error, child_traceback = payload
        error.add_note(f"(in the {self.lane} lane's worker process, pid {self.pid})\n{child_traceback}")
        raise error

    def close(self) -> None:
        """Let the child finish and reap it."""
        with contextlib.suppress(OSError):  # already stopped: the pipe is closed
            self._conn.send(None)
        self._reap(timeout_s=5.0)

    def stop(self) -> None:
        """Kill the child now (the run is stopping)."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        self._reap(timeout_s=5.0)

    def _alive(self) -> bool:
        try:
            done, _ = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            return False
        return done == 0

    def _reap(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while self._alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        if self._alive():
            os.kill(self.pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.pid, 0)
        self._conn.close()


def _serve(conn: Connection, handler: Callable[[str, Any], Any], threads: int) -> None:
    """The child's loop: jobs until the parent sends None or goes away; then exit without running the
    parent's atexit handlers or flushing its buffers (they belong to the deploy)."""
    code = 0
    try:
        _tie_to_parent()
        _quiet_output()
        _limit_threads(threads)
        while True:
            try:
                message = conn.recv()
            except EOFError:
                break
            if message is None:
                break
            key, inputs = message
            try:
                answer: tuple[bool, Any] = (True, handler(key, inputs))
            except BaseException as exc:  # noqa: BLE001 - every error goes back to the parent
                answer = (False, (_picklable(exc), traceback.format_exc()))
            conn.send(answer)
    except BaseException:  # noqa: BLE001 - the child must never return into the parent's code
        code = 1
    finally:
        os._exit(code)


def _tie_to_parent() -> None:
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() == 1:  # the parent died before the request took effect
        os._exit(1)


def _quiet_output() -> None:
    """Fresh stdout/stderr objects on /dev/null: the parent's may have been locked by one of its threads at the
    fork, and what the stages print belongs in their records, not the deploy's display."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115 - lives as long as the process
    sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115


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
    else a RuntimeError with its type and message."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001 - any pickling failure: fall back to the text
        return RuntimeError(f"{type(exc).__name__}: {exc}")
