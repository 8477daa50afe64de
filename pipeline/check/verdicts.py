"""accuracy.json's entries as every reader reads them: an `AccuracyRecord` per artifact, its `Verdict` on each
runtime it was validated on, and its checks as `CheckRecord`s. A benchmark row can win only on a runtime whose own
verdict passed (`AccuracyRecord.passed_on`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pipeline.check.results import Row, as_number, as_text


@dataclass(frozen=True)
class CheckRecord:
    """One accuracy check as validation recorded it (check/accuracy.py CheckResult.to_json)."""

    metric: str
    value: float | None
    threshold: float | None
    passed: bool
    informational: bool = False
    output: str | None = None
    inputs: str | None = None
    runtime: str | None = None
    reason: str | None = None
    scale: float = 1.0  # what the tolerance was multiplied by (accuracy.Check.scale)

    @classmethod
    def read(cls, check: Row) -> CheckRecord:
        return cls(
            metric=str(check.get("metric")),
            value=as_number(check.get("value")),
            threshold=as_number(check.get("threshold")),
            passed=bool(check.get("passed")),
            informational=bool(check.get("informational")),
            output=as_text(check.get("output")),
            inputs=as_text(check.get("inputs")),
            runtime=as_text(check.get("runtime")),
            reason=as_text(check.get("reason")),
            scale=as_number(check.get("scale")) or 1.0,
        )

    @property
    def required(self) -> bool:
        return not self.informational

    @property
    def measured(self) -> float:
        """The figure, NaN when there is none: a missing figure ranks as the worst."""
        return math.nan if self.value is None else self.value


@dataclass(frozen=True)
class Verdict:
    """An artifact on one runtime: its verdict, its checks there, and what validation added (divergence)."""

    runtime: str | None
    passed: bool
    reason: str | None
    precision: str | None
    checks: tuple[CheckRecord, ...] = ()
    divergence: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class AccuracyRecord:
    """One artifact's accuracy entry: passed on every runtime it was validated on, and each runtime's verdict."""

    name: str
    passed: bool
    reason: str | None
    precision: str | None
    runtime: str | None  # the first runtime validated on
    checks: tuple[CheckRecord, ...]
    runtimes: Mapping[str, Verdict]

    @classmethod
    def read(cls, name: str, entry: Row) -> AccuracyRecord:
        checks = tuple(CheckRecord.read(c) for c in entry.get("checks") or [])
        precision = as_text(entry.get("precision"))
        runtimes = {
            runtime: Verdict(
                runtime=runtime,
                passed=bool(record.get("passed")),
                reason=as_text(record.get("reason")),
                precision=precision,
                checks=tuple(c for c in checks if (c.runtime or runtime) == runtime),
                divergence=record.get("divergence")
                if isinstance(record.get("divergence"), Mapping)
                else None,
            )
            for runtime, record in (entry.get("runtimes") or {}).items()
        }
        return cls(
            name=name,
            passed=bool(entry.get("passed")),
            reason=as_text(entry.get("reason")),
            precision=precision,
            runtime=as_text(entry.get("runtime")),
            checks=checks,
            runtimes=runtimes,
        )

    @property
    def overall(self) -> Verdict:
        """The artifact across every runtime, as one verdict."""
        return Verdict(self.runtime, self.passed, self.reason, self.precision, self.checks)

    def on(self, runtime: str | None) -> Verdict | None:
        """The artifact as seen on one runtime (entries written before per-runtime records existed: whole)."""
        if runtime is None or not self.runtimes:
            return self.overall
        return self.runtimes.get(runtime)

    def passed_on(self, runtime: str) -> bool:
        """Whether the artifact holds a passing record of its own for this runtime: what a row needs to win."""
        found = self.runtimes.get(runtime)
        return bool(found and found.passed)

    @property
    def passed_anywhere(self) -> bool:
        return self.passed or any(v.passed for v in self.runtimes.values())


def records(accuracy: Row | None) -> dict[str, AccuracyRecord]:
    """accuracy.json's entries by artifact, in its order (none for a missing report)."""
    entries = (accuracy or {}).get("artifacts") or {}
    return {name: AccuracyRecord.read(name, entry) for name, entry in entries.items()}
