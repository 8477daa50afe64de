"""The closing console table of a deploy: one line per artifact and runner, verdict and latency at a glance."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pipeline.check.accuracy import COMPARABLE, LOWER_BOUNDS
from pipeline.check.speed import THROUGHPUT, fmt_rate
from pipeline.check.timings import Timing, is_winner_row, timings
from pipeline.check.verdicts import Verdict, records
from pipeline.core.errors import reason_line
from pipeline.core.variants import REFERENCE
from pipeline.report.facts import (
    failing_checks,
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
    from rich.text import Text

    rows = timings(speed)
    columns = unique(f"{b}|{s}" for b, s in sorted({group_key(r) for r in rows}))
    if objective_batch is not None:
        columns = [c for c in columns if c.split("|", 1)[0] == str(objective_batch)]
    by_rate = objective_metric == THROUGHPUT  # what selection ranked rows by (a served rate is load.json's)
    displayed = [r for r in rows if "|".join(map(str, group_key(r))) in columns]
    table = Table(
        title="Deploy summary", caption=Text(_caption(winner, displayed, by_rate)), caption_justify="left"
    )
    for name in ("artifact", "runtime", "precision", "accuracy"):
        table.add_column(name, no_wrap=name == "artifact", overflow="fold")  # fold: never drop digits
    for column in columns:
        batch, shape = column.split("|", 1)
        label = "seq/s" if by_rate else "p50 / p99 ms"
        table.add_column(_header(label, batch, shape), justify="right", no_wrap=True)
    table.add_column("note", ratio=1, overflow="fold")
    lines = _lines(accuracy, rows, speed, winner, columns, by_rate)
    shown = {line["name"] for line in lines}
    for failure in failed or []:
        if failure["artifact"] in shown:
            continue
        shown.add(failure["artifact"])
        cells = [failure["artifact"], "—", precision_of(failure["artifact"]), f"FAILED ({failure['stage']})"]
        cells += ["—"] * len(columns) + [reason_line(failure["error"], 300)]
        lines.append(
            {"name": failure["artifact"], "order": (math.inf, len(lines)), "cells": cells, "style": "red"}
        )
    for line in sorted(lines, key=lambda line: line["order"]):
        table.add_row(*(Text(cell) for cell in line["cells"]), style=line["style"])  # text, not markup
    return table


def _header(label: str, batch: str, shape: str) -> str:
    """A figure column's header: one input's shape on the batch's line, several inputs one per line, so that a
    model of three inputs does not widen the column until the accuracy and runtime columns fold to a few
    letters."""
    inputs = shape.split(", ")
    if len(inputs) == 1:
        return f"{label}\nbatch {batch}, {shape}"
    return "\n".join([label, f"batch {batch}", *inputs])


def _caption(winner: Dict | None, rows: list[Timing], by_rate: bool) -> str:
    parts = []
    if winner:
        parts.append(f"★ winner: {winner.get('artifact')} ({winner.get('runtime')}, {winner.get('io')} I/O)")
    else:
        parts.append("no winner: nothing passed sign-off")
    if by_rate and any(not r.settled(THROUGHPUT) for r in rows):
        parts.append("~ throughput run did not settle: read its interval in the sign-off")
    elif not by_rate and any(not r.stable for r in rows):
        parts.append("~ unstable row: read its spread, not a clean number")
    return "; ".join(parts)


def _runners(
    accuracy: Dict | None, rows: list[Timing], speed: Dict | None
) -> list[tuple[str, str | None, str | None]]:
    """(artifact, runtime, io) lines: validated artifacts first, then benchmark-only ones, then the not-run,
    then those left untimed in every I/O mode (benchmark.runtimes lists none of their runtimes)."""
    names = unique(
        [
            *records(accuracy),
            *(r.artifact for r in rows),
            *(a for a, _, _ in not_run(accuracy, speed)),
            *(str(x["artifact"]) for x in _left_for_twins(speed) if x["artifact"] != REFERENCE),
        ]
    )
    lines: list[tuple[str, str | None, str | None]] = []
    for name in names:
        runners = unique(f"{r.runtime}|{r.io}" for r in rows if r.artifact == name)
        if not runners:
            lines.append((name, None, None))
        for runner in runners:
            runtime, io = runner.split("|", 1)
            lines.append((name, runtime, io))
    return lines


def _lines(
    accuracy: Dict | None,
    rows: list[Timing],
    speed: Dict | None,
    winner: Dict | None,
    columns: list[str],
    by_rate: bool,
) -> list[dict]:
    entries = records(accuracy)
    reasons = {a: r for a, r, _ in reversed(not_run(accuracy, speed))}
    timed = {r.artifact for r in rows}
    for left in _left_for_twins(speed):  # validated, never timed: say why no figure follows
        if left["artifact"] not in timed:
            reasons.setdefault(left["artifact"], f"not timed: {left['reason']}")
    lines = []
    for name, runtime, io in _runners(accuracy, rows, speed):
        mine = [r for r in rows if (r.artifact, r.runtime, r.io) == (name, runtime, io)]
        won = any(is_winner_row(r, winner) for r in mine)
        cell = _rate if by_rate else _latency
        cells_by_column = {"|".join(map(str, group_key(r))): cell(r) for r in mine}
        runtime_text = runtime if io in (None, "host") else f"{runtime} ({io} I/O)"
        entry = entries[name].on(runtime) if name in entries else None
        note = _note(entry, reasons.get(name), bool(mine))
        first = [r for r in mine if columns and "|".join(map(str, group_key(r))) == columns[0]]
        figure = first[0].value(THROUGHPUT if by_rate else "p50_ms") if first else None
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
                "style": "bold green" if won else ("red" if entry is not None and not entry.passed else None),
            }
        )
    return lines


def _latency(row: Timing) -> str:
    text = f"{fmt_ms(row.p50_ms)} / {fmt_ms(row.p99_ms)}"
    return text if row.stable else text + " ~"


def _rate(row: Timing) -> str:
    text = fmt_rate(row.value(THROUGHPUT))
    return text if row.settled(THROUGHPUT) else text + " ~"


def _accuracy_cell(name: str, entry: Verdict | None) -> str:
    """'pass cosine 0.999930' or 'FAIL cosine 0.971200 < 0.98': the same metric for every passing line."""
    if entry is None:
        return "reference" if name == REFERENCE else "not validated"
    failing = failing_checks(entry)
    if failing:
        check = failing[0]
        if check.metric == COMPARABLE:  # no number to show: the note says why
            return f"FAIL {check.output or 'an output'} not comparable"
        broken = "<" if check.metric in LOWER_BOUNDS else ">"
        limit = "—" if check.threshold is None else f"{check.threshold:g}"
        return f"FAIL {check.metric} {fmt_metric(check.metric, check.value)} {broken} {limit}"
    if not entry.passed:
        return "FAIL"
    required = [c for c in key_checks(entry).values() if c.required]
    if not required:
        return "pass"
    check = required[0]
    return f"pass {check.metric} {fmt_metric(check.metric, check.value)}"


def _left_for_twins(speed: Dict | None) -> list[Dict]:
    """The pairs the host's rule left untimed in every I/O mode: for a faster twin, or an opt-in runtime the
    recipe does not list (pipeline/bench/hosts.py)."""
    timing = ((speed or {}).get("conditions") or {}).get("runtimes_timed") or {}
    return [x for x in timing.get("not_timed") or [] if x.get("io") == "any" and x.get("artifact")]


def _note(entry: Verdict | None, not_run_reason: str | None, benchmarked: bool) -> str:
    """Why the row reads as it does: a failed validation first (the artifact failed where it ran, whatever
    other runtime was left untimed), then why it was not run or timed."""
    if entry is not None and not entry.passed and entry.reason:
        return entry.reason
    if not benchmarked and not_run_reason:
        if "not runnable" in not_run_reason or not_run_reason.startswith("not timed"):
            return not_run_reason
        return f"not runnable on this host: {not_run_reason}"
    return not_run_reason or ""
