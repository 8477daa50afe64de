"""What a host times (benchmark.runtimes) and builds (variants.gpu).

A GPU deploy should not spend minutes timing rows that cannot win. By default a GPU host times:
- the GPU runtimes with device I/O at every batch, and with host I/O (copies included) at the smallest batch
  and the selection objective's batch only: what serving from host memory adds, without a second row per
  runtime at every batch;
- not the pairs whose faster twin is timed, as each runtime declares it (pipeline/core/runtimes.py, Runtime's
  mode_twins and artifact_twins). A mode's twin is a mode of the same artifact (the
  AOTInductor package launched kernel by kernel, plain or padding-aware, when its CUDA-graph capture is timed;
  the ExportedProgram run eagerly when a torch.compile mode of it is timed: the same kernels with more launch
  overhead): only its device-I/O rows go, since the twin has no host-I/O mode. An ONNX graph's twin is another
  artifact on the same ONNX Runtime CUDA runtime (ONNX Runtime's own fusions of a plain graph at
  the same precision; for the static Q/DQ INT8 graph, which the CUDA provider runs as dequantize plus float
  MatMul, since ONNX Runtime fuses Q/DQ MatMuls for its CPU provider only (that graph is built for TensorRT),
  its float graph): its rows go in both I/O modes, since the twin has its own host-I/O row. Each was measured
  slower than its twin at every batch on the H200, and their windows would cost the deploy seconds.
  The matrix (pipeline/bench/matrix.py) still validates an artifact left with no timed row (left_for_twin), so
  every built artifact carries an accuracy verdict; speed.json names each pair left out under
  conditions.runtimes_timed.not_timed (a runtime listed under selection.runtimes is never left out);
- the CPU reference (torch-fp32 on the CPU) at the smallest batch only, as a yardstick.
A CPU host times the CPU runtimes, except that where the recipe configures runtime.padding (real traffic is
padded) a runtime with a padding-aware twin (ONNX Runtime's CPU provider) keeps its padded rows for the plain
exports only: every other artifact is timed padding-aware, which was 3.1-3.3x faster on MiniLM's real sentences
at batch 1 and 8 (docs/benchmarking.md), and timing both doubled the benchmark. Either host leaves out an opt-in
runtime the recipe does not list. A recipe that lists `benchmark.runtimes` times exactly those, at every batch
and in both I/O modes.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

from pipeline.core.runtimes import Twin
from pipeline.core.variants import PLAIN_EXPORTS, REFERENCE
from pipeline.runners import registry

if TYPE_CHECKING:
    from pipeline.recipe import Recipe


class HostTiming(BaseModel):
    """The recipe's say in which (artifact, runtime) pairs are timed (pipeline/bench/matrix.py applies it)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    runtimes: list[str] | None  # benchmark.runtimes
    batch_sizes: list[int]  # the batches the benchmark measures (1 when the model has no batch dim)
    objective_batch: int = 1  # selection.objective.batch: host I/O rows are timed there too
    winner_runtimes: list[str] = []  # selection.runtimes: never left out as a faster twin's
    padded: bool = False  # runtime.padding is set: real traffic is padded (left_for_padding)

    @classmethod
    def from_recipe(cls, recipe: Recipe) -> HostTiming:
        bench = recipe.benchmark
        return cls(
            runtimes=bench.runtimes,
            batch_sizes=list(bench.batch_sizes) if bench.batch_dim in recipe.dims else [1],
            objective_batch=recipe.selection.objective.batch,
            winner_runtimes=list(recipe.selection.runtimes),
            padded=recipe.runtime.padding is not None,
        )


Pair = tuple[str, str]  # (artifact, runtime)


def faster_twin(artifact: str, runtime: str, pairs: Collection[Pair]) -> Twin | None:
    """The timed twin that makes this pair not worth timing by default, if any, as the runtime declares it
    (pipeline/core/runtimes.py); `pairs` are the (artifact, runtime) pairs this host has."""
    return registry.runtime(runtime).faster_twin(artifact, pairs)


def twin_artifacts(artifact: str) -> tuple[str, ...]:
    """The artifacts whose presence decides whether this one is timed (its faster twins on some runtime):
    validation waits for them before it chooses this artifact's runtimes."""
    found = (t for r in registry.runtimes().values() for t in r.artifact_twins.get(artifact, ()))
    return tuple(dict.fromkeys(found))


def _on_gpu(runtime: str) -> bool:
    return registry.runtime(runtime).on_gpu


def opted_out(timing: HostTiming, runtime: str) -> bool:
    """An opt-in runtime the recipe lists neither under benchmark.runtimes nor under selection.runtimes."""
    listed = [*(timing.runtimes or []), *timing.winner_runtimes]
    return registry.runtime(runtime).opt_in and runtime not in listed


def left_for_padding(timing: HostTiming, artifact: str, runtime: str, pairs: Collection[Pair]) -> str | None:
    """On a CPU host where the recipe configures runtime.padding (real traffic is padded): the padding-aware
    twin this runtime's rows are left out for, for every artifact but the plain exports, which keep their padded
    rows as the yardstick. Never for a runtime the recipe lists under selection.runtimes."""
    twin = registry.runtime(runtime).padded_twin
    if (
        not timing.padded
        or not twin
        or artifact in PLAIN_EXPORTS
        or runtime in timing.winner_runtimes
        or (artifact, twin) not in pairs
    ):
        return None
    return twin


def _left_for_twin(timing: HostTiming, artifact: str, runtime: str, pairs: Collection[Pair]) -> Twin | None:
    """The faster twin a GPU runtime is left out for by default; never one selection.runtimes lists."""
    return None if runtime in timing.winner_runtimes else faster_twin(artifact, runtime, pairs)


def timed(
    timing: HostTiming,
    artifact: str,
    runtime: str,
    batch: int,
    gpu_host: bool,
    io: str = "device",
    pairs: Collection[Pair] = (),
) -> bool:
    """Whether this (artifact, runtime) is timed at this batch in this I/O mode on this host."""
    if timing.runtimes is not None:
        return runtime in timing.runtimes
    if opted_out(timing, runtime):
        return False
    smallest = batch == min(timing.batch_sizes)
    if _on_gpu(runtime):
        if not gpu_host:
            return False
        twin = _left_for_twin(timing, artifact, runtime, pairs)
        if io == "device":
            return twin is None
        return (smallest or batch == timing.objective_batch) and not (twin and twin.every_io)
    if not gpu_host:
        return left_for_padding(timing, artifact, runtime, pairs) is None
    return artifact == REFERENCE and smallest  # the CPU reference, a yardstick


def left_for_twin(
    timing: HostTiming, artifact: str, runtime: str, gpu_host: bool, pairs: Collection[Pair]
) -> bool:
    """Whether this host's default leaves the pair untimed in every I/O mode for a faster twin: validation
    still checks such an artifact (on one of those runtimes) when nothing of it is timed, so that every built
    artifact carries an accuracy verdict."""
    if timing.runtimes is not None or not gpu_host or not _on_gpu(runtime):
        return False
    twin = _left_for_twin(timing, artifact, runtime, pairs)
    return bool(twin and twin.every_io)


def not_timed(timing: HostTiming, pairs: Iterable[Pair], gpu_host: bool) -> list[dict[str, str]]:
    """The (artifact, runtime) pairs this host leaves untimed by default, with why and in which I/O mode: an
    opt-in runtime the recipe does not list (any), or a pair whose faster twin is timed: device (a mode whose
    twin has no host I/O keeps its host-I/O rows) or any."""
    pairs = list(dict.fromkeys(pairs))
    if timing.runtimes is not None:
        return []
    out = []
    for artifact, runtime in pairs:
        if opted_out(timing, runtime):
            reason = "an opt-in runtime; list it under benchmark.runtimes or selection.runtimes to time it"
            out.append({"artifact": artifact, "runtime": runtime, "io": "any", "reason": reason})
            continue
        padded = None if gpu_host else left_for_padding(timing, artifact, runtime, pairs)
        if padded:
            reason = (
                f"its padding-aware twin {padded} is timed (runtime.padding: real traffic is padded; the plain "
                "exports keep their padded rows); list it under benchmark.runtimes to time it"
            )
            out.append({"artifact": artifact, "runtime": runtime, "io": "any", "reason": reason})
            continue
        twin = _left_for_twin(timing, artifact, runtime, pairs) if gpu_host and _on_gpu(runtime) else None
        if twin:
            why = f" ({twin.why})" if twin.why else ""
            out.append(
                {
                    "artifact": artifact,
                    "runtime": runtime,
                    "io": "any" if twin.every_io else "device",
                    "reason": f"its faster twin {twin.name} is timed{why}; list it under benchmark.runtimes to "
                    "time it",
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
            "only, except pairs whose faster twin is timed (not_timed); the CPU reference "
            f"({REFERENCE} on the CPU) at batch {smallest} only"
        )
    elif timing.padded:
        rule = (
            "CPU runtimes (no CUDA GPU on this host); runtime.padding says real traffic is padded, so a runtime "
            "with a padding-aware mode is timed in that mode only, except for the plain exports, which keep "
            "their padded rows as the yardstick"
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
