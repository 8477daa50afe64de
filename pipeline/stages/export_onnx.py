"""ONNX export with a symbolic axis per dynamic dim, named as the recipe names it.

The dynamo exporter is the default; the legacy TorchScript-based exporter is a recipe option and the fallback,
and when it is used as a fallback the dynamo error is recorded. Node stack traces (absolute source paths) are
dropped so that the bytes do not depend on where the code lives."""

from __future__ import annotations

import re
from pathlib import Path

import onnx
import torch

from pipeline.core.artifacts import ArtifactRecord
from pipeline.core.errors import StageError, plain
from pipeline.core.packages import package_version
from pipeline.core.variants import Variant, parse
from pipeline.decide.verdict import STAGE_WARNINGS, WEIGHTS
from pipeline.inputs.data import Dataset
from pipeline.inputs.export_dims import dynamic_shapes, example_batch
from pipeline.inputs.models import positional
from pipeline.inputs.specs import DataSpec, ModelSpec, dim_sizes
from pipeline.recipe import InputSpec, OnnxExport, Recipe
from pipeline.stages.base import Output, RunContext, Stage, StageConfig, StageResult
from pipeline.toolchain import ort_probe
from pipeline.toolchain.capture import captured
from pipeline.toolchain.onnx_tools import PROTOBUF_LIMIT, drop_initializer_value_info

_DROPPED_NODE_METADATA = ("pkg.torch.onnx.stack_trace",)
FILE = parse("onnx-fp32").file


class OnnxExportConfig(StageConfig):
    onnx: OnnxExport
    model: ModelSpec
    data: DataSpec

    @classmethod
    def from_recipe(cls, recipe: Recipe, recipe_dir: Path) -> OnnxExportConfig:
        return cls(
            onnx=recipe.export.onnx,
            model=ModelSpec.from_recipe(recipe, recipe_dir),
            data=DataSpec.from_recipe(recipe, recipe_dir),
        )


def _example(config: OnnxExportConfig, dataset: Dataset, batch: int | None) -> tuple[torch.Tensor, ...]:
    return positional(dataset.corner_feeds("opt", batch), config.model)


def _dynamo_export(ctx: RunContext, config: OnnxExportConfig, path: Path) -> None:
    spec, batch_dim = config.model, config.data.batch_dim
    dynamic = dynamic_shapes(spec)
    batch = example_batch(spec, batch_dim)
    program = torch.onnx.export(
        ctx.model(spec).module,
        _example(config, ctx.dataset(config.data), batch),
        dynamo=True,
        dynamic_shapes=(dynamic,),
        input_names=spec.input_names,
        output_names=list(spec.outputs),
        opset_version=config.onnx.opset,
        external_data=False,
        optimize=True,
        verbose=False,
    )
    program.save(str(path), external_data=False)


def _fixed_dynamic_axes(model: onnx.ModelProto, spec: ModelSpec) -> str | None:
    """Where the dynamo exporter fixed an axis the recipe declares dynamic: torch.export specializes a dim the
    model depends on (a loop over the length, a size it computes, a weight of that size) and the graph then
    runs at the example's size only. The corner run would fail on it as well, with ONNX Runtime's "invalid dimensions";
    this says which dim and why, which a user can act on."""
    graph_inputs = {value.name: value.type.tensor_type.shape.dim for value in model.graph.input}
    fixed: dict[tuple[str, int], list[str]] = {}  # (dim, the size it was fixed at) -> "input axis i"
    for input_spec in spec.inputs:
        for axis, (name, dim) in enumerate(
            zip(input_spec.shape, graph_inputs.get(input_spec.name, []), strict=False)
        ):
            rng = spec.dims.get(name) if isinstance(name, str) else None
            if rng is not None and rng.min < rng.max and dim.HasField("dim_value"):
                fixed.setdefault((name, dim.dim_value), []).append(f"{input_spec.name} axis {axis}")
    if not fixed:
        return None
    where = "; ".join(
        f"'{name}' ({spec.dims[name].min}..{spec.dims[name].max} in the recipe) at {size} on {', '.join(axes)}"
        for (name, size), axes in fixed.items()
    )
    return (
        f"the graph fixes {where}: torch.export found the model needs that size (its code loops or branches on "
        "it, computes a size from it, or a weight's shape ties it); declare the dim fixed (min equal to "
        "max under dims, or the size as an integer in the input's shape), or remove the dependency"
    )


def corner_batches(spec: ModelSpec, batch_dim: str) -> dict[str, int | None]:
    """The batch an export is run at, at the smallest and the largest shape: the recipe's smallest batch, and
    at most 2 at the largest (its other dims at their largest are the point; memory is not)."""
    if batch_dim not in spec.dims:
        return {"min": None, "max": None}
    dim = spec.dims[batch_dim]
    return {"min": dim.min, "max": dim.clamp(2)}


def _corner_run(
    ctx: RunContext, config: OnnxExportConfig, path: Path
) -> tuple[str | None, list[CornerShapes]]:
    """Why the exported graph does not run at the smallest, the opt or the largest shape the recipe allows, or
    None; with the dims' sizes and the graph's output shapes at each run (name_output_axes). The dynamo
    exporter may specialize a dim it was told is dynamic (an LSTM's sequence length was baked into a Reshape);
    the graph then fails only at another length, so it is run at both corners and at opt, in a child."""
    dataset = ctx.dataset(config.data)
    batches = corner_batches(config.model, config.data.batch_dim)
    batches["opt"] = _third_batch(config.model, config.data.batch_dim, set(batches.values()))
    feeds = {c: dataset.corner_feeds(c, b) for c, b in batches.items()}
    problem, shapes = ort_probe.corner_run(path, feeds)
    return problem, [(dim_sizes(config.model.inputs, feeds[c]), shapes[c]) for c in feeds if c in shapes]


def _third_batch(spec: ModelSpec, batch_dim: str, used: set[int | None]) -> int | None:
    """The batch of the run at the recipe's opt shapes: one the corners did not use where the range allows
    (they run 1 and 2 by default), so that an output axis of those sizes is not taken for the batch."""
    if batch_dim not in spec.dims:
        return None
    dim = spec.dims[batch_dim]
    return next((b for b in (3, dim.opt, dim.max) if dim.min <= b <= dim.max and b not in used), dim.opt)


def _legacy_export(ctx: RunContext, config: OnnxExportConfig, path: Path) -> None:
    spec = config.model
    axes = {s.name: {a: d for a, d in enumerate(s.shape) if isinstance(d, str)} for s in spec.inputs}
    torch.onnx.export(
        ctx.model(spec).module,
        _example(config, ctx.dataset(config.data), example_batch(spec, config.data.batch_dim) or 2),
        str(path),
        dynamo=False,
        input_names=spec.input_names,
        output_names=list(spec.outputs),
        dynamic_axes=axes,
        opset_version=config.onnx.opset,
        do_constant_folding=True,
    )


def name_dynamic_axes(model: onnx.ModelProto, inputs: list[InputSpec]) -> None:
    """Give every dynamic axis the recipe's dim name (exporters invent s0, s1 …), on inputs and outputs."""
    renames: dict[str, str] = {}
    specs = {s.name: s for s in inputs}
    for value in model.graph.input:
        spec = specs.get(value.name)
        if spec is None:
            continue
        for axis, dim in zip(spec.shape, value.type.tensor_type.shape.dim, strict=False):
            if isinstance(axis, str) and not dim.HasField(
                "dim_value"
            ):  # a fixed dim (min = max) stays a size
                if dim.dim_param:
                    renames[dim.dim_param] = axis
                dim.dim_param = axis
    for value in [*model.graph.output, *model.graph.value_info]:
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param in renames:
                dim.dim_param = renames[dim.dim_param]


# (recipe dim -> size, output -> shape) at a corner
CornerShapes = tuple[dict[str, int], dict[str, list[int]]]


def name_output_axes(model: onnx.ModelProto, runs: list[CornerShapes]) -> None:
    """Name each output axis after the recipe dim it follows, or fix its size, where the exporter gave it a
    name of its own: the TorchScript-based exporter names output axes after the node that made them
    ('Divpooled_dim_0'), so nothing downstream could tell an output's batch axis (a Triton config without
    batching) or its fixed width. Read from the graph's own outputs at the corner check's three runs (min, max,
    and opt at a third batch): an axis takes a dim's name only where it has that dim's size at every run, and
    no other dim's; an axis that matches no dim, or more than one, keeps its name."""
    dims = runs[0][0]
    for value in model.graph.output:
        seen = [shapes.get(value.name) for _, shapes in runs]
        axes = value.type.tensor_type.shape.dim
        if any(shape is None or len(shape) != len(axes) for shape in seen):
            continue
        for axis, dim in enumerate(axes):
            if dim.HasField("dim_value") or dim.dim_param in dims:
                continue
            sizes = [shape[axis] for shape in seen]
            followed = [d for d in dims if [run[d] for run, _ in runs] == sizes]
            if len(set(sizes)) > 1 and len(followed) == 1:
                dim.dim_param = followed[0]
            elif len(set(sizes)) == 1 and not followed:  # the same size at every run, and no dim's size
                dim.dim_value = sizes[0]


def _check_self_contained(model: onnx.ModelProto, weights_only: bool = False) -> None:
    """Every ONNX artifact here is one self-contained file (each stage reads, writes, stores and hashes that one
    file), and protobuf cannot serialize past 2 GB. An exporter writes a larger graph's weights to a file beside
    it instead, and onnx's checker then fails on the loaded model with a message about its own API; this says
    which model it is, how large, and what makes it so."""
    # weights_only: the exporter's graph, still holding the metadata the stage strips before saving
    size = sum(t.ByteSize() for t in model.graph.initializer) if weights_only else model.ByteSize()
    if size <= PROTOBUF_LIMIT:
        return
    subject, verb = ("the exported graph's weights", "are") if weights_only else ("the exported graph", "is")
    weights = sorted(model.graph.initializer, key=lambda t: t.ByteSize(), reverse=True)[:3]
    largest = ", ".join(f"{t.name} {list(t.dims)} {_gib(t.ByteSize())}" for t in weights)
    raise StageError(
        f"onnx: {subject} ({FILE}) {verb} {_gib(size)} ({size} bytes), which exceeds the 2 GB limit of a "
        "self-contained ONNX file, the only form the ONNX stages here read and write: leave the ONNX variants "
        f"out of variants.build, or make the model's weights smaller (the largest: {largest})"
    )


def _gib(size: int) -> str:
    return f"{size / 2**30:.2f} GiB"


def _strip_location_metadata(model: onnx.ModelProto) -> None:
    for node in model.graph.node:
        kept = [p for p in node.metadata_props if p.key not in _DROPPED_NODE_METADATA]
        del node.metadata_props[:]
        node.metadata_props.extend(kept)


def _reason(exc: Exception) -> str:
    """An exporter's failure on one line. torch.export's message opens with a generic banner: its cause is under
    "Exception summary". The FX node it was executing and the traceback after the cause are the exporter's
    insides (a hold-out's sign-off quoted a stack cut off mid-path): the innermost frame says where, in the
    model's code, it failed."""
    text = plain(str(exc)).split("## Exception summary", 1)[-1]
    text, _, trace = text.partition("Original traceback:")
    text = text.split("While executing %", 1)[0]
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return f"{type(exc).__name__}: {' '.join(lines)[:500]}{_innermost_frame(trace)}"


def _innermost_frame(trace: str) -> str:
    frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)', trace)
    if not frames:
        return ""
    path, line, function = frames[-1]
    return f" (in {function}, {Path(path).name} line {line})"


def _run(ctx: RunContext, config: OnnxExportConfig, inputs: dict[str, ArtifactRecord]) -> StageResult:
    cfg = config.onnx
    target = ctx.path(FILE)
    details: dict = {"exporter": cfg.exporter, "opset": cfg.opset}
    details[WEIGHTS] = ctx.model(config.model).weights_digest()  # the weights this process exports
    corners: list[CornerShapes] = []
    model = None  # the dynamo graph, parsed once: checked for fixed dims, then finished below if it is kept
    with captured(ctx.path("logs/export_onnx.log")):
        if cfg.exporter == "dynamo":
            ctx.report("onnx: exporting with the dynamo exporter")
            try:
                _dynamo_export(ctx, config, target)
                why = None
            except Exception as exc:  # noqa: BLE001 - any exporter failure is a reason to fall back
                why = _reason(exc)
            if not why:
                model = onnx.load(str(target))
                # before the corner run: the legacy graph would be as large
                _check_self_contained(model, weights_only=True)
                why = _fixed_dynamic_axes(model, config.model)
            # a full disk here is the deploy's, not dynamo's: raised, not a reason to fall back
            if not why:
                why, corners = _corner_run(ctx, config, target)
            if why:
                if not cfg.fallback:
                    raise StageError(f"onnx: the dynamo export failed: {why}")
                details["exporter"] = "legacy"
                details["fallback_reason"] = why
                details[STAGE_WARNINGS] = [
                    f"exported with the legacy (TorchScript-based) exporter, as the dynamo export failed: "
                    f"{why}"
                ]
                model = None  # the legacy graph replaces it on disk
                ctx.report(f"onnx: dynamo export failed ({why[:200]}), falling back to the legacy exporter")
                try:
                    _legacy_export(ctx, config, target)
                except Exception as exc:  # both reasons: dynamo's is often the one a user can act on
                    raise StageError(
                        f"onnx: neither exporter gave a graph: dynamo: {why}; legacy: {_reason(exc)}"
                    ) from exc
                legacy, corners = _corner_run(ctx, config, target)
                if legacy:  # one failure here, with both reasons, not one per graph made from it downstream
                    raise StageError(
                        f"onnx: neither exporter gave a graph that runs at the recipe's shapes: dynamo: {why}; "
                        f"legacy: {legacy}"
                    )
        else:
            ctx.report("onnx: exporting with the legacy exporter")
            _legacy_export(ctx, config, target)
            legacy, corners = _corner_run(ctx, config, target)
            if legacy:
                raise StageError(f"onnx: the legacy export does not run at the recipe's shapes: {legacy}")
    if model is None:
        model = onnx.load(str(target))
    name_dynamic_axes(model, config.model.inputs)
    if details["exporter"] == "legacy" and len(corners) == 3:  # dynamo's own names say more (a data-
        # dependent u0, an expression of dims) than sizes seen at three shapes
        name_output_axes(model, corners)
    _strip_location_metadata(model)
    # value_info restating initializers: ONNX Runtime 1.31's quantizer re-infers a Gemm's per-channel weights
    # against them and fails ("Inferred shape and existing shape differ"); the initializers say it all
    drop_initializer_value_info(model)
    _check_self_contained(model)
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
            Output(FILE, "onnx", "onnx-fp32", "fp32", details),
            Output("logs/export_onnx.log", "log"),
        ],
        details=details,
    )


def stages(recipe: Recipe, recipe_dir: Path, variants: list[Variant]) -> list[Stage]:
    if not any(v.name == "onnx-fp32" for v in variants):
        return []
    return [
        Stage(
            name="export_onnx",
            version=7,  # CHANGELOG.md, "Stage versions"
            config=OnnxExportConfig.from_recipe(recipe, recipe_dir),
            run=_run,
            environment=lambda: {
                "torch": torch.__version__,
                "onnx": onnx.__version__,
                "onnxscript": package_version("onnxscript"),
                "transformers": package_version("transformers"),
            },
            produces=("onnx-fp32",),
        )
    ]
