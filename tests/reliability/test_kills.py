"""A deploy killed at every boundary (each stage, inside a cache write, before the version's rename, between
the rename and the `latest` swap) leaves no version that looks finished and no `latest` that lies; the next
deploy resumes from what the killed ones left, and the artifacts it ends with are byte-identical to an
uninterrupted deploy's. Kills land through the PIPELINE_TEST_KILL_AT hook, not by timing."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from tests.reliability.conftest import TINY, Reference, deploy_args, run_cli, sha

# In run order: each killed deploy resumes what the previous one left, then dies one boundary later.
POINTS = [
    "cache-put",  # inside the first cache write (export_torchscript's model.ts)
    "stage:export_onnx",  # a build stage done (export_torchscript before it too)
    "stage:validate",
    "stage:benchmark",  # a measurement done: select is a boundary of the same kind
    "publish",  # everything written, manifest last, before the rename into v0001
    "rename",  # v0001 in place, latest not yet moved
]


@pytest.mark.slow
def test_kills_at_every_boundary_then_resume(reference: Reference, tmp_path: Path) -> None:
    root = tmp_path / "out"
    base = root / "tiny"
    for point in POINTS:
        result = run_cli(*deploy_args(TINY, root), env={"PIPELINE_TEST_KILL_AT": point})
        assert result.returncode == -signal.SIGKILL, (point, result.returncode, result.stderr[-2000:])
        assert not (base / "latest").exists(), point
        versions = sorted(p.name for p in base.glob("v*"))
        assert versions == (["v0001"] if point == "rename" else []), (point, versions)
        if point == "cache-put":
            assert list(base.glob(".cache/*/.*.tmp-*")), "the hook fires inside the cache write"
        if point.startswith("stage:"):
            records = [json.loads(p.read_text()) for p in base.glob(".work/*/stages.json")]
            done = {s["name"] for r in records for s in r["stages"]}
            assert point.split(":")[1] in done, (point, done)
    final = run_cli(*deploy_args(TINY, root))
    assert final.returncode == 0, final.stderr[-2000:]
    assert "recovered: tiny/latest -> v0001" in final.stdout
    assert final.stdout.strip().endswith("up to date: tiny/v0001"), final.stdout[-1000:]
    assert os.readlink(base / "latest") == "v0001" and sorted(p.name for p in base.glob("v*")) == ["v0001"]
    version = base / "v0001"
    assert {name: sha(version / name) for name in reference.hashes} == reference.hashes
    stages = {s["name"]: s for s in json.loads((version / "stages.json").read_text())["stages"]}
    assert {s["status"] for s in stages.values()} <= {"ran", "reused"}
    assert stages["export_torchscript"]["status"] == "reused"  # resumed from a killed run, not redone
    assert run_cli("verify", str(TINY), "--set", f"output.root={root}").returncode == 0
    assert list(base.glob(".cache/*/.*.tmp-*")) == [] and not list(base.glob(".latest.tmp-*"))


@pytest.mark.slow
def test_a_second_version_killed_before_latest_moves_is_recovered(
    reference: Reference, tmp_path: Path
) -> None:
    """The rename/`latest` window on a store that already has a signed-off latest: no duplicate version."""
    import shutil

    root = tmp_path / "out"
    shutil.copytree(reference.root, root, symlinks=True)
    killed = run_cli(*deploy_args(TINY, root), "--rebench", env={"PIPELINE_TEST_KILL_AT": "rename"})
    assert killed.returncode == -signal.SIGKILL
    assert os.readlink(root / "tiny/latest") == "v0001" and (root / "tiny/v0002/manifest.json").is_file()
    again = run_cli(*deploy_args(TINY, root))
    assert again.returncode == 0 and "recovered: tiny/latest -> v0002" in again.stdout
    assert again.stdout.strip().endswith("up to date: tiny/v0002")
    assert sorted(p.name for p in (root / "tiny").glob("v*")) == ["v0001", "v0002"]


@pytest.mark.slow
def test_a_kill_inside_a_tool_leaves_its_temp_files_only_inside_the_root(tmp_path: Path) -> None:
    """A deploy's temporary files live in `<root>/<name>/.tmp` (not the system temp folder): a kill inside a
    tool's scratch folder leaves them there, and the next deploy removes them. TorchInductor's cache stays in
    the system temp folder, where it always is (a documented cache)."""

    def outside(folder: Path) -> list[str]:
        return sorted(p.name for p in folder.iterdir() if not p.name.startswith("torchinductor_"))

    root, system_tmp = tmp_path / "out", tmp_path / "system-tmp"
    system_tmp.mkdir()
    args = deploy_args(TINY, root, "variants.build=[onnx-fp32, onnx-optimized-fp32]")
    killed = run_cli(*args, env={"PIPELINE_TEST_KILL_AT": "scratch", "TMPDIR": str(system_tmp)})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert list((root / "tiny" / ".tmp").glob("onnx-scratch-*")), "the run died inside its scratch folder"
    assert outside(system_tmp) == []
    resumed = run_cli(*args, env={"TMPDIR": str(system_tmp)})
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert not (root / "tiny" / ".tmp").exists() and outside(system_tmp) == []
