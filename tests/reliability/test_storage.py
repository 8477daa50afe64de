"""Damaged storage is detected, never trusted: every file kind of a version and of the cache, corrupted, is
found by `verify` (exit 1, the file named) and by the next deploy (never `up to date` on a damaged latest; a
damaged cache entry is reported and rebuilt); a version never shares bytes with the cache; `latest` pointing
outside the recipe's folder is ignored; a read-only root answers `up to date` or exits 2."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.reliability.conftest import (
    FAST,
    TINY,
    Reference,
    deploy_args,
    mount_tmpfs,
    run_cli,
    run_inprocess,
    sets,
    sha,
)

KINDS = [
    "model.ts",
    "model.onnx",
    "stages.json",
    "recipe.yaml",
    "reproduce.sh",
    "winner.json",
    "manifest.json",
    "reports/accuracy.json",
    "reports/speed.json",
    "reports/signoff.md",
    "reports/signoff.html",
    "reports/latency.png",
    "logs/export_onnx.log",
]


def copy_of(reference: Reference, tmp: Path) -> Path:
    root = tmp / "out"
    shutil.copytree(reference.root, root, symlinks=True)
    return root


def writable(path: Path) -> Path:
    path.parent.chmod(0o755)
    path.chmod(0o644)
    return path


def flip(path: Path, offset: int = 40) -> None:
    data = bytearray(writable(path).read_bytes())
    data[min(offset, len(data) - 1)] ^= 0x80
    path.write_bytes(bytes(data))


def verify(root: Path, version: str = "latest"):
    return run_inprocess("verify", str(TINY), version, *sets(f"output.root={root}"))


def test_an_intact_version_verifies(reference: Reference) -> None:
    result = verify(reference.root)
    assert result.returncode == 0 and "ok: tiny/v0001" in result.stdout, result.stdout
    assert verify(reference.root, "v0001").returncode == 0


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("how", ["flip", "truncate", "delete"])
def test_verify_names_each_damaged_file(reference: Reference, tmp_path: Path, kind: str, how: str) -> None:
    root = copy_of(reference, tmp_path)
    path = root / "tiny/v0001" / kind
    assert path.is_file(), kind
    if how == "flip":
        flip(path)
    elif how == "truncate":
        writable(path).write_bytes(path.read_bytes()[:-7])
    else:
        writable(path).unlink()
    result = verify(root, "v0001")
    assert result.returncode == 1, result.stdout
    assert f"damaged: tiny/v0001/{kind}:" in result.stdout, result.stdout
    assert "Traceback" not in result.stderr


def test_an_unlisted_file_is_damage(reference: Reference, tmp_path: Path) -> None:
    root = copy_of(reference, tmp_path)
    (writable(root / "tiny/v0001/winner.json").parent / "extra.bin").write_bytes(b"x")
    result = verify(root)
    assert result.returncode == 1 and "tiny/v0001/extra.bin: not in the manifest" in result.stdout


def test_verify_user_errors(reference: Reference, tmp_path: Path) -> None:
    result = verify(reference.root, "v0009")
    assert result.returncode == 2 and "no such version (versions: v0001)" in result.stderr
    assert verify(tmp_path / "empty").returncode == 2


@pytest.mark.parametrize(
    "damage",
    ["delete model.onnx", "flip winner.json", "flip manifest.json"],
)
def test_a_damaged_latest_is_reported_and_a_new_version_built(
    reference: Reference, tmp_path: Path, damage: str
) -> None:
    root = copy_of(reference, tmp_path)
    how, name = damage.split()
    path = next((root / "tiny/v0001").rglob(name))
    writable(path).unlink() if how == "delete" else flip(path, 12)
    result = run_cli(*deploy_args(TINY, root))  # a process of its own: TorchScript names are per process
    assert result.returncode == 0, result.stderr[-2000:] + result.stdout[-2000:]
    assert "up to date" not in result.stdout and "damaged" in result.stdout
    assert "Traceback" not in result.stderr
    assert os.readlink(root / "tiny/latest") == "v0002"
    new = root / "tiny/v0002"
    assert {n: sha(new / n) for n in reference.hashes} == reference.hashes
    assert verify(root).returncode == 0
    if name.endswith(".json") and name != "manifest.json":  # damaged JSON is named, not fatal
        assert f"{name}: sha256" in result.stdout  # the damaged latest lends neither verdict nor history


def test_plan_says_what_the_deploy_will_do_with_a_damaged_latest(
    reference: Reference, tmp_path: Path
) -> None:
    root = copy_of(reference, tmp_path)
    flip(root / "tiny/v0001/stages.json", 12)
    result = run_inprocess("plan", str(TINY), *sets(*FAST, f"output.root={root}"))
    assert result.returncode == 0 and "Traceback" not in result.stderr
    assert "damaged" in result.stdout and "stages.json" in result.stdout
    assert "no signed-off version yet" in result.stdout and "fresh" not in result.stdout


def test_an_unreadable_run_record_is_a_warning_and_skipped(
    reference: Reference, tmp_path: Path, capsys
) -> None:
    from pipeline.stages.record import read_records

    root = copy_of(reference, tmp_path)
    version = root / "tiny/v0001"
    assert "export_onnx" in read_records(version)
    flip(version / "stages.json", 12)
    assert read_records(version) == {}
    err = capsys.readouterr().err
    assert f"warning: {version / 'stages.json'}: damaged (not UTF-8 at byte 12); ignored" in err


def test_cache_entries_are_copies_and_damage_is_rebuilt(reference: Reference, tmp_path: Path) -> None:
    root = copy_of(reference, tmp_path)
    version = root / "tiny/v0001"
    entries = [p for p in (root / "tiny/.cache").rglob("*") if p.is_file()]
    kinds = {sha(version / n): n for n in ("model.ts", "model.onnx", "logs/export_onnx.log")}
    assert set(kinds) <= {p.name for p in entries}
    on_disk = reference.root / "tiny/.cache"
    assert all(p.stat().st_nlink == 1 for p in on_disk.rglob("*") if p.is_file())  # never hard links
    for entry in entries:
        flip(entry)
    assert verify(root).returncode == 0  # the version does not share the damaged bytes
    # Stale validation makes the deploy fetch the fresh exports: from the cache, found damaged, then from v0001.
    result = run_inprocess(*deploy_args(TINY, root, "validation.tolerances.fp32.max_abs=2e-3"))
    assert result.returncode == 0, result.stderr[-2000:] + result.stdout[-2000:]
    assert result.stderr.count("warning: cache entry") >= 2, result.stderr
    new = root / "tiny/v0002"
    assert {n: sha(new / n) for n in reference.hashes} == reference.hashes
    for digest, name in kinds.items():
        entry = root / "tiny/.cache" / digest[:2] / digest
        assert entry.is_file() and sha(entry) == digest, name  # dropped, then put back by the run


def test_latest_pointing_outside_is_ignored(reference: Reference, tmp_path: Path) -> None:
    root = copy_of(reference, tmp_path)
    outside = tmp_path / "elsewhere"
    shutil.copytree(root / "tiny/v0001", outside, symlinks=True)
    (root / "tiny/latest").unlink()
    (root / "tiny/latest").symlink_to(outside)
    result = verify(root)
    assert result.returncode == 2 and "no signed-off version" in result.stderr
    assert "points to" in result.stderr and "ignored" in result.stderr


def test_read_only_root_is_up_to_date_or_a_user_error(reference: Reference, tmp_path: Path) -> None:
    mount = tmp_path / "ro"
    why = mount_tmpfs(mount, "size=16m")
    if why:
        pytest.skip(f"cannot mount a tmpfs here (needs root and CAP_SYS_ADMIN): {why}")
    try:
        shutil.copytree(reference.root / "tiny", mount / "tiny", symlinks=True)
        subprocess.run(["mount", "-o", "remount,ro", str(mount)], check=True)
        fresh = run_inprocess(*deploy_args(TINY, mount))
        assert fresh.returncode == 0 and fresh.stdout.strip().endswith("up to date: tiny/v0001")
        stale = run_inprocess(*deploy_args(TINY, mount), "--rebench")
        lines = stale.stderr.strip().splitlines()
        assert stale.returncode == 2 and len(lines) == 1 and "Traceback" not in stale.stderr
        assert "output.root: " in lines[0] and "not writable" in lines[0], lines
    finally:
        subprocess.run(["umount", str(mount)], check=False)


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="no /proc on this machine")
def test_a_root_the_file_system_refuses_is_a_located_user_error(tmp_path: Path) -> None:
    """/proc accepts no folders: `validate` cannot know without writing; deploy says so in one located line."""
    root = f"/proc/pipeline-test-{os.getpid()}"
    result = run_inprocess("deploy", str(TINY), *sets(f"output.root={root}"))
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr[-2000:]
    assert lines[0].startswith(f"--set output.root={root}: output.root: ") and "cannot create" in lines[0]
