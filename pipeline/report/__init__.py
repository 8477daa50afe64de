"""Human-readable sign-off: signoff.md, signoff.html and PNG plots under a version's reports/ folder."""

from __future__ import annotations

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
    load: Dict | None = None,
) -> list[str]:
    """Write the plots, reports/signoff.md and reports/signoff.html; return their paths relative to out_dir.

    Writes nothing outside out_dir/reports/. `previous` is {"version", "accuracy", "speed", "winner"} of the
    last signed-off version, for the "changes since" section; `load` the server scenario's report, where it ran.
    Same inputs give the same bytes.
    """
    from pipeline.core.files import write_text_atomic
    from pipeline.report.document import build_document
    from pipeline.report.html import html_from
    from pipeline.report.markdown import markdown_from
    from pipeline.report.plots import write_plots

    out_dir = Path(out_dir)
    plots = write_plots(out_dir, accuracy, speed, winner, load)
    doc = build_document(header, accuracy, speed, winner, stages, previous, plots, load)
    write_text_atomic(out_dir / "reports" / "signoff.md", markdown_from(doc))
    write_text_atomic(out_dir / "reports" / "signoff.html", html_from(doc))
    return [*plots, "reports/signoff.md", "reports/signoff.html"]


__all__ = ["write_signoff"]
