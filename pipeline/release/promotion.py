"""Which version `latest` names, and who moved it there. A deploy of the recipe file as written moves `latest`
when it signs off; a deploy whose `--set` overrides change the recipe is a candidate, published beside the
others but not `latest` until `--promote` or `python -m pipeline promote` says so. An experiment then never
becomes what the next plain deploy compares against, nor what `latest`'s hand-offs serve.

Overrides of `output.*` (where versions are stored, how long to wait for the lock) and `tracking.*` (where
the run is recorded) change no artifact: they do not make a candidate."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pipeline.core.errors import PipelineError, Problem
from pipeline.core.files import write_json_atomic
from pipeline.core.stored import read_stored
from pipeline.recipe.loader import LoadedRecipe, load
from pipeline.release.manifest import resolved_recipe
from pipeline.release.store import MANIFEST, PROMOTIONS, VERSION_RE, Store

LOCATION_ONLY = ("output", "tracking")  # the recipe sections that say where, not what


def recipe_changes(loaded: LoadedRecipe) -> list[str]:
    """The recipe keys the overrides change against the recipe file alone (`output.*` aside), dotted."""
    keys = {o.partition("=")[0].strip() for o in loaded.overrides}
    if all(key.split(".")[0] in LOCATION_ONLY for key in keys):
        return []
    try:
        alone = resolved_recipe(load(loaded.path, []))
    except PipelineError:  # the file alone is no valid recipe: every override that is not a location counts
        return sorted(key for key in keys if key.split(".")[0] not in LOCATION_ONLY)
    return sorted(_differences(_what(alone), _what(resolved_recipe(loaded))))


def same_recipe(manifest: dict[str, Any], loaded: LoadedRecipe) -> bool:
    """The version was deployed from this recipe, wherever it was stored."""
    recipe = manifest.get("recipe")
    return isinstance(recipe, dict) and _what(recipe) == _what(resolved_recipe(loaded))


def record(store: Store, version: str, by: str) -> None:
    """Append a move of `latest` to the log (under the deploy lock)."""
    entries = store.promotions()
    entries.append({"version": version, "at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), "by": by})
    write_json_atomic(store.base / PROMOTIONS, {"promotions": entries})


EXPLICIT = ("promote", "deploy --promote")  # who promoted: a person, not a plain deploy's automatic move


def promoted_versions(store: Store) -> set[str]:
    """The versions promoted on purpose: by `promote` or `deploy --promote` (a plain deploy moving `latest`
    is not a promotion: prune may remove such a version once newer ones replace it)."""
    return {str(e.get("version")) for e in store.promotions() if e.get("by") in EXPLICIT}


def promote(store: Store, version: str, timeout_s: float) -> tuple[str | None, Path]:
    """Move `latest` to a signed-off, intact version; returns the version it named before, and the folder."""
    folder = store.base / version
    if not VERSION_RE.match(version) or not folder.is_dir():
        known = ", ".join(store.versions()) or "none"
        raise PipelineError(problems=[Problem(str(folder), "", f"no such version (versions: {known})")])
    with store.lock(timeout_s):
        damage = store.verify(version)
        if damage:
            raise PipelineError(
                problems=[Problem(str(folder), "", f"damaged, not promoted: {damage[0]} (verify lists all)")]
            )
        manifest = read_stored(folder / MANIFEST) or {}
        if manifest.get("signed_off") is not True:
            raise PipelineError(
                problems=[Problem(str(folder), "", "not signed off: only a signed-off version can be latest")]
            )
        before = store.latest()
        make_latest(store, version, "promote")
    return (before.name if before else None), folder


def make_latest(store: Store, version: str, by: str) -> None:
    """Point `latest` at a version checked signed off and intact, and log who did (under the deploy lock)."""
    store.point_latest(version)
    record(store, version, by)


def _what(recipe: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in recipe.items() if k not in LOCATION_ONLY}


def _differences(a: Any, b: Any, prefix: str = "") -> set[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        found: set[str] = set()
        for key in set(a) | set(b):
            found |= _differences(a.get(key), b.get(key), f"{prefix}{key}.")
        return found
    return {prefix.rstrip(".")} if a != b else set()
