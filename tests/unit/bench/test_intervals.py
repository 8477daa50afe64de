"""Confidence intervals that reflect window-to-window variation: a block bootstrap over whole windows for
p50, p90, p99 and mean, on synthetic samples with known structure (no timing involved)."""

from __future__ import annotations

from statistics import NormalDist

import numpy as np
import pytest

from pipeline.bench.stats import (
    BLOCK,
    IID,
    bootstrap_intervals,
    latency_stats,
    resampled_statistics,
    small_sample_factor,
    t_two_sided,
)


def test_resampled_statistics_equal_numpy_on_the_concatenated_resample() -> None:
    rng = np.random.default_rng(7)
    windows = [rng.lognormal(0, 0.4, size=int(n)).round(1) for n in rng.integers(1, 60, size=6)]  # ties too
    counts = rng.multinomial(6, [1 / 6] * 6, size=40)
    fast = resampled_statistics(windows, counts)
    for r, row in enumerate(counts):
        concatenated = np.concatenate(
            [w for w, times in zip(windows, row, strict=True) for _ in range(times)]
        )
        p50, p90, p99 = np.percentile(concatenated, [50, 90, 99])
        assert (fast["p50"][r], fast["p90"][r], fast["p99"][r]) == pytest.approx((p50, p90, p99))
        assert fast["mean"][r] == pytest.approx(concatenated.mean())


def test_block_intervals_are_wider_than_iid_when_window_medians_shift() -> None:
    rng = np.random.default_rng(1)
    shifts = [0.0, 0.6, -0.4, 0.3, -0.5, 0.5, -0.2, 0.1]  # the machine's state moves between windows
    data = np.concatenate([rng.normal(10 + s, 0.1, size=200) for s in shifts])
    block, method = bootstrap_intervals(data, [200] * len(shifts))
    iid, iid_method = bootstrap_intervals(data)
    assert (method, iid_method) == (BLOCK, IID)
    for name in ("p50", "p90", "p99", "mean"):
        assert block[name][1] - block[name][0] > 3 * (iid[name][1] - iid[name][0]), name


def test_block_intervals_contain_the_true_statistic_of_steady_data() -> None:
    """Coverage over 40 steady rows (5 windows of 200 lognormal calls): the 95 % intervals must contain the
    distribution's true value in most of them (p99 from 1000 calls is itself uncertain: a lower bar)."""
    mu, sigma, z = np.log(10.0), 0.2, NormalDist().inv_cdf
    truth = {
        "p50": np.exp(mu),
        "p90": np.exp(mu + sigma * z(0.90)),
        "p99": np.exp(mu + sigma * z(0.99)),
        "mean": np.exp(mu + sigma**2 / 2),
    }
    covered = dict.fromkeys(truth, 0)
    for seed in range(40):
        data = np.random.default_rng(seed).lognormal(mu, sigma, size=1000)
        intervals, _ = bootstrap_intervals(data, [200] * 5, resamples=1000, seed=seed)
        for name, value in truth.items():
            covered[name] += intervals[name][0] <= value <= intervals[name][1]
    assert covered["p50"] >= 34 and covered["p90"] >= 34 and covered["mean"] >= 34, covered
    assert covered["p99"] >= 30, covered


def test_the_p99_interval_comes_from_p99() -> None:
    rng = np.random.default_rng(2)
    body = [rng.normal(10, 0.2, size=300) for _ in range(6)]
    tails = [np.concatenate([w[:-6], rng.normal(30 + 2 * j, 1.0, size=6)]) for j, w in enumerate(body)]
    stats = latency_stats(np.concatenate(tails), window_sizes=[300] * 6)
    low, high = stats["ci95_ms"]["p99"]
    assert low <= stats["p99_ms"] <= high and low > stats["ci95_ms"]["p50"][1] + 10
    # a different tail moves the p99 interval and leaves the p50 one alone
    calmer = [np.concatenate([w[:-6], rng.normal(15, 0.5, size=6)]) for w in body]
    other = latency_stats(np.concatenate(calmer), window_sizes=[300] * 6)
    assert other["ci95_ms"]["p99"][1] < low
    assert other["ci95_ms"]["p50"] == pytest.approx(stats["ci95_ms"]["p50"], rel=0.01)


def test_rows_carry_all_intervals_and_the_contract_key() -> None:
    data = np.random.default_rng(4).lognormal(1.0, 0.3, size=600)
    stats = latency_stats(data, window_sizes=[100] * 6, seed=3)
    assert set(stats["ci95_ms"]) == {"p50", "p90", "p99", "mean"} and stats["ci_method"] == BLOCK
    assert stats["p50_ci95_ms"] == stats["ci95_ms"]["p50"]
    for name, key in (("p50", "p50_ms"), ("p90", "p90_ms"), ("p99", "p99_ms"), ("mean", "mean_ms")):
        low, high = stats["ci95_ms"][name]
        assert low <= stats[key] <= high
    assert latency_stats(data, window_sizes=[100] * 6, seed=3) == stats  # seeded: reports re-render alike
    assert latency_stats(data, window_sizes=[600])["ci_method"] == IID  # one window: calls are all there is
    assert latency_stats(data)["ci_method"] == IID
    with pytest.raises(ValueError, match="add up to 500"):
        latency_stats(data, window_sizes=[250, 250])


def test_small_sample_widening_uses_students_t() -> None:
    # two-sided 95 % t values from any table
    for df, value in ((1, 12.706), (2, 4.303), (4, 2.776), (9, 2.262), (30, 2.042)):
        assert t_two_sided(0.95, df) == pytest.approx(value, abs=1e-3)
    assert small_sample_factor(10) == pytest.approx((10 / 9) ** 0.5 * 2.262 / 1.960, rel=1e-3)
    assert small_sample_factor(1000) == pytest.approx(1.0, abs=0.01)


def test_a_latency_interval_stays_within_the_calls_measured() -> None:
    """Two windows far apart widen by t(1) = 12.7: the p99 interval reached [-93.9–678] ms, and a p50 interval
    once reached 162 ms where no call took more than 63: the widening stops at the fastest and slowest call."""
    samples = [1.0] * 20 + [5.0, 6.0, 300.0, 600.0] * 5
    intervals, method = bootstrap_intervals(samples, window_sizes=[20, 20])
    assert method == "block-bootstrap"
    assert all(1.0 <= low <= high <= 600.0 for low, high in intervals.values()), intervals
    fast, slow = [0.16] * 30, [0.16] * 10 + [17.0] * 15 + [63.0] * 5
    intervals, _ = bootstrap_intervals(fast + slow, window_sizes=[30, 30])
    low, high = intervals["p50"]
    assert 0.16 <= low <= high <= 63.0, intervals
