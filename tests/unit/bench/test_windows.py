"""The measurement policy, driven by deterministic fake workloads on a fake clock: these tests check what
the policy decides (when it stops, what it discards, how it interleaves), never how fast anything is."""

from __future__ import annotations

import pytest

from pipeline.bench.windows import Measurement, WindowPolicy, measure, measure_interleaved, measure_more
from tests.unit.bench.fakes import FakeClock, Workload

# Binary-exact numbers (1/64 s calls, 1/4 s windows) keep window boundaries exact.
POLICY = WindowPolicy(
    warmup_iters=10,
    warmup_s=0.25,
    window_s=0.25,
    stable_windows=3,
    stable_within=0.05,
    min_iters=20,
    min_s=1.0,
    max_windows=10,
    max_s=15.0,
)
CALL_MS = 15.625


def test_policy_comes_from_the_recipe() -> None:
    from pipeline.recipe import BenchmarkConfig

    policy = WindowPolicy.from_config(BenchmarkConfig(window_s=0.5, max_windows=4))
    assert policy.window_s == 0.5 and policy.max_windows == 4 and policy.warmup_iters == 10
    assert policy.describe()["discard_first_call"] is True


def test_warm_up_discards_the_first_call_then_meets_count_and_time() -> None:
    clock = FakeClock()
    work = Workload(clock, lambda i: 1000.0 if i == 0 else CALL_MS)
    m = measure(work, POLICY, clock)
    # first call (1 s, "compilation") + 16 calls to reach 0.25 s (>= 10 calls)
    assert m.warmup_iters == 17
    assert m.warmup_s == pytest.approx(0.25)
    assert len(m.samples) == work.calls - m.warmup_iters
    assert 1000.0 not in m.ms()


def test_warm_up_needs_the_iteration_count_even_when_time_is_spent() -> None:
    clock = FakeClock()
    work = Workload(clock, lambda i: 500.0)
    m = measure(work, WindowPolicy(warmup_iters=10, warmup_s=0.2, max_windows=1), clock)
    assert m.warmup_iters == 11


def test_stops_as_soon_as_windows_agree_and_minimums_are_met() -> None:
    clock = FakeClock()
    m = measure(Workload(clock, lambda i: CALL_MS), POLICY, clock)
    assert m.stable and m.done and m.stop_reason == "stable"
    assert len(m.window_medians) == 4  # 3 agreeing windows exist after 0.75 s; min_s = 1 s needs a 4th
    assert len(m.samples) == 64 and m.elapsed_s == pytest.approx(1.0)


def test_calls_longer_than_a_window_fill_windows_so_that_min_iters_is_met_when_windows_agree() -> None:
    clock = FakeClock()
    policy = WindowPolicy(
        warmup_iters=1, warmup_s=0.01, window_s=0.2, min_iters=5, min_s=1.0, max_windows=50, max_s=100
    )
    m = measure(Workload(clock, lambda i: 500.0), policy, clock)
    assert m.stable
    # ceil(5 / 3) = 2 calls per window: after the 3 windows that agree, 6 calls >= min_iters
    assert m.window_sizes == [2, 2, 2] and len(m.samples) == 6


def test_drifting_workload_caps_at_max_windows_and_is_flagged() -> None:
    clock = FakeClock()
    m = measure(Workload(clock, lambda i: CALL_MS * (1 + 0.02 * i)), POLICY, clock)
    assert not m.stable and m.done
    assert len(m.window_medians) == POLICY.max_windows
    assert m.stop_reason.startswith("cap") and "windows" in m.stop_reason
    assert m.window_spread(POLICY.stable_windows) > POLICY.stable_within


def test_windows_that_agree_after_a_change_of_level_are_not_stable() -> None:
    """A hold-out's TorchScript calls took 1.7 ms, then 164 ms from the second window on (another process took
    the CPU): the last three windows agreed, and the row was called stable with a p50 of neither level."""
    clock = FakeClock()
    warmup_calls = 26  # the first call, then 10 calls and 0.25 s of warm-up at 10 ms
    m = measure(Workload(clock, lambda i: 10.0 if i < warmup_calls + 25 else 160.0), POLICY, clock)
    assert not m.stable and m.done
    assert m.window_spread(POLICY.stable_windows) <= POLICY.stable_within  # the last windows do agree
    assert "window medians changed level during the run (10 ms before, 160 ms in the last 3 windows)" in (
        m.unstable_reason or ""
    )
    again = measure_more({"w": _slow(clock)}, {"w": m}, POLICY, clock=clock)
    assert again["w"].stable and again["w"].windows_before_remeasure == 0  # started anew: one level now
    assert set(again["w"].window_medians) == {160.0}
    clock = FakeClock()  # a drift within the limit is not a change of level
    m = measure(Workload(clock, lambda i: 10.0 if i < warmup_calls + 25 else 12.0), POLICY, clock)
    assert m.stable


def _slow(clock: FakeClock) -> Workload:
    return Workload(clock, lambda i: 160.0)


def test_time_cap_stops_before_the_window_cap() -> None:
    clock = FakeClock()
    policy = WindowPolicy(warmup_iters=1, warmup_s=0.01, window_s=0.25, max_windows=100, max_s=2.0)
    m = measure(Workload(clock, lambda i: CALL_MS * (1 + 0.05 * i)), policy, clock)
    assert not m.stable
    assert m.stop_reason == "cap: 2 s"
    assert len(m.window_medians) < 100 and m.elapsed_s >= 2.0


def test_candidates_are_interleaved_window_by_window() -> None:
    clock, log, order = FakeClock(), [], []
    steady = Workload(clock, lambda i: CALL_MS, "A", log)
    drifting = Workload(clock, lambda i: CALL_MS * (1 + 0.02 * i), "B", log)
    other = Workload(clock, lambda i: CALL_MS, "C", log)

    def on_window(key: str, m: Measurement) -> None:
        order.append(key)

    results = measure_interleaved({"A": steady, "B": drifting, "C": other}, POLICY, clock, on_window)
    assert order[:6] == ["A", "B", "C", "A", "B", "C"]
    assert results["A"].stable and results["C"].stable and not results["B"].stable
    # once A and C are done, B alone finishes its windows
    assert order[12:] == ["B"] * (POLICY.max_windows - 4)
    # every candidate is warmed up before any window runs
    warm = [results[k].warmup_iters for k in "ABC"]
    assert log[: sum(warm)] == ["A"] * warm[0] + ["B"] * warm[1] + ["C"] * warm[2]


def test_a_failing_candidate_is_dropped_and_the_others_finish() -> None:
    clock = FakeClock()

    def broken(i: int) -> float:
        if i > 30:
            raise RuntimeError("out of memory at this shape")
        return CALL_MS

    results = measure_interleaved(
        {"ok": Workload(clock, lambda i: CALL_MS), "bad": Workload(clock, broken)}, POLICY, clock
    )
    assert results["ok"].stable and results["ok"].error is None
    assert results["bad"].error == "RuntimeError: out of memory at this shape"
    assert not results["bad"].stable


def test_plain_float_workloads_are_accepted() -> None:
    clock = FakeClock()

    def work() -> float:
        clock.now += CALL_MS / 1000
        return CALL_MS

    m = measure(work, POLICY, clock)
    assert m.stable and m.wall_ms() == m.ms()
