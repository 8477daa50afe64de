"""Where the pipeline's code came from, as a release records it: the git revision, and whether the code
differs from it."""

from __future__ import annotations

import subprocess
from pathlib import Path


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", *args],
            capture_output=True,
            text=True,
            timeout=5,
            cwd=Path(__file__).parent.parent,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout


def git_revision() -> str | None:
    """The commit the pipeline's code came from (None outside a git checkout)."""
    return (_git("rev-parse", "HEAD") or "").strip() or None


def git_dirty() -> bool | None:
    """Whether the pipeline's code differs from that commit: a revision alone must not claim code it is not."""
    status = _git("status", "--porcelain", "--untracked-files=no", "--", str(Path(__file__).parent.parent))
    return None if status is None else bool(status.strip())
