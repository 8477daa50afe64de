"""signoff.html: the same document as signoff.md, as one self-contained page (inline CSS, PNGs beside it)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from pipeline.report.document import Block, Bullets, Code, Document, Image, Para, Table, build_document

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:2em auto;max-width:72em;padding:0 1em;color:#1d1d1f}
h1{font-size:1.6em;margin-bottom:.1em}h2{font-size:1.2em;margin-top:1.8em;border-bottom:1px solid #ddd}
.sub{color:#666;margin-top:0}
.verdict{display:inline-block;padding:.3em .8em;border-radius:4px;font-weight:700;font-size:1.2em}
.good.verdict{background:#dff3e3;color:#11612b}.bad.verdict{background:#fbe1e1;color:#9b1c1c}
p.bad{color:#9b1c1c}p.note{color:#555;font-size:.92em}
table{border-collapse:collapse;margin:.6em 0;font-variant-numeric:tabular-nums}
th,td{border:1px solid #ddd;padding:.25em .6em;text-align:left;vertical-align:top}
th{background:#f4f4f6}tr.bad td{background:#fdeeee}tr.warn td{background:#fff7e0}
tr.winner td{background:#e6f4ea;font-weight:600}
pre{background:#f6f8fa;padding:.8em;overflow-x:auto;font-size:.9em}
img{max-width:100%;border:1px solid #eee;margin:.6em 0}
"""


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


def html_from(doc: Document) -> str:
    body = [f"<h1>{escape(doc.title)}</h1>", f'<p class="sub">{escape(doc.subtitle)}</p>']
    for section in doc.sections:
        body.append(f"<h2>{escape(section.title)}</h2>")
        body.extend(_block(block) for block in section.blocks)
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{escape(doc.title)}</title>\n<style>{_CSS}</style>\n</head>\n<body>\n"
        + "\n".join(body)
        + "\n</body>\n</html>\n"
    )


def _block(block: Block) -> str:
    if isinstance(block, Para):
        if block.strong and block.tone in ("good", "bad"):
            return f'<p><span class="verdict {block.tone}">{escape(block.text)}</span></p>'
        text = f"<strong>{escape(block.text)}</strong>" if block.strong else escape(block.text)
        return f'<p class="{block.tone}">{text}</p>' if block.tone else f"<p>{text}</p>"
    if isinstance(block, Table):
        return _table(block)
    if isinstance(block, Bullets):
        return "<ul>\n" + "\n".join(f"<li>{escape(item)}</li>" for item in block.items) + "\n</ul>"
    if isinstance(block, Image):
        return f'<img src="{escape(block.src)}" alt="{escape(block.alt)}">'
    if isinstance(block, Code):
        return f"<p>{escape(block.caption)}</p>\n<pre>{escape(block.text)}</pre>"
    raise TypeError(f"unknown block {type(block).__name__}")


def _table(table: Table) -> str:
    head = "<tr>" + "".join(f"<th>{escape(h)}</th>" for h in table.headers) + "</tr>"
    rows = []
    for i, row in enumerate(table.rows):
        tone = table.tones[i] if i < len(table.tones) else ""
        attr = f' class="{tone}"' if tone else ""
        rows.append(f"<tr{attr}>" + "".join(f"<td>{escape(c)}</td>" for c in row) + "</tr>")
    return "<table>\n<thead>" + head + "</thead>\n<tbody>\n" + "\n".join(rows) + "\n</tbody>\n</table>"
