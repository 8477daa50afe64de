"""FP16 ONNX: the FP32 graph converted to float16, inputs and outputs kept FP32, overflow-prone ops kept FP32,
and accumulating scatters (ScatterElements / ScatterND with a reduction) kept FP32: ONNX Runtime's CPU provider
loads them in float16 but cannot run them.

Precision has to live in the graph (TensorRT 11 is strongly typed: no FP16 builder flag), so this is the
artifact both ONNX Runtime and the TensorRT builds use. The converter is ONNX Runtime's own
(`onnxruntime.transformers.float16`, the maintained copy of onnxconverter-common's): onnxconverter-common 1.16
leaves `Cast(to=FLOAT)` nodes FP32 while retyping their outputs FP16, which ONNX Runtime refuses to load."""

from __future__ import annotations

from pathlib import Path

import onnx

from pipeline.core.artifacts import ArtifactRecord
from pipeline.core.errors import StageError
from pipeline.core.variants import Variant, parse
from pipeline.recipe import Fp16Export, Recipe
from pipeline.stages.base import Output, RunContext, Stage, StageConfig, StageResult
from pipeline.toolchain import float16_mend, onnx_tools, ort_probe

FILE = parse("onnx-fp16").file


class Fp16Config(StageConfig):
    fp16: Fp16Export

    @classmethod
    def from_recipe(cls, recipe: Recipe) -> Fp16Config:
        return cls(fp16=recipe.export.fp16)


def convert(model: onnx.ModelProto, cfg: Fp16Export) -> onnx.ModelProto:
    """FP16 copy of `model`: float initializers and constants to float16, Cast nodes around blocked ops and
    (with keep_io_types) at the graph's float inputs and outputs; checked and topologically sorted."""
    try:
        from onnxruntime.transformers.float16 import convert_float_to_float16
    except ImportError as exc:
        raise StageError(
            f"fp16: needs onnxruntime ({exc}); install it: pip install 'deploy-pipeline[cpu]'"
        ) from exc
    model = onnx.ModelProto.FromString(model.SerializeToString())
    onnx_tools.drop_initializer_value_info(model)
    onnx_tools.outputs_from_nodes(model)
    converted = convert_float_to_float16(
        model,
        keep_io_types=cfg.keep_io_types,
        op_block_list=onnx_tools.fp16_block_list(cfg.block_ops),
        node_block_list=onnx_tools.fp16_node_block_list(model.graph),
        disable_shape_infer=False,
    )
    float16_mend.mend(converted.graph)
    onnx_tools.topological_sort(converted.graph)
    onnx.checker.check_model(converted)
    onnx.shape_inference.infer_shapes(converted, check_type=True, strict_mode=True)
    return converted


def onnxruntime_check(path: Path) -> str:
    """'ok' when ONNX Runtime (CPU) can load the graph, else its message: recorded, not fatal, since an FP16
    graph can be meant for TensorRT alone (the runners say what can run it). A graph that crashes the runtime
    as it loads fails the variant: no runner may load it in the deploy's process."""
    try:
        return ort_probe.load_problem(path) or "ok"
    except ort_probe.Crashed as exc:
        raise StageError(f"fp16: {exc}; the FP16 graph is not kept") from None


def _run(ctx: RunContext, config: Fp16Config, inputs: dict[str, ArtifactRecord]) -> StageResult:
    cfg = config.fp16
    ctx.report("fp16: converting the FP32 graph to float16")
    model = onnx_tools.load(inputs["onnx-fp32"].path)
    converted = convert(model, cfg)
    share = onnx_tools.fp16_node_share(converted)
    if share == 0:  # a float64 (or integer) graph: the copy computes nothing in float16
        raise StageError(
            "fp16: no node of the converted graph computes in float16 (the converter changes float32 only; "
            "this graph computes in another type)"
        )
    target = ctx.path(FILE)
    onnx_tools.save(converted, target)
    blocked = set(cfg.block_ops)
    details = {
        "fp16_node_share": share,
        "blocked_ops": sorted(blocked),
        "blocked_nodes": sum(n.op_type in blocked for n in converted.graph.node),
        "reducing_scatters_in_fp32": [n.name for n in onnx_tools.reducing_scatter_nodes(converted.graph)],
        "keep_io_types": cfg.keep_io_types,
        "cast_nodes": sum(n.op_type == "Cast" for n in converted.graph.node)
        - sum(n.op_type == "Cast" for n in model.graph.node),
        "initializers": onnx_tools.initializer_dtypes(converted),
        "converter": "onnxruntime.transformers.float16",
        "onnxruntime_cpu": onnxruntime_check(target),
    }
    return StageResult(outputs=[Output(FILE, "onnx", "onnx-fp16", "fp16", details)], details=details)


def stages(recipe: Recipe, recipe_dir: Path, variants: list[Variant]) -> list[Stage]:
    if not any(v.name == "onnx-fp16" for v in variants):
        return []
    return [
        Stage(
            name="fp16",
            version=6,
            config=Fp16Config.from_recipe(recipe),
            run=_run,
            environment=onnx_tools.onnx_environment,
            consumes=("onnx-fp32",),
            produces=("onnx-fp16",),
        )
    ]
