"""Files written so that no reader sees half of one: atomic writes, content digests, copies that never share
an inode, and the disk-full or read-only error behind a failure (so that it is reported as the user's, not as
a crash)."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

STORAGE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)


def storage_failure(exc: BaseException) -> OSError | None:
    """The disk-full or read-only error behind an exception (also when a library wrapped it), else None."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in STORAGE_ERRNOS:
            return current
        text = str(current)
        for code in STORAGE_ERRNOS:
            if os.strerror(code) in text:
                return OSError(code, os.strerror(code))
        current = current.__cause__ or current.__context__
    return None


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Readers never see a half-written file: write a sibling temp file, then rename over. A failed write
    (disk full) removes the temp file and names the file it was writing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise OSError(exc.errno, exc.strerror, str(path)) from exc


def write_text_atomic(path: Path, text: str) -> None:
    write_bytes_atomic(path, text.encode("utf-8"))


def write_json_atomic(path: Path, data: Any) -> None:
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")


FICLONE = 0x40049409  # Linux ioctl: share the source's blocks copy-on-write (btrfs, xfs); else a copy


def copy_file(source: Path, target: Path) -> None:
    """A reflink where the file system can, else a plain copy; never a hard link, so that changing one copy
    (a cache entry, a version's file) can never change the other."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists() or target.is_symlink():
        target.unlink()
    try:
        with open(source, "rb") as src, open(target, "wb") as dst:
            try:
                import fcntl

                fcntl.ioctl(dst.fileno(), FICLONE, src.fileno())
            except (ImportError, OSError):
                shutil.copyfileobj(src, dst, 1 << 20)
    except OSError as exc:
        target.unlink(missing_ok=True)
        raise OSError(exc.errno, exc.strerror, str(target)) from exc


def write_report(path: Path, report: Any, allow_nan: bool = True) -> None:
    """The one JSON writing of a report (indented, newline-terminated)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, allow_nan=allow_nan) + "\n", encoding="utf-8")


def read_report(path: Path) -> Any:
    """A report written by an earlier version's stage, for a stage that is reused rather than run."""
    return json.loads(path.read_text(encoding="utf-8"))
