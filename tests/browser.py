"""A sign-off page as a reader sees it: rendered in a headless Chromium (Qt WebEngine) by tests/browser_page.py in
a child process, at a given width, with a screenshot kept beside the test's files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

PAGE = Path(__file__).with_name("browser_page.py")


def first_screen(page: Path, width: int, shot: Path, height: int = 900) -> dict[str, Any]:
    """What the first screen of `page` shows at `width` × `height` pixels (browser_page.py's JSON)."""
    pytest.importorskip(
        "PyQt6.QtWebEngineWidgets", reason="the dev extra's PyQt6-WebEngine (a headless Chromium)"
    )
    done = subprocess.run(
        [sys.executable, str(PAGE), str(page), str(shot), str(width), str(height)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert shot.is_file() and shot.stat().st_size > 10_000, "no screenshot"
    return json.loads(done.stdout.strip().splitlines()[-1])
