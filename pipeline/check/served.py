"""reports/load.json read as every reader reads it (the sign-off's Load section, its plot, the deploy's closing
lines): per candidate of the server scenario, the highest rate it serves within the p99 target, and each LoadGen
run behind that figure."""

from __future__ import annotations

import math
from dataclasses import dataclass

from pipeline.check.results import Row, as_number, as_text
from pipeline.check.speed import Interval, as_interval


@dataclass(frozen=True)
class LoadPoint:
    """One LoadGen run of the server scenario: the rate asked for, the rate completed, and its p99."""

    target_qps: float
    completed_qps: float | None
    p99_ms: float | None
    met: bool  # issued in full, no error, p99 within the target


@dataclass(frozen=True)
class ServerSplit:
    """Where a request's time went in the run at the lowest rate tried (the least queueing: the serving path's
    own cost), mean ms per request: from the in-process batcher's clocks, or through Triton from its counters
    (which also split the compute step from the whole request inside the server)."""

    target_qps: float
    p50_ms: float | None  # LoadGen's, from issue to answer
    queue_ms: float
    runner_ms: float | None
    compute_infer_ms: float | None = None  # Triton only
    server_ms: float | None = None  # Triton only

    @classmethod
    def lowest(cls, runs: list[Row]) -> ServerSplit | None:
        split = [r for r in runs if isinstance(r.get("time_split"), dict)]
        if not split:
            return None
        run = min(split, key=lambda r: as_number(r.get("target_qps")) or 0.0)
        t = run["time_split"]
        queue = as_number(t.get("queue_ms"))
        if queue is None:
            return None
        return cls(
            target_qps=as_number(run.get("target_qps")) or 0.0,
            p50_ms=as_number(run.get("p50_ms")),
            queue_ms=queue,
            runner_ms=as_number(t.get("runner_ms")),
            compute_infer_ms=as_number(t.get("compute_infer_ms")),
            server_ms=as_number(t.get("server_ms")),
        )


@dataclass(frozen=True)
class ServedRate:
    """One candidate's row of reports/load.json: the highest rate it serves within the p99 target."""

    artifact: str
    runtime: str
    io: str
    through: str  # in_process or triton
    p99_target_ms: float | None
    max_qps: float | None
    ci95: Interval | None
    held: int | None  # repeats at that rate that held the target, of `repeats`
    repeats: int | None
    missed: str | None  # by how much it missed, when no rate met the target
    error: str | None
    bounded: bool  # no run failed: the candidate may serve more than the search asked
    loadgen_result: str | None  # VALID / INVALID of the run whose logs are kept
    points: tuple[LoadPoint, ...] = ()
    split: ServerSplit | None = None

    @classmethod
    def read(cls, row: Row) -> ServedRate:
        target = as_number(row.get("p99_target_ms"))
        points = tuple(
            LoadPoint(
                target_qps=as_number(run.get("target_qps")) or 0.0,
                completed_qps=as_number(run.get("completed_qps")),
                p99_ms=as_number(run.get("p99_ms")),
                met=bool(
                    run.get("duration_met")
                    and not run.get("error")
                    and target is not None
                    and (as_number(run.get("p99_ms")) or math.inf) <= target
                ),
            )
            for run in [*(row.get("runs") or []), *(row.get("repeats") or [])]
        )
        served = row.get("served") or {}
        return cls(
            artifact=str(row.get("artifact")),
            runtime=str(row.get("runtime")),
            io=str(row.get("io") or "host"),
            through=str(row.get("through") or "in_process"),
            p99_target_ms=target,
            max_qps=as_number(row.get("max_qps")),
            ci95=as_interval(row.get("ci95")),
            held=served.get("held"),
            repeats=served.get("of"),
            missed=as_text(row.get("missed")),
            error=as_text(row.get("error")),
            bounded=bool(row.get("bounded")),
            loadgen_result=as_text(row.get("loadgen_result")),
            points=points,
            split=ServerSplit.lowest([r for r in row.get("runs") or [] if isinstance(r, dict)]),
        )

    @property
    def label(self) -> str:
        io = "" if self.io == "host" else f", {self.io} I/O"
        return f"{self.artifact} ({self.runtime}{io})"


def served_rates(load: Row | None) -> list[ServedRate]:
    """load.json's rows, in its order (none for a missing report)."""
    return [ServedRate.read(row) for row in (load or {}).get("results") or []]
