"""`store: copy` on a local Ray instance, as a user runs it: each deploy runs into a scratch store of its own
and its version is sent back through Ray's object store; the driver publishes it into the shared store only
when every file matches the version's manifest. Real deploys of the tiny recipe; the damage in transit comes
from the task's own test hook (PIPELINE_TEST_CORRUPT_COPY)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.core.test_hooks import CORRUPT_COPY, KEEP_SCRATCH
from pipeline.release.store import Store
from tests.reliability.conftest import ROOT, TINY

pytest.importorskip("ray", reason="the fleet extra: pip install 'deploy-pipeline[fleet]'")


def _fleet(tmp_path: Path, **extra: object) -> Path:
    spec = {
        "name": "copied",
        "root": "store",
        "store": "copy",
        "recipes": [{"path": str(TINY)}],  # as written (short windows): its deploy moves latest
        "targets": [{"name": "cpu", "cpu": 1}],
        **extra,
    }
    path = tmp_path / "fleet.yaml"
    path.write_text(json.dumps(spec))  # JSON is YAML
    return path


def _run(path: Path, **env: str) -> tuple[int, dict, str]:
    proc = subprocess.run(
        [sys.executable, "-m", "pipeline", "fleet", str(path), "--json"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
        capture_output=True,
        text=True,
        timeout=600,
    )
    return proc.returncode, json.loads(proc.stdout) if proc.stdout.strip() else {}, proc.stderr


def _pipeline(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pipeline", *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )


def _files(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


def test_a_copied_version_is_published_as_the_node_made_it_and_the_next_run_is_up_to_date(
    tmp_path: Path,
) -> None:
    kept = tmp_path / "kept"
    code, doc, err = _run(_fleet(tmp_path), **{KEEP_SCRATCH: str(kept)})
    assert code == 0, err[-3000:]
    cell = doc["recipes"][str(TINY)]["cpu"]
    assert cell["status"] == "signed_off" and cell["version"] == "v0001", cell
    store = Store(tmp_path / "store" / "cpu", "tiny")
    folder = store.version_folder("v0001")
    assert Path(cell["path"]) == folder.resolve()  # the shared store's folder, not the node's scratch
    assert store.verify("v0001") == []
    # byte for byte what the node's deploy published in its scratch store, manifest and seal included
    node_version = kept / "attempt-1" / "tiny" / "v0001"  # the node's scratch store, kept by the test hook
    assert _files(folder) == _files(node_version) and len(_files(folder)) > 5
    # as a deploy in place leaves it: latest, its promotion logged, read-only files, no work left over
    assert store.latest() == folder
    assert [e["version"] for e in store.promotions()] == ["v0001"]
    assert not any(p.stat().st_mode & 0o222 for p in folder.rglob("*") if p.is_file())
    assert store.leftover_work_dirs() == []
    where = ["--set", f"output.root={tmp_path / 'store' / 'cpu'}"]
    verified = _pipeline("verify", str(TINY), *where)
    assert verified.returncode == 0 and "tiny/v0001 matches its manifest" in verified.stdout, verified
    listed = _pipeline("list", str(TINY), *where)
    assert listed.returncode == 0 and "v0001" in listed.stdout and "latest" in listed.stdout, listed
    # the next run's scratch store is seeded with latest: nothing changed, so nothing is built or sent
    code, doc, err = _run(_fleet(tmp_path))
    assert code == 0, err[-3000:]
    cell = doc["recipes"][str(TINY)]["cpu"]
    assert cell["status"] == "up_to_date" and cell["version"] == "v0001", cell
    assert Path(cell["path"]) == folder.resolve() and store.versions() == ["v0001"]


def test_a_byte_damaged_in_transit_is_caught_publishes_nothing_and_the_retry_signs_off(
    tmp_path: Path,
) -> None:
    code, doc, err = _run(_fleet(tmp_path, retries=1), **{CORRUPT_COPY: "model.onnx"})
    assert code == 0, err[-3000:]
    said = " ".join(err.split())  # the console wraps long lines
    assert "copy of tiny/v0001 from node " in said
    assert "model.onnx sha256 differs from the manifest; nothing published); running it again" in said
    cell = doc["recipes"][str(TINY)]["cpu"]
    assert cell["status"] == "signed_off" and cell["attempts"] == 2, cell
    store = Store(tmp_path / "store" / "cpu", "tiny")
    assert store.versions() == ["v0001"]  # the damaged copy took no number
    assert store.verify("v0001") == [] and store.leftover_work_dirs() == []


def test_a_damaged_copy_with_no_retry_left_fails_its_cell_and_publishes_nothing(tmp_path: Path) -> None:
    code, doc, err = _run(_fleet(tmp_path, retries=0), **{CORRUPT_COPY: "model.onnx"})
    assert code == 1, err[-3000:]
    cell = doc["recipes"][str(TINY)]["cpu"]
    assert cell["status"] == "failed" and cell["why"].startswith("copy of tiny/v0001 from node "), cell
    assert cell["why"].endswith(": model.onnx sha256 differs from the manifest; nothing published"), cell
    store = Store(tmp_path / "store" / "cpu", "tiny")
    assert store.versions() == [] and store.latest() is None and store.leftover_work_dirs() == []
    assert not (store.base / "promotions.json").exists()
