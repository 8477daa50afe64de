"""The plan: which stages a recipe asks for, in dependency order.

The registry is a plain table of stage factories in plan order. A build factory takes the recipe and the
variants the plan needs and returns the stages for those it builds, each declaring what it produces; the
checks (validate, benchmark, select, and sign-off last) take the artifact names they work on."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from pipeline.recipe import Recipe
from pipeline.specs import resolved_variant
from pipeline.stages import (
    benchmark,
    export_onnx,
    export_pt2,
    export_torchscript,
    fp16,
    int8,
    int8_dynamic,
    optimize_onnx,
    select,
    signoff,
    tensorrt,
    validate,
)
from pipeline.stages.base import Stage
from pipeline.variants import Variant, parse

BuildFactory = Callable[[Recipe, Path, list[Variant]], list[Stage]]
CheckFactory = Callable[[Recipe, Path, list[str]], Stage]

BUILDS: dict[str, BuildFactory] = {
    "export_torchscript": export_torchscript.stages,
    # early: its AOTInductor compile (half a minute on an H200 host) runs in the background while the ONNX
    # exports go on, instead of beside validation; after the TorchScript export, whose eager checks on all CPU
    # threads the compile's parallel phase slowed 4x (16.6 s instead of 4.1 on the H200 host); TensorRT builds
    # wait for it (quiet stages: they time tactics)
    "export_pt2": export_pt2.stages,
    "export_onnx": export_onnx.stages,
    "fp16": fp16.stages,
    "int8": int8.stages,
    "int8_dynamic": int8_dynamic.stages,
    "optimize_onnx": optimize_onnx.stages,
    "tensorrt": tensorrt.stages,
}
CHECKS: dict[str, CheckFactory] = {
    "validate": validate.stage,
    "benchmark": benchmark.stage,
    "select": select.stage,
    "signoff": signoff.stage,
}


def requested_variants(recipe: Recipe) -> list[str]:
    """variants.build, plus variants.gpu where this host has a CUDA GPU."""
    from pipeline.bench.hosts import gpu_only_variants, has_cuda

    return [*recipe.variants.build, *(gpu_only_variants(recipe) if has_cuda() else [])]


def artifact_name(recipe: Recipe, name: str) -> str:
    """The contract's artifact name for a recipe variant (engine-<p> takes the resolved flavour)."""
    return resolved_variant(recipe, name).name


def needed_variants(recipe: Recipe) -> list[Variant]:
    """Requested variants plus what they are built from (an FP16 engine needs the FP16 ONNX)."""
    wanted: list[Variant] = []

    def add(found: Variant) -> None:
        if found.built_from:
            add(parse(found.built_from))
        if all(w.name != found.name for w in wanted):
            wanted.append(found)

    for name in requested_variants(recipe):
        add(resolved_variant(recipe, name))
    return wanted


# The ONNX builds: CPU work in one process (the export traces the model on the CPU; conversions and INT8
# calibration use ONNX Runtime's CPU provider). On a GPU host they run on a lane, in a worker process beside the
# PyTorch side's validation in front (torch.compile, 20-37 s of one core on the H200 host), instead of before it.
ONNX_LANE = "onnx"
ONNX_BUILDS = ("export_onnx", "fp16", "int8", "int8_dynamic", "optimize_onnx")


LANE_SWITCH = "PIPELINE_ONNX_LANE"  # "1" / "0": the ONNX builds on a lane or in front, whatever the host
# (no lane where a stage in front consumes what it makes, whatever the switch)


def plan_stages(recipe: Recipe, recipe_dir: Path, overlap: bool | None = None) -> list[Stage]:
    """`overlap`: put the ONNX builds on a lane (default: $PIPELINE_ONNX_LANE if set, else where this host has
    a CUDA GPU: a small CPU host has no core to spare for them). The lane changes when the builds run, never
    what they make."""
    from pipeline.bench.hosts import has_cuda

    if overlap is None and os.environ.get(LANE_SWITCH) in ("0", "1"):
        overlap = os.environ[LANE_SWITCH] == "1"
    variants = needed_variants(recipe)
    built = [(name, stage) for name, build in BUILDS.items() for stage in build(recipe, recipe_dir, variants)]
    stages = [stage for _, stage in built]
    if has_cuda() if overlap is None else overlap:
        laned = [
            replace(stage, background=True, lane=ONNX_LANE) if name in ONNX_BUILDS else stage
            for name, stage in built
        ]
        if _lane_feeds_only_late_stages(laned):
            stages = laned
    artifacts = [v.name for v in variants]
    return stages + [check(recipe, recipe_dir, artifacts) for check in CHECKS.values()]


def _lane_feeds_only_late_stages(stages: list[Stage]) -> bool:
    """Whether no stage off the lane waits in front for what the lane makes (a TensorRT engine build from an
    ONNX graph would: then the lane would only move the same work out of the process, so there is none)."""
    made = {name for stage in stages if stage.lane for name in stage.produces}
    return not any(not stage.lane and made & set(stage.consumes) for stage in stages)
