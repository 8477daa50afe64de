"""Versions share unchanged artifacts where the file system copies on write, and only there: on an XFS file
system (made here on a loop device) a second version that changes one stage holds its artifacts in blocks the
first version holds too, `list` says how much of each is its own, and a write through one version changes only
that version's copy. On this machine's ext4, versions are copies and `list` says why."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.release.disk import shared_bytes
from pipeline.release.store import verify_folder
from tests.integration.test_deploy_cli import TINY, cli

CHANGE_ONE_STAGE = ["--set", "benchmark.max_s=0.2"]  # the benchmark and what follows it run again


@pytest.fixture(scope="module")
def xfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """An XFS file system (reflinks on, as mkfs.xfs makes it) mounted on a loop device for this module."""
    if shutil.which("mkfs.xfs") is None or os.geteuid() != 0:
        pytest.skip("needs mkfs.xfs (xfsprogs) and root to mount a loop device")
    base = tmp_path_factory.mktemp("xfs")
    image, mount = base / "fs.img", base / "mnt"
    mount.mkdir()
    with open(image, "wb") as f:
        f.truncate(512 * 1024 * 1024)
    subprocess.run(["mkfs.xfs", "-q", str(image)], check=True, timeout=60)
    mounted = subprocess.run(["mount", "-o", "loop", str(image), str(mount)], capture_output=True, timeout=60)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a loop device here: {mounted.stderr.decode(errors='replace').strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], timeout=60)


def _used(path: Path) -> int:
    s = os.statvfs(path)
    return (s.f_blocks - s.f_bfree) * s.f_frsize


def _listed(root: Path) -> dict:
    done = cli("list", str(TINY), "--json", root=root)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def test_a_version_that_changes_one_stage_shares_the_rest_copy_on_write(xfs: Path) -> None:
    root = xfs / "store"
    before = _used(xfs)
    first = cli("deploy", str(TINY), root=root)
    assert first.returncode == 0, first.stderr[-3000:]
    after_first = _used(xfs)
    second = cli("deploy", str(TINY), *CHANGE_ONE_STAGE, root=root)
    assert second.returncode == 0, second.stderr[-3000:]
    after_second = _used(xfs)
    v1, v2 = root / "tiny" / "v0001", root / "tiny" / "v0002"
    # every artifact of the second version sits in blocks another file (the cache, the first version) holds
    manifest = json.loads((v2 / "manifest.json").read_text())
    for entry in manifest["artifacts"]:
        path = v2 / entry["path"]
        assert shared_bytes(path) == path.stat().st_size > 0, entry["path"]
    # so the second version costs the disk its reports, not another copy of its artifacts
    artifacts = sum((v2 / e["path"]).stat().st_size for e in manifest["artifacts"])
    assert after_second - after_first < artifacts < after_first - before
    rows = {r["version"]: r for r in _listed(root)["versions"]}
    assert rows["v0002"]["shared_bytes"] >= artifacts and rows["v0002"]["own_bytes"] < artifacts
    assert rows["v0002"]["own_bytes"] + rows["v0002"]["shared_bytes"] == rows["v0002"]["bytes"]
    # a write through one version reaches no other: the blocks are copied on write
    target = v2 / manifest["artifacts"][0]["path"]
    target.chmod(0o644)
    with open(target, "r+b") as f:
        f.write(b"\x00" * 64)
    assert verify_folder(v1) == []
    assert any(line.startswith(manifest["artifacts"][0]["path"]) for line in verify_folder(v2))


def test_on_a_file_system_without_copy_on_write_versions_are_copies_and_list_says_so(tmp_path: Path) -> None:
    probe = tmp_path / "probe"
    probe.write_bytes(b"x" * 65536)
    if shared_bytes(probe) not in (0, None):
        pytest.skip("this file system shares blocks")
    for extra in ([], CHANGE_ONE_STAGE):
        done = cli("deploy", str(TINY), *extra, root=tmp_path)
        assert done.returncode == 0, done.stderr[-3000:]
    rows = _listed(tmp_path)["versions"]
    # nothing shared: 0 where the file system can say so, unknown (None) where it cannot (tmpfs)
    assert all(r["shared_bytes"] in (0, None) for r in rows) and len(rows) == 2
    assert all(r["own_bytes"] in (r["bytes"], None) for r in rows)
    shown = cli("list", str(TINY), root=tmp_path).stdout
    assert "each version is a full copy: this file system cannot share bytes copy-on-write" in shown
