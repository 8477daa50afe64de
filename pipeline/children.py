"""Child processes that never outlive the deploy that started them: on Linux the kernel sends the child
SIGKILL when its parent dies (PR_SET_PDEATHSIG), however the parent died (SIGKILL included)."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from typing import Any

PR_SET_PDEATHSIG = 1


def popen_tied(command: list[str], **kwargs: Any) -> subprocess.Popen:
    """subprocess.Popen whose child is killed when this process dies (Linux); elsewhere a plain Popen."""
    if sys.platform.startswith("linux"):
        parent = os.getpid()
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved before the fork, only called after it

        def die_with_parent() -> None:  # runs in the child between fork and exec
            prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            if os.getppid() != parent:  # the parent died before the request took effect
                os._exit(1)

        kwargs["preexec_fn"] = die_with_parent
    return subprocess.Popen(command, **kwargs)
