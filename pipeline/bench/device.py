"""Peak device memory and throughput of a GPU candidate (docs/benchmarking.md rules 6 and 10).

Memory: each candidate is probed over its own activation, staging and first call (when runtimes allocate
their weights, arenas and workspaces). Two readings, because no single one sees every runtime: PyTorch's
allocator peak (exact for torch runtimes, blind to ONNX Runtime's own arena) and the device's used-memory
delta from cudaMemGetInfo (sees everything this process allocates, but not what torch serves from memory it
had cached already). `bytes` is the larger of the two.

Throughput: requests submitted back to back on the runtime's stream with one synchronize at the end, so that
the host prepares request n+1 while the GPU runs request n where the runtime allows it (runtimes that
synchronize inside a call serialize, which the figure then shows). Sequences/s = batch x requests / seconds;
it is measured separately from the latency windows, never derived from them.
"""

from __future__ import annotations

import time
from typing import Any

from pipeline.runners.base import Runner

CHUNK = 8  # requests submitted between clock reads


class MemoryProbe:
    def __init__(self) -> None:
        import torch

        self._torch = torch
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        self._allocated = torch.cuda.memory_allocated()
        self._used = _device_used()

    def stop(self) -> dict[str, Any]:
        torch = self._torch
        torch.cuda.synchronize()
        torch_peak = max(0, torch.cuda.max_memory_allocated() - self._allocated)
        device_delta = max(0, _device_used() - self._used)
        return {
            "bytes": max(torch_peak, device_delta),
            "torch_peak_bytes": torch_peak,
            "device_used_delta_bytes": device_delta,
            "method": "max(torch allocator peak, cudaMemGetInfo used delta) over activation, staging, first call",
        }


def _device_used() -> int:
    import torch

    free, total = torch.cuda.mem_get_info()
    return int(total - free)


def throughput(runner: Runner, batch: int, seconds: float) -> dict[str, Any]:
    """Back-to-back requests for about `seconds` (at least one chunk), synchronized once at the end."""
    runner.synchronize()
    requests = 0
    start = time.perf_counter()
    while True:
        for _ in range(CHUNK):
            runner.infer_prepared()
        requests += CHUNK
        if time.perf_counter() - start >= seconds:
            break
    runner.synchronize()
    elapsed = time.perf_counter() - start
    return {
        "sequences_per_s": batch * requests / elapsed,
        "requests": requests,
        "seconds": round(elapsed, 4),
        "batch": batch,
        "mode": "back-to-back requests on the runtime's stream, one synchronize at the end",
    }
