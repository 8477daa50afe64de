"""speed.json's rows as every reader reads them: a `Timing` per row, with the one row identity (`Timing.id`), its
figures for any objective metric and their 95% intervals, and whether it settled. Selection, compare, the version
diff, the sign-off, the summary, the plots and the hand-offs read rows only through it, so a key is spelled,
defaulted and typed in one place."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pipeline.check.results import Row, as_number, as_text
from pipeline.check.speed import METRIC_INTERVAL, SERVED, THROUGHPUT, Interval, as_interval, maximized

RowId = tuple[str, str, str, bool, int, str]  # (artifact, runtime, io, cuda_graph, batch, shapes JSON)
LATENCY_KEYS = ("mean_ms", "p50_ms", "p90_ms", "p95_ms", "p99_ms", "min_ms", "max_ms")


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
        """The figure for an objective metric; None when the row has none (no throughput run, say; a served rate
        is load.json's, never a row's)."""
        if metric == SERVED:
            return None
        if metric == THROUGHPUT:
            return self.throughput.sequences_per_s if self.throughput else None
        return self.latency_ms.get(metric)

    def interval(self, metric: str) -> Interval | None:
        """The 95 % interval of an objective metric: the latency statistic's, or the throughput run's."""
        if metric == SERVED:
            return None
        if metric == THROUGHPUT:
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
        if metric == THROUGHPUT:
            return self.throughput.stable if self.throughput else True
        return self.stable

    def unsettled_reason(self, metric: str) -> str:
        if metric == THROUGHPUT:
            found = self.throughput.unstable_reason if self.throughput else None
            return found or "throughput segments disagree"
        return self.unstable_reason or self.stop_reason or "no stable windows"


def is_winner_row(row: Timing, winner: Mapping[str, Any] | None) -> bool:
    """The row the winner was chosen on: its artifact, runtime and I/O at the objective's batch and at the
    shapes winner.json records (without them, at the objective's sequence length)."""
    if not winner:
        return False
    if (row.artifact, row.runtime, row.io) != (
        winner.get("artifact"),
        winner.get("runtime"),
        winner.get("io", "host"),
    ):
        return False
    objective = winner.get("objective") or {}
    if objective.get("batch") is not None and row.batch != objective["batch"]:
        return False
    if winner.get("shapes"):
        return dict(row.shapes) == winner["shapes"]
    sequence = objective.get("sequence_length")
    return sequence is None or row.sequence_length == sequence


def timings(speed: Row | None) -> list[Timing]:
    """speed.json's rows, in its order (none for a missing report)."""
    return [Timing.read(row) for row in (speed or {}).get("results") or []]
