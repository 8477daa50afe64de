"""`python -m pipeline fleet` on a local Ray instance, as a user runs it: two recipes (the tiny encoder and the
CNN example) on two CPU targets, one deploy per Ray task, into one store; a target no node has; a worker
killed mid-deploy; Ctrl-C on the driver."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.release.store import Store
from tests.reliability.conftest import ROOT, TINY

pytest.importorskip("ray", reason="the fleet extra: pip install 'deploy-pipeline[fleet]'")

CNN = ROOT / "recipes/examples/cnn/cnn.yaml"
# one export and short windows: these tests are about the fleet, not the variants or their speed
FAST = [
    "variants.build=[onnx-fp32]",
    "benchmark.min_s=0.05",
    "benchmark.max_s=0.15",
    "benchmark.window_s=0.02",
]
STORE = "store #1"  # a YAML comment sign in the path: the store's root reaches each deploy quoted


def _fleet_file(tmp_path: Path, recipes: list[Path], targets: list[dict], **extra: object) -> Path:
    spec = {
        "name": "release",
        "root": STORE,
        "recipes": [{"path": str(r), "set": FAST} for r in recipes],
        "targets": targets,
        **extra,
    }
    path = tmp_path / "fleet.yaml"
    path.write_text(json.dumps(spec))  # JSON is YAML
    return path


def _start(path: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-m", "pipeline", "fleet", str(path), *extra],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _versions(root: Path) -> list[Path]:
    return sorted(root.glob("*/*/v[0-9]*"))


def _wait_for(check, timeout_s: float, what: str):  # noqa: ANN001, ANN202
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"{what} did not happen within {timeout_s:g} s")


def _attempt(state_root: Path, key: str, number: int) -> dict:
    """The attempt file the task writes (worker and deploy pids), once the deploy has started."""

    def found() -> dict | None:
        for path in state_root.glob(f"*/{key}.attempt-{number}.json"):
            note = json.loads(path.read_text())
            if note.get("deploy_pid"):
                return note
        return None

    return _wait_for(found, 60, f"attempt {number} of {key}")


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # a zombie is gone for our purpose
    stat = Path(f"/proc/{pid}/stat")
    return not stat.exists() or stat.read_text().split()[2] == "Z"


def test_two_recipes_on_two_cpu_targets_land_in_one_store_and_a_missing_gpu_is_said_at_once(
    tmp_path: Path,
) -> None:
    targets = [
        {"name": "cpu-1t", "cpu": 1, "set": ["benchmark.intra_op_threads=1"]},
        {"name": "cpu-2t", "cpu": 2, "set": ["benchmark.intra_op_threads=2"]},
        {"name": "h200", "gpu": {"type": "H200"}},
    ]
    proc = _start(_fleet_file(tmp_path, [TINY, CNN], targets), "--json")
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 1, err[-3000:]  # the H200 target ran nothing: not every deploy signed off
    # said before any deploy ran, not after a wait
    assert err.index("target h200: no node with gpu:H200") < err.index("4 deploys submitted"), err
    doc = json.loads(out)
    assert doc["command"] == "fleet" and doc["signed_off"] is False
    store = tmp_path / STORE
    for recipe, name in ((str(TINY), "tiny"), (str(CNN), "cnn")):
        cells = doc["recipes"][recipe]
        assert cells["h200"] == {"status": "not_run", "why": "no node with gpu:H200"}
        for target, threads in (("cpu-1t", 1), ("cpu-2t", 2)):
            cell = cells[target]
            assert cell["status"] == "signed_off", cell
            folder = Path(cell["path"])
            assert folder.parent == store / target / name  # one store, a folder per target
            assert Store(store / target, name).verify(folder.name) == []
            manifest = json.loads((folder / "manifest.json").read_text())
            assert manifest["recipe"]["benchmark"]["intra_op_threads"] == threads  # the target's own setting
            assert cell["accuracy"].startswith("pass") and cell["speed"].startswith("p50_ms")
    markdown = Path(doc["report"]["markdown"]).read_text()
    assert "no node with gpu:H200" in markdown and "nothing signed off" in markdown
    assert not (store / ".fleet").exists()  # the run's own state is gone
    # compare works across the targets of one recipe
    a, b = (doc["recipes"][str(TINY)][t]["path"] for t in ("cpu-1t", "cpu-2t"))
    compared = subprocess.run(
        [sys.executable, "-m", "pipeline", "compare", a, b, "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=120,
    )
    assert compared.returncode in (0, 1), compared.stderr[-2000:]  # 1: B is slower beyond the budget
    diff = json.loads(compared.stdout)
    assert diff["recipe"] == [{"key": "benchmark.intra_op_threads", "a": "1", "b": "2"}]
    assert {row["runtime"] for row in diff["speed"]} >= {"onnxruntime-cpu"}


def test_a_worker_killed_mid_deploy_publishes_nothing_and_the_retry_signs_off(tmp_path: Path) -> None:
    path = _fleet_file(tmp_path, [TINY], [{"name": "cpu", "cpu": 1}], retries=1)
    proc = _start(path, "--json")
    store = tmp_path / STORE
    first = _attempt(store / ".fleet", "cpu__tiny", 1)
    _wait_for(lambda: list((store / "cpu/tiny/.work").glob("*/*")), 60, "the deploy's first work")
    assert _versions(store) == []
    os.kill(first["worker_pid"], signal.SIGKILL)  # the Ray worker running the deploy dies mid-deploy
    _wait_for(lambda: _gone(first["deploy_pid"]), 20, "the deploy dying with its worker")
    assert _versions(store) == []  # nothing published by the killed attempt
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    cell = json.loads(out)["recipes"][str(TINY)]["cpu"]
    assert cell["status"] == "signed_off" and cell["attempts"] == 2, cell
    assert [v.name for v in _versions(store)] == ["v0001"]
    assert Store(store / "cpu", "tiny").verify("v0001") == []
    assert "signed off v0001, attempt 2" in err


def test_ctrl_c_on_the_driver_stops_every_deploy_before_it_publishes(tmp_path: Path) -> None:
    path = _fleet_file(tmp_path, [TINY, CNN], [{"name": "cpu", "cpu": 1}])
    proc = _start(path)
    store = tmp_path / STORE
    notes = [_attempt(store / ".fleet", key, 1) for key in ("cpu__tiny", "cpu__cnn")]
    assert _versions(store) == []
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 130, err[-3000:]
    assert "interrupted: the 2 running deploys were stopped before publishing" in err
    for note in notes:
        assert _gone(note["deploy_pid"]) and _gone(note["worker_pid"])
    assert _versions(store) == []
    assert not (store / "fleet-release.json").exists() and not (store / "fleet-release.md").exists()


def test_a_deploy_past_the_fleet_timeout_is_stopped_and_said_so(tmp_path: Path) -> None:
    path = _fleet_file(tmp_path, [TINY], [{"name": "cpu", "cpu": 1}], timeout_s=2)
    proc = _start(path, "--json")
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, err[-3000:]
    cell = json.loads(out)["recipes"][str(TINY)]["cpu"]
    assert cell["status"] != "signed_off" and cell["why"].startswith(
        "the deploy ran past the fleet's timeout_s (2 s)"
    )
    assert _versions(tmp_path / STORE) == []
