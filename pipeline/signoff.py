"""Sign-off: the human reports, the resolved recipe, reproduce.sh and, last of all, manifest.json."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import yaml

from pipeline.executor import RUN_RECORD, StageRecord
from pipeline.recipe_loader import LoadedRecipe
from pipeline.store import sha256_file, write_json_atomic, write_text_atomic

ARTIFACT_KINDS = ("torchscript", "onnx", "engine", "exported", "aoti")


def resolved_recipe(loaded: LoadedRecipe) -> dict[str, Any]:
    """The validated recipe with every default filled in and every path absolute, so that it re-runs from
    anywhere (reproduce.sh runs it from the version folder)."""
    data = loaded.recipe.model_dump(mode="json")
    base = loaded.path.parent.resolve()

    def absolute(value: str) -> str:
        p = Path(value)
        return str(p if p.is_absolute() else (base / p).resolve())

    samples = data["data"]["samples"]
    if "path" in samples:
        samples["path"] = absolute(samples["path"])
    if data["model"].get("path"):
        data["model"]["path"] = absolute(data["model"]["path"])
    data["output"]["root"] = str(Path(data["output"]["root"]).resolve())
    return data


def git_revision() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            cwd=Path(__file__).parent,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def _read(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.is_file() else None


def _artifacts(records: list[StageRecord]) -> list[dict[str, Any]]:
    return [
        {
            "name": out["artifact"],
            "path": out["path"],
            "kind": out["kind"],
            "precision": out.get("precision"),
            "stage": r.name,
            "fingerprint": r.fingerprint,
            "sha256": out["sha256"],
            "bytes": out["bytes"],
            "details": out.get("details", {}),
        }
        for r in records
        for out in r.outputs
        if out.get("kind") in ARTIFACT_KINDS and out.get("artifact")
    ]


def _reproduce_script(loaded: LoadedRecipe) -> str:
    cwd = shlex.quote(str(Path.cwd()))
    return (
        "#!/usr/bin/env sh\n"
        "# Re-runs this deploy from the resolved recipe saved beside this script (absolute paths, defaults filled).\n"
        "# Fresh stages are reused; pass --rebench to measure again. Same code: git checkout the manifest's git_revision.\n"
        "set -eu\n"
        'here=$(cd "$(dirname "$0")" && pwd)\n'
        f"cd {cwd}\n"
        f'exec {shlex.quote(sys.executable)} -m pipeline deploy "$here/recipe.yaml" "$@"\n'
    )


def write_signoff(
    workdir: Path,
    loaded: LoadedRecipe,
    version: str,
    records: list[StageRecord],
    environment: dict[str, Any],
    previous: Path | None,
) -> tuple[bool, list[str]]:
    """Write every sign-off file into the work folder, manifest.json last. Returns (signed_off, reasons)."""
    started = time.perf_counter()
    selection = _read(workdir / "reports/selection.json") or {
        "signed_off": False,
        "reasons": ["selection did not run"],
    }
    signed_off, reasons = bool(selection["signed_off"]), list(selection["reasons"])
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    resolved = resolved_recipe(loaded)
    header = {
        "name": loaded.recipe.name,
        "version": version,
        "created": created,
        "signed_off": signed_off,
        "signoff_reasons": reasons,
        "git_revision": git_revision(),
        "environment": environment,
        "artifacts": _artifacts(records),
        "benchmark_reused_from": next(
            (r.reused_from for r in records if r.name == "benchmark" and r.status == "reused"), None
        ),
    }
    accuracy = _read(workdir / "reports/accuracy.json") or {
        "schema_version": 1,
        "artifacts": {},
        "not_run": [],
    }
    speed = _read(workdir / "reports/speed.json") or {"schema_version": 1, "results": [], "not_run": []}
    winner = _read(workdir / "winner.json")
    prev = None
    if previous is not None:
        prev = {
            "version": previous.name,
            "accuracy": _read(previous / "reports/accuracy.json"),
            "speed": _read(previous / "reports/speed.json"),
            "winner": _read(previous / "winner.json"),
        }
    from pipeline.report import write_signoff as render

    write_text_atomic(workdir / "recipe.yaml", yaml.safe_dump(resolved, sort_keys=False))
    script = workdir / "reproduce.sh"
    write_text_atomic(script, _reproduce_script(loaded))
    script.chmod(0o755)
    record = StageRecord("signoff", 1, None, "ran", {}, {}, {})
    stage_dicts = [asdict(r) for r in [*records, record]]
    written = render(workdir, header, accuracy, speed, winner, stage_dicts, prev)
    record.outputs = [
        {
            "path": p,
            "kind": "report",
            "sha256": sha256_file(workdir / p),
            "bytes": (workdir / p).stat().st_size,
        }
        for p in written
    ]
    record.duration_s = round(time.perf_counter() - started, 3)
    record.details = {"signed_off": signed_off, "reasons": reasons}
    write_json_atomic(
        workdir / RUN_RECORD, {"schema_version": 1, "stages": [asdict(r) for r in [*records, record]]}
    )
    manifest = {
        "schema_version": 1,
        "name": loaded.recipe.name,
        "version": version,
        "created": created,
        "signed_off": signed_off,
        "signoff_reasons": reasons,
        "git_revision": header["git_revision"],
        "recipe": resolved,
        "overrides": list(loaded.overrides),
        "environment": environment,
        "artifacts": header["artifacts"],
        "files": [],
    }
    listed = {a["path"] for a in manifest["artifacts"]}
    for path in sorted(p for p in workdir.rglob("*") if p.is_file()):
        rel = path.relative_to(workdir).as_posix()
        if rel != "manifest.json" and rel not in listed:
            manifest["files"].append({"path": rel, "sha256": sha256_file(path), "bytes": path.stat().st_size})
    write_json_atomic(workdir / "manifest.json", manifest)
    return signed_off, reasons
