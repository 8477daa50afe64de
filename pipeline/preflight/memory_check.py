"""Whether the deploy's largest runs fit this machine's memory, told from pre-flight's probes: a run at a dim's max
grows memory about in proportion to the batch, so the probe's growth, scaled to the largest batch the deploy runs,
must fit what is available; a max too large to probe at all must at least leave room beyond its inputs."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipeline.core.errors import Problem
from pipeline.recipe import Recipe
from pipeline.recipe.loader import LoadedRecipe

MAX_PROBE = 1 << 24  # input elements of one probe run at a dim's max (16 M: an image batch of 1 at 2k x 2k)


def available_memory() -> int | None:
    """Bytes of memory this machine has available now (MemAvailable), None where it cannot be read."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def peak_rss() -> int:
    """This process's peak resident memory in bytes: what a probe run grew it by is read off it."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kB on Linux


def largest_batch(recipe: Recipe) -> int:
    """The largest batch a deploy runs the model at: the benchmark's, or a validation corner's."""
    return max([*recipe.benchmark.batch_sizes, *recipe.validation.corner_batches.values(), 1])


def gib(value: float) -> str:
    return f"{value / 2**30:.1f} GiB"


def run_memory_problems(
    loaded: LoadedRecipe, key: str, dim: str, size: int, grown: int, available: int | None
) -> list[Problem]:
    """The probe at this dim's max ran at the batch dim's min; the deploy runs larger batches, and memory grows
    about in proportion: refuse a max whose estimate is beyond what this machine has available."""
    recipe = loaded.recipe
    batch_rng = recipe.dims.get(recipe.benchmark.batch_dim)
    probed = batch_rng.min if batch_rng else 1
    biggest = largest_batch(recipe) if batch_rng else 1
    estimate = grown * biggest / probed
    if available is None or estimate <= available:
        return []
    return [
        loaded.problem(
            key,
            f"running the model when {dim} = {size} took {gib(grown)} at batch {probed}; at batch {biggest} "
            f"(the largest the deploy runs) that is about {gib(estimate)}, more than this machine's available "
            f"memory ({gib(available)})",
        )
    ]


def input_memory_problems(
    loaded: LoadedRecipe, key: str, dim: str, size: int, probe: dict[str, int], available: int | None
) -> list[Problem]:
    """A max too large to probe: its inputs alone, at the largest batch, must take at most a quarter of the
    memory available (the outputs, copies per runtime and activations take the rest)."""
    from pipeline.inputs.data import NUMPY_DTYPES

    recipe = loaded.recipe
    batch = (
        {recipe.benchmark.batch_dim: largest_batch(recipe)}
        if recipe.benchmark.batch_dim in recipe.dims
        else {}
    )
    shape_dims = {**probe, **batch}
    size_bytes = sum(
        int(np.prod(recipe.corner_shape(spec, "min", shape_dims), dtype=np.float64))
        * np.dtype(NUMPY_DTYPES[spec.dtype]).itemsize
        for spec in recipe.inputs
    )
    if available is None or size_bytes * 4 <= available:
        return []
    return [
        loaded.problem(
            key,
            f"the inputs alone take {gib(size_bytes)} when {dim} = {size} at batch "
            f"{shape_dims.get(recipe.benchmark.batch_dim, 1)}: more than a quarter of this machine's "
            f"available memory ({gib(available)})",
        )
    ]


def elements(recipe: Recipe, dims: dict[str, int]) -> int:
    """Input elements of one run at these dims: what decides whether a max is probed at all (MAX_PROBE)."""
    return sum(int(np.prod(recipe.corner_shape(spec, "min", dims))) for spec in recipe.inputs)
