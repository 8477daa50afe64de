"""signoff.md: the report as GitHub-flavoured Markdown, readable both rendered and as plain text."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from pipeline.report.blocks import (
    Block,
    Bullets,
    Card,
    Code,
    Document,
    Image,
    Para,
    Table,
    Text,
    text_of,
)
from pipeline.report.document import build_document

# '>' only opens a block quote at a line start, and cannot close a tag once every '<' is escaped.
# '[' and ']' stay: without a '(url)' or a reference definition after them they are literal text.
_SPECIAL = re.compile(r"([\\`*<|~&])|^>|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])", re.MULTILINE)


def render_markdown(
    header: Mapping[str, Any],
    accuracy: Mapping[str, Any] | None,
    speed: Mapping[str, Any] | None,
    winner: Mapping[str, Any] | None,
    stages: Sequence[Mapping[str, Any]],
    previous: Mapping[str, Any] | None = None,
    plots: Sequence[str] = (),
) -> str:
    """The whole sign-off page; `plots` are paths such as 'reports/latency.png' (linked relative to reports/)."""
    return markdown_from(build_document(header, accuracy, speed, winner, stages, previous, plots))


def markdown_from(doc: Document) -> str:
    """Sections in order; folded ones (the record) as <details> blocks, which GitHub and most viewers fold."""
    parts = [f"# {escape(doc.title)}", escape(doc.subtitle)]
    for section in doc.sections:
        if section.folded:
            parts.append(f"<details>\n<summary><b>{escape(section.title)}</b></summary>")
        else:
            parts.append(f"## {escape(section.title)}")
        parts.extend(_block(block) for block in section.blocks)
        if section.folded:
            parts.append("</details>")
    return "\n\n".join(parts) + "\n"


def escape(text: str) -> str:
    """Backslash-escape what Markdown (or raw HTML inside it) would interpret; a '<' in an error stays a '<'."""
    return _SPECIAL.sub(lambda m: "\\" + m.group(0), text)


def _cell(value: Text) -> str:
    text = text_of(value)
    return escape(" ".join(text.split())) if text else " "


def _block(block: Block) -> str:
    if isinstance(block, Para):
        return f"**{escape(block.text)}**" if block.strong else escape(block.text)
    if isinstance(block, Table):
        lines = [
            "| " + " | ".join(_cell(h) for h in block.headers) + " |",
            "|" + "|".join("---" for _ in block.headers) + "|",
        ]
        lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in block.rows]
        return "\n".join(lines)
    if isinstance(block, Bullets):
        return "\n".join(f"- {escape(' '.join(item.split()))}" for item in block.items)
    if isinstance(block, Image):
        return f"![{escape(block.alt)}]({block.src})"
    if isinstance(block, Card):
        lines = [f"**{escape(block.verdict)}**", "", "| | |", "|---|---|"]
        lines += [f"| {_cell(label)} | {_cell(value)} |" for label, value in block.facts]
        if block.snippet:
            fence = "`" * max(3, _longest_backtick_run(block.snippet) + 1)
            lines += ["", f"{fence}python\n{block.snippet}\n{fence}"]
        return "\n".join(lines)
    if isinstance(block, Code):
        fence = "`" * max(3, _longest_backtick_run(block.text) + 1)
        return f"{escape(block.caption)}\n\n{fence}\n{block.text}\n{fence}"
    raise TypeError(f"unknown block {type(block).__name__}")


def _longest_backtick_run(text: str) -> int:
    return max((len(m) for m in re.findall(r"`+", text)), default=0)
