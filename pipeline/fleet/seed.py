"""What a copy-mode deploy is given of the shared store before it runs: the recipe's `latest` and newest
versions, its promotions log and where `latest` points, written into the node's scratch store. The deploy then
judges "up to date", reuses fresh stages, numbers its version and writes its report's "changes since" exactly
as it would against the shared store itself (pipeline/run/deploy.py reads no other version than these)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.core.files import write_bytes_atomic
from pipeline.fleet.transfer import Listing, put_folder, write_folder
from pipeline.release.store import PROMOTIONS, Store


@dataclass(frozen=True)
class Seed:
    name: str  # the recipe's name: its folder in the store
    latest: str | None  # the version `latest` named when the deploy was submitted
    newest: str | None  # the newest version then: the copied one must be the next after it
    versions: tuple[tuple[str, Listing, tuple[Any, ...]], ...]  # (version, its files, their chunks' refs)
    promotions: bytes | None  # promotions.json as it was
    lock_timeout_s: float  # how long publishing the copy waits for the shared store's deploy lock


def make_seed(ray: Any, store: Store, lock_timeout_s: float) -> Seed:
    """The shared store's recipe folder as the deploy would read it (unlocked: versions never change once
    published, and the copy is published only if `latest` and the newest version are still these)."""
    latest = store.latest()
    versions = store.versions()
    newest = versions[-1] if versions else None
    names = sorted({v for v in (latest.name if latest else None, newest) if v})
    sent = []
    for name in names:
        files, refs = put_folder(ray, store.base / name)
        sent.append((name, files, tuple(refs)))
    log = store.base / PROMOTIONS
    return Seed(
        store.base.name,
        latest.name if latest else None,
        newest,
        tuple(sent),
        log.read_bytes() if log.is_file() else None,
        lock_timeout_s,
    )


def plant_seed(ray: Any, seed: Seed, store: Store) -> None:
    """Write the seed into the node's scratch store (on the node, before the deploy starts)."""
    store.base.mkdir(parents=True, exist_ok=True)
    for name, files, refs in seed.versions:
        write_folder(ray, files, refs, store.base / name)
    if seed.promotions is not None:
        write_bytes_atomic(store.base / PROMOTIONS, seed.promotions)
    if seed.latest:
        store.point_latest(seed.latest)


def seeded(seed: Seed) -> set[str]:
    return {name for name, _, _ in seed.versions}


def scratch_store(root: Path, seed: Seed) -> Store:
    return Store(root, seed.name)
