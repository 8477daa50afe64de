"""Disk a team can live with: `prune RECIPE --keep N` removes old versions but the N newest, every promoted one
and `latest`, and the cache entries no remaining version holds. A version is removed by one rename out of the
store's listing first, so that no reader ever sees half of one; a cache entry the next deploy needs is simply
built again."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.core.stored import read_or_none
from pipeline.release.promotion import promoted_versions
from pipeline.release.store import MANIFEST, Store


@dataclass
class Pruned:
    removed: list[str] = field(default_factory=list)
    kept: dict[str, str] = field(default_factory=dict)  # version -> why
    freed_bytes: int = 0
    cache_entries: int = 0


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def plan(store: Store, keep: int) -> tuple[list[str], dict[str, str]]:
    """(versions to remove, versions kept with why): the `keep` newest, every one promoted explicitly
    (`promote`, `deploy --promote`), latest."""
    versions = store.versions()
    latest = store.latest()
    kept: dict[str, str] = {}
    for version in versions[max(0, len(versions) - keep) :] if keep else []:
        kept[version] = "newest"
    for version in sorted(promoted_versions(store) & set(versions)):
        kept.setdefault(version, "promoted")
    if latest is not None:
        kept[latest.name] = "latest"
    return [v for v in versions if v not in kept], kept


def prune(store: Store, keep: int, timeout_s: float, dry_run: bool = False) -> Pruned:
    """Under the deploy lock: remove what plan() does not keep, then the cache entries no kept version lists."""
    result = Pruned()
    with store.lock(timeout_s):
        remove, result.kept = plan(store, keep)
        for version in remove:
            folder = store.base / version
            result.freed_bytes += folder_bytes(folder)
            result.removed.append(version)
            if not dry_run:
                _remove(folder)
        held = _listed_hashes(store, list(result.kept))
        for entry in sorted(store.cache_dir.glob("*/*")) if store.cache_dir.is_dir() else []:
            if entry.is_file() and not entry.name.startswith(".") and entry.name not in held:
                result.cache_entries += 1
                result.freed_bytes += entry.stat().st_size
                if not dry_run:
                    entry.unlink(missing_ok=True)
    return result


def _listed_hashes(store: Store, versions: list[str]) -> set[str]:
    held: set[str] = set()
    for version in versions:
        manifest = read_or_none(store.base / version / MANIFEST) or {}
        held |= {str(e.get("sha256")) for e in [*manifest.get("artifacts", []), *manifest.get("files", [])]}
    return held


def _remove(folder: Path) -> None:
    """Out of the listing in one rename, then deleted (its files are read-only: made writable first)."""
    trash = folder.with_name(f".pruned-{folder.name}-{os.getpid()}")
    os.rename(folder, trash)
    for path in trash.rglob("*"):
        if path.is_file() and not path.is_symlink():
            path.chmod(0o644)
    shutil.rmtree(trash)
