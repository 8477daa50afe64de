"""manifest.json, written last of all into a version's work folder: the seal of what sign-off decided and of
every file the version holds (the version folder appears by one rename after it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.core.files import sha256_file, write_json_atomic
from pipeline.decide.verdict import SignOff
from pipeline.recipe.loader import LoadedRecipe


def resolved_recipe(loaded: LoadedRecipe) -> dict[str, Any]:
    """The validated recipe with every default filled in; its paths are already absolute (the loader made
    them so), so it re-runs from anywhere."""
    return loaded.recipe.model_dump(mode="json")


def write_manifest(
    workdir: Path, loaded: LoadedRecipe, signoff: SignOff, release: dict[str, Any] | None = None
) -> None:
    """manifest.json: the header sign-off wrote into the report, the recipe, and every other file with its
    sha256 (the artifacts are listed with theirs). `release`: how it is published (the recipe keys its
    overrides change, whether it becomes latest: pipeline/release/promotion.py)."""
    header = signoff.header
    manifest = {
        "schema_version": 1,
        "name": header["name"],
        "version": header["version"],
        "created": header["created"],
        **signoff.outcome(),
        "git_revision": header["git_revision"],
        "git_dirty": header["git_dirty"],
        "recipe": resolved_recipe(loaded),
        "overrides": list(loaded.overrides),
        **(release or {}),
        "environment": header["environment"],
        "artifacts": header["artifacts"],
        "files": [],
    }
    listed = {a["path"] for a in manifest["artifacts"]}
    for path in sorted(p for p in workdir.rglob("*") if p.is_file()):
        rel = path.relative_to(workdir).as_posix()
        if rel != "manifest.json" and rel not in listed:
            manifest["files"].append({"path": rel, "sha256": sha256_file(path), "bytes": path.stat().st_size})
    write_json_atomic(workdir / "manifest.json", manifest)
