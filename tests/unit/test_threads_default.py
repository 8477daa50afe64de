"""How many threads a CPU runtime gets when the recipe names none: OMP_NUM_THREADS where the environment sets
it, else the cores the deploy may run on (its CPU affinity), never more threads than cores it can use."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.inputs.specs import RunnerSettings
from pipeline.recipe.loader import load

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "tests/recipes/tiny.yaml"


def _threads(*overrides: str) -> int:
    return RunnerSettings.from_recipe(load(TINY, list(overrides)).recipe).threads


def test_the_environments_omp_num_threads_is_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert _threads() == 3


def test_the_recipe_beats_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert _threads("benchmark.intra_op_threads=2") == 2


def test_openmps_list_form_gives_its_outermost_level(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "3,2")
    assert _threads() == 3


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="no CPU affinity on this OS")
@pytest.mark.parametrize("value", ["", "0", "four", "-1"])
def test_an_unusable_omp_num_threads_falls_back_to_the_cores(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", value)
    assert _threads() == len(os.sched_getaffinity(0))


def test_the_count_resolved_is_what_the_settings_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    """So that it is in every fingerprint built from them: a deploy under another OMP_NUM_THREADS or affinity
    does not reuse timings measured at another thread count."""
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert RunnerSettings.from_recipe(load(TINY, []).recipe).intra_op_threads == 3


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this OS")
def test_a_process_limited_to_one_core_gets_one_thread() -> None:
    """As `taskset -c 0` or a container's cpuset limits it: the machine's core count would oversubscribe."""
    code = (
        "import os, sys; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
        "from pathlib import Path; from pipeline.inputs.specs import RunnerSettings; "
        "from pipeline.recipe.loader import load; "
        f"print(RunnerSettings.from_recipe(load(Path({str(TINY)!r}), []).recipe).threads)"
    )
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"} | {"PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "1"
