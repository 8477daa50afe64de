"""What changed since the previous signed-off version, one plain line per change.

A version here is a dict {"version": "v0002", "accuracy": {...}, "speed": {...}, "winner": {...} | None,
"signed_off": bool (optional)} holding the contract's JSON reports of that version. The changes themselves come
from check/version_diff.py, which `compare` gates on too; this module only words them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pipeline.check.speed import figure_text
from pipeline.check.timings import RowId, Timing
from pipeline.check.verdicts import AccuracyRecord
from pipeline.check.version_diff import RowChange, accuracy_changes, speed_changes
from pipeline.report.facts import (
    fmt_change,
    fmt_metric,
    fmt_ms,
    intervals_overlap,
    key_checks,
    not_run,
    shape_text,
)

Version = Mapping[str, Any]


def diff_versions(previous: Version, current: Version) -> list[str]:
    """Lines such as 'onnx-fp32 batch 1 p50 34.7 -> 31.2 ms (-10%)', ordered verdict, winner, accuracy, speed."""
    lines: list[str] = []
    lines += _signoff_lines(previous, current)
    lines += _winner_lines(previous.get("winner"), current.get("winner"))
    lines += _accuracy_lines(previous.get("accuracy"), current.get("accuracy"))
    lines += _speed_lines(previous.get("speed"), current.get("speed"))
    lines += _not_run_lines(previous, current)
    return lines


def _signoff_lines(previous: Version, current: Version) -> list[str]:
    before, after = previous.get("signed_off"), current.get("signed_off")
    if before is None or after is None or before == after:
        return []
    word = {True: "signed off", False: "not signed off"}
    return [f"verdict {word[bool(before)]} -> {word[bool(after)]}"]


def _winner_text(winner: Mapping[str, Any]) -> str:
    return f"{winner.get('artifact')} ({winner.get('runtime')}, {winner.get('io')} I/O)"


def _value_text(winner: Mapping[str, Any]) -> str:
    return figure_text(winner.get("value"), winner.get("unit"))


def _winner_lines(before: Mapping[str, Any] | None, after: Mapping[str, Any] | None) -> list[str]:
    if not before and not after:
        return []
    if not after:
        return [f"winner {_winner_text(before)} -> none (sign-off failed)"]  # type: ignore[arg-type]
    if not before:
        return [f"winner none -> {_winner_text(after)}: {_value_text(after)}"]
    same = _winner_text(before) == _winner_text(after)
    values = f"{_value_text(before)} -> {_value_text(after)}"
    old, new = before.get("value"), after.get("value")
    same_unit = (before.get("unit") or "ms") == (after.get("unit") or "ms")  # not when the objective changed
    if same_unit and isinstance(old, int | float) and isinstance(new, int | float):
        noise = ", within noise" if intervals_overlap(before.get("interval"), after.get("interval")) else ""
        values += f" ({fmt_change(old, new)}{noise})"
    if same:
        return [f"winner unchanged: {_winner_text(after)}, {values}"]
    return [f"winner {_winner_text(before)} -> {_winner_text(after)}, {values}"]


def _verdict(entry: AccuracyRecord) -> str:
    return "pass" if entry.passed else "FAIL"


def _accuracy_lines(before: Mapping[str, Any] | None, after: Mapping[str, Any] | None) -> list[str]:
    lines: list[str] = []
    for moved in sorted(accuracy_changes(before, after), key=lambda m: m.artifact):
        name, old, new = moved.artifact, moved.before, moved.after
        if new is None:
            lines.append(f"{name} not validated any more")
        elif old is None:
            lines.append(f"{name} new: accuracy {_verdict(new)}{_reason(new)}")
        elif moved.verdict_changed:
            lines.append(f"{name} accuracy {_verdict(old)} -> {_verdict(new)}{_reason(new)}")
        else:
            lines += _figure_lines(name, old, new)
    return lines


def _reason(entry: AccuracyRecord) -> str:
    return f": {entry.reason}" if entry.reason and not entry.passed else ""


def _figure_lines(name: str, old: AccuracyRecord, new: AccuracyRecord) -> list[str]:
    """Key figures that moved while the verdict held (same artifact, re-validated with other data or code)."""
    old_checks, new_checks = key_checks(old.overall), key_checks(new.overall)
    lines = []
    for metric in new_checks:
        if metric not in old_checks:
            continue
        a = fmt_metric(metric, old_checks[metric].value)
        b = fmt_metric(metric, new_checks[metric].value)
        if a != b:
            lines.append(f"{name} {metric} {a} -> {b}")
    return lines


def _speed_lines(before: Mapping[str, Any] | None, after: Mapping[str, Any] | None) -> list[str]:
    """One line per row that moved beyond noise, new or gone; rows whose p50 CIs overlap share one line."""
    moves = sorted(speed_changes(before, after, "p50_ms"), key=lambda m: m.id)
    labels = _labels([m.row for m in moves])
    lines: list[str] = []
    steady: list[str] = []
    for moved in moves:
        label = labels[moved.id]
        if moved.verdict == "gone":
            lines.append(f"{label} not benchmarked any more")
        elif moved.verdict == "new":
            lines.append(f"{label} new: p50 {fmt_ms(moved.b)} ms")
        elif moved.verdict == "within noise":
            steady.append(f"{label} ({_percent(moved)})")
        else:
            line = f"{label} p50 {fmt_ms(moved.a)} -> {fmt_ms(moved.b)} ms ({_percent(moved)})"
            lines.append(line if moved.row.stable else line + ", unstable")
    if steady:
        lines.append("within noise (p50 95% CIs overlap): " + ", ".join(steady))
    return lines


def _percent(moved: RowChange) -> str:
    return fmt_change(moved.a, moved.b) if moved.a is not None and moved.b is not None else "n/a"


def _labels(rows: list[Timing]) -> dict[RowId, str]:
    """'onnx-fp32 batch 1', naming runtime, I/O or shape only where they tell rows of one artifact apart."""
    runners: dict[str, set] = {}
    shapes: dict[tuple, set] = {}
    for row in rows:
        runners.setdefault(row.artifact, set()).add((row.runtime, row.io))
        shapes.setdefault((row.artifact, row.batch), set()).add(shape_text(row.shapes))
    labels = {}
    for row in rows:
        label = row.artifact
        if len(runners[label]) > 1:
            label += f" [{row.runtime}, {row.io} I/O]"
        label += f" batch {row.batch}"
        if len(shapes[(row.artifact, row.batch)]) > 1:
            label += f" shape {shape_text(row.shapes)}"
        labels[row.id] = label
    return labels


def _not_run_lines(previous: Version, current: Version) -> list[str]:
    before = {a for a, _, _ in not_run(previous.get("accuracy"), previous.get("speed"))}
    lines = []
    for artifact, reason, _ in not_run(current.get("accuracy"), current.get("speed")):
        if artifact not in before:
            lines.append(f"{artifact} not run: {reason}")
            before.add(artifact)
    return lines
