"""Packed ONNX graphs (`onnx-packed-fp32`, `onnx-packed-fp16`): the model run on a batch's real tokens only.

Padded text spends most of its compute on padding; padding-aware groups (pipeline/runners/bucketing.py) cut
that per group of lengths, a packed graph cuts all of it: every projection and feed-forward layer runs on one
row of the batch's real tokens, attention runs per sentence (pipeline/inputs/packed_model.py). Before export
the packed model is run beside the padded one on the recipe's data: a model that mixes tokens outside its
attention is refused here, with the difference, instead of failing validation with a graph that never could
pass. The graph is run in a child at the recipe's smallest and largest shapes, as the plain export is.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnx
import torch

from pipeline.core.artifacts import ArtifactRecord
from pipeline.core.errors import StageError, plain
from pipeline.core.packages import package_version
from pipeline.core.packing import Packing, grid_names
from pipeline.core.variants import Variant, parse
from pipeline.decide.verdict import WEIGHTS
from pipeline.inputs.export_dims import example_batch
from pipeline.inputs.packed_model import (
    PackedModel,
    check_exact,
    packed_attention_on,
    position_rule,
    why_not_packable,
)
from pipeline.inputs.specs import DataSpec, ModelSpec
from pipeline.recipe import Fp16Export, OnnxExport, PaddingConfig, Recipe
from pipeline.stages.base import Output, RunContext, Stage, StageConfig, StageResult
from pipeline.stages.export_onnx import corner_batches
from pipeline.stages.fp16 import convert, onnxruntime_check
from pipeline.toolchain import onnx_tools, ort_probe
from pipeline.toolchain.capture import captured

if TYPE_CHECKING:
    from pipeline.inputs.data import Dataset

FP32, FP16 = parse("onnx-packed-fp32"), parse("onnx-packed-fp16")
TOKENS = "packed_tokens"  # the dynamic axis of the packed row, as the graph names it
LONGEST = "longest"  # the longest sentence of a batch


class PackedExportConfig(StageConfig):
    onnx: OnnxExport
    fp16: Fp16Export | None  # None: the FP16 copy is not asked for
    padding: PaddingConfig
    model: ModelSpec
    data: DataSpec

    @classmethod
    def from_recipe(cls, recipe: Recipe, recipe_dir: Path, fp16: bool) -> PackedExportConfig:
        assert recipe.runtime.padding is not None  # the recipe checks refuse a packed variant without it
        return cls(
            onnx=recipe.export.onnx,
            fp16=recipe.export.fp16 if fp16 else None,
            padding=recipe.runtime.padding,
            model=ModelSpec.from_recipe(recipe, recipe_dir),
            data=DataSpec.from_recipe(recipe, recipe_dir),
        )


def packing_of(model: ModelSpec, padding: PaddingConfig, data: DataSpec, module: torch.nn.Module) -> Packing:
    """The layout this recipe's batches pack into: the mask, the inputs with a sequence axis, the positions."""
    mask, seq = padding.mask_input, data.sequence_dim
    per_token = tuple(
        s.name for s in model.inputs if len(s.shape) > 1 and s.shape[1] == seq and s.name != mask
    )
    rule, offset = position_rule(module)
    position_input = "position_ids" if "position_ids" in per_token else None
    return Packing(
        mask, per_token, rule, offset, position_input, padding.max_groups, padding.group_overhead_tokens
    )


def longest_sentence(model: ModelSpec, data: DataSpec) -> int | None:
    """The recipe's longest sequence (a local attention window must cover it), None without a sequence dim."""
    seq = data.sequence_dim
    return model.dims[seq].max if seq in model.dims else None


def checked_samples(
    name: str,
    module: torch.nn.Module,
    packing: Packing,
    model: ModelSpec,
    dataset: Dataset,
    per_token: list[str],
) -> list[dict[str, np.ndarray]]:
    """The recipe's batches the packed model was run on beside the padded one (up to two validation batches),
    once it is shown to reproduce it there; a model it cannot pack, or whose packed run differs, fails the
    variant `name` with the reason before anything is exported."""
    outputs = list(model.outputs)
    why = why_not_packable(module, packing, outputs, per_token, longest_sentence(model, dataset.spec))
    if why:
        raise StageError(f"{name}: {why}")
    batch_dim = dataset.spec.batch_dim
    batch = example_batch(model, batch_dim)
    samples = dataset.validation_feeds(batch or 1)[:2] or [dataset.corner_feeds("opt", batch)]
    reference = PackedModel(module, packing, model.input_names, outputs).eval()
    with torch.inference_mode():
        for feeds in samples:
            problem = check_exact(module, reference, feeds, packing, per_token)
            if problem:
                raise StageError(
                    f"{name}: packing does not reproduce this model ({problem}): the packed model assumes "
                    "each sentence's tokens meet only in attention, and positions by column or from the padding "
                    "index; this model works another way"
                )
    return samples


def real_token_share(packing: Packing, samples: list[dict[str, np.ndarray]]) -> float:
    """The share of real tokens in the checked batches, for the artifact's record."""
    real, padded = zip(*(packing.example_count(f) for f in samples), strict=True)
    return round(sum(real) / sum(padded), 4)


def _dynamic_axes(packing: Packing, config: PackedExportConfig) -> dict[str, dict[int, str]]:
    axes: dict[str, dict[int, str]] = {}
    for s in config.model.inputs:
        if s.name in packing.per_token and s.name != packing.mask:
            axes[s.name] = {1: TOKENS}
        else:
            axes[s.name] = {a: d for a, d in enumerate(s.shape) if isinstance(d, str)}
    axes["pack_positions"] = {1: TOKENS}
    axes["pack_layout"] = axes[packing.mask]
    axes["pack_tokens"] = {0: TOKENS}
    for g, name in enumerate(grid_names(packing.groups)):
        axes[name] = {0: f"sentences_{g}", 1: f"length_{g}"}
    return axes


def _export(
    packed: PackedModel, feeds: dict[str, np.ndarray], config: PackedExportConfig, path: Path
) -> None:
    names = packed.graph_inputs()
    example = packed.packing.pack(feeds)
    axes = {n: a for n, a in _dynamic_axes(packed.packing, config).items() if n in names}
    torch.onnx.export(
        packed,
        tuple(torch.from_numpy(example[n]) for n in names),
        str(path),
        dynamo=False,  # the legacy exporter traces the packed attention's index arithmetic as it runs
        input_names=names,
        output_names=list(config.model.outputs),
        dynamic_axes=axes,
        opset_version=config.onnx.opset,
        do_constant_folding=True,
    )


def _run(ctx: RunContext, config: PackedExportConfig, inputs: dict[str, ArtifactRecord]) -> StageResult:
    loaded = ctx.model(config.model)
    module, dataset = loaded.module, ctx.dataset(config.data)
    outputs, per_token = list(config.model.outputs), list(config.padding.per_token_outputs)
    packing = packing_of(config.model, config.padding, config.data, module)
    samples = checked_samples("onnx-packed", module, packing, config.model, dataset, per_token)
    packed = PackedModel(module, packing, config.model.input_names, outputs).eval()
    target = ctx.path(FP32.file)
    ctx.report("onnx-packed: exporting the packed model")
    with (
        captured(ctx.path("logs/export_packed.log")),
        packed_attention_on(module, packing),
        torch.inference_mode(),
    ):
        try:
            _export(packed, samples[0], config, target)
        except Exception as exc:  # noqa: BLE001 - the exporter's failure is this variant's, with its reason
            raise StageError(
                f"onnx-packed: the export failed: {type(exc).__name__}: {plain(str(exc))[:400]}"
            ) from None
    model = onnx.load(str(target))
    onnx_tools.drop_initializer_value_info(model)
    onnx.checker.check_model(model, full_check=False)
    onnx.save(model, str(target))
    corners = corner_batches(config.model, config.data.batch_dim)
    problem = ort_probe.corner_problem(
        target, {c: packing.pack(dataset.corner_feeds(c, b)) for c, b in corners.items()}
    )
    if problem:
        raise StageError(f"onnx-packed: the packed graph does not run at the recipe's shapes: {problem}")
    details = {
        "exporter": "legacy",
        "opset": config.onnx.opset,
        WEIGHTS: loaded.weights_digest(),
        "packing": packing.to_json(),
        "inputs": [i.name for i in model.graph.input],
        "nodes": len(model.graph.node),
        "real_token_share": real_token_share(packing, samples),
    }
    result = [Output(FP32.file, FP32.format, FP32.name, "fp32", details)]
    if config.fp16 is not None:
        result.append(_fp16(ctx, config.fp16, model, details))
    result.append(Output("logs/export_packed.log", "log"))
    return StageResult(outputs=result, details=details)


def _fp16(ctx: RunContext, cfg: Fp16Export, model: onnx.ModelProto, fp32: dict) -> Output:
    """The packed graph in float16, converted as the plain FP16 graph is (pipeline/stages/fp16.py)."""
    ctx.report("onnx-packed: converting the packed graph to float16")
    converted = convert(model, cfg)
    share = onnx_tools.fp16_node_share(converted)
    if share == 0:
        raise StageError("onnx-packed: no node of the FP16 packed graph computes in float16")
    target = ctx.path(FP16.file)
    onnx_tools.save(converted, target)
    details = {
        **{k: fp32[k] for k in ("packing", WEIGHTS, "real_token_share")},
        "fp16_node_share": share,
        "onnxruntime_cpu": onnxruntime_check(target),
    }
    return Output(FP16.file, FP16.format, FP16.name, "fp16", details)


def stages(recipe: Recipe, recipe_dir: Path, variants: list[Variant]) -> list[Stage]:
    names = {v.name for v in variants}
    if FP32.name not in names:
        return []
    fp16 = FP16.name in names
    return [
        Stage(
            name="export_packed",
            version=2,  # CHANGELOG.md, "Stage versions"
            config=PackedExportConfig.from_recipe(recipe, recipe_dir, fp16),
            run=_run,
            environment=lambda: {
                "torch": torch.__version__,
                "onnx": onnx.__version__,
                "transformers": package_version("transformers"),
                "onnxruntime": package_version("onnxruntime"),
            },
            produces=(FP32.name, *((FP16.name,) if fp16 else ())),
        )
    ]
