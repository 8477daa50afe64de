"""A child for run_job tests: writes its pid where the job says, then sleeps.
Run as `python -m tests.reliability.sleepy_job JOB.json` (pipeline.core.children.run_job)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from pipeline.core.children import serve_job


def build(job: dict[str, Any]) -> dict[str, Any]:
    Path(job["pid"]).write_text(str(os.getpid()))
    time.sleep(float(job["sleep_s"]))
    return {"ok": True}


if __name__ == "__main__":
    sys.exit(serve_job(None, "tests.reliability.sleepy_job", "sleepy", build))
