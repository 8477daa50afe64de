"""ONNX export with a symbolic axis per dynamic dim, named as the recipe names it.

The dynamo exporter is the default; the legacy TorchScript-based exporter is a recipe option and the fallback,
and when it is used as a fallback the dynamo error is recorded. Node stack traces (absolute source paths) are
dropped so that the bytes do not depend on where the code lives."""

from __future__ import annotations

from pathlib import Path

import onnx
import torch

from pipeline.onnx_tools import captured
from pipeline.recipe import Recipe
from pipeline.stages.base import (
    ArtifactRecord,
    Output,
    RunContext,
    Stage,
    StageResult,
    model_data_slice,
    package_version,
)
from pipeline.stages.export_torchscript import corner_args

_DROPPED_NODE_METADATA = ("pkg.torch.onnx.stack_trace",)


def _dynamo_export(ctx: RunContext, path: Path) -> None:
    recipe = ctx.recipe
    dims = {name: torch.export.Dim(name, min=rng.min, max=rng.max) for name, rng in recipe.dims.items()}
    dynamic = tuple(
        {axis: dims[d] for axis, d in enumerate(spec.shape) if isinstance(d, str)} for spec in recipe.inputs
    )
    example = corner_args(
        ctx,
        "opt",
        batch=max(2, recipe.dims[recipe.benchmark.batch_dim].opt)
        if recipe.benchmark.batch_dim in recipe.dims
        else None,
    )
    program = torch.onnx.export(
        ctx.model().module,
        example,
        dynamo=True,
        dynamic_shapes=(dynamic,),
        input_names=[s.name for s in recipe.inputs],
        output_names=list(recipe.outputs),
        opset_version=recipe.export.onnx.opset,
        external_data=False,
        optimize=True,
        verbose=False,
    )
    program.save(str(path), external_data=False)


def _legacy_export(ctx: RunContext, path: Path) -> None:
    recipe = ctx.recipe
    axes = {
        spec.name: {a: d for a, d in enumerate(spec.shape) if isinstance(d, str)} for spec in recipe.inputs
    }
    torch.onnx.export(
        ctx.model().module,
        corner_args(ctx, "opt", batch=2),
        str(path),
        dynamo=False,
        input_names=[s.name for s in recipe.inputs],
        output_names=list(recipe.outputs),
        dynamic_axes=axes,
        opset_version=recipe.export.onnx.opset,
        do_constant_folding=True,
    )


def name_dynamic_axes(model: onnx.ModelProto, recipe: Recipe) -> None:
    """Give every dynamic axis the recipe's dim name (exporters invent s0, s1 …), on inputs and outputs."""
    renames: dict[str, str] = {}
    specs = {s.name: s for s in recipe.inputs}
    for value in model.graph.input:
        spec = specs.get(value.name)
        if spec is None:
            continue
        for axis, dim in zip(spec.shape, value.type.tensor_type.shape.dim, strict=False):
            if isinstance(axis, str):
                if dim.dim_param:
                    renames[dim.dim_param] = axis
                dim.dim_param = axis
    for value in [*model.graph.output, *model.graph.value_info]:
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param in renames:
                dim.dim_param = renames[dim.dim_param]


def _strip_location_metadata(model: onnx.ModelProto) -> None:
    for node in model.graph.node:
        kept = [p for p in node.metadata_props if p.key not in _DROPPED_NODE_METADATA]
        del node.metadata_props[:]
        node.metadata_props.extend(kept)


def _run(ctx: RunContext, inputs: dict[str, ArtifactRecord]) -> StageResult:
    cfg = ctx.recipe.export.onnx
    target = ctx.path("model.onnx")
    details: dict = {"exporter": cfg.exporter, "opset": cfg.opset}
    with captured(ctx.path("logs/export_onnx.log")):
        if cfg.exporter == "dynamo":
            ctx.report("onnx: exporting with the dynamo exporter")
            try:
                _dynamo_export(ctx, target)
            except Exception as exc:  # noqa: BLE001 - any exporter failure is a reason to fall back
                if not cfg.fallback:
                    raise
                details["exporter"] = "legacy"
                details["fallback_reason"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:500]}"
                ctx.report("onnx: dynamo export failed, falling back to the legacy exporter")
                _legacy_export(ctx, target)
        else:
            ctx.report("onnx: exporting with the legacy exporter")
            _legacy_export(ctx, target)
    model = onnx.load(str(target))
    name_dynamic_axes(model, ctx.recipe)
    _strip_location_metadata(model)
    onnx.checker.check_model(model, full_check=False)
    onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    onnx.save(model, str(target))
    details.update(
        nodes=len(model.graph.node),
        inputs=[i.name for i in model.graph.input],
        outputs=[o.name for o in model.graph.output],
    )
    return StageResult(
        outputs=[
            Output("model.onnx", "onnx", "onnx-fp32", "fp32", details),
            Output("logs/export_onnx.log", "log"),
        ],
        details=details,
    )


def stage(recipe: Recipe, recipe_dir: Path) -> Stage:
    return Stage(
        name="export_onnx",
        version=1,
        run=_run,
        config={
            "onnx": recipe.export.onnx.model_dump(),
            **model_data_slice(recipe, recipe_dir),
        },
        environment=lambda: {
            "torch": torch.__version__,
            "onnx": onnx.__version__,
            "onnxscript": package_version("onnxscript"),
            "transformers": package_version("transformers"),
        },
        produces=("onnx-fp32",),
    )
