"""The sign-off report as a neutral document (sections of paragraphs, tables, lists, images, code).

Markdown and HTML render this one structure, so the two pages can never tell different stories.
Every text here is plain; the renderers escape it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from pipeline.report.diff import diff_versions
from pipeline.report.facts import (
    artifacts_of,
    check_text,
    failing_checks,
    first_line,
    flag_text,
    flatten,
    fmt_ci,
    fmt_ms,
    fmt_seconds,
    is_informational,
    is_winner_row,
    key_checks,
    metrics_present,
    not_run,
    scalar_text,
    shape_text,
    sorted_results,
    where,
)

Dict = Mapping[str, Any]


@dataclass(frozen=True)
class Para:
    text: str
    strong: bool = False
    tone: str = ""  # "" | good | bad | note


@dataclass(frozen=True)
class Table:
    headers: list[str]
    rows: list[list[str]]
    tones: list[str] = field(default_factory=list)  # per row: "" | bad | warn | winner


@dataclass(frozen=True)
class Bullets:
    items: list[str]


@dataclass(frozen=True)
class Image:
    src: str  # relative to reports/, where the pages live
    alt: str


@dataclass(frozen=True)
class Code:
    caption: str
    text: str


Block = Para | Table | Bullets | Image | Code


@dataclass(frozen=True)
class Section:
    title: str
    blocks: list[Block]


@dataclass(frozen=True)
class Document:
    title: str
    subtitle: str
    signed_off: bool
    sections: list[Section]


def build_document(
    header: Dict,
    accuracy: Dict | None,
    speed: Dict | None,
    winner: Dict | None,
    stages: Sequence[Dict],
    previous: Dict | None = None,
    plots: Sequence[str] = (),
) -> Document:
    """Verdict first, then why (winner), the evidence (accuracy, speed), what did not run, and the record."""
    images = {PurePosixPath(p).stem: PurePosixPath(p).name for p in plots}
    sections = [
        _verdict(header),
        _winner(winner),
        _accuracy(accuracy, images.get("accuracy")),
        _speed(speed, winner, images.get("latency")),
        _measured(header, speed),
        _flags(speed),
        _not_run(accuracy, speed),
        _changes(header, accuracy, speed, winner, previous),
        _artifacts(header),
        _stages(stages),
        _pairs("Benchmark conditions", (speed or {}).get("conditions")),
        _pairs("Environment", header.get("environment")),
    ]
    subtitle = (
        f"created {header.get('created') or '—'} · git revision {header.get('git_revision') or 'unknown'}"
    )
    title = f"Sign-off: {header.get('name', '?')} {header.get('version', '?')}"
    return Document(title, subtitle, bool(header.get("signed_off")), [s for s in sections if s.blocks])


def _verdict(header: Dict) -> Section:
    signed = bool(header.get("signed_off"))
    blocks: list[Block] = [
        Para("SIGNED OFF" if signed else "NOT SIGNED OFF", strong=True, tone="good" if signed else "bad")
    ]
    reasons = [str(r) for r in header.get("signoff_reasons") or []]
    if reasons:
        blocks.append(Bullets(reasons))
    return Section("Verdict", blocks)


def _winner(winner: Dict | None) -> Section:
    if not winner:
        return Section(
            "Winner",
            [Para("No artifact was selected: nothing may be deployed from this version.", tone="bad")],
        )
    objective = winner.get("objective") or {}
    goal = ", ".join(f"{k} {scalar_text(v)}" for k, v in objective.items() if v is not None)
    value = _value(winner.get("value"), winner.get("unit"))
    blocks: list[Block] = [
        Para(
            f"{winner.get('artifact')} on {winner.get('runtime')} ({winner.get('io')} I/O): {value}",
            strong=True,
        ),
        Para(f"Objective: {goal or '—'}."),
    ]
    runner_up = winner.get("runner_up")
    if runner_up:
        blocks.append(
            Para(
                f"Runner-up: {runner_up.get('artifact')} at "
                f"{_value(runner_up.get('value'), winner.get('unit'))}{_ratio(winner, runner_up)}."
            )
        )
    else:
        blocks.append(Para("No runner-up: it was the only candidate that passed validation."))
    if winner.get("reason"):
        blocks.append(Para(f"Why: {winner['reason']}"))
    return Section("Winner", blocks)


def _ratio(winner: Dict, runner_up: Dict) -> str:
    a, b = winner.get("value"), runner_up.get("value")
    if not (isinstance(a, int | float) and isinstance(b, int | float) and a > 0 and b > 0):
        return ""
    ratio = b / a if (winner.get("unit") or "ms") == "ms" else a / b
    return f" (the winner is {ratio:.2f}× faster)"


def _value(value: Any, unit: Any) -> str:
    unit = unit or "ms"
    return f"{fmt_ms(value) if unit == 'ms' else scalar_text(value)} {unit}"


def _accuracy(accuracy: Dict | None, image: str | None) -> Section:
    entries = artifacts_of(accuracy)
    if not entries:
        return Section(
            "Accuracy", [Para("No artifact was validated.", tone="bad")] if accuracy is not None else []
        )
    metrics = metrics_present(accuracy)
    headers = ["artifact", "precision", "verdict", "required checks passed", *metrics, "reason"]
    rows, tones = [], []
    for name, entry in entries.items():
        picked = key_checks(entry)
        required = [c for c in entry.get("checks") or [] if not is_informational(c)]
        rows.append(
            [
                name,
                str(entry.get("precision") or "—"),
                "pass" if entry.get("passed") else "FAIL",
                f"{sum(bool(c.get('passed')) for c in required)}/{len(required)}",
                *[check_text(picked[m]) if m in picked else "—" for m in metrics],
                str(entry.get("reason") or ""),
            ]
        )
        tones.append("" if entry.get("passed") else "bad")
    reference = (accuracy or {}).get("reference", "the reference")
    blocks: list[Block] = [
        Para(
            f"Every artifact against {reference}. Each figure is the worst check of that metric over outputs and "
            "inputs (shape corners min/opt/max and the held-out data); (info) marks a check that is reported but does not gate."
        ),
        Table(headers, rows, tones),
    ]
    failures = [
        f"{name}: {where(c)}: {check_text(c, with_metric=True)}"
        for name, entry in entries.items()
        for c in failing_checks(entry)[:5]
    ]
    if failures:
        blocks += [Para("Failing checks (worst first, at most five per artifact):"), Bullets(failures)]
    if image:
        blocks.append(Image(image, "Accuracy: key error figures against thresholds"))
    return Section("Accuracy", blocks)


def _speed(speed: Dict | None, winner: Dict | None, image: str | None) -> Section:
    rows_in = sorted_results(speed)
    if not rows_in:
        return Section(
            "Speed", [Para("No artifact was benchmarked.", tone="bad")] if speed is not None else []
        )
    headers = [
        "artifact",
        "runtime",
        "io",
        "batch",
        "shapes",
        "p50 ms",
        "p99 ms",
        "p50 95% CI ms",
        "cv",
        "n",
        "stable",
    ]
    rows, tones = [], []
    for r in rows_in:
        won = is_winner_row(r, winner)
        rows.append(
            [
                f"{r.get('artifact')} ★" if won else str(r.get("artifact")),
                str(r.get("runtime")),
                str(r.get("io")),
                str(r.get("batch")),
                shape_text(r.get("shapes")),
                fmt_ms(r.get("p50_ms")),
                fmt_ms(r.get("p99_ms")),
                fmt_ci(r.get("p50_ci95_ms")),
                f"{r['cv']:.3f}" if isinstance(r.get("cv"), int | float) else "—",
                scalar_text(r.get("n")),
                "yes" if r.get("stable") else "NO",
            ]
        )
        tones.append("winner" if won else ("warn" if not r.get("stable") else ""))
    blocks: list[Block] = [Table(headers, rows, tones)]
    notes = "Same inputs, timer, warm-up and window policy for every row."
    if any(tone == "winner" for tone in tones):
        notes += " ★ marks the winner at the objective's shape."
    if any(not r.get("stable") for r in rows_in):
        notes += (
            " Rows with stable NO hit the window cap before their window medians agreed: read their spread "
            "(p50 to p99), not a clean number."
        )
    blocks.append(Para(notes, tone="note"))
    if image:
        blocks.append(
            Image(image, "Latency: p50 per artifact with p50..p99 range and the p50 confidence interval")
        )
    return Section("Speed", blocks)


def _measured(header: Dict, speed: Dict | None) -> Section:
    """A benchmark is never served from cache silently: say when and where it was measured."""
    conditions = (speed or {}).get("conditions") or {}
    if not conditions:
        return Section("Measured", [])
    text = f"Measured at {conditions.get('measured_at', '?')} on {conditions.get('host', '?')}."
    reused = header.get("benchmark_reused_from")
    if reused:
        text += f" These numbers were reused from {reused}, not measured again; deploy with --rebench to re-measure."
    return Section("Measured", [Para(text, tone="note" if reused else "")])


def _flags(speed: Dict | None) -> Section:
    flags = [flag_text(f) for f in (speed or {}).get("flags") or []]
    return Section("Flags", [Bullets(flags)] if flags else [])


def _not_run(accuracy: Dict | None, speed: Dict | None) -> Section:
    items = not_run(accuracy, speed)
    if not items:
        return Section("Not run", [])
    rows = [[artifact, reason, stages] for artifact, reason, stages in items]
    return Section(
        "Not run",
        [
            Para("Built or requested, but not runnable on this host:"),
            Table(["artifact", "reason", "skipped by"], rows),
        ],
    )


def _changes(
    header: Dict, accuracy: Dict | None, speed: Dict | None, winner: Dict | None, previous: Dict | None
) -> Section:
    if not previous:
        return Section("Changes", [])
    current = {
        "version": header.get("version"),
        "accuracy": accuracy,
        "speed": speed,
        "winner": winner,
        "signed_off": header.get("signed_off"),
    }
    lines = diff_versions(previous, current)
    title = f"Changes since {previous.get('version', 'the previous version')}"
    return Section(title, [Bullets(lines)] if lines else [Para("No changes.")])


def _artifacts(header: Dict) -> Section:
    items = header.get("artifacts") or []
    rows = [
        [
            str(a.get("name")),
            str(a.get("kind") or "—"),
            str(a.get("precision") or "—"),
            str(a.get("path") or "—"),
            _size(a.get("bytes")),
            str(a.get("sha256") or "—")[:12],
            ", ".join(f"{k} {v}" for k, v in flatten(a.get("details") or {})),
        ]
        for a in items
    ]
    if not rows:
        return Section("Artifacts", [])
    return Section(
        "Artifacts", [Table(["artifact", "kind", "precision", "file", "size", "sha256", "details"], rows)]
    )


def _size(value: Any) -> str:
    if not isinstance(value, int):
        return "—"
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("kB", 1 << 10)):
        if value >= scale:
            return f"{value / scale:.1f} {unit}"
    return f"{value} B"


def _stages(stages: Sequence[Dict]) -> Section:
    if not stages:
        return Section("Stages", [])
    rows, tones = [], []
    for s in stages:
        status = str(s.get("status"))
        rows.append(
            [str(s.get("name")), status, fmt_seconds(s.get("duration_s")), first_line(s.get("error"))]
        )
        tones.append({"failed": "bad", "skipped": "warn"}.get(status, ""))
    blocks: list[Block] = [Table(["stage", "status", "duration", "error"], rows, tones)]
    for s in stages:
        error = str(s.get("error") or "")
        if "\n" in error.strip() or len(error) > 160:
            blocks.append(Code(f"{s.get('name')}: full error", error.strip()))
        warnings = (s.get("details") or {}).get("warnings")
        if isinstance(warnings, list) and warnings:
            blocks.append(Para(f"{s.get('name')} warnings:", tone="note"))
            blocks.append(Bullets([first_line(w, 400) for w in warnings]))
    return Section("Stages", blocks)


def _pairs(title: str, data: Any) -> Section:
    pairs = flatten(data) if isinstance(data, Mapping) else []
    return Section(title, [Table(["key", "value"], [[k, v] for k, v in pairs])] if pairs else [])
