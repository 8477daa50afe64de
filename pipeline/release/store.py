"""The artifact store: version folders that never change once they appear, a work folder per run, a
content-addressed cache, the `latest` pointer and the deploy lock.

Publication is one atomic rename of a finished work folder (manifest written last); a killed deploy leaves
only `.work/<run-id>`, never anything that looks like a version."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import stat
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import filelock

from pipeline.core.errors import LockHeldError, PipelineError
from pipeline.core.files import copy_file, sha256_file, write_json_atomic
from pipeline.core.stored import Damaged, read_or_none, read_stored
from pipeline.core.test_hooks import kill_point

VERSION_RE = re.compile(r"^v(\d{4,})$")
MANIFEST = "manifest.json"
PROMOTIONS = "promotions.json"  # beside the versions: every move of latest, oldest first
SEAL = "manifest_sha256"  # the manifest's own digest (canonical JSON without this key), added on publish
_warned: set[str] = set()


def warn(message: str) -> None:
    """One `warning:` line on stderr, once per message (damaged files found while reading old versions)."""
    if message not in _warned:
        _warned.add(message)
        print(f"warning: {message}", file=sys.stderr)


def read_json(path: Path) -> Any | None:
    """A contract file of an earlier run or version (pipeline/core/stored.py: bounded, and of the shape its readers
    rely on): None when absent, and None with a warning naming the path when damaged (stored data is never
    trusted)."""
    return read_or_none(path, warn)


def _read_only(path: Path) -> None:
    mode = path.stat().st_mode
    path.chmod(mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


class Store:
    def __init__(self, root: Path, name: str):
        self.base = root / name
        self.cache_dir = self.base / ".cache"
        self.work_root = self.base / ".work"

    # ------------------------------------------------------------ lock

    def create_problem(self) -> str | None:
        """Create the recipe's folder; why it cannot be (a root under /proc, a folder the file system
        refuses), or None."""
        try:
            self.base.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            return f"{self.base}: cannot create the output folder ({exc.strerror})"
        return None

    @contextlib.contextmanager
    def lock(self, timeout_s: float) -> Iterator[None]:
        problem = self.create_problem()
        if problem:
            raise PipelineError(problem)
        path = self.base / ".deploy.lock"
        lock = filelock.FileLock(str(path), timeout=timeout_s)
        try:
            lock.acquire()
        except filelock.Timeout:
            raise LockHeldError(
                f"{path}: another deploy of '{self.base.name}' holds the lock (waited {timeout_s:g} s; "
                "raise output.lock_timeout_s to wait longer)"
            ) from None
        try:
            yield
        finally:
            lock.release()

    def write_problem(self) -> str | None:
        """Why nothing can be written under this recipe's folder (a read-only mount, no permission), or None."""
        path = self.base
        while not path.exists() and path != path.parent:
            path = path.parent
        for folder in (path, self.work_root, self.cache_dir):
            if folder.is_dir() and not os.access(folder, os.W_OK):
                return f"{folder} is not writable (read-only file system or no permission)"
        return None

    # ------------------------------------------------------------ versions

    def versions(self) -> list[str]:
        if not self.base.is_dir():
            return []
        found = [p.name for p in self.base.iterdir() if p.is_dir() and VERSION_RE.match(p.name)]
        return sorted(found, key=lambda v: int(v[1:]))

    def latest(self) -> Path | None:
        """The version `latest` names; a link that points anywhere but a version folder here is ignored."""
        link = self.base / "latest"
        if not link.is_symlink():
            return None
        target = os.readlink(link)
        if VERSION_RE.match(target) and (self.base / target).is_dir():
            return self.base / target
        warn(f"{link} points to {target}, not a version of {self.base}; ignored")
        return None

    def version_folder(self, version: str) -> Path:
        """Where a version appears once published."""
        return self.base / version

    def next_version(self) -> str:
        existing = self.versions()
        return f"v{(int(existing[-1][1:]) + 1 if existing else 1):04d}"

    def new_work_dir(self) -> Path:
        run_id = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + f"-{os.getpid()}"
        path = self.work_root / run_id
        path.mkdir(parents=True)
        return path

    def leftover_work_dirs(self, keep: Path | None = None) -> list[Path]:
        if not self.work_root.is_dir():
            return []
        return sorted(p for p in self.work_root.iterdir() if p.is_dir() and p != keep)

    def publish(self, work: Path, version: str, promote: bool) -> Path:
        """Seal the manifest, freeze the finished work folder and rename it into place; move `latest` only
        when promoted (signed off, and not a candidate or asked to: pipeline/release/promotion.py). A kill
        between the rename and the `latest` swap is repaired by recover_latest()."""
        kill_point("publish")
        manifest = work / MANIFEST
        if manifest.is_file():
            data = json.loads(manifest.read_bytes())
            data[SEAL] = manifest_digest(data)
            write_json_atomic(manifest, data)
        for path in work.rglob("*"):
            if path.is_file():
                _read_only(path)
        target = self.base / version
        os.rename(work, target)
        kill_point("rename")
        if promote:
            self.point_latest(version)
        return target

    def point_latest(self, version: str) -> None:
        tmp = self.base / f".latest.tmp-{os.getpid()}"
        if tmp.is_symlink() or tmp.exists():
            tmp.unlink()
        tmp.symlink_to(version)
        os.replace(tmp, self.base / "latest")

    def recover_latest(self) -> str | None:
        """A deploy killed between its version's rename and the `latest` swap left a complete signed-off
        version newer than `latest` that its deploy meant to make latest (manifest `promoted`) and that never
        was (not in promotions.json): move `latest` to the newest such version that verifies (under the lock).
        A version latest named before is not one: moving back to it would undo a rollback."""
        latest = self.latest()
        floor = int(latest.name[1:]) if latest else 0
        for version in reversed(self.versions()):
            if int(version[1:]) <= floor:
                break
            manifest = read_json(self.base / version / MANIFEST)
            if not isinstance(manifest, dict) or manifest.get("signed_off") is not True:
                continue
            if manifest.get("promoted") is not True or self._logged(version):
                continue  # a candidate, or a version latest has named before (a rollback is not undone)
            damage = self.verify(version)
            if damage:
                warn(f"{self.base / version} is signed off but damaged ({damage[0]}); latest not moved to it")
                continue
            self.point_latest(version)
            return version
        return None

    def promotions(self) -> list[dict[str, Any]]:
        """Every move of `latest`, oldest first (promotions.json, written by pipeline/release/promotion.py); a
        damaged log loses who promoted what, never a version: `latest` itself still says."""
        try:
            found = (read_stored(self.base / PROMOTIONS) or {}).get("promotions")
        except Damaged:
            return []
        return [e for e in found if isinstance(e, dict)] if isinstance(found, list) else []

    def _logged(self, version: str) -> bool:
        """Named in promotions.json: its move of latest completed once."""
        return any(e.get("version") == version for e in self.promotions())

    @contextlib.contextmanager
    def temp_dir(self) -> Iterator[Path]:
        """The deploy's temporary files (Python's tempfile, and TMPDIR for child processes) go to `.tmp` under
        the recipe's folder, emptied before and after: the tools a deploy runs (ONNX Runtime's calibration copies
        of the model, exporter scratch folders) then never write outside the output root, and what a killed run
        left there is removed by the next one. Call under the lock."""
        path = self.base / ".tmp"
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
        saved_dir, saved_env = tempfile.tempdir, os.environ.get("TMPDIR")
        tempfile.tempdir = str(path)
        os.environ["TMPDIR"] = str(path)
        try:
            yield path
        finally:
            tempfile.tempdir = saved_dir
            if saved_env is None:
                os.environ.pop("TMPDIR", None)
            else:
                os.environ["TMPDIR"] = saved_env
            shutil.rmtree(path, ignore_errors=True)

    def clean_temp_files(self) -> list[Path]:
        """Temp files of killed runs: the `latest` swap's link, half-made cache entries and versions a killed
        prune had taken out of the listing but not yet deleted (under the lock)."""
        found = [*self.base.glob(".latest.tmp-*"), *self.cache_dir.glob("*/.*.tmp-*")]
        for path in found:
            path.unlink(missing_ok=True)
        for folder in self.base.glob(".pruned-*"):
            shutil.rmtree(folder, ignore_errors=True)
            found.append(folder)
        return found

    def separate_cache(self) -> int:
        """Stores made before cache entries were copies hold hard links shared with version files: give each
        such entry bytes of its own, so that damage to one can never reach the other (under the lock)."""
        count = 0
        for entry in self.cache_dir.glob("*/*"):
            if entry.is_file() and entry.stat().st_nlink > 1:
                tmp = entry.with_name(f".{entry.name}.tmp-{os.getpid()}")
                copy_file(entry, tmp)
                _read_only(tmp)
                os.replace(tmp, entry)
                count += 1
        return count

    # ------------------------------------------------------------ verification

    def verify(self, version: str | Path) -> list[str]:
        """Re-hash a version against its manifest: one `path: problem` per damaged, missing or unlisted file
        (a manifest that cannot be read, or whose seal does not match, is itself damage); [] when intact."""
        folder = version if isinstance(version, Path) else self.base / version
        return verify_folder(folder)

    def discard_work(self, keep: Path | None = None) -> None:
        """Remove folders of earlier killed runs once their reusable outputs are in the cache."""
        for path in self.leftover_work_dirs(keep):
            shutil.rmtree(path, ignore_errors=True)

    # ------------------------------------------------------------ content-addressed cache

    def cache_path(self, sha: str) -> Path:
        return self.cache_dir / sha[:2] / sha

    def cache_put(self, path: Path, sha: str) -> None:
        """Keep a read-only copy (or reflink) of a stage output; never a hard link to a work or version file."""
        target = self.cache_path(sha)
        if target.exists():
            return
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{sha}.tmp-{os.getpid()}")
        try:
            copy_file(path, tmp)
            kill_point("cache-put")
            _read_only(tmp)
            os.replace(tmp, target)
        except OSError as exc:
            raise OSError(exc.errno, exc.strerror, str(target)) from exc
        finally:
            tmp.unlink(missing_ok=True)

    def fetch(self, sha: str, target: Path, fallbacks: list[Path]) -> str | None:
        """Place a copy of the file with this sha256 at target (from the cache, else a fallback copy); None on
        success, else why not. A cached file whose content no longer matches is reported and dropped."""
        problems = []
        for source in [self.cache_path(sha), *fallbacks]:
            if not source.is_file():
                continue
            actual = sha256_file(source)
            if actual != sha:
                problems.append(f"{source} has sha256 {actual[:12]}…, expected {sha[:12]}…")
                if source == self.cache_path(sha):
                    warn(f"cache entry {source} is damaged (sha256 {actual[:12]}…); dropped")
                    source.unlink(missing_ok=True)
                continue
            copy_file(source, target)
            if source != self.cache_path(sha):
                self.cache_put(target, sha)  # a dropped (or never made) entry is made again from a good copy
            return None
        return "; ".join(problems) or "no cached copy"


def verify_folder(folder: Path) -> list[str]:
    """Re-hash a version folder against its manifest: one `path: problem` per damaged, missing or unlisted file
    or folder (a manifest that cannot be read, or whose seal does not match, is itself damage); [] when
    intact. A folder named like a version must carry its manifest's version; a copy named otherwise (a
    release handed on, `verify`/`compare` of a folder) is judged by its bytes alone."""
    try:
        manifest = read_stored(folder / MANIFEST)
    except Damaged as exc:
        return [f"{MANIFEST}: {exc.reason}"]
    if manifest is None:
        return [f"{MANIFEST}: missing"]
    listed = {str(e["path"]): str(e["sha256"]) for e in [*manifest["artifacts"], *manifest["files"]]}
    damage = []
    seal = manifest.get(SEAL)
    if seal is None:
        damage.append(f"{MANIFEST}: unsealed (publication adds {SEAL}; an edited manifest loses it)")
    elif seal != manifest_digest(manifest):
        damage.append(f"{MANIFEST}: its content does not match its seal ({SEAL})")
    named = VERSION_RE.match(folder.name) is not None
    if named and manifest.get("version", folder.name) != folder.name:
        damage.append(f"{MANIFEST}: names version {manifest.get('version')}, the folder is {folder.name}")
    root = folder.resolve()
    for rel, sha in listed.items():
        path = folder / rel
        if not path.resolve().is_relative_to(root):
            damage.append(f"{rel}: outside the version folder")
        elif not path.is_file():
            damage.append(f"{rel}: missing")
        elif (actual := sha256_file(path)) != sha:
            damage.append(f"{rel}: sha256 {actual[:12]}…, the manifest says {sha[:12]}…")
    holders = {parent.as_posix() for rel in listed for parent in Path(rel).parents}
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder).as_posix()
        if (path.is_file() or path.is_symlink()) and rel != MANIFEST and rel not in listed:
            damage.append(f"{rel}: not in the manifest")
        elif path.is_dir() and not path.is_symlink() and rel not in holders:
            damage.append(f"{rel}/: a folder not in the manifest")
    return damage


def manifest_digest(manifest: dict[str, Any]) -> str:
    """sha256 of the manifest's canonical JSON without its seal: any change to what it says shows."""
    body = {k: v for k, v in manifest.items() if k != SEAL}
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()
