"""The report's Inputs section: what values each input held across the validation batches, so that a reader
sees what the artifacts were judged on (token ids over the whole vocabulary, or all 0 and 1)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pipeline.report.blocks import Cell, Para, Section, Table, Text
from pipeline.report.facts import input_sets_text

Dict = Mapping[str, Any]


def inputs_section(accuracy: Dict | None) -> Section:
    covered = (accuracy or {}).get("inputs") or {}
    if not covered:
        return Section("Inputs", [])
    rows: list[list[Text]] = []
    tones = []
    for name, found in covered.items():
        distinct = f"{found.get('distinct')}{'+' if found.get('distinct_capped') else ''}"
        held_out = found.get("held_out_distinct")
        degenerate = isinstance(held_out, int) and held_out < 2
        shapes = found.get("shapes") or []
        rows.append(
            [
                name,
                str(found.get("dtype") or "—"),
                _shape_text(found.get("dim_ranges"), shapes),
                _value(found.get("min")),
                _value(found.get("max")),
                Cell(distinct, "bad") if degenerate else distinct,
            ]
        )
        tones.append("warn" if degenerate else "")
    return Section(
        "Inputs",
        [
            Para(
                f"What each input held over every validation batch ({input_sets_text(accuracy)}): the "
                "artifacts were judged on these values only. Distinct values are counted up to 1000.",
                tone="note",
            ),
            Table(["input", "dtype", "shape (each axis's range)", "min", "max", "distinct"], rows, tones),
        ],
    )


def _value(value: Any) -> str:
    return "—" if not isinstance(value, int | float) else f"{value:g}"


def _shape_text(ranges: list[list[int]] | None, shapes: list[list[int]]) -> str:
    """'1–2 × 8–1600': each axis's own range, so the longest sequence shows even where a wider batch of
    shorter ones is the larger shape. Reports from before the ranges were kept give smallest … largest."""
    if ranges:
        return " × ".join(str(lo) if lo == hi else f"{lo}–{hi}" for lo, hi in ranges)
    return " … ".join("×".join(str(d) for d in s) for s in shapes) or "—"
