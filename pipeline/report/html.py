"""signoff.html: the same document as signoff.md, as one self-contained page (inline CSS, PNGs beside it),
rendered from a Jinja2 template with autoescaping, so no error text can inject markup."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

from pipeline.report.blocks import (
    Block,
    Bullets,
    Card,
    Cell,
    Code,
    Document,
    Image,
    Para,
    Table,
)
from pipeline.report.document import build_document


def render_html(
    header: Mapping[str, Any],
    accuracy: Mapping[str, Any] | None,
    speed: Mapping[str, Any] | None,
    winner: Mapping[str, Any] | None,
    stages: Sequence[Mapping[str, Any]],
    previous: Mapping[str, Any] | None = None,
    plots: Sequence[str] = (),
) -> str:
    """The whole sign-off page; `plots` are paths such as 'reports/latency.png' (linked relative to reports/)."""
    return html_from(build_document(header, accuracy, speed, winner, stages, previous, plots))


@functools.cache
def _template() -> Any:
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("pipeline.report", "templates"),
        autoescape=True,
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
    )
    return env.get_template("signoff.html.j2")


def html_from(doc: Document) -> str:
    sections = [
        {"title": s.title, "folded": s.folded, "blocks": [_view(b) for b in s.blocks]} for s in doc.sections
    ]
    return _template().render(doc=doc, sections=sections)


def _view(block: Block) -> dict[str, Any]:
    """A block as the template reads it: a kind plus plain fields (cells always with a tone)."""
    if isinstance(block, Para):
        return {"kind": "para", "text": block.text, "strong": block.strong, "tone": block.tone}
    if isinstance(block, Table):
        rows = [
            {
                "tone": block.tones[i] if i < len(block.tones) else "",
                "cells": [c if isinstance(c, Cell) else Cell(c) for c in row],
            }
            for i, row in enumerate(block.rows)
        ]
        return {"kind": "table", "headers": block.headers, "rows": rows}
    if isinstance(block, Bullets):
        return {"kind": "bullets", "entries": block.items, "tone": block.tone}
    if isinstance(block, Image):
        return {"kind": "image", "src": block.src, "alt": block.alt}
    if isinstance(block, Code):
        return {"kind": "code", "caption": block.caption, "text": block.text}
    if isinstance(block, Card):
        return {
            "kind": "card",
            "state": block.state,
            "verdict": block.verdict,
            "facts": block.facts,
            "snippet": block.snippet,
        }
    raise TypeError(f"unknown block {type(block).__name__}")
