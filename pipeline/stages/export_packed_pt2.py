"""Packed tokens for the compiled PyTorch path: `exported-packed-fp16` (a torch.export program of the packed
model) and `aoti-packed-fp16` (its AOTInductor package for this host's device).

The packed ONNX graph (pipeline/stages/export_packed.py) lays sentences out in grids for attention, because an
ONNX graph has no variable-length attention. PyTorch has one: FlashAttention's varlen kernel reads each
sentence's span of the packed row directly, so nothing is gathered, masked or scattered around attention
(pipeline/inputs/packed_model.py, `varlen_attention`; the layout is pipeline/core/packing.py's `varlen`).

The kernel exists on CUDA only (Ampere on), in FP16 and BF16. The model is traced on the device the package is
built for: on such a GPU the graph holds the kernel; elsewhere it holds the same spans as a block-diagonal
mask (quadratic in a batch's tokens: right for checks and small batches, not for speed), and details.attention
says which, read from the traced graph. Before export the
packed model is run beside the padded one in FP32 on the CPU, as the ONNX packing is: a model that mixes tokens
outside attention is refused with the difference.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipeline.core import host
from pipeline.core.artifacts import ArtifactRecord
from pipeline.core.errors import StageError, plain
from pipeline.core.packages import package_version
from pipeline.core.packing import FLASH_VARLEN, Packing
from pipeline.core.variants import Variant, parse
from pipeline.decide.verdict import WEIGHTS
from pipeline.inputs.export_dims import input_axes, symbolic_dims
from pipeline.inputs.packed_model import PackedModel, packed_attention_on
from pipeline.inputs.specs import DataSpec, ModelSpec
from pipeline.recipe import PaddingConfig, Recipe
from pipeline.stages import export_pt2
from pipeline.stages.base import BACKGROUND, Output, RunContext, Stage, StageConfig, StageResult
from pipeline.stages.export_packed import checked_samples, longest_sentence, packing_of, real_token_share
from pipeline.toolchain.capture import captured

EXPORTED, AOTI = parse("exported-packed-fp16"), parse("aoti-packed-fp16")
BUCKET = 64  # the packed row rounds up to this many tokens: one CUDA graph per 64 tokens of a batch's total
MASKED = "block-diagonal mask (scaled_dot_product_attention)"


class PackedPt2Config(StageConfig):
    precision: str
    device: str  # export.pt2.device: auto | cpu | cuda
    fuse_projections: bool
    gelu_epilogue: bool
    conv_epilogue: bool
    mask_input: str  # runtime.padding's: the grid settings there are the ONNX packing's, not read here
    per_token_outputs: list[str]
    model: ModelSpec
    data: DataSpec

    @classmethod
    def from_recipe(cls, recipe: Recipe, recipe_dir: Path) -> PackedPt2Config:
        assert recipe.runtime.padding is not None  # the recipe checks refuse a packed variant without it
        pt2 = recipe.export.pt2
        return cls(
            precision=EXPORTED.precision,
            device=pt2.device,
            fuse_projections=pt2.fuse_projections,
            gelu_epilogue=export_pt2.gelu_epilogue_for(recipe, EXPORTED.precision),
            conv_epilogue=export_pt2.conv_epilogue_for(recipe, EXPORTED.precision),
            mask_input=recipe.runtime.padding.mask_input,
            per_token_outputs=list(recipe.runtime.padding.per_token_outputs),
            model=ModelSpec.from_recipe(recipe, recipe_dir),
            data=DataSpec.from_recipe(recipe, recipe_dir),
        )


def varlen_packing(config: PackedPt2Config, module: torch.nn.Module) -> Packing:
    """The recipe's packing (mask, per-token inputs, positions) with spans for the varlen kernel."""
    padding = PaddingConfig(mask_input=config.mask_input, per_token_outputs=config.per_token_outputs)
    grids = packing_of(config.model, padding, config.data, module)
    # the kernel's bound on a span: the longest sentence, or the filler (up to a bucket of tokens)
    longest = max(longest_sentence(config.model, config.data) or 0, BUCKET)
    return dataclasses.replace(grids, attention="varlen", bucket=BUCKET, longest=longest)


def _attention_in(program: torch.export.ExportedProgram) -> str:
    """Which attention the traced graph holds: read from the graph, not assumed from the device."""
    flash = torch.ops.aten._flash_attention_forward.default
    return FLASH_VARLEN if any(node.target is flash for node in program.graph.nodes) else MASKED


def savable(program: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """FlashAttention's kernel also returns its random-number state as uint64 tensors, which torch.export's
    serializer before torch 2.12 has no dtype for, so saving fails. That state is unused here (no dropout), so
    where the serializer lacks uint64 it is recorded as int64 of the same shape: loading re-traces the kernel
    and gets its real outputs back."""
    from torch._export.serde import serialize

    if torch.uint64 in getattr(serialize, "_TORCH_TO_SERIALIZE_DTYPE", {torch.uint64: None}):
        return program
    flash = torch.ops.aten._flash_attention_forward.default
    for node in program.graph.nodes:
        if node.target is flash and isinstance(node.meta.get("val"), tuple):
            node.meta["val"] = tuple(
                torch.empty_like(v, dtype=torch.int64) if getattr(v, "dtype", None) == torch.uint64 else v
                for v in node.meta["val"]
            )
    return program


def _dynamic(packing: Packing, config: PackedPt2Config, names: list[str]) -> tuple[dict[int, Any], ...]:
    """One symbolic dim per recipe dim, the packed row's length, and the number of spans."""
    dims = symbolic_dims(config.model.dims)
    most = max(r.max for r in config.model.dims.values())
    total = 1
    for r in config.model.dims.values():
        total *= r.max
    row = torch.export.Dim("packed_tokens", min=2, max=total + packing.bucket)
    spans = torch.export.Dim("spans", min=3, max=most + 2)
    shapes = {s.name: s.shape for s in config.model.inputs}
    axes: dict[str, dict[int, Any]] = {}
    for name in names:
        if (name in packing.per_token and name != packing.mask) or name == "pack_positions":
            axes[name] = {1: row}
        elif name == "pack_layout":
            axes[name] = axes[packing.mask]
        elif name == "pack_cu":
            axes[name] = {0: spans}
        else:
            axes[name] = input_axes(shapes[name], dims)
    return tuple(axes[n] for n in names)


def _export(ctx: RunContext, config: PackedPt2Config, inputs: dict[str, ArtifactRecord]) -> StageResult:
    loaded = ctx.model(config.model)
    module, dataset = loaded.module, ctx.dataset(config.data)
    outputs, per_token = list(config.model.outputs), list(config.per_token_outputs)
    packing = varlen_packing(config, module)
    samples = checked_samples(EXPORTED.name, module, packing, config.model, dataset, per_token)
    device = export_pt2.target_device(config.device)
    if device == "cuda" and not host.has_cuda():
        raise StageError(f"{EXPORTED.name}: export.pt2.device is cuda, but this host has no CUDA GPU")
    dtype = export_pt2.DTYPES[config.precision]
    copied = copy.deepcopy(module).to(device=device, dtype=dtype).eval()
    packed = PackedModel(copied, packing, config.model.input_names, outputs).eval()
    wrapped = export_pt2.KeepIoTypes(packed, dtype).eval()
    names = packed.graph_inputs()
    example_feeds = packing.pack(samples[0])
    example = tuple(torch.from_numpy(np.ascontiguousarray(example_feeds[n])).to(device) for n in names)
    dynamic = _dynamic(packing, config, names)
    ctx.report(f"{EXPORTED.name}: torch.export of the packed model on {device}")
    started = time.perf_counter()
    log = "logs/export_packed_pt2.log"
    with captured(ctx.path(log)), packed_attention_on(copied, packing), torch.no_grad():
        try:
            program = torch.export.export(wrapped, example, dynamic_shapes=(dynamic,), strict=False)
        except Exception as exc:  # noqa: BLE001 - the exporter's failure is this variant's, with its reason
            raise StageError(
                f"{EXPORTED.name}: torch.export failed: {type(exc).__name__}: {plain(str(exc))[:400]}"
            ) from None
    details: dict[str, Any] = {
        WEIGHTS: loaded.weights_digest(),
        "precision": config.precision,
        "device": device,
        "attention": _attention_in(program),
        "packing": packing.to_json(),
        "io_dtype": "float32 (floating outputs)",
    }
    program, fused = export_pt2.fuse_as_asked(program, example, dynamic, config)
    details |= fused
    torch.export.save(savable(program), str(ctx.path(EXPORTED.file or "")))
    details["export_s"] = round(time.perf_counter() - started, 2)
    details["real_token_share"] = real_token_share(packing, samples)
    return StageResult(
        outputs=[
            Output(EXPORTED.file or "", EXPORTED.format, EXPORTED.name, config.precision, details),
            Output(log, "log"),
        ],
        details=details,
    )


def stages(recipe: Recipe, recipe_dir: Path, variants: list[Variant]) -> list[Stage]:
    """The packed export where exported-packed-fp16 (or the package built from it) is asked for; the package's
    AOTInductor compile where aoti-packed-fp16 is."""
    names = {v.name for v in variants}
    if EXPORTED.name not in names:
        return []
    out = [
        Stage(
            name="export_packed_pt2",
            version=4,  # CHANGELOG.md, "Stage versions"
            config=PackedPt2Config.from_recipe(recipe, recipe_dir),
            run=_export,
            environment=lambda: {
                "torch": torch.__version__,
                "transformers": package_version("transformers"),
                "gpu": host.gpu_name(),
            },
            produces=(EXPORTED.name,),
        )
    ]
    if AOTI.name in names:
        out.append(
            Stage(
                name="aoti_packed_fp16",
                version=1,  # CHANGELOG.md, "Stage versions"
                config=export_pt2.AotiConfig.from_recipe(recipe, AOTI.precision),
                run=functools.partial(export_pt2.compile_package, source=EXPORTED, target=AOTI),
                environment=export_pt2.aoti_environment(recipe.export.pt2.device),
                consumes=(EXPORTED.name,),
                produces=(AOTI.name,),
                placement=BACKGROUND,
            )
        )
    return out
