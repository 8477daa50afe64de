"""torch.compile's compile of an ExportedProgram, done ahead in a child process so that validation's own compile
of the same program finds Inductor's caches filled (GPU hosts, pipeline.plan).

Validation compiles every torch.compile runtime of `exported-<p>` in the deploy's process, which keeps the
compiled module for the benchmark (pipeline.runners.compiled): on the H200 host 21.7 s of validation's 60 s, two
graphs (batch 1 and batch >= 2) with cold caches. The same compile in a fresh process took 25.2 s with cold
caches and 11.0 s once another process had compiled the program (Inductor's FX graph and kernel caches and
AOTAutograd's cache are on disk and keyed by the graph, not the process). So this stage runs exactly what
validation will run, the runtimes' own runners over validation's own batches, in a child process beside the
exports; validation waits for it (it takes its output late) before it compiles. Nothing it makes is deployed:
its output is a log of the compile times. Where the caches are off or gone, validation compiles as before."""

from __future__ import annotations

import json
import time
from pathlib import Path

from pipeline.artifacts import ArtifactRecord
from pipeline.packages import package_version
from pipeline.recipe import Recipe, ValidationConfig
from pipeline.specs import DataSpec, RunnerSettings
from pipeline.stages.base import Output, RunContext, Stage, StageConfig, StageResult
from pipeline.variants import Variant


def cache_name(precision: str) -> str:
    """What the stage produces for validation to wait for (not a deployable artifact)."""
    return f"cache:torch-compile-{precision}"


class WarmConfig(StageConfig):
    precision: str
    validation: ValidationConfig  # validation's batches: the shapes whose graphs it compiles
    data: DataSpec
    runners: RunnerSettings  # the torch.compile modes and the input names

    @classmethod
    def from_recipe(cls, recipe: Recipe, recipe_dir: Path, precision: str) -> WarmConfig:
        return cls(
            precision=precision,
            validation=recipe.validation,
            data=DataSpec.from_recipe(recipe, recipe_dir),
            runners=RunnerSettings.from_recipe(recipe),
        )


def _run(ctx: RunContext, config: WarmConfig, inputs: dict[str, ArtifactRecord]) -> StageResult:
    from pipeline.runners.pt2 import exported_runners
    from pipeline.stages.validate import validation_batches

    batches = validation_batches(ctx.dataset(config.data), config.validation)
    compiling = [
        r for r in exported_runners(inputs[f"exported-{config.precision}"], config.runners) if r.compile_mode
    ]
    took: dict[str, float] = {}
    for runner in compiling:
        started = time.perf_counter()
        runner.activate()
        try:
            for batch in batches:
                runner.infer(batch.feeds)
        finally:
            runner.deactivate()
        took[runner.runtime] = round(time.perf_counter() - started, 2)
    log = f"logs/warm_compile_{config.precision}.json"
    # the file says what was compiled, not how long it took: validation's fingerprint includes its sha256
    ctx.path(log).write_text(json.dumps({"runtimes": sorted(took), "batches": len(batches)}, indent=1) + "\n")
    details = {"compile_s": took, "batches": len(batches)}
    return StageResult([Output(log, "log", cache_name(config.precision), details=details)], details=details)


def stages(recipe: Recipe, recipe_dir: Path, variants: list[Variant]) -> list[Stage]:
    """One per exported-<p> variant built, when the recipe times torch.compile runtimes."""
    if not recipe.runtime.torch_compile:
        return []
    return [
        Stage(
            name=f"warm_compile_{v.precision}",
            version=1,
            config=WarmConfig.from_recipe(recipe, recipe_dir, v.precision),
            run=_run,
            environment=lambda: {"torch": package_version("torch"), "triton": package_version("triton")},
            consumes=(f"exported-{v.precision}",),
            produces=(cache_name(v.precision),),
        )
        for v in variants
        if v.format == "exported"
    ]
