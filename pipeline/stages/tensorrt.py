"""TensorRT engine stages: one per engine variant, each building `model.<flavour>.<precision>.engine` from the
ONNX of that precision in a child process (pipeline.toolchain.trt.build).

Variant names: `engine-<p>` uses export.tensorrt.flavour (auto: tensorrt if installed, else tensorrt-rtx);
`tensorrt-<p>` and `tensorrt-rtx-<p>` name their flavour. Precision lives in the ONNX graph (strongly typed
builds), so the engine of precision p is built from the ONNX artifact of precision p.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from pipeline.check.results import EngineDetails
from pipeline.core.artifacts import ArtifactRecord
from pipeline.core.children import run_job
from pipeline.core.errors import StageError
from pipeline.core.variants import Variant, parse
from pipeline.recipe import Recipe, corner_shape
from pipeline.stages.base import ALONE, Output, RunContext, Stage, StageConfig, StageResult
from pipeline.toolchain.trt import global_pools
from pipeline.toolchain.trt.flavour import (
    DISPLAY,
    INSTALL,
    RTX_COMPUTE_CAPABILITIES,
    local_compute_capability,
    module_name,
    resolve_flavour,
    trt_version,
)

VERSION = 2
NO_BUILDER = "no TensorRT builder installed (pip install 'deploy-pipeline[tensorrt-rtx]' or '[tensorrt]')"
CORNERS = ("min", "opt", "max")


class EngineBuildError(StageError):
    """An engine build failed; carries the ONNX parser's messages (node name, operator, reason) when it parsed."""

    def __init__(self, message: str, parser_errors: list[dict[str, Any]] | None = None):
        super().__init__(message)
        self.parser_errors = list(parser_errors or [])


class EngineConfig(StageConfig):
    flavour: str
    trt_version: str | None
    precision: str
    source: str  # the ONNX artifact of the engine's precision
    compute_capabilities: list[str]  # TensorRT-RTX's ahead-of-time targets; ["current"]: this host's GPU
    profiles: list[dict[str, list[list[int]]]]
    optimization_level: int
    workspace_mb: int
    build_timeout_s: int

    @classmethod
    def from_recipe(cls, recipe: Recipe, variant: Variant) -> EngineConfig:
        assert variant.flavour is not None and variant.built_from is not None
        settings = recipe.export.tensorrt
        rtx = variant.flavour == "tensorrt-rtx"
        return cls(
            flavour=variant.flavour,
            trt_version=trt_version(variant.flavour),
            precision=variant.precision,
            source=variant.built_from,
            compute_capabilities=list(settings.compute_capabilities) if rtx else ["current"],
            profiles=engine_profiles(recipe),
            optimization_level=settings.optimization_level,
            workspace_mb=settings.workspace_mb,
            build_timeout_s=settings.build_timeout_s,
        )


class NoBuilderConfig(StageConfig):
    """An engine-<precision> request that export.tensorrt.flavour `auto` resolved to no installed builder."""

    precision: str


def engine_variants(recipe: Recipe) -> list[tuple[int, Variant]]:
    """(index in variants.build, the variant with its flavour resolved) per engine variant; an `engine-<p>`
    whose `auto` flavour finds no builder keeps its name and has no flavour."""
    found = []
    for i, name in enumerate(recipe.variants.build):
        variant = parse(name)
        if variant.flavour_from_setting:
            variant = parse(name, resolve_flavour(recipe.export.tensorrt.flavour))
        if variant.format == "engine":
            found.append((i, variant))
    return found


def engine_profiles(recipe: Recipe) -> list[dict[str, list[list[int]]]]:
    """Optimization profiles as {input: [min shape, opt shape, max shape]}; a profile's dims override the recipe's."""
    profiles = []
    for profile in recipe.export.tensorrt.profiles or [None]:
        dims = {**recipe.dims, **(profile.dims if profile else {})}
        profiles.append({spec.name: [corner_shape(spec, dims, c) for c in CORNERS] for spec in recipe.inputs})
    return profiles


def stages(recipe: Recipe, recipe_dir: Path, variants: list[Variant]) -> list[Stage]:
    """One stage per distinct (flavour, precision) engine among the variants."""
    made: dict[str, Stage] = {}
    for variant in variants:
        if variant.format != "engine":
            continue
        stage = (
            _missing_builder_stage(variant.precision)
            if variant.flavour is None
            else _engine_stage(recipe, variant)
        )
        made.setdefault(stage.name, stage)
    return list(made.values())


def _no_builder(ctx: RunContext, config: NoBuilderConfig, inputs: dict[str, ArtifactRecord]) -> StageResult:
    raise StageError(NO_BUILDER)


def _missing_builder_stage(precision: str) -> Stage:
    return Stage(
        name=f"engine-{precision}",
        version=VERSION,
        config=NoBuilderConfig(precision=precision),
        run=_no_builder,
        produces=(f"engine-{precision}",),
    )


def _build(ctx: RunContext, config: EngineConfig, inputs: dict[str, ArtifactRecord]) -> StageResult:
    return build_engine(ctx, inputs[config.source], config)


def _engine_stage(recipe: Recipe, variant: Variant) -> Stage:
    config = EngineConfig.from_recipe(recipe, variant)
    return Stage(
        name=variant.name,
        version=VERSION,
        config=config,
        run=_build,
        environment=lambda: builder_environment(config.flavour),
        consumes=(config.source,),
        produces=(variant.name,),
        placement=ALONE,  # it times tactics: no background compile beside it
    )


def builder_environment(flavour: str) -> dict[str, Any]:
    """The library version a build depends on; the datacenter builder also depends on the GPU it runs on."""
    env: dict[str, Any] = {"tensorrt_flavour": flavour, "tensorrt_version": trt_version(flavour)}
    if flavour == "tensorrt":
        env["gpu_compute_capability"] = local_compute_capability()
    return env


def timing_cache_dir(ctx: RunContext) -> Path:
    """`<output root>/<recipe name>/.cache/timing`: ctx.cache_dir when the context has one, else derived from the
    work folder (`<root>/<name>/.work/<run-id>`)."""
    cache = getattr(ctx, "cache_dir", None) or ctx.workdir.parent.parent / ".cache"
    return Path(cache) / "timing"


def build_engine(ctx: RunContext, onnx: ArtifactRecord, config: EngineConfig) -> StageResult:
    """Run the builder child for one engine, record its configuration and layers, raise on failure."""
    flavour, precision = config.flavour, config.precision
    variant = parse(f"{flavour}-{precision}")
    name = variant.name
    if module_name(flavour) is None:
        raise StageError(f"{DISPLAY[flavour]} is not installed ({INSTALL[flavour]})")
    rel = {
        "engine": variant.file,
        "log": f"logs/{name}.build.log",
        "build": f"logs/{name}.build.json",
        "layers": f"logs/{name}.layers.json",
    }
    cache = timing_cache_dir(ctx) / f"{flavour}-{config.trt_version}.cache" if flavour == "tensorrt" else None
    with tempfile.TemporaryDirectory(prefix=f"{name}-") as tmp:
        parsed, pools = global_pools.for_tensorrt(onnx.path, Path(tmp))
        job = {
            "onnx": str(parsed),
            "engine": str(ctx.path(rel["engine"])),
            "flavour": flavour,
            "profiles": config.profiles,
            "compute_capabilities": config.compute_capabilities,
            "optimization_level": config.optimization_level,
            "workspace_mb": config.workspace_mb,
            "timing_cache": str(cache) if cache else None,
            "log": str(ctx.path(rel["log"])),
            "layers": str(ctx.path(rel["layers"])),
            "result": str(Path(tmp) / "result.json"),
        }
        ctx.report(f"{name}: building from {onnx.name}")
        result = run_builder(job, Path(tmp), config.build_timeout_s, ctx.report)
    record = {
        **result,
        "stage": name,
        "source": {"artifact": onnx.name, "sha256": onnx.sha256},
        "timing_cache": job["timing_cache"],
        "global_average_pools": pools,  # average pools over their whole input, rewritten for the parser
    }
    ctx.path(rel["build"]).write_text(json.dumps(record, indent=1))
    if not result.get("ok"):
        raise EngineBuildError(failure_message(name, result), result.get("parser_errors"))
    details: EngineDetails = {k: result.get(k) for k in EngineDetails.__annotations__}  # type: ignore[misc]
    return StageResult(
        outputs=[
            Output(rel["engine"], "engine", artifact=name, precision=precision, details=details),
            Output(rel["log"], "log"),
            Output(rel["build"], "log"),
            Output(
                rel["layers"],
                "log",
                details={"source": result["layers_source"], "count": result["layer_count"]},
            ),
        ],
        details={
            "build_s": result["build_s"],
            "engine_bytes": result["engine_bytes"],
            "notes": result["notes"],
            "global_average_pools": pools,
        },
    )


def run_builder(job: dict[str, Any], tmp: Path, timeout_s: float, report: Any = print) -> dict[str, Any]:
    """Run `python -m pipeline.toolchain.trt.build` on the job (pipeline.core.children.run_job), keep its output in the build
    log, and return its JSON result (a synthesized failure when it died without writing one)."""
    outcome = run_job("pipeline.toolchain.trt.build", job, tmp, timeout_s, report)
    _append_output(Path(job["log"]), outcome.lines)
    result = outcome.result
    if result is None:
        error = outcome.death(timeout_s, "engine build", "export.tensorrt.build_timeout_s")
        result = {"ok": False, "parser_errors": [], "error": error}
    result["child"] = {
        "command": outcome.command,
        "returncode": outcome.returncode,
        "wall_s": outcome.wall_s,
    }
    return result


def _append_output(log: Path, lines: list[str]) -> None:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a", encoding="utf-8") as f:
        f.write("\n--- builder process output ---\n" + "\n".join(lines) + "\n")


def failure_message(name: str, result: dict[str, Any]) -> str:
    """One readable message: the error, then every parser error as node (operator): reason."""
    errors = result.get("parser_errors") or []
    if not errors:
        return f"{name}: {result.get('error')}"
    described = [
        f"node {e['node_name'] or e['node']} ({e['node_operator'] or '?'}): {e['description']}"
        if e.get("node_name")
        else e["message"]
        for e in errors
    ]
    return f"{name}: the ONNX parser rejected the graph: " + "; ".join(described)


def preflight_problems(recipe: Recipe) -> list[tuple[str, str]]:
    """Checks that touch the installation: an engine flavour the recipe names is installed, the compute
    capabilities suit TensorRT-RTX, and engine profile dims are real dims within min..max."""
    variants = engine_variants(recipe)
    if not variants:
        return []
    problems = []
    settings = recipe.export.tensorrt
    for i, variant in variants:
        flavour, requested = variant.flavour, variant.requested
        if flavour is None and requested in recipe.variants.required:
            problems.append(("export.tensorrt.flavour", f"required variant '{requested}': {NO_BUILDER}"))
        if flavour is None or module_name(flavour) is not None:
            continue
        key = "export.tensorrt.flavour" if variant.flavour_from_setting else f"variants.build[{i}]"
        problems.append(
            (key, f"'{requested}' needs {DISPLAY[flavour]}, which is not installed ({INSTALL[flavour]})")
        )
    if any(variant.flavour == "tensorrt-rtx" for _, variant in variants):
        for j, cc in enumerate(settings.compute_capabilities):
            if cc not in RTX_COMPUTE_CAPABILITIES:
                problems.append(
                    (
                        f"export.tensorrt.compute_capabilities[{j}]",
                        f"TensorRT-RTX cannot target {cc}: it supports {', '.join(RTX_COMPUTE_CAPABILITIES)}",
                    )
                )
    return _unique(problems) + profile_problems(recipe)


def profile_problems(recipe: Recipe) -> list[tuple[str, str]]:
    """Profile dims must be dims of the inputs, each within min <= opt <= max."""
    problems = []
    used = recipe.dim_names()
    for k, profile in enumerate(recipe.export.tensorrt.profiles):
        for dim, rng in profile.dims.items():
            key = f"export.tensorrt.profiles[{k}].dims.{dim}"
            if dim not in used:
                problems.append((key, f"'{dim}' is not a dynamic dim of any input"))
            elif not rng.min <= rng.opt <= rng.max:
                problems.append((key, f"needs min <= opt <= max (got {rng.min}, {rng.opt}, {rng.max})"))
    return problems


def _unique(problems: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return list(dict.fromkeys(problems))
