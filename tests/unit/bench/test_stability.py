"""Slow calls, the true reason for an unstable row, and measuring again: the window policy on a fake clock.
These tests check what the policy decides, never how fast anything is."""

from __future__ import annotations

import math

import pytest

from pipeline.bench.windows import (
    Measurement,
    WindowPolicy,
    measure,
    measure_interleaved,
    measure_more,
    sizing,
)
from tests.unit.bench.fakes import FakeClock, Workload

DEFAULT = WindowPolicy()  # window_s 0.2, stable_windows 3, within 5 %, min_iters 20, min_s 1, caps 10 / 15 s
# One call per window for the slow fakes below: min_iters 3 over 3 stable windows.
ONE_CALL = WindowPolicy(warmup_iters=2, warmup_s=0.01, window_s=0.2, min_iters=3, max_windows=10, max_s=100)


def test_a_250_ms_call_reaches_stable_under_the_default_policy() -> None:
    clock = FakeClock()
    m = measure(Workload(clock, lambda i: 250.0 * (1 + 0.02 * math.sin(i))), DEFAULT, clock)
    assert m.stable and m.stop_reason == "stable" and m.unstable_reason is None
    # ceil(20 / 3) = 7 calls per window: three agreeing windows hold 21 calls
    assert m.window_sizes == [7, 7, 7] and len(m.samples) == 21
    fields = m.row_fields()
    assert fields["min_iters_effective"] == 20 and fields["window_min_calls"] == 7
    assert fields["warmup_call_ms"] == pytest.approx(250.0, rel=0.03)
    assert fields["remeasured"] is False and fields["windows_remeasured"] == 0


def test_fast_calls_fill_windows_by_time_as_before() -> None:
    clock = FakeClock()
    m = measure(Workload(clock, lambda i: 15.625), DEFAULT, clock)
    assert m.stable and m.sizing.min_iters == 20
    # 0.2 s of 15.625 ms calls is 13 calls (> 7): the window size is the policy's, and min_s needs 5 windows
    assert m.window_sizes == [13] * 5


def test_a_4_s_call_keeps_a_minimum_that_fits_the_time_cap() -> None:
    assert sizing(DEFAULT, 4.0).min_iters == 3  # 15 s / 2 allows 1 call; never fewer than stable_windows
    assert sizing(DEFAULT, 1.0).min_iters == 7 and sizing(DEFAULT, 1.0).window_min_calls == 3
    clock = FakeClock()
    steady = measure(Workload(clock, lambda i: 4000.0), DEFAULT, clock)
    assert steady.stable and steady.window_sizes == [1, 1, 1]
    clock = FakeClock()
    noisy = measure(Workload(clock, lambda i: 4000.0 if i % 2 else 4400.0), DEFAULT, clock)
    assert not noisy.stable and noisy.stop_reason == "cap: 15 s"
    assert noisy.unstable_reason == (
        "hit the 15 s cap after 4 windows: window medians spread 10.0% over the last 3 windows (limit 5%)"
    )


def test_a_noisy_candidate_says_its_window_medians_disagree() -> None:
    clock = FakeClock()
    m = measure(Workload(clock, lambda i: 600.0 if i % 2 else 500.0), ONE_CALL, clock)
    assert not m.stable and m.stop_reason == "cap: 10 windows"
    assert m.unstable_reason == (
        "hit the 10-window cap: window medians spread 20.0% over the last 3 windows (limit 5%)"
    )


def test_every_rule_not_met_is_named() -> None:
    clock = FakeClock()
    policy = WindowPolicy(warmup_iters=2, warmup_s=0.01, window_s=0.25, min_iters=40, max_windows=2)
    m = measure(Workload(clock, lambda i: 15.625), policy, clock)
    assert not m.stable and m.window_sizes == [16, 16]
    assert m.unstable_reason == (
        "hit the 2-window cap: only 2 windows (needs 3 that agree); only 32 calls in 2 windows (needs 40); "
        "only 0.5 s measured (needs 1 s)"
    )


def _noisy_then_steady(clock: FakeClock, noisy: list[bool]) -> Workload:
    return Workload(clock, lambda i: (600.0 if i % 2 else 500.0) if noisy[0] else 500.0, "A")


def test_measure_more_keeps_earlier_windows_and_can_turn_a_row_stable() -> None:
    clock, noisy, order = FakeClock(), [True], []
    work = {"A": _noisy_then_steady(clock, noisy), "B": Workload(clock, lambda i: 500.0, "B")}
    first = measure_interleaved(work, ONE_CALL, clock)
    assert not first["A"].stable and first["B"].stable
    before = list(first["A"].window_medians)
    warm_before = first["A"].warmup_iters

    noisy[0] = False  # whatever disturbed A is gone
    again = measure_more(
        work, first, ONE_CALL, extra_windows=10, clock=clock, on_window=lambda k, m: order.append(k)
    )
    a, b = again["A"], again["B"]
    assert a is first["A"] and a.window_medians[:10] == before  # the first run's windows are kept
    assert a.stable and a.unstable_reason is None
    # the first run ended on a 500 ms window: two new 500 ms windows make the last three agree
    assert before[-1] == 500.0 and a.window_medians[10:] == [500.0, 500.0]
    assert a.window_sizes == [1] * 12 and len(a.samples) == 12
    assert a.warmup_iters > warm_before  # warmed up again before the new windows
    fields = a.row_fields()
    assert fields["remeasured"] is True and fields["windows_remeasured"] == 2
    assert fields["max_windows_effective"] == 20
    assert b.stable and b.row_fields()["windows_remeasured"] == 1  # the rival ran interleaved with A
    assert order == ["A", "B", "A"]


def test_measure_more_of_a_candidate_that_stays_noisy_reports_the_extended_cap() -> None:
    clock = FakeClock()
    work = {"A": _noisy_then_steady(clock, [True])}
    first = measure_interleaved(work, ONE_CALL, clock)
    again = measure_more(work, first, ONE_CALL, extra_windows=5, clock=clock, warm_up_first=False)
    m = again["A"]
    assert not m.stable and len(m.window_medians) == 15 and m.stop_reason == "cap: 15 windows"
    assert m.unstable_reason.startswith("hit the 15-window cap: window medians spread 20.0%")


def test_measure_more_leaves_failed_candidates_and_refuses_unknown_ones() -> None:
    clock = FakeClock()
    failed = Measurement(done=True, error="RuntimeError: boom", stop_reason="error")
    work = {"bad": Workload(clock, lambda i: 500.0)}
    assert measure_more(work, {"bad": failed}, ONE_CALL, clock=clock)["bad"].window_medians == []
    with pytest.raises(ValueError, match="no earlier measurement"):
        measure_more({"new": Workload(clock, lambda i: 1.0)}, {}, ONE_CALL, clock=clock)
