"""Speed metrics in one place: which way each objective metric is better (a latency statistic, lower; throughput,
higher), how its figures are written, and whether two intervals overlap (within noise). A row itself is read as a
`Timing` (check/timings.py)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

Interval = tuple[float, float]
METRIC_INTERVAL = {"p50_ms": "p50", "p90_ms": "p90", "p99_ms": "p99", "mean_ms": "mean"}
THROUGHPUT = "sequences_per_s"  # the throughput run's figure (row["throughput"])
SERVED = "max_qps_at_p99"  # the server scenario's rate within the p99 target (reports/load.json)


def maximized(metric: str) -> bool:
    """Whether more is better for this metric (a rate) rather than less (latency)."""
    return metric in (THROUGHPUT, SERVED)


def unit_of(metric: str) -> str:
    if metric == SERVED:
        return "requests/s"
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


def fmt_qps(found: float | None) -> str:
    """Requests per second: three significant figures below 1000 (a CPU model serves 4.06, not "4"), whole
    above: 3.74, 62.1, 1042."""
    if found is None or not isinstance(found, int | float) or math.isnan(found):
        return "—"
    return f"{found:.0f}" if abs(found) >= 1000 else f"{found:#.3g}".rstrip(".")


def figure_text(found: float | None, unit: str | None) -> str:
    """A winner's figure with its unit: '0.191 ms', '12.0 ms', '107965 seq/s', '62.1 requests/s'."""
    if (unit or "ms") == "ms":
        return f"{fmt_ms(found)} ms"
    if unit == "requests/s":
        return f"{fmt_qps(found)} {unit}"
    return f"{fmt_rate(found)} {unit}"


def metric_name(metric: str) -> str:
    """How a reason or report names the metric: 'p50', 'mean', 'sequences/s', 'requests/s within the p99 target'."""
    if metric == SERVED:
        return "requests/s within the p99 target"
    return "sequences/s" if maximized(metric) else METRIC_INTERVAL.get(metric, metric)


def as_interval(value: Any) -> Interval | None:
    """A [low, high] pair as an interval; None for anything else."""
    if isinstance(value, Sequence) and not isinstance(value, str) and len(value) == 2:
        return (float(value[0]), float(value[1]))
    return None


def overlap(a: Interval | None, b: Interval | None) -> bool:
    """Whether two intervals overlap: the difference between their rows is within the noise. Unknown
    intervals never overlap."""
    if a is None or b is None:
        return False
    return a[0] <= b[1] and b[0] <= a[1]
