"""`python -m pipeline serve` as a user runs it, for tests: started on free ports and read until it says it is
ready; and what the served version's own winner runner answers, in this process, to compare with."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def start_serve(
    recipe: Path, root: Path, timeout_s: float = 120
) -> tuple[subprocess.Popen[str], list[str], int]:
    """The server process, the lines it printed up to `ready:`, and its HTTP port. The caller stops it."""
    command = [sys.executable, "-m", "pipeline", "serve", str(recipe), "--set", f"output.root={root}"]
    command += ["--http-port", "0", "--grpc-port", "0", "--metrics-port", "0"]
    server = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    deadline = time.monotonic() + timeout_s
    assert server.stdout is not None
    while time.monotonic() < deadline:
        line = server.stdout.readline()
        lines.append(line)
        if line.startswith("ready:") or not line:
            break
    if not lines[-1].startswith("ready:"):
        server.kill()
        server.communicate(timeout=30)
        raise AssertionError("".join(lines))
    return server, lines, int(lines[-1].split("http://127.0.0.1:")[1].split()[0])


def winner_outputs(version: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """What the version's winner, run by its own runner in this process, answers to `feeds`."""
    from pipeline.recipe.loader import load
    from pipeline.release.serve import winner_runner

    runner = winner_runner(load(version / "recipe.yaml").recipe, version).runner
    runner.activate()
    try:
        return runner.infer(feeds)
    finally:
        runner.deactivate()
