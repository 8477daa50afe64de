"""The tests' warm `python -m pipeline` (tests/warm_cli.py) answers as a new interpreter does: the same exit
code, stdout and stderr, from the caller's working directory and environment, and a timeout kills it."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.warm_cli import ROOT, _server, run_pipeline

COMMANDS = [
    (["--version"], ROOT),
    (["deplyo", "x.yaml"], ROOT),  # a usage error: exit 2, said on stderr
    (["validate", "tiny.yaml", "--json"], ROOT / "tests/recipes"),  # a path relative to the caller's folder
]


@pytest.mark.parametrize("args,cwd", COMMANDS, ids=["version", "usage-error", "relative-recipe"])
def test_a_warm_command_answers_as_a_new_interpreter(args: list[str], cwd: Path) -> None:
    assert _server() is not None, "the warm server did not start"
    warm = run_pipeline(args, cwd=cwd, timeout=120)
    fresh = run_pipeline(args, cwd=cwd, timeout=120, fresh=True)
    assert (warm.returncode, warm.stdout, warm.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)


def test_the_callers_environment_reaches_the_command(tmp_path: Path) -> None:
    """PIPELINE_TEST_KILL_AT makes a deploy SIGKILL itself after its first stage: only a command that got
    the caller's environment dies that way."""
    env = {**os.environ, "PIPELINE_TEST_KILL_AT": "stage:export_torchscript"}
    args = ["deploy", "tests/recipes/tiny.yaml", "--set", f"output.root={tmp_path}"]
    assert run_pipeline(args, env=env, timeout=120).returncode == -signal.SIGKILL


def test_a_timeout_kills_the_command_and_says_so(tmp_path: Path) -> None:
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        run_pipeline(["deploy", "tests/recipes/tiny.yaml", "--set", f"output.root={tmp_path}"], timeout=0.5)
    assert time.monotonic() - started < 10
