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
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import filelock

from pipeline.errors import LockHeldError

VERSION_RE = re.compile(r"^v(\d{4,})$")


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Readers never see a half-written file: write a sibling temp file, then rename over."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def write_text_atomic(path: Path, text: str) -> None:
    write_bytes_atomic(path, text.encode("utf-8"))


def write_json_atomic(path: Path, data: Any) -> None:
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")


def _read_only(path: Path) -> None:
    mode = path.stat().st_mode
    path.chmod(mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


def link_or_copy(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists():
        target.unlink()
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


class Store:
    def __init__(self, root: Path, name: str):
        self.base = root / name
        self.cache_dir = self.base / ".cache"
        self.work_root = self.base / ".work"

    # ------------------------------------------------------------ lock

    @contextlib.contextmanager
    def lock(self, timeout_s: float) -> Iterator[None]:
        self.base.mkdir(parents=True, exist_ok=True)
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

    # ------------------------------------------------------------ versions

    def versions(self) -> list[str]:
        if not self.base.is_dir():
            return []
        found = [p.name for p in self.base.iterdir() if p.is_dir() and VERSION_RE.match(p.name)]
        return sorted(found, key=lambda v: int(v[1:]))

    def latest(self) -> Path | None:
        link = self.base / "latest"
        if link.is_symlink() and link.resolve().is_dir():
            return link.resolve()
        return None

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

    def publish(self, work: Path, version: str, signed_off: bool) -> Path:
        """Freeze the finished work folder and rename it into place; move `latest` only on sign-off."""
        for path in work.rglob("*"):
            if path.is_file():
                _read_only(path)
        target = self.base / version
        os.rename(work, target)
        if signed_off:
            tmp = self.base / f".latest.tmp-{os.getpid()}"
            if tmp.is_symlink() or tmp.exists():
                tmp.unlink()
            tmp.symlink_to(version)
            os.replace(tmp, self.base / "latest")
        return target

    def discard_work(self, keep: Path | None = None) -> None:
        """Remove folders of earlier killed runs once their reusable outputs are in the cache."""
        for path in self.leftover_work_dirs(keep):
            shutil.rmtree(path, ignore_errors=True)

    # ------------------------------------------------------------ content-addressed cache

    def cache_path(self, sha: str) -> Path:
        return self.cache_dir / sha[:2] / sha

    def cache_put(self, path: Path, sha: str) -> None:
        target = self.cache_path(sha)
        if target.exists():
            return
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{sha}.tmp-{os.getpid()}")
        link_or_copy(path, tmp)
        os.replace(tmp, target)

    def fetch(self, sha: str, target: Path, fallbacks: list[Path]) -> str | None:
        """Place a file with this sha256 at target (from the cache, else a fallback copy); None on success,
        else why not (a cached file whose content no longer matches is reported and dropped)."""
        problems = []
        for source in [self.cache_path(sha), *fallbacks]:
            if not source.is_file():
                continue
            actual = sha256_file(source)
            if actual != sha:
                problems.append(f"{source} has sha256 {actual[:12]}…, expected {sha[:12]}…")
                if source == self.cache_path(sha):
                    source.unlink(missing_ok=True)
                continue
            link_or_copy(source, target)
            return None
        return "; ".join(problems) or "no cached copy"
