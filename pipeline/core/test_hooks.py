"""Test hooks the reliability suite drives through the environment (README, Development): die, or lose the
work folder, at a named point of a deploy, as a killed deploy or a cleaner would there. Unset, they do
nothing."""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

KILL_AT = "PIPELINE_TEST_KILL_AT"  # test hook: SIGKILL this process at the named point (README, Development)


def kill_point(point: str) -> None:
    """Test hook: die at `point` when PIPELINE_TEST_KILL_AT names it, as a killed deploy would there."""
    if os.environ.get(KILL_AT) == point:
        os.kill(os.getpid(), signal.SIGKILL)


LOSE_AT = "PIPELINE_TEST_LOSE_AT"  # test hook: empty the work folder at the named point (README, Development)


def lose_point(point: str, folder: Path) -> None:
    """Test hook: remove everything in `folder` at `point` when PIPELINE_TEST_LOSE_AT names it, as a cleaner
    (or another process) emptying a running deploy's work folder would."""
    if os.environ.get(LOSE_AT) == point:
        for path in folder.iterdir():
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink()


CORRUPT_COPY = "PIPELINE_TEST_CORRUPT_COPY"  # test hook: flip a byte of this file as a fleet copies it back


def corrupt_copy(rel: str, data: bytes, attempt: int) -> bytes:
    """Test hook: the first chunk of the version file `rel` with its first byte flipped, on a fleet deploy's
    first attempt only, when PIPELINE_TEST_CORRUPT_COPY names it: a link that damages one copy in transit (the
    retry's copy arrives intact)."""
    if os.environ.get(CORRUPT_COPY) == rel and attempt == 1 and data:
        return bytes([data[0] ^ 0xFF]) + data[1:]
    return data


KEEP_SCRATCH = "PIPELINE_TEST_KEEP_SCRATCH"  # test hook: keep a copy of a fleet deploy's scratch store here


def keep_scratch(scratch: Path, attempt: int) -> None:
    """Test hook: copy a fleet deploy's scratch store to PIPELINE_TEST_KEEP_SCRATCH/attempt-N before it is
    removed, so a test can compare what the node made with what the driver published."""
    keep = os.environ.get(KEEP_SCRATCH)
    if keep:
        shutil.copytree(scratch, Path(keep) / f"attempt-{attempt}", symlinks=True, dirs_exist_ok=True)
