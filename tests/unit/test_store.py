"""Store: atomic publication, immutable versions, latest only on sign-off, content-addressed cache, lock."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.core.errors import LockHeldError
from pipeline.core.files import sha256_file, write_json_atomic
from pipeline.release.store import Store


def _work(store: Store, content: bytes = b"x") -> Path:
    work = store.new_work_dir()
    (work / "model.onnx").write_bytes(content)
    return work


def test_publish_is_one_rename_and_freezes_files(tmp_path: Path) -> None:
    store = Store(tmp_path, "m")
    work = _work(store)
    target = store.publish(work, store.next_version(), promote=True)
    assert target.name == "v0001" and not work.exists()
    assert not (target / "model.onnx").stat().st_mode & 0o222
    assert (store.base / "latest").resolve() == target
    assert os.readlink(store.base / "latest") == "v0001"  # relative link


def test_latest_does_not_move_to_a_failed_version(tmp_path: Path) -> None:
    store = Store(tmp_path, "m")
    store.publish(_work(store), store.next_version(), promote=True)
    failed = store.publish(_work(store, b"y"), store.next_version(), promote=False)
    assert failed.name == "v0002" and store.versions() == ["v0001", "v0002"]
    assert store.latest().name == "v0001"


def test_killed_run_leaves_only_a_work_folder(tmp_path: Path) -> None:
    store = Store(tmp_path, "m")
    _work(store)
    assert store.versions() == [] and store.latest() is None
    assert len(store.leftover_work_dirs()) == 1


def test_cache_detects_a_modified_file(tmp_path: Path) -> None:
    store = Store(tmp_path, "m")
    src = tmp_path / "a.bin"
    src.write_bytes(b"payload")
    sha = sha256_file(src)
    store.cache_put(src, sha)
    assert store.fetch(sha, tmp_path / "out" / "a.bin", []) is None
    assert (tmp_path / "out" / "a.bin").read_bytes() == b"payload"
    cached = store.cache_path(sha)
    cached.chmod(0o644)
    os.unlink(cached)
    cached.write_bytes(b"tampered")
    problem = store.fetch(sha, tmp_path / "again.bin", [])
    assert problem and "expected" in problem and not cached.exists()


def test_json_writes_are_atomic(tmp_path: Path) -> None:
    write_json_atomic(tmp_path / "r.json", {"a": 1})
    assert (tmp_path / "r.json").read_text().strip().startswith("{")
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_second_deploy_waits_then_names_the_lock(tmp_path: Path) -> None:
    store = Store(tmp_path, "m")
    store.base.mkdir(parents=True)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import filelock, sys, time; l = filelock.FileLock(sys.argv[1]); l.acquire(); print('held', flush=True); time.sleep(30)",
            str(store.base / ".deploy.lock"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        started = time.monotonic()
        with pytest.raises(LockHeldError) as info, store.lock(0.3):
            pass
        assert time.monotonic() - started >= 0.3
        assert ".deploy.lock" in str(info.value) and info.value.exit_code == 2
    finally:
        holder.kill()
        holder.wait()
    with store.lock(0):
        pass


def test_cache_entries_never_share_bytes_with_a_version(tmp_path: Path) -> None:
    store = Store(tmp_path, "m")
    work = _work(store, b"model bytes")
    sha = sha256_file(work / "model.onnx")
    store.cache_put(work / "model.onnx", sha)
    version = store.publish(work, store.next_version(), promote=True)
    entry = store.cache_path(sha)
    assert entry.stat().st_nlink == 1 and (version / "model.onnx").stat().st_nlink == 1
    os.unlink(entry)
    os.link(version / "model.onnx", entry)  # as stores made by earlier releases have it
    assert store.separate_cache() == 1
    assert entry.stat().st_nlink == 1 and (version / "model.onnx").stat().st_nlink == 1
    assert sha256_file(entry) == sha


def test_verify_names_damage_and_the_seal_covers_the_manifest(tmp_path: Path) -> None:
    import json

    store = Store(tmp_path, "m")
    work = _work(store, b"model bytes")
    write_json_atomic(
        work / "manifest.json",
        {
            "version": "v0001",
            "signed_off": True,
            "artifacts": [{"path": "model.onnx", "sha256": sha256_file(work / "model.onnx")}],
            "files": [],
        },
    )
    version = store.publish(work, "v0001", promote=True)
    assert store.verify("v0001") == []
    manifest = version / "manifest.json"
    manifest.chmod(0o644)
    data = json.loads(manifest.read_text())
    data["signed_off"] = False  # still valid JSON, every listed hash intact
    manifest.write_text(json.dumps(data))
    assert store.verify("v0001") == ["manifest.json: its content does not match its seal (manifest_sha256)"]


def test_a_signed_off_version_newer_than_latest_is_recovered(tmp_path: Path) -> None:
    store = Store(tmp_path, "m")
    for content in (b"a", b"b"):
        work = _work(store, content)
        write_json_atomic(
            work / "manifest.json",
            {
                "version": store.next_version(),
                "signed_off": True,
                "promoted": True,  # its deploy meant to make it latest
                "artifacts": [{"path": "model.onnx", "sha256": sha256_file(work / "model.onnx")}],
                "files": [],
            },
        )
        store.publish(work, store.next_version(), promote=content == b"a")  # as if killed before latest
    assert store.latest().name == "v0001"
    assert store.recover_latest() == "v0002" and store.latest().name == "v0002"
    assert store.recover_latest() is None


def test_recovery_never_makes_a_candidate_latest(tmp_path: Path) -> None:
    """A candidate (its --set changed the recipe) published without moving latest is not a deploy killed
    before its latest swap: recovery leaves latest where it was."""
    store = Store(tmp_path, "m")
    for content, promoted in ((b"a", True), (b"b", False)):
        work = _work(store, content)
        write_json_atomic(
            work / "manifest.json",
            {
                "version": store.next_version(),
                "signed_off": True,
                "promoted": promoted,
                "artifacts": [{"path": "model.onnx", "sha256": sha256_file(work / "model.onnx")}],
                "files": [],
            },
        )
        store.publish(work, store.next_version(), promote=promoted)
    assert store.latest().name == "v0001"
    assert store.recover_latest() is None and store.latest().name == "v0001"
