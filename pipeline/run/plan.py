"""The plan: which stages a recipe asks for, in dependency order.

The registry is a plain table of stage factories in plan order. A build factory takes the recipe and the
variants the plan needs and returns the stages for those it builds, each declaring what it produces; the
checks (validate, benchmark, select, and sign-off last) take the artifact names they work on."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from pipeline.core import host
from pipeline.core.variants import Variant, parse
from pipeline.inputs.specs import resolved_variant
from pipeline.recipe import Recipe
from pipeline.stages import (
    benchmark,
    export_onnx,
    export_packed,
    export_packed_pt2,
    export_pt2,
    export_torchscript,
    fp16,
    int8,
    int8_dynamic,
    int8_mixed,
    load,
    optimize_onnx,
    select,
    signoff,
    tensorrt,
    validate,
)
from pipeline.stages.base import Stage, on_lane

BuildFactory = Callable[[Recipe, Path, list[Variant]], list[Stage]]
CheckFactory = Callable[[Recipe, Path, list[str]], Stage | None]  # None: not asked for by this recipe

BUILDS: dict[str, BuildFactory] = {
    "export_torchscript": export_torchscript.stages,
    # early: its AOTInductor compile (tens of seconds) runs in the background while the ONNX exports go on,
    # instead of beside validation; after the TorchScript export, whose eager checks on all CPU threads the
    # compile's parallel phase would slow; TensorRT builds wait for it (placed alone: they time tactics)
    "export_pt2": export_pt2.stages,
    "export_packed_pt2": export_packed_pt2.stages,
    "export_onnx": export_onnx.stages,
    "export_packed": export_packed.stages,
    "fp16": fp16.stages,
    "int8": int8.stages,
    "int8_dynamic": int8_dynamic.stages,
    "int8_mixed": int8_mixed.stages,  # placed alone: it times its mixes
    "optimize_onnx": optimize_onnx.stages,
    "tensorrt": tensorrt.stages,
}
CHECKS: dict[str, CheckFactory] = {
    "validate": validate.stage,
    "benchmark": benchmark.stage,
    "select": select.stage,
    "load": load.stage,  # only where benchmark.scenarios holds server; after select (the winner is a candidate),
    # except under max_qps_at_p99, where select ranks what load measures (in_dependency_order)
    "signoff": signoff.stage,
}


def requested_variants(recipe: Recipe) -> list[str]:
    """variants.build, plus variants.gpu where this host has a CUDA GPU."""
    from pipeline.bench.hosts import gpu_only_variants

    return [*recipe.variants.build, *(gpu_only_variants(recipe) if host.has_cuda() else [])]


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
# PyTorch side's validation in front (torch.compile takes tens of seconds of one core), instead of before it.
ONNX_LANE = "onnx"
ONNX_BUILDS = ("export_onnx", "export_packed", "fp16", "int8", "int8_dynamic", "optimize_onnx")


LANE_SWITCH = "PIPELINE_ONNX_LANE"  # "1" / "0": the ONNX builds on a lane or in front, whatever the host
# (no lane where a stage in front consumes what it makes, whatever the switch)


def plan_stages(recipe: Recipe, recipe_dir: Path, overlap: bool | None = None) -> list[Stage]:
    """`overlap`: put the ONNX builds on a lane (default: $PIPELINE_ONNX_LANE if set, else where this host has
    a CUDA GPU: a small CPU host has no core to spare for them). The lane changes when the builds run, never
    what they make."""
    if overlap is None and os.environ.get(LANE_SWITCH) in ("0", "1"):
        overlap = os.environ[LANE_SWITCH] == "1"
    variants = needed_variants(recipe)
    built = [(name, stage) for name, build in BUILDS.items() for stage in build(recipe, recipe_dir, variants)]
    stages = [stage for _, stage in built]
    if host.has_cuda() if overlap is None else overlap:
        laned = [
            replace(stage, placement=on_lane(ONNX_LANE)) if name in ONNX_BUILDS else stage
            for name, stage in built
        ]
        if _lane_feeds_only_late_stages(laned):
            stages = laned
    artifacts = [v.name for v in variants]
    checks = [check(recipe, recipe_dir, artifacts) for check in CHECKS.values()]
    return stages + in_dependency_order([found for found in checks if found is not None])


def in_dependency_order(stages: list[Stage]) -> list[Stage]:
    """The stages in their given order, except that a stage which uses what a later one produces moves after it
    (stable: nothing else moves). A cycle keeps the given order: the executor reports what is missing."""
    placed: list[Stage] = []
    pending = list(stages)
    while pending:
        later = {name for stage in pending for name in stage.produces}
        ready = next(
            (s for s in pending if not ({*s.consumes, *s.consumes_any} & (later - set(s.produces)))),
            pending[0],
        )
        placed.append(ready)
        pending.remove(ready)
    return placed


def _lane_feeds_only_late_stages(stages: list[Stage]) -> bool:
    """Whether no stage off the lane waits in front for what the lane makes (a TensorRT engine build from an
    ONNX graph would: then the lane would only move the same work out of the process, so there is none)."""
    made = {name for stage in stages if stage.lane for name in stage.produces}
    return not any(not stage.lane and made & set(stage.consumes) for stage in stages)
