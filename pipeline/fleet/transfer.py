"""A folder's files moved between a Ray worker and the driver in fixed-size chunks, for nodes that do not share
a file system: no file is ever one Python bytes object (versions hold artifacts of hundreds of MB), and each
chunk is its own object in Ray's object store, so Ray moves, spills and frees them one at a time.

Worker to driver, the chunks are yielded by a streaming generator task (Ray's recommended way to return many
objects: each is owned by the caller, so it outlives the worker that made it); driver to worker, they are
`ray.put` by the driver and handed to the task as references it reads one at a time."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

CHUNK_BYTES = 8 << 20  # one object per 8 MiB: big enough to move fast, small enough to hold a few in memory

Listing = list[tuple[str, int]]  # (path relative to the folder, POSIX; size in bytes), in sending order


def list_files(folder: Path) -> Listing:
    """Every file under `folder`, sorted, with its size: what the receiver expects, in order."""
    return [
        (path.relative_to(folder).as_posix(), path.stat().st_size)
        for path in sorted(folder.rglob("*"))
        if path.is_file() and not path.is_symlink()
    ]


def chunk_count(size: int) -> int:
    return -(-size // CHUNK_BYTES)


def read_chunks(
    folder: Path, files: Listing, alter: Callable[[str, bytes], bytes] = lambda rel, data: data
) -> Iterator[bytes]:
    """The listed files' bytes, chunk after chunk (an empty file has none). `alter` sees each file's first
    chunk: the test hook that damages a copy in transit."""
    for rel, size in files:
        with open(folder / rel, "rb") as f:
            for index in range(chunk_count(size)):
                data = f.read(CHUNK_BYTES)
                yield alter(rel, data) if index == 0 else data


def receive_files(chunks: Iterator[bytes], files: Listing, into: Path) -> tuple[dict[str, str], list[str]]:
    """Write the listed files under `into` from their chunks, hashing as they arrive (no second read); the
    sha256 of each file received whole, and what went wrong (`path: why`) for the others."""
    received: dict[str, str] = {}
    problems: list[str] = []
    root = into.resolve()
    for rel, size in files:
        target = into / rel
        if not target.resolve().is_relative_to(root) or rel.startswith("/"):
            problems.append(f"{rel}: a path outside the version folder")
            _skip(chunks, chunk_count(size))
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha256()
        written = 0
        with open(target, "wb") as f:
            for _ in range(chunk_count(size)):
                data = next(chunks, None)
                if data is None:
                    problems.append(f"{rel}: missing (the copy ended early)")
                    return received, problems
                f.write(data)
                digest.update(data)
                written += len(data)
        if written != size:
            problems.append(f"{rel}: {written} bytes arrived, {size} were sent")
        else:
            received[rel] = digest.hexdigest()
    return received, problems


def _skip(chunks: Iterator[bytes], count: int) -> None:
    for _ in range(count):
        next(chunks, None)


def put_folder(ray: Any, folder: Path) -> tuple[Listing, list[Any]]:
    """The folder's files as driver-owned objects (`ray.put` per chunk), for a task to write out on its node."""
    files = list_files(folder)
    return files, [ray.put(chunk) for chunk in read_chunks(folder, files)]


def write_folder(ray: Any, files: Listing, refs: Iterable[Any], into: Path) -> None:
    """Write what put_folder sent, fetching one chunk at a time."""
    chunks = (ray.get(ref) for ref in refs)
    _, problems = receive_files(chunks, files, into)
    if problems:
        raise OSError(f"the seed copy of {into.name} is incomplete: {'; '.join(problems)}")
