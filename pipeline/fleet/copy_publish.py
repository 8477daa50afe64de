"""`store: copy`, the driver's side: receive a version a node sent back, check every file's sha256 against the
version's own manifest, and publish it into the shared store with the store's own publication (one rename of a
finished work folder, under the recipe's deploy lock), so that it is indistinguishable from a version deployed
in place: the same number, seal, read-only files, `latest` and promotions log. A copy that fails the check
publishes nothing and its work folder is removed; a driver killed meanwhile leaves only `.work/<run-id>`,
which the next deploy removes, as a killed deploy's."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pipeline.fleet.seed import Seed
from pipeline.fleet.transfer import receive_files
from pipeline.release.promotion import make_latest
from pipeline.release.promotion import record as record_promotion
from pipeline.release.store import MANIFEST, SEAL, Store, manifest_digest


class CopyFailed(Exception):
    """The copy did not arrive as its manifest says: the cell fails with this reason and runs again."""


def publish_copy(chunks: Iterator[bytes], result: dict[str, Any], store: Store, seed: Seed) -> dict[str, Any]:
    """The task's result with the version published in the shared store and its paths pointing there; raises
    CopyFailed, located ("copy of tiny/v0003 from node n1: model.onnx sha256 differs from the manifest"),
    having published nothing."""
    copy = result.pop("copy")
    version = copy["version"]
    where = f"copy of {store.base.name}/{version or (result.get('document') or {}).get('version')}"
    where += f" from node {copy['node']}"
    if not version and not copy["promotions"] and copy["latest"] == seed.latest:
        return _pointing_to(store, result)  # nothing made and latest not moved: the shared store is as it was
    with store.lock(seed.lock_timeout_s):
        changed = _store_changed(store, seed)
        if changed:
            raise CopyFailed(f"{where}: {changed}; nothing published")
        if version:
            work = store.new_work_dir()
            try:
                _receive(chunks, copy["files"], work, version)
                store.publish(work, version, _manifest(work).get("promoted") is True)
            except CopyFailed as exc:
                raise CopyFailed(f"{where}: {exc}; nothing published") from None
            finally:
                shutil.rmtree(work, ignore_errors=True)  # gone once renamed; else the failed copy
        _replay_latest(store, version, copy)
    return _pointing_to(store, result)


def _pointing_to(store: Store, result: dict[str, Any]) -> dict[str, Any]:
    """The result with the version's paths in the shared store (the deploy named its scratch store's)."""
    document = result.get("document")
    if document and document.get("version") and store.version_folder(document["version"]).is_dir():
        folder = store.version_folder(document["version"]).resolve()
        document["path"] = str(folder)
        document["report"] = str(folder / "reports" / "signoff.html")
    return result


def _store_changed(store: Store, seed: Seed) -> str | None:
    """Why the deploy's view of the store is out of date (another deploy published or moved `latest` while
    it ran: its version number, or what it judged against, would be wrong), else None."""
    latest = store.latest()
    versions = store.versions()
    if (versions[-1] if versions else None) != seed.newest:
        return f"{versions[-1]} was published in the shared store while the deploy ran"
    if (latest.name if latest else None) != seed.latest:
        return (
            f"latest moved to {latest.name if latest else 'nothing'} in the shared store while the deploy ran"
        )
    return None


def _receive(chunks: Iterator[bytes], files: list[tuple[str, int]], work: Path, version: str) -> None:
    """Write the version's files into the work folder and check them against its manifest (hashed as they
    arrive): every listed file present with its sha256, nothing unlisted, the manifest's seal intact."""
    try:
        received, problems = receive_files(chunks, [(str(r), int(n)) for r, n in files], work)
    except Exception as exc:  # noqa: BLE001 - a lost node or object mid-copy: the copy failed, said so
        raise CopyFailed(f"the copy broke off ({type(exc).__name__}: {str(exc).splitlines()[0]})") from None
    manifest = _manifest(work) if MANIFEST in received else None
    if manifest is None:
        raise CopyFailed(f"{MANIFEST} did not arrive" if not problems else problems[0])
    listed = {str(e["path"]): str(e["sha256"]) for e in [*manifest["artifacts"], *manifest["files"]]}
    for rel, sha in listed.items():
        if rel not in received:
            problems.append(f"{rel} is missing from the copy")
        elif received[rel] != sha:
            problems.append(f"{rel} sha256 differs from the manifest")
    problems += [f"{rel} is not in the manifest" for rel in received if rel != MANIFEST and rel not in listed]
    if manifest.get(SEAL) != manifest_digest(manifest):
        problems.append(f"{MANIFEST} does not match its seal ({SEAL})")
    if manifest.get("version") != version:
        problems.append(f"{MANIFEST} names version {manifest.get('version')}, the copy is {version}")
    if problems:
        raise CopyFailed("; ".join(problems[:3]) + ("; …" if len(problems) > 3 else ""))


def _manifest(work: Path) -> dict[str, Any]:
    try:
        data = json.loads((work / MANIFEST).read_bytes())
    except (OSError, ValueError) as exc:
        raise CopyFailed(f"{MANIFEST} cannot be read ({exc})") from None
    if not isinstance(data, dict) or not all(isinstance(data.get(k), list) for k in ("artifacts", "files")):
        raise CopyFailed(f"{MANIFEST} does not list the version's files")
    return data


def _replay_latest(store: Store, version: str | None, copy: dict[str, Any]) -> None:
    """Make the shared store's `latest` and promotions log what the deploy made of its scratch copy (under the
    lock): a published version the deploy promoted is logged as it logged it (publish moved `latest`); an
    up-to-date candidate it promoted is made latest; a `latest` it recovered is moved there too."""
    for entry in copy["promotions"]:
        named, by = str(entry.get("version")), str(entry.get("by"))
        if named == version:
            record_promotion(store, named, by)
        elif store.version_folder(named).is_dir() and not store.verify(named):
            make_latest(store, named, by)
    current = store.latest()
    wanted = copy["latest"]
    if wanted and (current is None or current.name != wanted) and store.version_folder(wanted).is_dir():
        store.point_latest(wanted)
