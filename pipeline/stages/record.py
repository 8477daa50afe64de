"""The run record (stages.json): per stage its fingerprint, inputs, outputs, status, error and duration. The
executor writes it after every stage; later deploys read it to reuse what is fresh."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.release.store import read_json, warn

RUN_RECORD = "stages.json"


@dataclass
class StageRecord:
    name: str
    version: int
    fingerprint: str | None
    status: str  # ran | reused | failed | skipped
    config: dict[str, Any] = field(default_factory=dict)
    environment: dict[str, Any] = field(default_factory=dict)
    inputs: dict[str, str] = field(default_factory=dict)  # artifact name -> sha256
    outputs: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None
    duration_s: float = 0.0
    details: dict[str, Any] = field(default_factory=dict)
    reused_from: str | None = None
    finished: str | None = None
    why: str | None = None  # why it ran (stale reason) or why it could be reused
    produces: list[str] = field(default_factory=list)  # artifacts it was to make (a failure names them)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StageRecord:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)


def read_records(folder: Path) -> dict[str, StageRecord]:
    """The run record of an earlier version or killed run; unreadable ones are warned about and skipped."""
    data = read_json(folder / RUN_RECORD)
    try:
        return {r["name"]: StageRecord.from_json(r) for r in data.get("stages", [])} if data else {}
    except (AttributeError, KeyError, TypeError):
        warn(f"{folder / RUN_RECORD}: not a run record; ignored")
        return {}
