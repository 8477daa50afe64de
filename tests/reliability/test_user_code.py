"""Hostile model code, run through the real command: a model that exits, interrupts, hangs, crashes or prints
ends the tool with the exit code that says what happened and a message naming it, `--json` stdout is one JSON
document holding the error, and nothing is published or left behind where nothing was meant to be."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.reliability.conftest import FAST, ROOT, TINY, Result, run_cli, run_inprocess, sets

BAD = "tests.reliability.bad_models"
TIMEOUT_S = 300  # per command: a hang fails the test instead of stalling the run


def deploy(tmp: Path, entrypoint: str | None, *overrides: str, env: dict[str, str] | None = None) -> Result:
    """`deploy --json` of the tiny recipe with the factory swapped, from the repository, into tmp/out."""
    model = [f"model.entrypoint={entrypoint}"] if entrypoint else []
    args = sets(*FAST, f"output.root={tmp / 'out'}", *model, *overrides)
    return run_cli("deploy", str(TINY), "--json", *args, env=env, timeout=TIMEOUT_S)


def document(result: Result) -> dict[str, Any]:
    """stdout as exactly one JSON document (json.loads refuses anything before or after it)."""
    doc = json.loads(result.stdout)
    assert doc["exit_code"] == result.returncode, doc
    return doc


def nothing_published(root: Path) -> None:
    base = root / "tiny"
    assert not list(base.glob("v*")) and not (base / "latest").exists()
    assert not list(base.glob(".work/*")), "a work folder was left behind"


# ---------------------------------------------------------------- pre-flight: the model's code in a child

PREFLIGHT = {
    "factory calls sys.exit(0)": (
        f"{BAD}:exits",
        (),
        "building the model failed: UserCodeExit: the model's code called sys.exit(0)",
    ),
    "factory raises KeyboardInterrupt": (
        f"{BAD}:interrupts",
        (),
        "building the model failed: UserCodeExit: the model's code raised KeyboardInterrupt "
        "(no Ctrl-C reached the pipeline)",
    ),
    "factory calls os._exit(7)": (
        f"{BAD}:hard_exit",
        (),
        "building or running the model killed its process (exit code 7)",
    ),
    "factory segfaults": (
        f"{BAD}:segfault",
        (),
        "building or running the model killed its process (signal 11: segmentation fault)",
    ),
    "factory hangs": (
        f"{BAD}:hangs",
        ("model.build_timeout_s=4",),  # a forked check (the CLI's) is in the factory at once
        "building or running the model did not finish within model.build_timeout_s (4 s)",
    ),
    "module import ends the process": (
        "tests.reliability.dies_on_import:factory",
        (),
        "importing 'tests.reliability.dies_on_import' killed its process (exit code 7)",
    ),
}


@pytest.mark.parametrize("case", PREFLIGHT, ids=list(PREFLIGHT))
def test_hostile_model_code_is_a_located_user_error(case: str, tmp_path: Path) -> None:
    entrypoint, overrides, message = PREFLIGHT[case]
    started = time.monotonic()
    result = deploy(tmp_path, entrypoint, *overrides)
    line = f"--set model.entrypoint={entrypoint}: model.entrypoint: {message}"
    assert result.returncode == 2, (result.returncode, result.stderr[-3000:])
    assert line in result.stderr.splitlines(), result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert document(result)["errors"] == [line]
    assert not (tmp_path / "out").exists(), "pre-flight wrote under the output root"
    assert time.monotonic() - started < 120


def test_ctrl_c_still_stops_the_deploy_and_its_model_check(tmp_path: Path) -> None:
    """A Ctrl-C at the terminal reaches the whole process group: the deploy stops as interrupted (130), and the
    model check's child, which ignores it, is killed by the deploy."""
    marker = tmp_path / "model.pid"
    args = sets(
        f"output.root={tmp_path / 'out'}", f"model.entrypoint={BAD}:hangs", "model.build_timeout_s=300"
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline", "deploy", str(TINY), "--json", *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "BAD_MODEL_MARKER": str(marker)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert marker.exists(), "the model check never started"
        time.sleep(0.5)  # the factory is in its loop
        os.killpg(proc.pid, signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, stderr[-3000:]
    assert "interrupted: nothing was published" in stderr
    assert json.loads(stdout)["exit_code"] == 130
    child = int(marker.read_text())
    assert not Path(f"/proc/{child}").exists(), "the model check's child outlived the deploy"


# ---------------------------------------------------------------- stages: the model's code in the deploy


def test_a_model_whose_own_output_is_not_finite_is_the_error_not_every_artifact(tmp_path: Path) -> None:
    """The reference itself gives NaN on the recipe's inputs: every artifact would "fail" against it (the
    sign-off said "2 of 2 requested variants failed"); the deploy says the model is what to fix."""
    result = deploy(tmp_path, f"{BAD}:not_finite")
    assert result.returncode == 2, (result.returncode, result.stderr[-3000:])
    (line,) = document(result)["errors"]
    assert line.startswith("model: the model's own outputs are not finite on the recipe's validation inputs")
    assert "pooled at min:" in line and "NaN/inf values" in line and "hidden" not in line, line
    assert "Traceback" not in result.stderr
    base = tmp_path / "out" / "tiny"
    assert not list(base.glob("v*")) and not (base / "latest").exists()


@pytest.mark.slow
def test_sys_exit_while_a_stage_runs_the_model_fails_that_stage(tmp_path: Path) -> None:
    """The model exits only while TorchScript traces it: that variant fails with the reason, the others are
    built, judged and published (the ONNX graph by the dynamo exporter, which does not trace that way)."""
    result = deploy(tmp_path, f"{BAD}:exits_when_traced", "export.onnx.exporter=dynamo")
    doc = document(result)
    error = "UserCodeExit: the model's code called sys.exit(0)"
    assert doc["failed"] == [{"artifact": "torchscript-fp32", "stage": "export_torchscript", "error": error}]
    assert result.returncode == 0 and doc["status"] == "signed_off", result.stderr[-3000:]
    assert f"failed at export_torchscript: {error}" in result.stderr
    version = tmp_path / "out/tiny/v0001"
    assert "SystemExit" in (version / "logs/export_torchscript.error.txt").read_text()


@pytest.mark.slow
def test_keyboard_interrupt_from_the_model_in_validation_is_a_user_error(tmp_path: Path) -> None:
    """Validation cannot fail on its own (its failure stops the run): the model's KeyboardInterrupt there is
    a user error, not a Ctrl-C (130) and not a bug (3); nothing is published or left behind."""
    result = deploy(tmp_path, f"{BAD}:interrupts_on_batches")
    line = (
        "model: the model's code raised KeyboardInterrupt (no Ctrl-C reached the pipeline) in the validate "
        "stage, whose failure stops the run: nothing was published"
    )
    assert result.returncode == 2, (result.returncode, result.stderr[-3000:])
    assert line in result.stderr.splitlines() and "Traceback" not in result.stderr
    assert document(result)["errors"] == [line]
    nothing_published(tmp_path / "out")


@pytest.mark.slow
def test_what_the_model_prints_never_reaches_the_json_document(tmp_path: Path) -> None:
    """One deploy for two promises: a model that prints every way it can (Python, fd 1, C stdio, in forward,
    at exit) leaves stdout one JSON document; and with an unwritable HOME, matplotlib's temporary config folder
    outlives the deploy's temp folder (its atexit cleanup printed a traceback)."""
    unset = dict.fromkeys(("MPLCONFIGDIR", "XDG_CONFIG_HOME", "XDG_CACHE_HOME"), "")
    result = deploy(tmp_path, f"{BAD}:chatty", env={"HOME": "/proc", **unset})
    doc = document(result)
    assert result.returncode == 0 and doc["status"] == "signed_off", result.stderr[-3000:]
    for said in ("factory {", "fd 1", "C stdio", "forward", "atexit"):
        assert f"chatty: {said}" in result.stderr, said
    assert "chatty" not in result.stdout
    assert "Traceback" not in result.stderr, result.stderr[-3000:]


# ---------------------------------------------------------------- exit 0 only with an outcome


def _returns_nothing(*args: Any, **kwargs: Any) -> None:
    return None


def _exits(*args: Any, **kwargs: Any) -> None:
    sys.exit(0)


def _interrupts(*args: Any, **kwargs: Any) -> None:
    raise KeyboardInterrupt


WITHOUT_OUTCOME = {
    "returns nothing": (
        _returns_nothing,
        "the deploy returned NoneType without publishing a version or saying up to date",
    ),
    "sys.exit(0)": (_exits, "internal error: sys.exit(0) called during `deploy`: the command did not finish"),
    "KeyboardInterrupt": (
        _interrupts,
        "internal error: KeyboardInterrupt raised during `deploy` without a Ctrl-C",
    ),
}


@pytest.mark.parametrize("case", WITHOUT_OUTCOME, ids=list(WITHOUT_OUTCOME))
def test_a_deploy_without_an_outcome_exits_3(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever path leaves run_deploy without an outcome (a bug, or code no boundary caught), exit 0 is not
    one of its ends: exit 3 with a message, the JSON document holding it."""
    from pipeline.run import deploy as deploy_module

    run_deploy, message = WITHOUT_OUTCOME[case]
    monkeypatch.setattr(deploy_module, "run_deploy", run_deploy)
    result = run_inprocess("deploy", str(TINY), "--json", *sets(f"output.root={tmp_path / 'out'}"))
    assert result.returncode == 3, result.stderr[-3000:]
    assert message in result.stderr
    assert document(result)["exit_code"] == 3


def test_the_readme_names_everything_a_deploy_writes_outside_its_root(tmp_path: Path) -> None:
    """With an empty HOME and temp folder, what appears there after a deploy is what the README's trust-model
    paragraph lists (the list missed ONNX Runtime's ~/.cache/Microsoft/DeveloperTools and ~/.config/matplotlib)."""
    home, temp = tmp_path / "home", tmp_path / "tmp"
    home.mkdir()
    temp.mkdir()
    unset = dict.fromkeys(
        ("MPLCONFIGDIR", "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "TORCHINDUCTOR_CACHE_DIR"), ""
    )
    result = deploy(tmp_path, None, env={"HOME": str(home), "TMPDIR": str(temp), **unset})
    assert result.returncode == 0, result.stderr[-2000:]
    readme = (ROOT / "README.md").read_text()
    paragraph = readme[readme.index("Outside it, only caches") : readme.index("Temporary files (INT8")]
    written = sorted(
        "~/" + p.relative_to(home).as_posix()
        for p in home.rglob("*")
        if p.is_dir() and p.parent.relative_to(home).parts in {(), (".cache",), (".config",)}
    )
    written += sorted(
        p.name for p in temp.iterdir()
    )  # the system temp folder: named by pattern in the README
    named = {
        "~/.cache": "~/.cache/",
        "~/.config": "~/.config/",
        "~/.cache/matplotlib": "~/.cache/matplotlib",
        "~/.config/matplotlib": "~/.config/matplotlib",
        "~/.cache/Microsoft": "~/.cache/Microsoft/DeveloperTools",
    }
    for path in written:
        text = named.get(path, "torchinductor_<user>" if path.startswith("torchinductor_") else path)
        assert text in paragraph, f"{path} was written but the README does not name it"
