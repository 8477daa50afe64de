from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.report import write_signoff
from tests.unit.report import samples


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def twice(tmp_path_factory) -> tuple[Path, list[str]]:
    """write_signoff run twice on fresh copies of the same inputs, into a/ and b/."""
    root = tmp_path_factory.mktemp("signoff")
    written = []
    for name in ("a", "b"):
        args = (samples.header(), samples.accuracy(), samples.speed(), samples.winner(), samples.stages())
        written = write_signoff(root / name, *args, previous=samples.previous())
    return root, written


def test_writes_pages_and_plots_only_under_reports(twice):
    root, written = twice
    assert written == [
        "reports/latency.png",
        "reports/accuracy.png",
        "reports/signoff.md",
        "reports/signoff.html",
    ]
    assert sorted(_files(root / "a")) == sorted(written)
    md = (root / "a" / "reports/signoff.md").read_text(encoding="utf-8")
    assert "![Latency" in md and "(latency.png)" in md and "Changes since v0002" in md


def test_same_inputs_same_bytes(twice):
    root, _ = twice
    assert _files(root / "a") == _files(root / "b")


def test_nothing_to_plot_still_writes_pages(tmp_path, inputs):
    written = write_signoff(tmp_path, inputs["header"] | {"signed_off": False}, None, None, None, [])
    assert written == ["reports/signoff.md", "reports/signoff.html"]
    assert ".png" not in (tmp_path / "reports/signoff.html").read_text(encoding="utf-8")
