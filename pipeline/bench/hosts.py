"""What a host times (benchmark.runtimes) and builds (variants.gpu).

A GPU deploy should not spend minutes timing rows that cannot win. By default a GPU host times:
- the GPU runtimes with device I/O at every batch, and with host I/O (copies included) at the smallest batch
  and the selection objective's batch only: what serving from host memory adds, without a second row per
  runtime at every batch;
- not the device-I/O rows of a mode whose faster twin of the same artifact is timed (TWINS: the AOTInductor
  package launched kernel by kernel, plain or padding-aware, when its CUDA-graph capture is timed; the
  ExportedProgram run eagerly when a torch.compile mode of it is timed): the same kernels with more launch
  overhead cannot win (measured slower at every batch on the H200), and their windows would cost the deploy
  seconds; host-I/O rows stay (the twins have none); speed.json names each such pair under
  conditions.runtimes_timed.not_timed (a runtime listed under selection.runtimes is never left out);
- the CPU reference (torch-cpu of torch-fp32) at the smallest batch only, as a yardstick.
A CPU host times the CPU runtimes. A recipe that lists `benchmark.runtimes` times exactly those, at every
batch and in both I/O modes.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
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
    batch_sizes: list[int]  # the batches the benchmark measures (1 when the model has no batch dim)
    objective_batch: int = 1  # selection.objective.batch: host I/O rows are timed there too
    winner_runtimes: list[str] = []  # selection.runtimes: never left out as a faster twin's

    @classmethod
    def from_recipe(cls, recipe: Recipe) -> HostTiming:
        bench = recipe.benchmark
        return cls(
            runtimes=bench.runtimes,
            batch_sizes=list(bench.batch_sizes) if bench.batch_dim in recipe.dims else [1],
            objective_batch=recipe.selection.objective.batch,
            winner_runtimes=list(recipe.selection.runtimes),
        )


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


# mode -> the faster twins of the same artifact that, when timed, leave its device-I/O rows untimed by default
TWINS: dict[str, tuple[str, ...]] = {
    "torch-aoti-cuda": ("torch-aoti-cuda-graph",),
    "torch-aoti-cuda-bucketed": ("torch-aoti-cuda-graph-bucketed",),
}
COMPILED = "torch-compile-cuda"  # the runtimes torch.compile makes of an ExportedProgram on CUDA


def faster_twin(artifact: str, runtime: str, siblings: Iterable[str]) -> str | None:
    """The timed twin that makes this (artifact, runtime) not worth timing by default, if any; `siblings`
    are the runtimes the artifact has on this host."""
    others = sorted(set(siblings) - {runtime})
    if runtime in TWINS:
        return next((t for t in TWINS[runtime] if t in others), None)
    if artifact.startswith("exported-") and runtime == "torch-cuda":
        return next((t for t in others if t.startswith(COMPILED)), None)
    return None


def _left_for_twin(timing: HostTiming, artifact: str, runtime: str, siblings: Iterable[str]) -> str | None:
    """The faster twin a GPU runtime is left out for by default; never one selection.runtimes lists."""
    return None if runtime in timing.winner_runtimes else faster_twin(artifact, runtime, siblings)


def timed(
    timing: HostTiming,
    artifact: str,
    runtime: str,
    batch: int,
    gpu_host: bool,
    io: str = "device",
    siblings: Iterable[str] = (),
) -> bool:
    """Whether this (artifact, runtime) is timed at this batch in this I/O mode on this host."""
    if timing.runtimes is not None:
        return runtime in timing.runtimes
    smallest = batch == min(timing.batch_sizes)
    if is_gpu_runtime(runtime):
        if not gpu_host:
            return False
        if io == "device":
            return not _left_for_twin(timing, artifact, runtime, siblings)
        return smallest or batch == timing.objective_batch
    if not gpu_host:
        return True
    return artifact == REFERENCE and runtime == "torch-cpu" and smallest


def timed_anywhere(
    timing: HostTiming, artifact: str, runtime: str, gpu_host: bool, io: str, siblings: Iterable[str] = ()
) -> bool:
    """Whether this (artifact, runtime) is timed at some batch in this I/O mode: validation covers exactly
    the pairs with a runner timed somewhere."""
    return any(timed(timing, artifact, runtime, b, gpu_host, io, siblings) for b in timing.batch_sizes)


def not_timed(timing: HostTiming, pairs: Iterable[tuple[str, str]], gpu_host: bool) -> list[dict[str, str]]:
    """The (artifact, runtime) pairs whose device-I/O rows this host leaves untimed because a faster twin is
    timed, with why (their host-I/O rows, where the runtime has them, are timed as usual)."""
    pairs = list(pairs)
    if timing.runtimes is not None or not gpu_host:
        return []
    out = []
    for artifact, runtime in pairs:
        siblings = [r for a, r in pairs if a == artifact]
        twin = _left_for_twin(timing, artifact, runtime, siblings) if is_gpu_runtime(runtime) else None
        if twin:
            out.append(
                {
                    "artifact": artifact,
                    "runtime": runtime,
                    "io": "device",
                    "reason": f"its faster twin {twin} is timed; list it under benchmark.runtimes to time it",
                }
            )
    return out


def policy(timing: HostTiming, gpu_host: bool) -> dict[str, Any]:
    """The rule, as recorded in speed.json's conditions."""
    if timing.runtimes is not None:
        return {"runtimes": list(timing.runtimes), "rule": "benchmark.runtimes, every batch"}
    smallest = min(timing.batch_sizes)
    if gpu_host:
        host = sorted({smallest, timing.objective_batch} & set(timing.batch_sizes)) or [smallest]
        rule = (
            f"GPU runtimes at every batch with device I/O, with host I/O at batch {', '.join(map(str, host))} "
            "only, except the device-I/O rows of modes whose faster twin is timed (not_timed); the CPU reference "
            f"({REFERENCE} on torch-cpu) at batch {smallest} only"
        )
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
