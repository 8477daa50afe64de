"""Human-readable sign-off: signoff.md, signoff.html and PNG plots under a version's reports/ folder."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

Dict = Mapping[str, Any]


def write_signoff(
    out_dir: Path,
    header: Dict,
    accuracy: Dict | None,
    speed: Dict | None,
    winner: Dict | None,
    stages: Sequence[Dict],
    previous: Dict | None = None,
) -> list[str]:
    """Write the plots, reports/signoff.md and reports/signoff.html; return their paths relative to out_dir.

    Writes nothing outside out_dir/reports/. `previous` is {"version", "accuracy", "speed", "winner"} of the
    last signed-off version, for the "changes since" section. Same inputs give the same bytes.
    """
    from pipeline.report.html import render_html
    from pipeline.report.markdown import render_markdown
    from pipeline.report.plots import write_plots

    out_dir = Path(out_dir)
    plots = write_plots(out_dir, accuracy, speed, winner)
    args = (header, accuracy, speed, winner, stages, previous)
    _write_text(out_dir / "reports" / "signoff.md", render_markdown(*args, plots=plots))
    _write_text(out_dir / "reports" / "signoff.html", render_html(*args, plots=plots))
    return [*plots, "reports/signoff.md", "reports/signoff.html"]


def _write_text(target: Path, text: str) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(text, encoding="utf-8", newline="\n")
    os.replace(tmp, target)


__all__ = ["write_signoff"]
