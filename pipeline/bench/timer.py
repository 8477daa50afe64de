"""The one timer of the benchmark (docs/benchmarking.md rule 2).

CPU runners: time.perf_counter around a call that has returned its outputs (plus the runner's
synchronize, a no-op on the host). GPU runners: CUDA events recorded on the stream the runtime computes on,
after a synchronize, so that no unsynchronized GPU call is ever timed. Each sample also carries the wall
time of the same call, so that host-bound GPU rows (GPU time far below wall time) can be flagged (rule 8).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Protocol

from pipeline.core import host
from pipeline.runners import registry
from pipeline.runners.base import Runner


@dataclass(frozen=True)
class Sample:
    """One timed call: `ms` is what the statistics use; `wall_ms` is host wall time of the same call."""

    ms: float
    wall_ms: float


class Timer(Protocol):
    name: str

    def measure(self, runner: Runner) -> Sample: ...


class CpuTimer:
    """perf_counter around infer_prepared() + synchronize(): the call has returned its outputs."""

    name = "perf_counter"

    def measure(self, runner: Runner) -> Sample:
        start = time.perf_counter()
        runner.infer_prepared()
        runner.synchronize()
        elapsed = (time.perf_counter() - start) * 1e3
        return Sample(elapsed, elapsed)


class CudaEventTimer:
    """CUDA events on the runner's stream (`runner.cuda_stream`: a torch stream or a raw handle), else on
    torch's current stream; the runner is synchronized before the start event and after the end event.

    A runtime that computes on a stream it does not expose is still bracketed correctly: its
    synchronize() runs before the end event is waited on, so the event pair cannot end early; the
    figure then includes that synchronize, and the timer's name says so.
    """

    def __init__(self, runner: Runner):
        import torch

        self._torch = torch
        self.stream = _torch_stream(getattr(runner, "cuda_stream", None))
        self.name = "cuda_events" if self.stream is not None else "cuda_events(current stream, synchronized)"
        self._start = torch.cuda.Event(enable_timing=True)
        self._end = torch.cuda.Event(enable_timing=True)

    def measure(self, runner: Runner) -> Sample:
        stream = self.stream or self._torch.cuda.current_stream()
        runner.synchronize()
        self._torch.cuda.synchronize()
        wall_start = time.perf_counter()
        self._start.record(stream)
        runner.infer_prepared()
        if self.stream is None:
            runner.synchronize()
        self._end.record(stream)
        self._end.synchronize()
        runner.synchronize()
        wall = (time.perf_counter() - wall_start) * 1e3
        return Sample(self._start.elapsed_time(self._end), wall)


def on_gpu(runner: Runner) -> bool:
    """Whether the runtime computes on a CUDA device (its numbers then come from CUDA events)."""
    return runner.io == "device" or registry.on_gpu(runner.runtime)


def timer_for(runner: Runner) -> Timer:
    """The timer every candidate of this kind gets: one rule for all artifacts, decided by the device."""
    if on_gpu(runner) and _cuda_events_available():
        return CudaEventTimer(runner)
    return CpuTimer()  # on a GPU runtime without torch CUDA: wall time around a synchronized call


def _cuda_events_available() -> bool:
    return host.has_cuda()


def _torch_stream(stream: Any) -> Any:
    if stream is None:
        return None
    import torch

    if isinstance(stream, torch.cuda.Stream):
        return stream
    return torch.cuda.ExternalStream(int(stream))
