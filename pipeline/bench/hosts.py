"""What a host times (benchmark.runtimes) and builds (variants.gpu).

A GPU deploy should not spend minutes timing CPU runtimes at batch 256: by default a GPU host times the GPU
runtimes, plus the CPU reference (torch-cpu of torch-fp32) at the smallest batch only, as a yardstick; a CPU
host times the CPU runtimes. A recipe that lists `benchmark.runtimes` times exactly those, at every batch.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pipeline.recipe import Recipe

GPU_RUNTIMES = frozenset({"tensorrt", "tensorrt-rtx"})
REFERENCE = "torch-fp32"


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


def is_gpu_runtime(runtime: str) -> bool:
    return "-cuda" in runtime or runtime in GPU_RUNTIMES


def timed(recipe: Recipe, artifact: str, runtime: str, batch: int, gpu_host: bool) -> bool:
    """Whether this (artifact, runtime) is timed at this batch on this host."""
    chosen = recipe.benchmark.runtimes
    if chosen is not None:
        return runtime in chosen
    if is_gpu_runtime(runtime):
        return gpu_host
    if not gpu_host:
        return True
    return artifact == REFERENCE and runtime == "torch-cpu" and batch == min(recipe.benchmark.batch_sizes)


def timed_anywhere(recipe: Recipe, artifact: str, runtime: str, gpu_host: bool) -> bool:
    """Whether this (artifact, runtime) is timed at some batch: validation covers exactly these pairs."""
    return any(timed(recipe, artifact, runtime, b, gpu_host) for b in recipe.benchmark.batch_sizes)


def policy(recipe: Recipe, gpu_host: bool) -> dict[str, Any]:
    """The rule, as recorded in speed.json's conditions."""
    if recipe.benchmark.runtimes is not None:
        return {"runtimes": list(recipe.benchmark.runtimes), "rule": "benchmark.runtimes, every batch"}
    if gpu_host:
        rule = f"GPU runtimes at every batch; the CPU reference ({REFERENCE} on torch-cpu) at batch {min(recipe.benchmark.batch_sizes)} only"
    else:
        rule = "CPU runtimes (no CUDA GPU on this host)"
    return {"runtimes": None, "rule": rule}


def skipped_gpu_variants(recipe: Recipe, gpu_host: bool) -> list[dict[str, str]]:
    """not_run entries for variants.gpu on a host without a GPU (they are not built there)."""
    if gpu_host:
        return []
    return [
        {"artifact": v, "reason": "GPU-only variant (variants.gpu): this host has no CUDA GPU, not built"}
        for v in recipe.variants.gpu
        if v not in recipe.variants.build
    ]
