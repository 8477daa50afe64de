"""Latency statistics of one benchmark row (docs/benchmarking.md rule 6): order statistics, spread, and bootstrap
confidence intervals of p50, p90, p99 and the mean, so that selection can tell a real lead from noise.

Intervals resample whole measurement windows (a block bootstrap): calls inside one window share the machine's
state of that moment (clocks, caches, neighbours), so an iid resample of single calls pretends to more
independent evidence than there is and ignores how much the windows disagree. With a single window (or no
window boundaries from the caller) there is nothing to resample but calls, and the row says so (`ci_method`).

A block bootstrap knows only k independent units. Its plain percentile interval is then too narrow: on steady
(iid lognormal) data it covered the true p50 in about 74 % of rows at 3 windows, 85 % at 5 and 90 % at 10.
The block interval is therefore widened around the row's estimate by sqrt(k / (k - 1)) * t(k - 1) / z
(the usual small-sample correction of a variance estimated from k units), which brought p50, p90 and mean
back to 94-98 % at 3, 5 and 10 windows. The widening stops at the fastest and the slowest call measured: at
two windows the factor is about 9, and a row whose windows disagreed (0.16 against 17 ms) was otherwise given
a p50 interval reaching 162 ms, past any call it made. p99 from few calls per window still covers less (about 80-90 %):
the tail of a few hundred calls is itself uncertain beyond what resampling can see.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist
from typing import Any

import numpy as np

# Resampled rows are drawn in chunks so that memory stays bounded for long, fast rows.
_CHUNK_ELEMENTS = 4_000_000
RESAMPLES = 2000
QUANTILES = {"p50": 50.0, "p90": 90.0, "p99": 99.0}
STATISTICS = (*QUANTILES, "mean")
BLOCK = "block-bootstrap"  # whole windows resampled with replacement
IID = "iid-bootstrap"  # single calls resampled with replacement (one window, or no window boundaries)


def bootstrap_intervals(
    samples_ms: Sequence[float],
    window_sizes: Sequence[int] | None = None,
    confidence: float = 0.95,
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> tuple[dict[str, list[float]], str]:
    """Intervals of p50, p90, p99 and mean, and the method used.

    `window_sizes` splits the samples (in measurement order) into windows; with two or more windows, whole
    windows are resampled with replacement and each statistic is computed on the resample's calls together;
    the percentile interval is then widened for the few windows it rests on (module docstring).
    """
    data = _samples(samples_ms)
    sizes = [int(s) for s in window_sizes or [] if s > 0]
    if sizes and sum(sizes) != data.size:
        raise ValueError(f"window sizes add up to {sum(sizes)}, but there are {data.size} samples")
    if data.size == 1:
        return {name: [float(data[0])] * 2 for name in STATISTICS}, IID
    if len(sizes) < 2:
        resampled = _iid_resampled(data, resamples, seed)
        return {name: _interval(resampled[name], confidence) for name in STATISTICS}, IID
    windows = np.split(data, np.cumsum(sizes)[:-1])
    k = len(windows)
    counts = np.random.default_rng(seed).multinomial(k, [1.0 / k] * k, size=resamples)
    resampled = resampled_statistics(windows, counts)
    estimates = {name: float(np.percentile(data, q)) for name, q in QUANTILES.items()}
    estimates["mean"] = float(data.mean())
    factor = small_sample_factor(k, confidence)
    intervals = {}
    for name in STATISTICS:
        low, high = _interval(resampled[name], confidence)
        centre = estimates[name]
        intervals[name] = [  # widened, but never past the fastest or the slowest call measured
            max(float(data.min()), min(low, centre - factor * (centre - low))),
            min(float(data.max()), max(high, centre + factor * (high - centre))),
        ]
    return intervals, BLOCK


def small_sample_factor(units: int, confidence: float = 0.95) -> float:
    """sqrt(k / (k - 1)) * t(k - 1) / z: how much wider an interval from k resampled units must be than the
    plain percentile interval (the bootstrap variance is (k - 1) / k of the unbiased one, and the variance
    itself is estimated from k units)."""
    z = NormalDist().inv_cdf(0.5 + confidence / 2.0)
    return math.sqrt(units / (units - 1)) * t_two_sided(confidence, units - 1) / z


def t_two_sided(confidence: float, df: int) -> float:
    """The t value with P(|T| <= t) = confidence for Student's t with integer `df` (bisection on the closed
    form of Abramowitz & Stegun 26.7.3-4; no scipy needed)."""
    low, high = 0.0, 1.0
    while _t_central(high, df) < confidence:
        low, high = high, high * 2.0
    for _ in range(80):
        mid = (low + high) / 2.0
        low, high = (mid, high) if _t_central(mid, df) < confidence else (low, mid)
    return (low + high) / 2.0


def _t_central(t: float, df: int) -> float:
    """P(|T| <= t) for Student's t with integer df."""
    theta = math.atan(t / math.sqrt(df))
    c2 = math.cos(theta) ** 2
    term, total = 1.0, 1.0
    if df % 2 == 1:
        for j in range(1, (df - 1) // 2):
            term *= c2 * (2 * j) / (2 * j + 1)
            total += term
        tail = math.sin(theta) * math.cos(theta) * total if df > 1 else 0.0
        return 2.0 / math.pi * (theta + tail)
    for j in range(1, df // 2):
        term *= c2 * (2 * j - 1) / (2 * j)
        total += term
    return math.sin(theta) * total


def resampled_statistics(windows: Sequence[np.ndarray], counts: np.ndarray) -> dict[str, np.ndarray]:
    """p50, p90, p99 and mean of each block resample, without building it: resample r takes window j
    `counts[r, j]` times. Equal to numpy's (linear) percentile and mean of the concatenated resample.

    Memory is O(samples + resamples x windows): a rank in the resample is found by a binary search over the
    sorted samples, counting how many calls of each window lie at or below a candidate value.
    """
    counts = np.asarray(counts, dtype=np.int64)
    sizes = np.array([w.size for w in windows], dtype=np.int64)
    sums = np.array([w.sum() for w in windows], dtype=np.float64)
    by_window = [np.sort(w) for w in windows]
    ordered = np.sort(np.concatenate(by_window))
    total = counts @ sizes
    out = {"mean": (counts @ sums) / total}
    for name, q in QUANTILES.items():
        position = (total - 1) * (q / 100.0)
        below = np.floor(position).astype(np.int64)
        above = np.minimum(below + 1, total - 1)
        low = _value_at_rank(ordered, by_window, counts, below)
        high = _value_at_rank(ordered, by_window, counts, above)
        out[name] = low + (position - below) * (high - low)
    return out


def _value_at_rank(
    ordered: np.ndarray, by_window: list[np.ndarray], counts: np.ndarray, rank: np.ndarray
) -> np.ndarray:
    """The value at 0-based `rank` of each resample's sorted calls: the smallest sample value v whose
    weighted count of calls <= v exceeds the rank (a vectorized binary search over `ordered`)."""
    lo = np.zeros(rank.size, dtype=np.int64)
    hi = np.full(rank.size, ordered.size - 1, dtype=np.int64)
    while np.any(lo < hi):
        mid = (lo + hi) // 2
        value = ordered[mid]
        at_or_below = np.zeros(rank.size, dtype=np.int64)
        for j, window in enumerate(by_window):
            at_or_below += counts[:, j] * np.searchsorted(window, value, side="right")
        enough = at_or_below > rank
        hi = np.where(enough, mid, hi)
        lo = np.where(enough, lo, mid + 1)
    return ordered[lo]


def _iid_resampled(data: np.ndarray, resamples: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    per_chunk = max(1, _CHUNK_ELEMENTS // data.size)
    parts: dict[str, list[np.ndarray]] = {name: [] for name in STATISTICS}
    for start in range(0, resamples, per_chunk):
        rows = min(per_chunk, resamples - start)
        resample = data[rng.integers(0, data.size, size=(rows, data.size))]
        for name, values in zip(
            QUANTILES, np.percentile(resample, list(QUANTILES.values()), axis=1), strict=True
        ):
            parts[name].append(values)
        parts["mean"].append(resample.mean(axis=1))
    return {name: np.concatenate(values) for name, values in parts.items()}


def _interval(values: np.ndarray, confidence: float) -> list[float]:
    tail = (1.0 - confidence) / 2.0 * 100.0
    low, high = np.percentile(values, [tail, 100.0 - tail])
    return [float(low), float(high)]


def _samples(samples_ms: Sequence[float]) -> np.ndarray:
    data = np.asarray(samples_ms, dtype=np.float64)
    if data.size == 0:
        raise ValueError("no samples")
    return data


def latency_stats(
    samples_ms: Sequence[float], seed: int = 0, window_sizes: Sequence[int] | None = None
) -> dict[str, Any]:
    """n, mean, p50/p90/p95/p99, min, max, cv (std / mean), all in milliseconds; `ci95_ms` (95 % intervals
    of p50, p90, p99 and mean), `ci_method`, and the contract's `p50_ci95_ms` (= ci95_ms["p50"]).

    Pass `window_sizes` (calls per window, in order) for intervals that reflect window-to-window variation.
    Latency only: throughput comes from a separate overlapped run, never from these numbers (rule 6).
    """
    data = _samples(samples_ms)
    p50, p90, p95, p99 = np.percentile(data, [50, 90, 95, 99])
    mean = float(data.mean())
    std = float(data.std(ddof=1)) if data.size > 1 else 0.0
    intervals, method = bootstrap_intervals(data, window_sizes, seed=seed)
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
        "p50_ci95_ms": list(intervals["p50"]),
        "ci95_ms": intervals,
        "ci_method": method,
    }
