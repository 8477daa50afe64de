"""What validation, the benchmark and selection hand on, typed twice: the JSON shapes of reports/accuracy.json,
reports/speed.json and reports/selection.json (winner.json) as the stages write them, and the typed records every
reader reads them as.

The reports are plain JSON-ready dicts with declared keys (the contract's keys are required, the rest optional,
more may be added), so a stage hands them on in memory by declared name (pipeline/run/executor.py) and each is
written as JSON once, by the stage that makes it. A report is parsed from its file only when its stage was reused
from an earlier version (`read_report`). Readers never index those dicts: `timings(speed)` gives each speed row
as a `Timing` (with the one row identity, `Timing.id`) and `records(accuracy)` each artifact's accuracy entry as an
`AccuracyRecord` (its verdict per runtime, its checks as `CheckRecord`s). Selection, compare, the version diff
and every report section read results this way, so a key is spelled, defaulted and typed in one place."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict

from pipeline.check.speed import METRIC_INTERVAL, THROUGHPUT, Interval, as_interval, maximized

if TYPE_CHECKING:
    from pipeline.check.accuracy import ArtifactAccuracy

Row = Mapping[str, Any]
RowId = tuple[str, str, str, bool, int, str]  # (artifact, runtime, io, cuda_graph, batch, shapes JSON)
LATENCY_KEYS = ("mean_ms", "p50_ms", "p90_ms", "p95_ms", "p99_ms", "min_ms", "max_ms")


class SpeedRow(TypedDict):
    """One (artifact, runtime, io, shapes) measurement (docs/benchmarking.md rule 6)."""

    artifact: str
    runtime: str
    io: str
    batch: int
    shapes: dict[str, list[int]]
    n: int
    mean_ms: float
    p50_ms: float
    p90_ms: float
    p95_ms: float
    p99_ms: float
    min_ms: float
    max_ms: float
    cv: float
    p50_ci95_ms: list[float]
    stable: bool
    precision: NotRequired[str | None]
    sequence_length: NotRequired[int | None]
    ci95_ms: NotRequired[dict[str, list[float]]]
    cuda_graph: NotRequired[bool]
    stop_reason: NotRequired[str]
    unstable_reason: NotRequired[str | None]


class SpeedReport(TypedDict):
    schema_version: int
    conditions: dict[str, Any]
    results: list[SpeedRow]
    not_run: list[dict[str, str]]
    failed: NotRequired[list[dict[str, Any]]]
    flags: NotRequired[list[dict[str, Any]]]


class AccuracyEntry(TypedDict):
    """One artifact in accuracy.json: passed on every runtime, and each runtime's own record."""

    passed: bool
    reason: str | None
    precision: str | None
    runtime: str | None
    checks: list[dict[str, Any]]
    runtimes: NotRequired[dict[str, dict[str, Any]]]


class AccuracyReport(TypedDict):
    schema_version: int
    reference: str
    artifacts: dict[str, AccuracyEntry]
    not_run: list[dict[str, str]]
    reference_runtime: NotRequired[str | None]
    warnings: NotRequired[list[str]]
    inputs: NotRequired[dict[str, Any]]  # per input: the values validation covered (min, max, distinct)


class Winner(TypedDict):
    """winner.json: what to ship, how it was chosen, and the accuracy record it passed."""

    artifact: str
    runtime: str
    io: str
    objective: dict[str, Any]
    value: float
    unit: str
    runner_up: dict[str, Any] | None
    reason: str
    file: NotRequired[str | None]
    cuda_graph: NotRequired[bool]
    interval: NotRequired[list[float]]
    shapes: NotRequired[dict[str, list[int]] | None]
    stable: NotRequired[bool]
    provisional: NotRequired[bool]
    accuracy: NotRequired[dict[str, Any]]
    baseline: NotRequired[dict[str, Any] | None]
    within_noise_of: NotRequired[list[str]]


class Selection(TypedDict):
    """reports/selection.json: the winner, or the reasons there is none."""

    reasons: list[str]
    winner: Winner | None


class EngineDetails(TypedDict, total=False):
    """What an engine stage records about its build, read by the runner that decides where it can run."""

    flavour: str
    trt_version: str | None
    compute_capabilities: list[str]
    profiles: list[dict[str, list[list[int]]]]
    optimization_level: int
    build_s: float
    layer_count: int
    layers_source: str


def artifact_entry(results: list[ArtifactAccuracy]) -> AccuracyEntry:
    """One artifact's accuracy.json entry from its record on each runtime it was validated on.

    `passed` holds when every required check on every runtime passed (the contract's meaning); `runtimes`
    keeps each runtime's own verdict, which is what selection reads: a benchmark row can only win on a
    runtime whose record passed. Every check names its runtime."""
    first = results[0]
    failing = [r for r in results if not r]
    reason = None
    if failing:
        reason = failing[0].reason
        if len(results) > 1:
            reason = f"on {failing[0].runtime}: {reason}"
    return {
        "passed": not failing,
        "reason": reason,
        "precision": first.precision,
        "runtime": first.runtime,
        "runtimes": {
            r.runtime: {"passed": r.passed, "reason": r.reason, **r.details} for r in results if r.runtime
        },
        "checks": [{**c.to_json(), "runtime": r.runtime} for r in results for c in r.checks],
    }


def as_number(found: Any) -> float | None:
    """A JSON figure as a float (NaN kept: a check can measure NaN); None when absent or not a number."""
    return float(found) if isinstance(found, int | float) and not isinstance(found, bool) else None


def as_text(found: Any) -> str | None:
    return None if found is None else str(found)


@dataclass(frozen=True)
class Throughput:
    """A row's back-to-back throughput run (pipeline/bench/device.py)."""

    sequences_per_s: float | None
    ci95: Interval | None = None
    stable: bool = True
    unstable_reason: str | None = None
    error: str | None = None

    @classmethod
    def read(cls, found: Any) -> Throughput | None:
        if not isinstance(found, Mapping):
            return None
        return cls(
            sequences_per_s=as_number(found.get(THROUGHPUT)),
            ci95=as_interval(found.get("ci95")),
            stable=bool(found.get("stable", True)),
            unstable_reason=as_text(found.get("unstable_reason")),
            error=as_text(found.get("error")),
        )


@dataclass(frozen=True)
class Timing:
    """One speed row as every reader sees it: what ran, on which inputs, and its figures."""

    artifact: str
    runtime: str
    io: str = "host"
    cuda_graph: bool = False
    batch: int | None = None
    shapes: Mapping[str, list[int]] = field(default_factory=dict)
    precision: str | None = None
    recorded_sequence: int | None = None
    latency_ms: Mapping[str, float] = field(default_factory=dict)  # mean_ms, p50_ms, ... as measured
    ci95_ms: Mapping[str, Interval] = field(default_factory=dict)  # p50, p90, p99, mean
    cv: float | None = None
    n: int | None = None
    stable: bool = True
    unstable_reason: str | None = None
    stop_reason: str | None = None
    throughput: Throughput | None = None
    peak_memory_bytes: float | None = None

    @classmethod
    def read(cls, row: Row) -> Timing:
        batch, sequence = row.get("batch"), row.get("sequence_length")
        ci95 = {k: i for k, v in (row.get("ci95_ms") or {}).items() if (i := as_interval(v)) is not None}
        p50_ci = as_interval(row.get("p50_ci95_ms"))
        if p50_ci is not None:
            ci95.setdefault("p50", p50_ci)
        n = row.get("n")
        return cls(
            artifact=str(row.get("artifact")),
            runtime=str(row.get("runtime")),
            io=str(row.get("io") or "host"),
            cuda_graph=bool(row.get("cuda_graph")),
            batch=batch if isinstance(batch, int) else None,
            shapes=dict(row.get("shapes") or {}),
            precision=as_text(row.get("precision")),
            recorded_sequence=sequence if isinstance(sequence, int) else None,
            latency_ms={k: f for k in LATENCY_KEYS if (f := as_number(row.get(k))) is not None},
            ci95_ms=ci95,
            cv=as_number(row.get("cv")),
            n=n if isinstance(n, int) else None,
            stable=bool(row.get("stable", True)),
            unstable_reason=as_text(row.get("unstable_reason")),
            stop_reason=as_text(row.get("stop_reason")),
            throughput=Throughput.read(row.get("throughput")),
            peak_memory_bytes=as_number((row.get("peak_memory") or {}).get("bytes")),
        )

    @property
    def id(self) -> RowId:
        """The row's identity, the one every reader matches rows by: what ran (artifact, runtime, I/O, whether
        replayed as a CUDA graph) and on which inputs (the batch, and the shapes, which hold the sequence
        length). Ids sort in the order a reader scans rows (a row without a batch sorts as batch 0)."""
        shapes = json.dumps(dict(self.shapes), sort_keys=True)
        return (self.artifact, self.runtime, self.io, self.cuda_graph, self.batch or 0, shapes)

    @property
    def p50_ms(self) -> float | None:
        return self.latency_ms.get("p50_ms")

    @property
    def p99_ms(self) -> float | None:
        return self.latency_ms.get("p99_ms")

    @property
    def sequence_length(self) -> int | None:
        """Recorded, else the second axis of the first input's shape."""
        if self.recorded_sequence is not None:
            return self.recorded_sequence
        shapes = list(self.shapes.values())
        return shapes[0][1] if shapes and len(shapes[0]) > 1 else None

    @property
    def label(self) -> str:
        """'onnx-fp32 (onnxruntime-cpu)', with ', device I/O' only where it is not host I/O."""
        io = "" if self.io == "host" else f", {self.io} I/O"
        return f"{self.artifact} ({self.runtime}{io})"

    def value(self, metric: str) -> float | None:
        """The figure for an objective metric; None when the row has none (no throughput run, say)."""
        if maximized(metric):
            return self.throughput.sequences_per_s if self.throughput else None
        return self.latency_ms.get(metric)

    def interval(self, metric: str) -> Interval | None:
        """The 95 % interval of an objective metric: the latency statistic's, or the throughput run's."""
        if maximized(metric):
            return self.throughput.ci95 if self.throughput else None
        return self.ci95_ms.get(METRIC_INTERVAL.get(metric, metric.removesuffix("_ms")))

    def interval_or_point(self, metric: str) -> Interval:
        """The interval, or the value as a point when the benchmark gave none."""
        found = self.interval(metric)
        if found is not None:
            return found
        point = self.value(metric)
        assert point is not None, f"row without {metric}"
        return (point, point)

    def rank_key(self, metric: str) -> float:
        """Sort key, best first, for rows that have the metric."""
        found = self.value(metric)
        assert found is not None, f"row without {metric}"
        return -found if maximized(metric) else found

    def settled(self, metric: str) -> bool:
        """Whether the measurement of the metric settled: the latency windows, or the throughput segments."""
        if maximized(metric):
            return self.throughput.stable if self.throughput else True
        return self.stable

    def unsettled_reason(self, metric: str) -> str:
        if maximized(metric):
            found = self.throughput.unstable_reason if self.throughput else None
            return found or "throughput segments disagree"
        return self.unstable_reason or self.stop_reason or "no stable windows"


def timings(speed: Row | None) -> list[Timing]:
    """speed.json's rows, in its order (none for a missing report)."""
    return [Timing.read(row) for row in (speed or {}).get("results") or []]


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


REPORTS = {  # declared name -> the file its stage writes
    "report:accuracy": "reports/accuracy.json",
    "report:speed": "reports/speed.json",
    "report:selection": "reports/selection.json",
    "report:matrix": "reports/matrix.json",  # pipeline/bench/matrix.py: what is validated and timed
    "report:load": "reports/load.json",  # pipeline/stages/load.py: the server scenario's rates at the p99 target
}
