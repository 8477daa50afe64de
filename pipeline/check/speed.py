"""How a speed row is read, in one place: the value and 95 % interval of an objective metric (a latency
statistic, lower is better, or throughput, higher is better), whether two intervals overlap (within noise), the
row's sequence length, and whether it is the row the winner was chosen on. Selection, compare and the reports
all read rows this way."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

Row = Mapping[str, Any]
Interval = tuple[float, float]
METRIC_INTERVAL = {"p50_ms": "p50", "p90_ms": "p90", "p99_ms": "p99", "mean_ms": "mean"}
THROUGHPUT = "sequences_per_s"  # the throughput run's figure (row["throughput"]), the one metric maximized


RowId = tuple[str, str, str, bool, int, str]  # (artifact, runtime, io, cuda_graph, batch, shapes JSON)


def row_id(row: Row) -> RowId:
    """A speed row's identity, the one every reader matches rows by: what ran (artifact, runtime, I/O, whether
    replayed as a CUDA graph) and on which inputs (the batch, and the shapes, which hold the sequence length).
    Ids sort in the order a reader scans rows (a row without a batch sorts as batch 0)."""
    shapes = json.dumps(row.get("shapes") or {}, sort_keys=True)
    batch = row.get("batch")
    return (
        str(row.get("artifact")),
        str(row.get("runtime")),
        str(row.get("io") or "host"),
        bool(row.get("cuda_graph")),
        batch if isinstance(batch, int) else 0,
        shapes,
    )


def maximized(metric: str) -> bool:
    """Whether more is better for this metric (throughput) rather than less (latency)."""
    return metric == THROUGHPUT


def unit_of(metric: str) -> str:
    return "seq/s" if maximized(metric) else "ms"


def fmt_ms(found: float | None) -> str:
    """Latency with three significant figures, trailing zeros kept: 0.0298, 0.412, 3.07, 26.0, 195. Every ms
    figure of the reports goes through here, so that a reason and the table beside it read alike."""
    if found is None or not isinstance(found, int | float) or math.isnan(found):
        return "—"
    if abs(found) >= 100:
        return f"{found:.0f}"
    return f"{found:#.3g}".rstrip(".")


def fmt_rate(found: float | None) -> str:
    """Sequences per second, whole: 107965."""
    if found is None or not isinstance(found, int | float) or math.isnan(found):
        return "—"
    return f"{found:.0f}"


def figure_text(found: float | None, unit: str | None) -> str:
    """A winner's figure with its unit: '0.191 ms', '12.0 ms', '107965 seq/s'."""
    if (unit or "ms") == "ms":
        return f"{fmt_ms(found)} ms"
    return f"{fmt_rate(found)} {unit}"


def metric_name(metric: str) -> str:
    """How a reason or report names the metric: 'p50', 'mean', 'sequences/s'."""
    return "sequences/s" if maximized(metric) else METRIC_INTERVAL.get(metric, metric)


def value(row: Row, metric: str) -> float | None:
    """The row's figure for an objective metric; None when it has none (a row without a throughput run)."""
    found = (row.get("throughput") or {}).get(THROUGHPUT) if maximized(metric) else row.get(metric)
    return float(found) if isinstance(found, int | float) else None


def rank_key(row: Row, metric: str) -> float:
    """Sort key, best first, for rows that have the metric."""
    found = value(row, metric)
    assert found is not None, f"row without {metric}"
    return -found if maximized(metric) else found


def interval(row: Row, metric: str) -> Interval | None:
    """The row's 95 % interval of an objective metric: for a latency statistic `ci95_ms[p50|p90|p99|mean]` when
    the row has it, else `p50_ci95_ms` for the median; for throughput the throughput run's `ci95`; None when
    the row gives none."""
    if maximized(metric):
        return as_interval((row.get("throughput") or {}).get("ci95"))
    key = METRIC_INTERVAL.get(metric, metric.removesuffix("_ms"))
    found = (row.get("ci95_ms") or {}).get(key)
    if found is None and key == "p50":
        found = row.get("p50_ci95_ms")
    return as_interval(found)


def as_interval(value: Any) -> Interval | None:
    """A [low, high] pair as an interval; None for anything else."""
    if isinstance(value, Sequence) and not isinstance(value, str) and len(value) == 2:
        return (float(value[0]), float(value[1]))
    return None


def interval_or_point(row: Row, metric: str) -> Interval:
    """The row's interval, or its value as a point when the benchmark gave none."""
    found = interval(row, metric)
    if found is not None:
        return found
    point = value(row, metric)
    assert point is not None, f"row without {metric}"
    return (point, point)


def overlap(a: Interval | None, b: Interval | None) -> bool:
    """Whether two intervals overlap: the difference between their rows is within the noise. Unknown
    intervals never overlap."""
    if a is None or b is None:
        return False
    return a[0] <= b[1] and b[0] <= a[1]


def sequence_of(row: Row) -> int | None:
    """The row's sequence length: recorded, else the second axis of its first input's shape."""
    if row.get("sequence_length") is not None:
        return row["sequence_length"]
    shapes = list((row.get("shapes") or {}).values())
    return shapes[0][1] if shapes and len(shapes[0]) > 1 else None


def is_winner_row(row: Row, winner: Row | None) -> bool:
    """The row the winner was chosen on: its artifact, runtime and I/O at the objective's batch and at the
    shapes winner.json records (without them, at the objective's sequence length)."""
    if not winner:
        return False
    who = ("artifact", "runtime")
    if [row.get(k) for k in who] != [winner.get(k) for k in who] or row.get("io", "host") != winner.get(
        "io", "host"
    ):
        return False
    objective = winner.get("objective") or {}
    if objective.get("batch") is not None and row.get("batch") != objective["batch"]:
        return False
    if winner.get("shapes"):
        return row.get("shapes") == winner["shapes"]
    sequence = objective.get("sequence_length")
    return sequence is None or sequence_of(row) == sequence
