"""A fake clock and workloads that 'take' a chosen latency of it: the window policy decides on them exactly as
on real calls, and nothing real is ever timed."""

from __future__ import annotations

from collections.abc import Callable

from pipeline.bench.timer import Sample


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Workload:
    """Each call 'takes' latency(i) milliseconds of the fake clock; all calls are logged."""

    def __init__(
        self, clock: FakeClock, latency: Callable[[int], float], name: str = "w", log: list | None = None
    ):
        self.clock, self.latency, self.name = clock, latency, name
        self.calls = 0
        self.log = log if log is not None else []

    def __call__(self) -> Sample:
        ms = self.latency(self.calls)
        self.calls += 1
        self.clock.now += ms / 1000.0
        self.log.append(self.name)
        return Sample(ms, ms)
