"""A full disk mid-deploy: exit 2 with `no space left on device while writing <file>`, no traceback, no
version, the work folder kept; after space is freed the next deploy resumes it and signs off with the same
bytes as an uninterrupted deploy. Needs a small tmpfs (root with CAP_SYS_ADMIN); skipped otherwise."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.reliability.conftest import TINY, Reference, deploy_args, mount_tmpfs, run_cli, sha

# Room for the TorchScript export (about 0.7 MB, twice: work folder and cache) but not for the ONNX one after it.
SMALL = "size=2m"


@pytest.mark.slow
def test_disk_full_is_a_user_error_and_the_next_deploy_resumes(reference: Reference, tmp_path: Path) -> None:
    root = tmp_path / "small"
    why = mount_tmpfs(root, "size=256k")
    if why:
        pytest.skip(f"cannot mount a small tmpfs here (needs root and CAP_SYS_ADMIN): {why}")
    try:
        # Too small for the TorchScript file itself (torch's own writer used to abort the process here).
        tiny_disk = run_cli(*deploy_args(TINY, root))
        assert tiny_disk.returncode == 2 and "Traceback" not in tiny_disk.stderr, tiny_disk.stderr[-2000:]
        assert "no space left on device while writing " in tiny_disk.stderr and "model.ts" in tiny_disk.stderr
        subprocess.run(["mount", "-o", f"remount,{SMALL}", str(root)], check=True)
        full = run_cli(*deploy_args(TINY, root))
        progress = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d \[")  # a deploy's stage lines (stderr)
        lines = [line for line in full.stderr.strip().splitlines() if not progress.match(line)]
        assert full.returncode == 2, full.stderr[-2000:]
        assert len(lines) == 1 and "Traceback" not in full.stderr
        assert (
            lines[0].startswith("--set output.root=")
            and "output.root: no space left on device while writing " in lines[0]
        )
        base = root / "tiny"
        assert not list(base.glob("v*")) and not (base / "latest").exists()
        assert len(list((base / ".work").iterdir())) >= 1
        subprocess.run(["mount", "-o", "remount,size=64m", str(root)], check=True)
        again = run_cli(*deploy_args(TINY, root))
        assert again.returncode == 0, again.stderr[-2000:]
        version = base / "v0001"
        stages = {s["name"]: s["status"] for s in json.loads((version / "stages.json").read_text())["stages"]}
        assert stages["export_torchscript"] == "reused", stages  # resumed from the work folder kept
        assert {name: sha(version / name) for name in reference.hashes} == reference.hashes
        assert list((base / ".work").iterdir()) == []
    finally:
        subprocess.run(["umount", str(root)], check=False)
