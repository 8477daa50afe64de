"""--json's promise: stdout holds exactly one JSON document, whatever the command's code, the libraries it
uses and the user's model print while it runs."""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
from collections.abc import Iterator
from typing import TextIO


@contextlib.contextmanager
def json_stdout(active: bool) -> Iterator[TextIO]:
    """Yield where the JSON document goes (stdout as the command found it); while the block runs, everything
    else written to stdout goes to stderr. Inactive: yields sys.stdout and changes nothing.

    When stdout is the process's fd 1, the redirect is at the file-descriptor level, so that child processes,
    native code (printf) and the model's own prints follow it too; fd 1 then stays on stderr after the block,
    so that nothing the process prints later (atexit handlers, a model's daemon threads, C stdio buffers
    flushed at exit) can follow the document. Otherwise (stdout replaced in-process, as tests capture it) only
    sys.stdout is redirected, and restored after."""
    if not active:
        yield sys.stdout
        return
    original = sys.stdout
    real = _take_fd1(original) if _fileno(original) == 1 else None
    sys.stdout = sys.stderr
    try:
        yield real if real is not None else original
    finally:
        sys.stdout = original
        if real is not None:
            real.close()


def _take_fd1(stdout: TextIO) -> TextIO:
    """Point fd 1 at stderr and return a stream on what fd 1 was (the real stdout)."""
    stdout.flush()
    flush_c_stdio()
    saved = os.dup(1)
    os.dup2(2, 1)
    return os.fdopen(saved, "w", encoding="utf-8", closefd=True)


def _fileno(stream: TextIO) -> int | None:
    try:
        return stream.fileno()
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is an OSError and a ValueError
        return None


def flush_c_stdio() -> None:
    """What C code buffered for stdout goes out now: before fd 1 moves, or before the process leaves without
    C's own exit (pipeline/core/quick_exit.py)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).fflush(None)
