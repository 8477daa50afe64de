from __future__ import annotations

import numpy as np
import pytest

from pipeline.bench.stats import bootstrap_intervals, latency_stats

KEYS = ("n", "mean_ms", "p50_ms", "p90_ms", "p95_ms", "p99_ms", "min_ms", "max_ms", "cv", "p50_ci95_ms")


def test_known_array_percentiles_and_spread() -> None:
    data = np.arange(1, 101, dtype=float)
    stats = latency_stats(data)
    assert set(KEYS) <= set(stats)
    assert stats["n"] == 100
    assert stats["mean_ms"] == pytest.approx(50.5)
    assert stats["p50_ms"] == pytest.approx(50.5)
    assert stats["p90_ms"] == pytest.approx(90.1)
    assert stats["p95_ms"] == pytest.approx(95.05)
    assert stats["p99_ms"] == pytest.approx(99.01)
    assert (stats["min_ms"], stats["max_ms"]) == (1.0, 100.0)
    assert stats["cv"] == pytest.approx(np.std(data, ddof=1) / 50.5)


def test_constant_samples_have_no_spread() -> None:
    stats = latency_stats([4.0] * 30)
    assert stats["cv"] == 0.0
    assert stats["p50_ci95_ms"] == [4.0, 4.0]


def test_single_sample() -> None:
    stats = latency_stats([7.5])
    assert stats["n"] == 1 and stats["p99_ms"] == 7.5 and stats["cv"] == 0.0
    assert stats["p50_ci95_ms"] == [7.5, 7.5]


def median_ci(samples, seed: int = 0, resamples: int = 2000) -> tuple[float, float]:
    """The median's interval over iid calls (no window boundaries)."""
    intervals, method = bootstrap_intervals(samples, resamples=resamples, seed=seed)
    assert method == "iid-bootstrap"
    low, high = intervals["p50"]
    return low, high


def test_no_samples_is_an_error() -> None:
    with pytest.raises(ValueError):
        latency_stats([])


def test_median_ci_contains_the_median_and_is_seeded() -> None:
    data = np.random.default_rng(3).lognormal(mean=1.0, sigma=0.3, size=400)
    low, high = median_ci(data, seed=1)
    assert low <= float(np.median(data)) <= high
    assert low < high
    assert median_ci(data, seed=1) == (low, high)


def test_median_ci_narrows_with_more_samples() -> None:
    rng = np.random.default_rng(5)
    few = median_ci(rng.normal(10, 1, size=50), resamples=500)
    many = median_ci(rng.normal(10, 1, size=2000), resamples=500)
    assert many[1] - many[0] < few[1] - few[0]


def test_long_rows_are_resampled_in_bounded_chunks() -> None:
    data = np.random.default_rng(0).normal(1.0, 0.05, size=20_000)
    low, high = median_ci(data, resamples=400)  # 400 x 20000 picks: two chunks
    assert low <= float(np.median(data)) <= high
