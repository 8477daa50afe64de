"""The plan: which stages a recipe asks for, in dependency order. Registries are explicit dict literals."""

from __future__ import annotations

import importlib
from dataclasses import replace
from pathlib import Path

from pipeline.recipe import Recipe
from pipeline.stages.base import Stage

# variant -> (module under pipeline.stages, the variants it is built from)
VARIANT_STAGES: dict[str, tuple[str, tuple[str, ...]]] = {
    "torchscript-fp32": ("export_torchscript", ()),
    "onnx-fp32": ("export_onnx", ()),
    "onnx-fp16": ("fp16", ("onnx-fp32",)),
    "onnx-int8": ("int8", ("onnx-fp32",)),
    "onnx-int8-dynamic": ("int8_dynamic", ("onnx-fp32",)),
    "onnx-optimized-fp32": ("optimize_onnx", ("onnx-fp32",)),
    "onnx-optimized-fp16": ("optimize_onnx", ("onnx-fp32",)),
    "exported-fp32": ("export_pt2", ()),
    "exported-fp16": ("export_pt2", ()),
    "exported-bf16": ("export_pt2", ()),
    "aoti-fp32": ("export_pt2", ("exported-fp32",)),
    "aoti-fp16": ("export_pt2", ("exported-fp16",)),
    "aoti-bf16": ("export_pt2", ("exported-bf16",)),
}
ENGINE_SOURCES = {"fp32": "onnx-fp32", "fp16": "onnx-fp16", "int8": "onnx-int8"}
STAGE_ORDER = (
    "export_torchscript",
    "export_onnx",
    "fp16",
    "int8",
    "int8_dynamic",
    "optimize_onnx",
    "export_pt2",
)


def engine_precision(variant: str) -> str | None:
    """'engine-fp16' / 'tensorrt-rtx-int8' -> the precision; None for a non-engine variant."""
    if variant.startswith(("engine-", "tensorrt-")):
        return variant.rsplit("-", 1)[1]
    return None


def engine_flavour(variant: str, recipe: Recipe) -> str | None:
    """The TensorRT flavour an engine variant builds with; None when `auto` finds none installed."""
    from pipeline.trt.flavour import resolve_flavour

    if variant.startswith("engine-"):
        return resolve_flavour(recipe.export.tensorrt.flavour)
    return "tensorrt-rtx" if variant.startswith("tensorrt-rtx-") else "tensorrt"


def artifact_name(variant: str, recipe: Recipe) -> str:
    """The contract's artifact name for a recipe variant (engine-<p> takes the resolved flavour)."""
    precision = engine_precision(variant)
    if precision is None:
        return variant
    flavour = engine_flavour(variant, recipe)
    return f"{flavour}-{precision}" if flavour else variant


def needed_variants(recipe: Recipe) -> list[str]:
    """Requested variants plus what they are built from (an FP16 engine needs the FP16 ONNX)."""
    wanted: list[str] = []

    def add(variant: str) -> None:
        precision = engine_precision(variant)
        sources = (ENGINE_SOURCES[precision],) if precision else VARIANT_STAGES[variant][1]
        for source in sources:
            add(source)
        if variant not in wanted:
            wanted.append(variant)

    for v in requested_variants(recipe):
        add(v)
    return wanted


def requested_variants(recipe: Recipe) -> list[str]:
    """variants.build, plus variants.gpu where this host has a CUDA GPU."""
    from pipeline.bench.hosts import has_cuda

    extra = [v for v in recipe.variants.gpu if v not in recipe.variants.build] if has_cuda() else []
    return [*recipe.variants.build, *extra]


def plan_stages(recipe: Recipe, recipe_dir: Path) -> list[Stage]:
    variants = needed_variants(recipe)
    stages: list[Stage] = []
    for module_name in STAGE_ORDER:
        mine = [v for v in variants if VARIANT_STAGES.get(v, ("",))[0] == module_name]
        if not mine:
            continue
        module = importlib.import_module(f"pipeline.stages.{module_name}")
        if hasattr(module, "stages"):
            stages += [s for s in module.stages(recipe, recipe_dir) if set(s.produces) & set(mine)]
        else:
            stages.append(module.stage(recipe, recipe_dir))
    if any(engine_precision(v) for v in variants):
        from pipeline.stages import tensorrt

        stages += tensorrt.stages(recipe, recipe_dir)
    artifacts = [artifact_name(v, recipe) for v in variants]
    from pipeline.stages import benchmark, select, validate

    stages.append(replace(validate.stage(recipe, recipe_dir, artifacts), produces=("report:accuracy",)))
    stages.append(replace(benchmark.stage(recipe, recipe_dir, artifacts), produces=("report:speed",)))
    stages.append(select.stage(recipe, recipe_dir, artifacts))
    return stages
