"""Shared by the reliability tests: the CLI run as a user runs it (a child process from a folder of its own)
or in-process (cheap, for the bad-input table), and one reference deploy of the tiny recipe."""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.warm_cli import run_pipeline

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "tests/recipes/tiny.yaml"
# Short benchmark windows: these tests are about faults, not numbers (every run here uses the same settings,
# so that fingerprints match across them).
FAST = ("benchmark.min_s=0.05", "benchmark.max_s=0.15")
ARTIFACTS = ("model.ts", "model.onnx")


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


def sets(*overrides: str) -> list[str]:
    return [arg for o in overrides for arg in ("--set", o)]


def run_cli(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 300
) -> Result:
    """`python -m pipeline ...` in a child process (tests/warm_cli.py), from `cwd` (default: the repository)."""
    environ = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    done = run_pipeline(list(args), cwd=cwd or ROOT, env=environ, timeout=timeout)
    return Result(done.returncode, done.stdout, done.stderr)


def run_inprocess(*args: str) -> Result:
    """The CLI's main() in this process: the same code path, without a second start-up of torch."""
    from pipeline import cli
    from pipeline.preflight.model_child import IN_PROCESS

    out, err = io.StringIO(), io.StringIO()
    saved = os.environ.get(IN_PROCESS)
    os.environ[IN_PROCESS] = "1"  # the model check in this process too (the child is tested by run_cli)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli.main(list(args))
    finally:
        if saved is None:
            os.environ.pop(IN_PROCESS, None)
        else:
            os.environ[IN_PROCESS] = saved
    return Result(code, out.getvalue(), err.getvalue())


def deploy_args(recipe: Path, root: Path, *overrides: str) -> list[str]:
    return ["deploy", str(recipe), *sets(*FAST, f"output.root={root}", *overrides)]


def mount_tmpfs(path: Path, options: str) -> str | None:
    """Mount a tmpfs at path (None), or say why not (not root, no CAP_SYS_ADMIN): the test then skips."""
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True)
    return None if done.returncode == 0 else (done.stderr.decode().strip() or "mount failed")


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass
class Reference:
    root: Path  # <root>/tiny/v0001, signed off
    hashes: dict[str, str]  # artifact file -> sha256

    @property
    def base(self) -> Path:
        return self.root / "tiny"


@pytest.fixture(scope="session")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Reference:
    """One tiny deploy, run from an empty folder with the recipe in another: nothing may appear outside the
    output root (neither in the working directory nor beside the recipe)."""
    cwd, recipe_dir = tmp_path_factory.mktemp("cwd"), tmp_path_factory.mktemp("recipe")
    recipe = recipe_dir / "tiny.yaml"
    recipe.write_text(TINY.read_text())
    root = tmp_path_factory.mktemp("reference") / "out"
    result = run_cli(*deploy_args(recipe, root), cwd=cwd)
    assert result.returncode == 0, result.stderr[-3000:]
    assert list(cwd.iterdir()) == [] and [p.name for p in recipe_dir.iterdir()] == ["tiny.yaml"]
    version = root / "tiny" / "v0001"
    return Reference(root, {name: sha(version / name) for name in ARTIFACTS})
