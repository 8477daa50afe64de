"""ONNX Runtime's transformer optimizer: fused contrib ops (SkipLayerNormalization, BiasGelu, Attention where
the pattern is found) in FP32 and FP16. These graphs hold com.microsoft ops, so they target ONNX Runtime only
(TensorRT and the quantizers take the plain graph). At opt_level 2 the optimizer first runs ONNX Runtime's own
extended fusions for the CPU provider; level 1 leaves those to session load."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import onnx

from pipeline import onnx_tools
from pipeline.errors import StageError
from pipeline.recipe import Recipe
from pipeline.stages.base import ArtifactRecord, Output, RunContext, Stage, StageResult
from pipeline.stages.fp16 import block_list

FP32_FILE = "model.optimized.onnx"
FP16_FILE = "model.optimized.fp16.onnx"


def optimize(ctx: RunContext, source: Path, fp16: bool) -> tuple[onnx.ModelProto, dict[str, int]]:
    """Run the optimizer (and the FP16 conversion); returns the graph and the fused-op statistics."""
    try:
        from onnxruntime.transformers.optimizer import optimize_model
    except ImportError as exc:
        raise StageError(
            f"optimize_onnx: needs onnxruntime ({exc}); pip install 'deploy-pipeline[cpu]'"
        ) from exc
    cfg = ctx.recipe.export.optimize
    config = ctx.model().config
    with onnx_tools.scratch_cwd():
        optimized = optimize_model(
            str(source.resolve()),
            model_type=cfg.model_type or "bert",
            num_heads=int(config.get("num_attention_heads", 0)),
            hidden_size=int(config.get("hidden_size", 0)),
            opt_level=cfg.opt_level,
            use_gpu=False,
            only_onnxruntime=cfg.model_type is None,  # no transformer fusions for other models
        )
    stats = {k: int(v) for k, v in sorted(optimized.get_fused_operator_statistics().items()) if v}
    if fp16:
        optimized.convert_float_to_float16(
            keep_io_types=ctx.recipe.export.fp16.keep_io_types,
            op_block_list=block_list(ctx.recipe.export.fp16),
        )
    model = optimized.model
    onnx_tools.ensure_opset_imports(model)
    onnx_tools.topological_sort(model.graph)
    onnx.checker.check_model(model)
    return model, stats


def _runner(
    precision: str, file: str, artifact: str
) -> Callable[[RunContext, dict[str, ArtifactRecord]], StageResult]:
    fp16 = precision == "fp16"
    name = f"optimize_onnx_{precision}"

    def run(ctx: RunContext, inputs: dict[str, ArtifactRecord]) -> StageResult:
        ctx.report(f"{name}: running the ONNX Runtime transformer optimizer")
        log = f"logs/{name}.log"
        with onnx_tools.captured(ctx.path(log)):
            model, stats = optimize(ctx, inputs["onnx-fp32"].path, fp16)
        onnx_tools.save(model, ctx.path(file))
        details: dict[str, Any] = {
            "target": "onnxruntime",
            "fused_ops": stats,
            "contrib_ops": {
                k: v for k, v in onnx_tools.op_counts(model).items() if k.startswith("com.microsoft.")
            },
            "opt_level": ctx.recipe.export.optimize.opt_level,
            "model_type": ctx.recipe.export.optimize.model_type,
        }
        if fp16:
            details["fp16_node_share"] = onnx_tools.fp16_node_share(model)
        return StageResult(
            outputs=[Output(file, "onnx", artifact, precision, details), Output(log, "log")], details=details
        )

    return run


def stages(recipe: Recipe, recipe_dir: Path) -> list[Stage]:
    common = {"optimize": recipe.export.optimize.model_dump()}
    return [
        Stage(
            name="optimize_onnx_fp32",
            version=1,
            run=_runner("fp32", FP32_FILE, "onnx-optimized-fp32"),
            config=common,
            environment=onnx_tools.onnx_environment,
            consumes=("onnx-fp32",),
            produces=("onnx-optimized-fp32",),
        ),
        Stage(
            name="optimize_onnx_fp16",
            version=1,
            run=_runner("fp16", FP16_FILE, "onnx-optimized-fp16"),
            config={**common, "fp16": recipe.export.fp16.model_dump()},
            environment=onnx_tools.onnx_environment,
            consumes=("onnx-fp32",),
            produces=("onnx-optimized-fp16",),
        ),
    ]
