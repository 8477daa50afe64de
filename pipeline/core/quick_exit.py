"""Leave the process without tearing the interpreter down.

A deploy has imported PyTorch, ONNX Runtime and matplotlib; Python's own shutdown then frees every module and
object one by one: 0.5 to 1 s of each command, after its last line is printed and every file is written. What
shutdown does that matters is done here first: the atexit handlers run (logging's flush, temporary folders,
Ray and MLflow clients), Python's and C's standard streams are flushed, and output that could not be written
fails the command with exit code 120, as Python's own exit does. The ordinary exit is taken instead where a
thread other than the main one is still running and not a daemon (Python waits for it), and under a tracer or
profiler (cProfile and coverage write their results after the program returns).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
from typing import NoReturn

from pipeline.core.json_stdout import flush_c_stdio

UNWRITTEN = 120  # Python's exit code when flushing stdout at exit fails


def _others_running() -> bool:
    main = threading.main_thread()
    return any(t is not main and t.is_alive() and not t.daemon for t in threading.enumerate())


def _flushed() -> bool:
    """Python's streams and C's stdio flushed; False when some output could not be written."""
    written = True
    for stream in (sys.stdout, sys.stderr):
        if stream is None:  # no such stream (its file descriptor was closed at start)
            continue
        try:
            stream.flush()
        except (OSError, ValueError) as exc:
            written = False
            with contextlib.suppress(Exception):
                os.write(2, f"output could not be written: {exc}\n".encode())
    flush_c_stdio()
    return written


def quick_exit(code: int) -> NoReturn:
    ordinary = sys.gettrace() is not None or sys.getprofile() is not None
    if ordinary or threading.current_thread() is not threading.main_thread() or _others_running():
        sys.exit(code)
    atexit._run_exitfuncs()
    if not _flushed() and code == 0:
        code = UNWRITTEN
    os._exit(code)
