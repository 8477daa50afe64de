"""Peak device memory and throughput of a GPU candidate (docs/benchmarking.md rules 6 and 10).

Memory: each candidate is probed over its own activation, staging and first call (when runtimes allocate
their weights, arenas and workspaces). Two readings, because no single one sees every runtime: PyTorch's
allocator peak (exact for torch runtimes, blind to ONNX Runtime's own arena) and the device's used-memory
delta from cudaMemGetInfo (sees everything this process allocates, but not what torch serves from memory it
had cached already). `bytes` is the larger of the two.

Throughput: requests submitted back to back on the runtime's stream, synchronized only at the end of each of
SEGMENTS segments, so that the host prepares request n+1 while the GPU runs request n where the runtime allows
it (runtimes that synchronize inside a call serialize, which the figure then shows). A segment holds as many
requests as the row's median call (wall time, from its latency windows) fits in its share of the run: counted
by the host's clock instead, an asynchronous runtime queued requests faster than the GPU ran them and the
closing synchronize waited for the queue (a 0.3 s run took 1.3 s at batch 256 on the H200). Sequences/s = batch x
requests / seconds over the whole run; it is measured separately from the latency windows, never derived from
them. The segments' own rates give the 95 % interval (Student's t over the segments), which selection under a
throughput objective compares as it compares latency intervals; the run is `stable` when that interval's
half-width is within the recipe's `stable_within` of the figure.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any

from pipeline.bench.stats import t_two_sided
from pipeline.runners.base import Runner

SEGMENTS = 5  # synchronized segments of a throughput run: its interval rests on their rates


class MemoryProbe:
    def __init__(self) -> None:
        import torch

        self._torch = torch
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        self._allocated = torch.cuda.memory_allocated()
        self._used = _device_used()

    def stop(self, held_bytes: int = 0) -> dict[str, Any]:
        """`held_bytes`: device memory the candidate held before its activation (a compiled module kept from
        validation, pipeline.runners.compiled), which no reading over the activation sees."""
        torch = self._torch
        torch.cuda.synchronize()
        torch_peak = max(0, torch.cuda.max_memory_allocated() - self._allocated)
        device_delta = max(0, _device_used() - self._used)
        reading = {
            "bytes": max(torch_peak, device_delta) + held_bytes,
            "torch_peak_bytes": torch_peak,
            "device_used_delta_bytes": device_delta,
            "method": "max(torch allocator peak, cudaMemGetInfo used delta) over activation, staging, first call",
        }
        if held_bytes:
            reading["held_bytes"] = held_bytes
            reading["method"] += ", plus the weights it held before (a compiled module kept from validation)"
        return reading


def _device_used() -> int:
    import torch

    free, total = torch.cuda.mem_get_info()
    return int(total - free)


def throughput(
    runner: Runner, batch: int, seconds: float, stable_within: float, call_s: float
) -> dict[str, Any]:
    """Back-to-back requests for about `seconds` (at most, when requests overlap) in SEGMENTS segments of the
    same number of requests, as many as calls of `call_s` fit in a segment's share (at least one)."""
    per_segment = max(1, round(seconds / SEGMENTS / call_s)) if call_s > 0 else 1
    rates, requests, elapsed = [], 0, 0.0
    for _ in range(SEGMENTS):
        took = _segment(runner, per_segment)
        rates.append(batch * per_segment / took)
        requests += per_segment
        elapsed += took
    figure = batch * requests / elapsed
    mean = statistics.fmean(rates)
    half = t_two_sided(0.95, SEGMENTS - 1) * statistics.stdev(rates) / math.sqrt(SEGMENTS)
    low, high = max(0.0, min(figure, mean - half)), max(figure, mean + half)
    stable = half <= stable_within * figure
    out: dict[str, Any] = {
        "sequences_per_s": figure,
        "ci95": [low, high],
        "stable": stable,
        "segment_rates": [round(r, 1) for r in rates],
        "requests": requests,
        "seconds": round(elapsed, 6),
        "batch": batch,
        "mode": f"back-to-back requests on the runtime's stream, {SEGMENTS} segments each synchronized at its end",
    }
    if not stable:
        out["unstable_reason"] = (
            f"throughput segments spread ±{half / figure:.1%} (95% interval), more than {stable_within:.0%}; "
            "a longer benchmark.throughput_s gives each segment more requests"
        )
    return out


def _segment(runner: Runner, requests: int) -> float:
    """The seconds `requests` back-to-back requests take, from the first submission to one synchronize."""
    runner.synchronize()
    start = time.perf_counter()
    for _ in range(requests):
        runner.infer_prepared()
    runner.synchronize()
    return time.perf_counter() - start
