"""What a host times (benchmark.runtimes) and builds (variants.gpu).

A GPU deploy should not spend minutes timing CPU runtimes at batch 256: by default a GPU host times the GPU
runtimes, plus the CPU reference (torch-cpu of torch-fp32) at the smallest batch only, as a yardstick; a CPU
host times the CPU runtimes. A recipe that lists `benchmark.runtimes` times exactly those, at every batch.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

from pipeline.runtimes import is_gpu_runtime
from pipeline.variants import REFERENCE

if TYPE_CHECKING:
    from pipeline.recipe import Recipe


class HostTiming(BaseModel):
    """The recipe's say in which (artifact, runtime) pairs are timed: validation covers exactly these."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    runtimes: list[str] | None  # benchmark.runtimes
    batch_sizes: list[int]

    @classmethod
    def from_recipe(cls, recipe: Recipe) -> HostTiming:
        return cls(runtimes=recipe.benchmark.runtimes, batch_sizes=list(recipe.benchmark.batch_sizes))


@functools.cache
def has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    try:
        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001 - a broken CUDA setup reads as no GPU
        return False


def timed(timing: HostTiming, artifact: str, runtime: str, batch: int, gpu_host: bool) -> bool:
    """Whether this (artifact, runtime) is timed at this batch on this host."""
    if timing.runtimes is not None:
        return runtime in timing.runtimes
    if is_gpu_runtime(runtime):
        return gpu_host
    if not gpu_host:
        return True
    return artifact == REFERENCE and runtime == "torch-cpu" and batch == min(timing.batch_sizes)


def timed_anywhere(timing: HostTiming, artifact: str, runtime: str, gpu_host: bool) -> bool:
    """Whether this (artifact, runtime) is timed at some batch: validation covers exactly these pairs."""
    return any(timed(timing, artifact, runtime, b, gpu_host) for b in timing.batch_sizes)


def policy(timing: HostTiming, gpu_host: bool) -> dict[str, Any]:
    """The rule, as recorded in speed.json's conditions."""
    if timing.runtimes is not None:
        return {"runtimes": list(timing.runtimes), "rule": "benchmark.runtimes, every batch"}
    if gpu_host:
        rule = f"GPU runtimes at every batch; the CPU reference ({REFERENCE} on torch-cpu) at batch {min(timing.batch_sizes)} only"
    else:
        rule = "CPU runtimes (no CUDA GPU on this host)"
    return {"runtimes": None, "rule": rule}


def gpu_only_variants(recipe: Recipe) -> list[str]:
    """variants.gpu that variants.build does not also ask for: built only where there is a GPU."""
    return [v for v in recipe.variants.gpu if v not in recipe.variants.build]


def skipped_gpu_variants(gpu_only: list[str], gpu_host: bool) -> list[dict[str, str]]:
    """not_run entries for the GPU-only variants on a host without a GPU (they are not built there)."""
    if gpu_host:
        return []
    return [
        {"artifact": v, "reason": "GPU-only variant (variants.gpu): this host has no CUDA GPU, not built"}
        for v in gpu_only
    ]
