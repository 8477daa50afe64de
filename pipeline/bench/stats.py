"""Latency statistics of one benchmark row (BENCHMARKING.md rule 6): order statistics, spread, and a
bootstrap confidence interval of the median, so that selection can tell a real lead from noise."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

# Resampled medians are drawn in chunks so that memory stays bounded for long, fast rows.
_CHUNK_ELEMENTS = 4_000_000


def bootstrap_median_ci(
    samples_ms: Sequence[float], confidence: float = 0.95, resamples: int = 2000, seed: int = 0
) -> tuple[float, float]:
    """Percentile-bootstrap interval of the median; seeded so that a report re-renders identically."""
    data = np.asarray(samples_ms, dtype=np.float64)
    if data.size == 0:
        raise ValueError("no samples")
    if data.size == 1:
        return float(data[0]), float(data[0])
    rng = np.random.default_rng(seed)
    per_chunk = max(1, _CHUNK_ELEMENTS // data.size)
    medians = []
    for start in range(0, resamples, per_chunk):
        rows = min(per_chunk, resamples - start)
        picks = rng.integers(0, data.size, size=(rows, data.size))
        medians.append(np.median(data[picks], axis=1))
    tail = (1.0 - confidence) / 2.0 * 100.0
    low, high = np.percentile(np.concatenate(medians), [tail, 100.0 - tail])
    return float(low), float(high)


def latency_stats(samples_ms: Sequence[float], seed: int = 0) -> dict[str, Any]:
    """n, mean, p50/p90/p95/p99, min, max, cv (std / mean) and p50_ci95_ms, all in milliseconds.

    Latency only: throughput comes from a separate overlapped run, never from these numbers (rule 6).
    """
    data = np.asarray(samples_ms, dtype=np.float64)
    if data.size == 0:
        raise ValueError("no samples")
    p50, p90, p95, p99 = np.percentile(data, [50, 90, 95, 99])
    mean = float(data.mean())
    std = float(data.std(ddof=1)) if data.size > 1 else 0.0
    low, high = bootstrap_median_ci(data, seed=seed)
    return {
        "n": int(data.size),
        "mean_ms": mean,
        "p50_ms": float(p50),
        "p90_ms": float(p90),
        "p95_ms": float(p95),
        "p99_ms": float(p99),
        "min_ms": float(data.min()),
        "max_ms": float(data.max()),
        "std_ms": std,
        "cv": std / mean if mean > 0 else 0.0,
        "p50_ci95_ms": [low, high],
    }
