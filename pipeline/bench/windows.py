"""The measurement policy (docs/benchmarking.md rules 1, 4 and 5), independent of any runtime.

Warm-up: discard the first call, then at least `warmup_iters` calls and `warmup_s` seconds.
Windows: each about `window_s` of calls (at least one; for slow calls see below); a row is done when the
last `stable_windows` window medians agree within `stable_within` (relative to the smallest), no earlier window
median is LEVEL_SHIFT times off theirs, and it has at least `min_iters` calls and `min_s` seconds, or when it
hits `max_windows` or `max_s`, whichever comes first; a row stopped by a cap is unstable and says so. Candidates of one shape are interleaved window by window
(A B C A B C ...), so that machine drift does not favour whoever ran first.

Slow calls: the windows are sized from the median wall time of one warm-up call (`call_s`), so that a
candidate whose call is longer than a window can still reach `stable`:
- `min_iters` is lowered to the calls that fit in half of `max_s` (the other half leaves room for windows that
  do not agree yet), never below `stable_windows` and never above the policy's `min_iters`;
- a window holds at least ceil(min_iters / stable_windows) calls (and lasts at least `window_s`), so that the
  minimum number of calls is met by the time the first `stable_windows` windows can be compared.
With the default policy a 250 ms call gets 7-call windows (stable after 3 windows, 21 calls, 5.25 s) and a 4 s
call keeps min_iters 3 with 1-call windows (stable after 3 calls in 12 s if they agree; otherwise the 15 s cap
stops it after the 4th). Calls shorter than window_s / ceil(min_iters / stable_windows) (about 28 ms by
default) fill that many calls in a window anyway: for them nothing changes. Every row records what was used.

A row that stops unstable says why (`unstable_reason`): the cap that stopped it and each rule not met.
`measure_more` continues existing measurements under extended caps, keeping their earlier windows.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Hashable
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from pipeline.bench.timer import Sample

if TYPE_CHECKING:
    from pipeline.recipe import BenchmarkConfig

Workload = Callable[[], Sample | float]
Clock = Callable[[], float]
K = TypeVar("K", bound=Hashable)


# An earlier window median this many times off the agreeing last windows': not warm-up drift (the warm-up is
# done before the first window) but a change of the host under the measurement, such as another process
# taking the CPU, after which the row's statistics mix two levels and describe neither.
LEVEL_SHIFT = 3.0


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
            "stability": "(max - min) / min of the last stable_windows window medians, and no earlier median "
            f"more than {LEVEL_SHIFT:g} times off theirs (else the level changed; a row measured again after "
            "that starts anew)",
            "slow_calls": "windows hold >= ceil(min_iters / stable_windows) calls; min_iters is lowered "
            "to the calls that fit in max_s / 2 (never below stable_windows)",
            "intervals": "95 % block bootstrap over whole windows, widened by sqrt(k / (k - 1)) * t(k - 1) "
            "/ z for k windows (iid over calls with a single window)",
            **asdict(self),
        }


@dataclass(frozen=True)
class Sizing:
    """What one candidate's windows effectively use (module docstring, "Slow calls")."""

    call_s: float | None  # median wall time of one warm-up call; None: not warmed up
    min_iters: int
    window_min_calls: int
    max_windows: int
    max_s: float


def sizing(policy: WindowPolicy, call_s: float | None) -> Sizing:
    """The effective minimum calls and window size for a candidate whose calls take `call_s` seconds."""
    min_iters = policy.min_iters
    if call_s is not None and call_s > 0:
        affordable = max(policy.stable_windows, math.floor(policy.max_s / (2.0 * call_s)))
        min_iters = min(policy.min_iters, affordable)
    return Sizing(
        call_s=call_s,
        min_iters=min_iters,
        window_min_calls=max(1, math.ceil(min_iters / policy.stable_windows)),
        max_windows=policy.max_windows,
        max_s=policy.max_s,
    )


@dataclass
class Measurement:
    """Everything one candidate measured at one shape; `samples` excludes warm-up."""

    samples: list[Sample] = field(default_factory=list)
    window_medians: list[float] = field(default_factory=list)
    window_sizes: list[int] = field(default_factory=list)  # calls per window, in order (block bootstrap)
    elapsed_s: float = 0.0
    warmup_iters: int = 0
    warmup_s: float = 0.0
    stable: bool = False
    done: bool = False
    stop_reason: str = ""
    unstable_reason: str | None = None  # why a finished row is not stable: the cap and each rule not met
    sizing: Sizing | None = None  # set by the first warm-up
    windows_before_remeasure: int | None = None  # set by measure_more: the windows of the first run
    error: str | None = None  # the candidate raised: it is dropped, the others go on

    def ms(self) -> list[float]:
        return [s.ms for s in self.samples]

    def wall_ms(self) -> list[float]:
        return [s.wall_ms for s in self.samples]

    def wall_p50_ms(self) -> float:
        """The median host wall time of a call (a GPU row's flag; a throughput run's segment size)."""
        return float(np.median(self.wall_ms()))

    def level_shift(self, last: int) -> tuple[float, float] | None:
        """(an earlier window's median, the last `last` windows' median) where the earlier one is more than
        LEVEL_SHIFT times off: the last windows agree, but not with what came before them."""
        tail, earlier = self.window_medians[-last:], self.window_medians[:-last]
        level = float(np.median(tail)) if tail else 0.0
        if not earlier or not level > 0 or not all(v > 0 for v in earlier):  # 0 ms: the spread rule says so
            return None
        worst = max(earlier, key=lambda v: max(v / level, level / v))
        return (worst, level) if max(worst / level, level / worst) > LEVEL_SHIFT else None

    def window_spread(self, last: int) -> float | None:
        """(max - min) / min of the last `last` window medians: the agreement the policy checks."""
        tail = self.window_medians[-last:]
        if len(tail) < 2 or min(tail) <= 0:
            return None
        return (max(tail) - min(tail)) / min(tail)

    def row_fields(self) -> dict[str, Any]:
        """What speed.json records beside the statistics: the true reason for instability, the effective
        sizing, and whether the row was measured again."""
        s = self.sizing
        before = self.windows_before_remeasure
        return {
            "unstable_reason": self.unstable_reason,
            "window_sizes": list(self.window_sizes),
            "warmup_call_ms": s.call_s * 1e3 if s and s.call_s is not None else None,
            "min_iters_effective": s.min_iters if s else None,
            "window_min_calls": s.window_min_calls if s else None,
            "max_windows_effective": s.max_windows if s else None,
            "max_s_effective": s.max_s if s else None,
            "remeasured": before is not None,
            "windows_remeasured": len(self.window_medians) - before if before is not None else 0,
        }


def _call(workload: Workload) -> Sample:
    result = workload()
    return result if isinstance(result, Sample) else Sample(float(result), float(result))


def warm_up(
    workload: Workload, policy: WindowPolicy, measurement: Measurement, clock: Clock = time.perf_counter
) -> None:
    """Discard the first call (compilation, arena growth, autotuning), then warm up by count and time; the
    median warm-up call sizes the windows (first warm-up only: a re-measured row keeps its sizing)."""
    _call(workload)
    start = last = clock()
    durations: list[float] = []
    while len(durations) < policy.warmup_iters or last - start < policy.warmup_s:
        _call(workload)
        now = clock()
        durations.append(now - last)
        last = now
    measurement.warmup_iters += len(durations) + 1
    measurement.warmup_s += last - start
    if measurement.sizing is None:
        measurement.sizing = sizing(policy, float(np.median(durations)) if durations else None)


def run_window(
    workload: Workload, policy: WindowPolicy, measurement: Measurement, clock: Clock = time.perf_counter
) -> None:
    """One window of about `window_s` and at least `window_min_calls` calls, then the stopping rule."""
    if measurement.sizing is None:
        measurement.sizing = sizing(policy, None)
    start, window = clock(), []
    while len(window) < measurement.sizing.window_min_calls or clock() - start < policy.window_s:
        window.append(_call(workload))
    measurement.elapsed_s += clock() - start
    measurement.samples.extend(window)
    measurement.window_sizes.append(len(window))
    measurement.window_medians.append(float(np.median([s.ms for s in window])))
    _decide(policy, measurement)


def _decide(policy: WindowPolicy, m: Measurement) -> None:
    size = m.sizing or sizing(policy, None)
    unmet = _unmet(policy, size, m)
    windows = len(m.window_medians)
    if not unmet:
        m.stable, m.done, m.stop_reason = True, True, "stable"
        return
    if windows >= size.max_windows:
        m.done, m.stop_reason = True, f"cap: {size.max_windows} windows"
        m.unstable_reason = f"hit the {size.max_windows}-window cap: " + "; ".join(unmet)
    elif m.elapsed_s >= size.max_s:
        m.done, m.stop_reason = True, f"cap: {_seconds(size.max_s)} s"
        m.unstable_reason = f"hit the {_seconds(size.max_s)} s cap after {windows} windows: " + "; ".join(
            unmet
        )


def _unmet(policy: WindowPolicy, size: Sizing, m: Measurement) -> list[str]:
    """Each stopping rule the measurement does not meet yet, as a reader would want it said."""
    unmet, windows = [], len(m.window_medians)
    spread = m.window_spread(policy.stable_windows)
    if windows < policy.stable_windows:
        unmet.append(f"only {windows} windows (needs {policy.stable_windows} that agree)")
    elif spread is None:
        unmet.append("window medians cannot be compared (a median of 0 ms)")
    elif spread > policy.stable_within:
        unmet.append(
            f"window medians spread {spread * 100:.1f}% over the last {policy.stable_windows} windows "
            f"(limit {policy.stable_within * 100:g}%)"
        )
    shift = m.level_shift(policy.stable_windows)
    if shift is not None:
        unmet.append(
            f"window medians changed level during the run ({shift[0]:.3g} ms before, {shift[1]:.3g} ms in the "
            f"last {policy.stable_windows} windows): the host's load changed under the measurement"
        )
    if len(m.samples) < size.min_iters:
        unmet.append(f"only {len(m.samples)} calls in {windows} windows (needs {size.min_iters})")
    if m.elapsed_s < policy.min_s:
        unmet.append(f"only {_seconds(m.elapsed_s)} s measured (needs {_seconds(policy.min_s)} s)")
    return unmet


def _seconds(value: float) -> str:
    """15.0 -> "15", 27.3125 -> "27.312": a cap extended by measure_more is not a round number."""
    return f"{value:.3f}".rstrip("0").rstrip(".")


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
    _interleave(workloads, results, policy, clock, on_window)
    return results


def measure_more(
    workloads: dict[K, Workload],
    measurements: dict[K, Measurement],
    policy: WindowPolicy,
    extra_windows: int | None = None,
    extra_s: float | None = None,
    clock: Clock = time.perf_counter,
    on_window: Callable[[K, Measurement], None] | None = None,
    warm_up_first: bool = True,
) -> dict[K, Measurement]:
    """Measure the candidates of `workloads` again, interleaved, continuing their existing Measurements:
    earlier windows are kept (except where they changed level, `level_shift`: then the row starts anew), the
    caps grow by `extra_windows` windows and `extra_s` seconds (default: the policy's caps) beyond what each
    has measured, and the stopping rule then runs after every new window
    (every candidate gets at least one). Pass an unstable candidate together with its rivals, so that the
    new windows are interleaved with theirs. Warm-up runs again unless `warm_up_first` is False (runners
    still warm from the first run); a candidate that failed before is left as it is.
    """
    missing = [key for key in workloads if key not in measurements]
    if missing:
        raise ValueError(f"no earlier measurement for {missing}")
    if extra_windows is not None and extra_windows < 1:
        raise ValueError(f"extra_windows must be at least 1 (got {extra_windows})")
    active = {key: w for key, w in workloads.items() if measurements[key].error is None}
    for key in active:
        m = measurements[key]
        if m.level_shift(policy.stable_windows) is not None:  # two levels: its statistics describe neither
            m.samples, m.window_medians, m.window_sizes, m.elapsed_s = [], [], [], 0.0
            m.windows_before_remeasure = 0
        size = m.sizing or sizing(policy, None)
        m.sizing = replace(
            size,
            max_windows=len(m.window_medians) + (extra_windows or policy.max_windows),
            max_s=m.elapsed_s + (extra_s if extra_s is not None else policy.max_s),
        )
        if m.windows_before_remeasure is None:
            m.windows_before_remeasure = len(m.window_medians)
        m.done, m.stable, m.stop_reason, m.unstable_reason = False, False, "", None
    if warm_up_first:
        for key, workload in active.items():
            _guarded(measurements[key], warm_up, workload, policy, measurements[key], clock)
    _interleave(active, measurements, policy, clock, on_window)
    return {key: measurements[key] for key in workloads}


def _interleave(
    workloads: dict[K, Workload],
    results: dict[K, Measurement],
    policy: WindowPolicy,
    clock: Clock,
    on_window: Callable[[K, Measurement], None] | None,
) -> None:
    """Windows A B C A B C ... until every candidate of `workloads` is done."""
    while not all(results[key].done for key in workloads):
        for key, workload in workloads.items():
            if results[key].done:
                continue
            _guarded(results[key], run_window, workload, policy, results[key], clock)
            if on_window is not None:
                on_window(key, results[key])


def _guarded(m: Measurement, step: Callable[..., None], *args: Any) -> None:
    """Run one step of a candidate; a failure ends that candidate only, with the error kept."""
    try:
        step(*args)
    except Exception as exc:  # a runtime error at this shape belongs to this candidate, not the benchmark
        m.done, m.stable, m.error = True, False, f"{type(exc).__name__}: {exc}"
        m.stop_reason, m.unstable_reason = "error", f"failed: {m.error}"


def measure(workload: Workload, policy: WindowPolicy, clock: Clock = time.perf_counter) -> Measurement:
    """A single candidate under the same policy."""
    return measure_interleaved({0: workload}, policy, clock)[0]
