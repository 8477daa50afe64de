"""Sign-off: the human reports, the resolved recipe, reproduce.sh and, last of all, manifest.json."""

from __future__ import annotations

import os
import shlex
import subprocess
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import yaml

from pipeline.recipe_loader import LoadedRecipe
from pipeline.run_record import RUN_RECORD, StageRecord
from pipeline.store import read_json, sha256_file, write_json_atomic, write_text_atomic
from pipeline.triton import write_model_repository
from pipeline.variants import FORMATS
from pipeline.verdict import Verdict, decide, shape_warnings, variant_failures

ARTIFACT_KINDS = FORMATS


def resolved_recipe(loaded: LoadedRecipe) -> dict[str, Any]:
    """The validated recipe with every default filled in; its paths are already absolute (the loader made
    them so), so it re-runs from anywhere."""
    return loaded.recipe.model_dump(mode="json")


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", *args], capture_output=True, text=True, timeout=5, cwd=Path(__file__).parent, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout


def git_revision() -> str | None:
    """The commit the pipeline's code came from (None outside a git checkout)."""
    return (_git("rev-parse", "HEAD") or "").strip() or None


def git_dirty() -> bool | None:
    """Whether the pipeline's code differs from that commit: a revision alone must not claim code it is not."""
    status = _git("status", "--porcelain", "--untracked-files=no", "--", str(Path(__file__).parent))
    return None if status is None else bool(status.strip())


def _read(path: Path) -> dict[str, Any] | None:
    return read_json(path)  # an earlier version's damaged report is warned about and left out


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


def _reproduce_script(loaded: LoadedRecipe, final: Path) -> str:
    """A script that re-runs this deploy on any machine with the project checkout and the recipe: it runs
    from $REPO (default: the folder the deploy ran from, relative to the version folder `final`), with the
    recipe and overrides as given, into the store that holds this version (wherever that now lies)."""
    cwd = Path.cwd().resolve()
    repo = os.path.relpath(cwd, final.resolve())
    recipe = (cwd / loaded.path).resolve()  # an absolute path stays absolute
    if recipe.is_relative_to(cwd):  # a recipe outside the checkout stays where it is
        recipe = recipe.relative_to(cwd)
    kept = [o for o in loaded.overrides if o.partition("=")[0].strip() != "output.root"]  # set below
    overrides = "".join(f" --set {shlex.quote(o)}" for o in kept)
    return (
        "#!/usr/bin/env sh\n"
        "# Re-runs this deploy: the same recipe and --set overrides, from the project checkout, into the store that\n"
        "# holds this version, so fresh stages are reused (pass --rebench to measure again). Same code: git checkout\n"
        "# the manifest's git_revision. REPO: the checkout (default: where the deploy ran, relative to this folder);\n"
        "# PYTHON: the interpreter (default: the checkout's .venv, else python3).\n"
        "set -eu\n"
        'here=$(cd "$(dirname "$0")" && pwd)\n'
        f'cd "${{REPO:-$here/{repo}}}"\n'
        'if [ -z "${PYTHON:-}" ]; then\n'
        "  if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi\n"
        "fi\n"
        f'exec "$PYTHON" -m pipeline deploy {shlex.quote(str(recipe))}{overrides} --set "output.root=$here/../.." "$@"\n'
    )


def judge(loaded: LoadedRecipe, records: list[StageRecord], workdir: Path) -> Verdict:
    """The verdict from what ran: requested and required variants (contract names), their failures, the
    selection, and the warnings the validation and the exports raised."""
    from pipeline.plan import artifact_name

    recipe = loaded.recipe
    requested = [artifact_name(recipe, v) for v in recipe.variants.build]
    required = [artifact_name(recipe, v) for v in recipe.variants.required]
    accuracy = _read(workdir / "reports/accuracy.json")
    speed = _read(workdir / "reports/speed.json")
    selection = _read(workdir / "reports/selection.json") or {"reasons": ["selection did not run"]}
    failures = variant_failures(requested, records, accuracy, speed)
    built = [out["artifact"] for r in records for out in r.outputs if out.get("kind") in ARTIFACT_KINDS]
    warnings = [*((accuracy or {}).get("warnings") or []), *shape_warnings(records, built)]
    return decide(requested, required, recipe.variants.allow_failed, failures, selection, warnings)


def write_signoff(
    workdir: Path,
    loaded: LoadedRecipe,
    version: str,
    records: list[StageRecord],
    environment: dict[str, Any],
    previous: Path | None,
) -> Verdict:
    """Write every sign-off file into the work folder, manifest.json last. winner.json only when signed off."""
    started = time.perf_counter()
    verdict = judge(loaded, records, workdir)
    selection = _read(workdir / "reports/selection.json") or {}
    winner = selection.get("winner") if verdict.signed_off else None
    if winner:
        write_json_atomic(workdir / "winner.json", winner)
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    resolved = resolved_recipe(loaded)
    outcome = {
        "signed_off": verdict.signed_off,
        "signoff_reasons": verdict.reasons,
        "headline": verdict.headline(),
        "provisional": verdict.provisional,
        "requested": verdict.requested,
        "failed": [f.to_json() for f in verdict.failures],
        "warnings": verdict.warnings,
    }
    header = {
        "name": loaded.recipe.name,
        "version": version,
        "created": created,
        **outcome,
        "git_revision": git_revision(),
        "git_dirty": git_dirty(),
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
    write_text_atomic(script, _reproduce_script(loaded, workdir.parent.parent / version))
    script.chmod(0o755)
    write_model_repository(workdir, loaded.recipe, winner, header["artifacts"], speed)  # export.triton
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
    record.details = {"signed_off": verdict.signed_off, "reasons": verdict.reasons}
    write_json_atomic(
        workdir / RUN_RECORD, {"schema_version": 1, "stages": [asdict(r) for r in [*records, record]]}
    )
    manifest = {
        "schema_version": 1,
        "name": loaded.recipe.name,
        "version": version,
        "created": created,
        **outcome,
        "git_revision": header["git_revision"],
        "git_dirty": header["git_dirty"],
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
    return verdict
