"""How much of a version's disk is its own: the bytes of its files whose blocks no other file shares. Versions
share bytes only where the file system can copy on write (XFS, btrfs: `core/files.copy_file` reflinks there),
so that a write through one version can never reach another; elsewhere (ext4, tmpfs) every version is a copy.
The kernel's FIEMAP ioctl says which extents of a file are shared."""

from __future__ import annotations

import fcntl
import os
import struct
from dataclasses import dataclass
from pathlib import Path

FS_IOC_FIEMAP = 0xC020660B
EXTENT_LAST, EXTENT_SHARED = 0x1, 0x2000
# fm_start, fm_length, fm_flags, fm_mapped_extents, fm_extent_count, reserved
HEADER = struct.Struct("=QQIIII")
EXTENT = struct.Struct("=QQQQQIIII")  # logical, physical, length, 2 reserved, flags, 3 reserved
BATCH = 128


@dataclass(frozen=True)
class Usage:
    total: int  # the files' sizes
    shared: int | None  # bytes in blocks another file holds too (a reflink copy); None: not knowable here

    @property
    def own(self) -> int | None:
        """What removing the folder would free (the cache or another version holds the shared blocks)."""
        return None if self.shared is None else max(self.total - self.shared, 0)


def shared_bytes(path: Path) -> int | None:
    """Bytes of the file in extents shared with another file; None where the file system cannot say."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    shared, start = 0, 0
    try:
        while True:
            request = bytearray(HEADER.size + EXTENT.size * BATCH)
            HEADER.pack_into(request, 0, start, 0xFFFFFFFFFFFFFFFF - start, 0, 0, BATCH, 0)
            try:
                fcntl.ioctl(fd, FS_IOC_FIEMAP, request)
            except OSError:
                return None
            mapped = HEADER.unpack_from(request, 0)[3]
            if mapped == 0:
                return shared
            for i in range(mapped):
                logical, _, length, _, _, flags, *_ = EXTENT.unpack_from(
                    request, HEADER.size + EXTENT.size * i
                )
                if flags & EXTENT_SHARED:
                    shared += length
                start = logical + length
                if flags & EXTENT_LAST:
                    return min(shared, os.fstat(fd).st_size)
    finally:
        os.close(fd)


def usage(folder: Path) -> Usage:
    """The folder's files: their total size, and how much of it sits in shared blocks."""
    total, shared, known = 0, 0, True
    for path in folder.rglob("*"):
        if not path.is_file() or path.is_symlink():
            continue
        size = path.stat().st_size
        total += size
        found = shared_bytes(path) if size else 0
        if found is None:
            known = False
        else:
            shared += found
    return Usage(total, shared if known else None)
