"""Leave the process without tearing the interpreter down.

A deploy has imported PyTorch, ONNX Runtime and matplotlib; Python's own shutdown then frees every module and
object one by one: 0.5 to 1 s of each command, after its last line is printed and every file is written. What
shutdown does that matters is done here first: the atexit handlers run (logging's flush, temporary folders,
Ray and MLflow clients) and the standard streams are flushed. Where a thread other than the main one is still
running and not a daemon, Python would wait for it, so the ordinary exit is taken instead.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
from typing import NoReturn


def _others_running() -> bool:
    main = threading.main_thread()
    return any(t is not main and t.is_alive() and not t.daemon for t in threading.enumerate())


def quick_exit(code: int) -> NoReturn:
    if threading.current_thread() is not threading.main_thread() or _others_running():
        sys.exit(code)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe or stream: nothing more can reach it
            stream.flush()
    os._exit(code)
