"""The record the report keeps folded at its end: the artifacts with their details, the stages, and the
conditions of the measurement (the benchmark's policy and the machine), each fact once."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pipeline.core.errors import reason_line
from pipeline.report.blocks import Block, Bullets, Code, Para, Section, Table, Text
from pipeline.report.facts import first_line, flatten, fmt_seconds

Dict = Mapping[str, Any]
DETAIL_CHARS = 160  # a detail value longer than this is cut in the artifacts table (the JSON keeps it whole)


def artifacts_section(header: Dict) -> Section:
    items = header.get("artifacts") or []
    rows: list[list[Text]] = [
        [
            str(a.get("name")),
            str(a.get("kind") or "—"),
            _precision(a),
            str(a.get("path") or "—"),
            _size(a.get("bytes")),
            str(a.get("sha256") or "—")[:12],
        ]
        for a in items
    ]
    if not rows:
        return Section("Artifacts", [])
    blocks: list[Block] = [Table(["artifact", "kind", "precision", "file", "size", "sha256"], rows)]
    for a in items:
        details = [f"{k}: {_cut(v)}" for k, v in flatten(a.get("details") or {})]
        if details:
            blocks += [Para(f"{a.get('name')} details:", tone="note"), Bullets(details)]
    return Section("Artifacts", blocks, folded=True)


def _precision(artifact: Dict) -> str:
    """'int8 (1 of 32 weight layers)' where a quantized graph keeps some of its weight layers in float: a
    CNN's dynamic INT8 quantizes only its classifier, and 'int8' alone would say the whole model."""
    precision = str(artifact.get("precision") or "—")
    details = artifact.get("details") or {}
    quantized, layers = details.get("quantized_count"), details.get("weight_layers")
    if isinstance(quantized, int) and isinstance(layers, int) and 0 < quantized < layers:
        return f"{precision} ({quantized} of {layers} weight layers)"
    return precision


def _cut(text: str) -> str:
    return text if len(text) <= DETAIL_CHARS else text[: DETAIL_CHARS - 1] + "…"


def _size(value: Any) -> str:
    if not isinstance(value, int):
        return "—"
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("kB", 1 << 10)):
        if value >= scale:
            return f"{value / scale:.1f} {unit}"
    return f"{value} B"


def stages_section(stages: Sequence[Dict]) -> Section:
    if not stages:
        return Section("Stages", [])
    rows: list[list[Text]] = []
    tones = []
    for s in stages:
        status = str(s.get("status"))
        rows.append(
            [str(s.get("name")), status, fmt_seconds(s.get("duration_s")), reason_line(s.get("error"), 160)]
        )
        tones.append({"failed": "bad", "skipped": "warn"}.get(status, ""))
    blocks: list[Block] = [Table(["stage", "status", "duration", "error"], rows, tones)]
    for s in stages:
        error = str(s.get("error") or "")
        if "\n" in error.strip() or len(error) > 160:
            blocks.append(Code(f"{s.get('name')}: full error", error.strip()))
        warnings = (s.get("details") or {}).get("warnings") or (s.get("details") or {}).get("tracer_warnings")
        if isinstance(warnings, list) and warnings:
            blocks.append(Para(f"{s.get('name')} warnings:", tone="note"))
            blocks.append(Bullets([first_line(w, 400) for w in warnings]))
    return Section("Stages", blocks, folded=True)


def conditions_section(speed: Dict | None, environment: Any) -> Section:
    """One table: how the benchmark measured (policy, threads, timer, inputs) and the machine and libraries,
    each fact once."""
    conditions = dict((speed or {}).get("conditions") or {})
    pairs = flatten({k: v for k, v in conditions.items() if k not in ("device", "versions")}, "benchmark")
    if isinstance(environment, Mapping):
        pairs += flatten(environment, "environment")
    else:
        pairs += flatten({k: conditions[k] for k in ("device", "versions") if k in conditions}, "benchmark")
    rows: list[list[Text]] = [[k, _cut(v)] for k, v in pairs]
    return Section("Conditions", [Table(["key", "value"], rows)] if rows else [], folded=True)
