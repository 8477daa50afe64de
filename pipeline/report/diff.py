"""What changed since the previous signed-off version, one plain line per change.

A version here is a dict {"version": "v0002", "accuracy": {...}, "speed": {...}, "winner": {...} | None,
"signed_off": bool (optional)} holding the contract's JSON reports of that version.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pipeline.check.speed import figure_text
from pipeline.report.facts import (
    artifacts_of,
    cis_overlap,
    fmt_change,
    fmt_metric,
    fmt_ms,
    intervals_overlap,
    key_checks,
    not_run,
    results_of,
    row_key,
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


def _verdict(entry: Mapping[str, Any]) -> str:
    return "pass" if entry.get("passed") else "FAIL"


def _accuracy_lines(before: Mapping[str, Any] | None, after: Mapping[str, Any] | None) -> list[str]:
    old, new = artifacts_of(before), artifacts_of(after)
    lines: list[str] = []
    for name in sorted(set(old) | set(new)):
        if name not in new:
            lines.append(f"{name} not validated any more")
        elif name not in old:
            lines.append(f"{name} new: accuracy {_verdict(new[name])}{_reason(new[name])}")
        elif _verdict(old[name]) != _verdict(new[name]):
            lines.append(
                f"{name} accuracy {_verdict(old[name])} -> {_verdict(new[name])}{_reason(new[name])}"
            )
        else:
            lines += _figure_lines(name, old[name], new[name])
    return lines


def _reason(entry: Mapping[str, Any]) -> str:
    return f": {entry['reason']}" if entry.get("reason") and not entry.get("passed") else ""


def _figure_lines(name: str, old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """Key figures that moved while the verdict held (same artifact, re-validated with other data or code)."""
    old_checks, new_checks = key_checks(old), key_checks(new)
    lines = []
    for metric in new_checks:
        if metric not in old_checks:
            continue
        a = fmt_metric(metric, old_checks[metric].get("value"))
        b = fmt_metric(metric, new_checks[metric].get("value"))
        if a != b:
            lines.append(f"{name} {metric} {a} -> {b}")
    return lines


def _speed_lines(before: Mapping[str, Any] | None, after: Mapping[str, Any] | None) -> list[str]:
    """One line per row that moved beyond noise, new or gone; rows whose p50 CIs overlap share one line."""
    old = {row_key(r): r for r in results_of(before)}
    new = {row_key(r): r for r in results_of(after)}
    labels = _labels(list(old.values()) + list(new.values()))
    lines: list[str] = []
    steady: list[str] = []
    for key in sorted(set(old) | set(new), key=_sortable):
        label = labels[key]
        if key not in new:
            lines.append(f"{label} not benchmarked any more")
        elif key not in old:
            lines.append(f"{label} new: p50 {fmt_ms(new[key].get('p50_ms'))} ms")
        elif cis_overlap(old[key], new[key]):
            steady.append(f"{label} ({_percent(old[key], new[key])})")
        else:
            lines.append(_speed_change(label, old[key], new[key]))
    if steady:
        lines.append("within noise (p50 95% CIs overlap): " + ", ".join(steady))
    return lines


def _percent(old: Mapping[str, Any], new: Mapping[str, Any]) -> str:
    a, b = old.get("p50_ms"), new.get("p50_ms")
    return fmt_change(a, b) if isinstance(a, int | float) and isinstance(b, int | float) else "n/a"


def _speed_change(label: str, old: Mapping[str, Any], new: Mapping[str, Any]) -> str:
    line = f"{label} p50 {fmt_ms(old.get('p50_ms'))} -> {fmt_ms(new.get('p50_ms'))} ms ({_percent(old, new)})"
    return line + ", unstable" if new.get("stable") is False else line


def _sortable(key: tuple) -> tuple:
    artifact, runtime, io, batch, shapes = key
    return (str(artifact), str(runtime), str(io), batch if isinstance(batch, int) else 0, repr(shapes))


def _labels(rows: list[Mapping[str, Any]]) -> dict[tuple, str]:
    """'onnx-fp32 batch 1', naming runtime, I/O or shape only where they tell rows of one artifact apart."""
    runners: dict[str, set] = {}
    shapes: dict[tuple, set] = {}
    for row in rows:
        runners.setdefault(str(row.get("artifact")), set()).add((row.get("runtime"), row.get("io")))
        shapes.setdefault((row.get("artifact"), row.get("batch")), set()).add(shape_text(row.get("shapes")))
    labels = {}
    for row in rows:
        label = str(row.get("artifact"))
        if len(runners[label]) > 1:
            label += f" [{row.get('runtime')}, {row.get('io')} I/O]"
        label += f" batch {row.get('batch')}"
        if len(shapes[(row.get("artifact"), row.get("batch"))]) > 1:
            label += f" shape {shape_text(row.get('shapes'))}"
        labels[row_key(row)] = label
    return labels


def _not_run_lines(previous: Version, current: Version) -> list[str]:
    before = {a for a, _, _ in not_run(previous.get("accuracy"), previous.get("speed"))}
    lines = []
    for artifact, reason, _ in not_run(current.get("accuracy"), current.get("speed")):
        if artifact not in before:
            lines.append(f"{artifact} not run: {reason}")
            before.add(artifact)
    return lines
