"""The closing console table of a deploy: one line per artifact and runner, verdict and latency at a glance."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pipeline.check.accuracy import LOWER_BOUNDS
from pipeline.check.results import artifacts_of, results_of, runtime_entry
from pipeline.check.speed import THROUGHPUT, fmt_rate, is_winner_row, maximized, value
from pipeline.core.variants import REFERENCE
from pipeline.report.facts import (
    failing_checks,
    first_line,
    fmt_metric,
    fmt_ms,
    group_key,
    key_checks,
    not_run,
    precision_of,
    unique,
)

if TYPE_CHECKING:
    from rich.table import Table

Dict = Mapping[str, Any]


def summary_table(
    accuracy: Dict | None,
    speed: Dict | None,
    winner: Dict | None,
    objective_batch: int | None,
    failed: list[Dict] | None = None,
    objective_metric: str = "p50_ms",
) -> Table:
    """Artifact, precision, accuracy verdict with its deciding figure, p50 / p99 per benchmarked shape (under a
    throughput objective: sequences/s, what selection ranked by).

    Lines are ordered by the first column's figure (best first), unmeasured ones last.
    With objective_batch, only that batch's shapes get columns (the ones selection judged); the winner's
    line is starred, and artifacts this host cannot run say so with the reason. Requested variants that failed
    to build (`failed`: manifest.json's list) get a line of their own, last, with the stage and the error.
    """
    from rich.table import Table

    rows = results_of(speed)
    columns = unique(f"{b}|{s}" for b, s in sorted({group_key(r) for r in rows}))
    if objective_batch is not None:
        columns = [c for c in columns if c.split("|", 1)[0] == str(objective_batch)]
    by_rate = maximized(objective_metric)
    displayed = [r for r in rows if "|".join(map(str, group_key(r))) in columns]
    table = Table(
        title="Deploy summary", caption=_caption(winner, displayed, by_rate), caption_justify="left"
    )
    for name in ("artifact", "runtime", "precision", "accuracy"):
        table.add_column(name, no_wrap=name == "artifact", overflow="fold")  # fold: never drop digits
    for column in columns:
        batch, shape = column.split("|", 1)
        label = "seq/s" if by_rate else "p50 / p99 ms"
        table.add_column(f"{label}\nbatch {batch}, {shape}", justify="right", no_wrap=True)
    table.add_column("note", ratio=1, overflow="fold")
    lines = _lines(accuracy, speed, winner, columns, by_rate)
    shown = {line["name"] for line in lines}
    for failure in failed or []:
        if failure["artifact"] in shown:
            continue
        shown.add(failure["artifact"])
        cells = [failure["artifact"], "—", precision_of(failure["artifact"]), f"FAILED ({failure['stage']})"]
        cells += ["—"] * len(columns) + [first_line(failure["error"], 300)]
        lines.append(
            {"name": failure["artifact"], "order": (math.inf, len(lines)), "cells": cells, "style": "red"}
        )
    for line in sorted(lines, key=lambda line: line["order"]):
        table.add_row(*line["cells"], style=line["style"])
    return table


def _caption(winner: Dict | None, rows: list[Dict], by_rate: bool) -> str:
    parts = []
    if winner:
        parts.append(f"★ winner: {winner.get('artifact')} ({winner.get('runtime')}, {winner.get('io')} I/O)")
    else:
        parts.append("no winner: nothing passed sign-off")
    if by_rate and any((r.get("throughput") or {}).get("stable") is False for r in rows):
        parts.append("~ throughput run did not settle: read its interval in the sign-off")
    elif not by_rate and any(r.get("stable") is False for r in rows):
        parts.append("~ unstable row: read its spread, not a clean number")
    return "; ".join(parts)


def _runners(accuracy: Dict | None, speed: Dict | None) -> list[tuple[str, str | None, str | None]]:
    """(artifact, runtime, io) lines: validated artifacts first, then benchmark-only ones, then the not-run."""
    names = unique(
        [
            *artifacts_of(accuracy),
            *(str(r.get("artifact")) for r in results_of(speed)),
            *(a for a, _, _ in not_run(accuracy, speed)),
        ]
    )
    lines = []
    for name in names:
        runners = unique(
            f"{r.get('runtime')}|{r.get('io')}" for r in results_of(speed) if r.get("artifact") == name
        )
        if not runners:
            lines.append((name, None, None))
        for runner in runners:
            runtime, io = runner.split("|", 1)
            lines.append((name, runtime, io))
    return lines


def _lines(
    accuracy: Dict | None, speed: Dict | None, winner: Dict | None, columns: list[str], by_rate: bool
) -> list[dict]:
    entries = artifacts_of(accuracy)
    reasons = {a: r for a, r, _ in reversed(not_run(accuracy, speed))}
    timed = {r.get("artifact") for r in results_of(speed)}
    for left in _left_for_twins(speed):  # validated, never timed: say why no figure follows
        if left["artifact"] not in timed:
            reasons.setdefault(left["artifact"], f"not timed: {left['reason']}")
    lines = []
    for name, runtime, io in _runners(accuracy, speed):
        mine = [
            r
            for r in results_of(speed)
            if (r.get("artifact"), r.get("runtime"), r.get("io")) == (name, runtime, io)
        ]
        won = any(is_winner_row(r, winner) for r in mine)
        cell = _rate if by_rate else _latency
        cells_by_column = {"|".join(map(str, group_key(r))): cell(r) for r in mine}
        runtime_text = runtime if io in (None, "host") else f"{runtime} ({io} I/O)"
        entry = runtime_entry(entries.get(name), runtime)
        note = _note(entry, reasons.get(name), bool(mine))
        first = [r for r in mine if columns and "|".join(map(str, group_key(r))) == columns[0]]
        figure = value(first[0], THROUGHPUT if by_rate else "p50_ms") if first else None
        order = math.inf if figure is None else (-figure if by_rate else figure)
        lines.append(
            {
                "name": name,
                "order": (order, len(lines)),
                "cells": [
                    f"★ {name}" if won else name,
                    runtime_text or "—",
                    precision_of(name, accuracy),
                    _accuracy_cell(name, entry),
                    *[cells_by_column.get(c, "—") for c in columns],
                    note,
                ],
                "style": "bold green"
                if won
                else ("red" if entry is not None and not entry.get("passed") else None),
            }
        )
    return lines


def _latency(row: Dict) -> str:
    text = f"{fmt_ms(row.get('p50_ms'))} / {fmt_ms(row.get('p99_ms'))}"
    return text + " ~" if row.get("stable") is False else text


def _rate(row: Dict) -> str:
    text = fmt_rate(value(row, THROUGHPUT))
    return text + " ~" if (row.get("throughput") or {}).get("stable") is False else text


def _accuracy_cell(name: str, entry: Dict | None) -> str:
    """'pass cosine 0.999930' or 'FAIL cosine 0.971200 < 0.98': the same metric for every passing line."""
    if entry is None:
        return "reference" if name == REFERENCE else "not validated"
    failing = failing_checks(entry)
    if failing:
        check = failing[0]
        broken = "<" if check.get("metric") in LOWER_BOUNDS else ">"
        return f"FAIL {check.get('metric')} {fmt_metric(str(check.get('metric')), check.get('value'))} {broken} {check.get('threshold')}"
    if not entry.get("passed"):
        return "FAIL"
    required = [c for c in key_checks(entry).values() if not c.get("informational")]
    if not required:
        return "pass"
    check = required[0]
    return f"pass {check.get('metric')} {fmt_metric(str(check.get('metric')), check.get('value'))}"


def _left_for_twins(speed: Dict | None) -> list[Dict]:
    """The pairs the host's rule left untimed in every I/O mode: for a faster twin, or an opt-in runtime the
    recipe does not list (pipeline/bench/hosts.py)."""
    timing = ((speed or {}).get("conditions") or {}).get("runtimes_timed") or {}
    return [x for x in timing.get("not_timed") or [] if x.get("io") == "any" and x.get("artifact")]


def _note(entry: Dict | None, not_run_reason: str | None, benchmarked: bool) -> str:
    if not benchmarked and not_run_reason:
        if "not runnable" in not_run_reason or not_run_reason.startswith("not timed"):
            return not_run_reason
        return f"not runnable on this host: {not_run_reason}"
    if entry is not None and not entry.get("passed") and entry.get("reason"):
        return str(entry["reason"])
    return not_run_reason or ""
