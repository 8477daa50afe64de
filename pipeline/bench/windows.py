"""The measurement policy (BENCHMARKING.md rules 1, 4 and 5), independent of any runtime.

Warm-up: discard the first call, then at least `warmup_iters` calls and `warmup_s` seconds.
Windows: each about `window_s` of calls (at least one); a row is done when the last `stable_windows` window
medians agree within `stable_within` (relative to the smallest) and it has at least `min_iters` calls and
`min_s` seconds, or when it hits `max_windows` or `max_s`, whichever comes first; a row stopped by a cap is
unstable and says so. Candidates of one shape are interleaved window by window (A B C A B C ...), so that
machine drift does not favour whoever ran first.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from pipeline.bench.timer import Sample

if TYPE_CHECKING:
    from pipeline.recipe import BenchmarkConfig

Workload = Callable[[], Sample | float]
Clock = Callable[[], float]
K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True)
class WindowPolicy:
    warmup_iters: int = 10
    warmup_s: float = 0.2
    window_s: float = 0.2
    stable_windows: int = 3
    stable_within: float = 0.05
    min_iters: int = 20
    min_s: float = 1.0
    max_windows: int = 10
    max_s: float = 15.0

    @classmethod
    def from_config(cls, bench: BenchmarkConfig) -> WindowPolicy:
        return cls(**{name: getattr(bench, name) for name in cls.__dataclass_fields__})

    def describe(self) -> dict[str, Any]:
        """The policy as recorded in speed.json's conditions."""
        return {
            "discard_first_call": True,
            "interleaved": True,
            "stability": "(max - min) / min of window medians",
            **asdict(self),
        }


@dataclass
class Measurement:
    """Everything one candidate measured at one shape; `samples` excludes warm-up."""

    samples: list[Sample] = field(default_factory=list)
    window_medians: list[float] = field(default_factory=list)
    elapsed_s: float = 0.0
    warmup_iters: int = 0
    warmup_s: float = 0.0
    stable: bool = False
    done: bool = False
    stop_reason: str = ""
    error: str | None = None  # the candidate raised: it is dropped, the others go on

    def ms(self) -> list[float]:
        return [s.ms for s in self.samples]

    def wall_ms(self) -> list[float]:
        return [s.wall_ms for s in self.samples]

    def window_spread(self, last: int) -> float | None:
        """(max - min) / min of the last `last` window medians: the agreement the policy checks."""
        tail = self.window_medians[-last:]
        if len(tail) < 2 or min(tail) <= 0:
            return None
        return (max(tail) - min(tail)) / min(tail)


def _call(workload: Workload) -> Sample:
    result = workload()
    return result if isinstance(result, Sample) else Sample(float(result), float(result))


def warm_up(
    workload: Workload, policy: WindowPolicy, measurement: Measurement, clock: Clock = time.perf_counter
) -> None:
    """Discard the first call (compilation, arena growth, autotuning), then warm up by count and time."""
    _call(workload)
    start, iters = clock(), 0
    while iters < policy.warmup_iters or clock() - start < policy.warmup_s:
        _call(workload)
        iters += 1
    measurement.warmup_iters = iters + 1
    measurement.warmup_s = clock() - start


def run_window(
    workload: Workload, policy: WindowPolicy, measurement: Measurement, clock: Clock = time.perf_counter
) -> None:
    """One window of about `window_s` (at least one call), then the stopping rule."""
    start, window = clock(), []
    while not window or clock() - start < policy.window_s:
        window.append(_call(workload))
    measurement.elapsed_s += clock() - start
    measurement.samples.extend(window)
    measurement.window_medians.append(float(np.median([s.ms for s in window])))
    _decide(policy, measurement)


def _decide(policy: WindowPolicy, m: Measurement) -> None:
    enough = len(m.samples) >= policy.min_iters and m.elapsed_s >= policy.min_s
    spread = m.window_spread(policy.stable_windows)
    agree = (
        len(m.window_medians) >= policy.stable_windows
        and spread is not None
        and spread <= policy.stable_within
    )
    if enough and agree:
        m.stable, m.done, m.stop_reason = True, True, "stable"
    elif len(m.window_medians) >= policy.max_windows:
        m.done, m.stop_reason = True, f"cap: {policy.max_windows} windows"
    elif m.elapsed_s >= policy.max_s:
        m.done, m.stop_reason = True, f"cap: {policy.max_s:g} s"


def measure_interleaved(
    workloads: dict[K, Workload],
    policy: WindowPolicy,
    clock: Clock = time.perf_counter,
    on_window: Callable[[K, Measurement], None] | None = None,
) -> dict[K, Measurement]:
    """Warm every candidate up, then run windows A B C A B C ... until each candidate is done."""
    results = {key: Measurement() for key in workloads}
    for key, workload in workloads.items():
        _guarded(results[key], warm_up, workload, policy, results[key], clock)
    while not all(m.done for m in results.values()):
        for key, workload in workloads.items():
            if results[key].done:
                continue
            _guarded(results[key], run_window, workload, policy, results[key], clock)
            if on_window is not None:
                on_window(key, results[key])
    return results


def _guarded(m: Measurement, step: Callable[..., None], *args: Any) -> None:
    """Run one step of a candidate; a failure ends that candidate only, with the error kept."""
    try:
        step(*args)
    except Exception as exc:  # a runtime error at this shape belongs to this candidate, not the benchmark
        m.done, m.stable, m.error = True, False, f"{type(exc).__name__}: {exc}"
        m.stop_reason = "error"


def measure(workload: Workload, policy: WindowPolicy, clock: Clock = time.perf_counter) -> Measurement:
    """A single candidate under the same policy."""
    return measure_interleaved({0: workload}, policy, clock)[0]
