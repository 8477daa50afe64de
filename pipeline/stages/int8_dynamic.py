"""Dynamically quantized INT8 ONNX for ONNX Runtime on the CPU: int8 weights stored once, activations
quantized per call (DynamicQuantizeLinear + MatMulInteger). No calibration data, and on the CPU the fastest
ONNX variant for encoders; TensorRT cannot use it (no MatMulInteger), onnx-int8 is the TensorRT graph.

Weights are quantized per output channel (per-tensor weights cost accuracy for no speed) and unsigned: signed
weights run on x86 CPUs without VNNI through an instruction that saturates, so a signed-weight file's accuracy
would depend on the CPU that serves it (docs/benchmarking.md has the figures for both)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from pipeline.check.graph_check import GraphRejected, check_graph
from pipeline.core.artifacts import ArtifactRecord
from pipeline.core.errors import StageError
from pipeline.core.variants import Variant, parse
from pipeline.recipe import Recipe
from pipeline.stages.base import Output, RunContext, Stage, StageConfig, StageResult
from pipeline.toolchain import onnx_tools
from pipeline.toolchain.capture import captured

FILE = parse("onnx-int8-dynamic").file
LOG = "logs/int8_dynamic.log"
SETTINGS: dict[str, Any] = {
    "op_types": ["MatMul", "Gemm"],
    "weight_type": "QUInt8",
    "per_channel": True,
    "MatMulConstBOnly": True,
}


class Int8DynamicConfig(StageConfig):
    """Nothing of the recipe: the quantizer's fixed settings (a change to them must re-run the stage)."""

    settings: dict[str, Any]


def quantize(source: Path, target: Path, nodes: list[str] | None = None) -> None:
    """`nodes`: quantize only these (None: every weight MatMul and Gemm)."""
    try:
        from onnxruntime.quantization import QuantType, quantize_dynamic
    except ImportError as exc:
        raise StageError(
            f"int8_dynamic: needs onnxruntime ({exc}); pip install 'deploy-pipeline[cpu]'"
        ) from exc
    quantize_dynamic(
        str(source),
        str(target),
        op_types_to_quantize=SETTINGS["op_types"],
        per_channel=SETTINGS["per_channel"],
        weight_type=QuantType[SETTINGS["weight_type"]],  # SETTINGS is what the fingerprint holds
        nodes_to_quantize=nodes,
        extra_options={"MatMulConstBOnly": SETTINGS["MatMulConstBOnly"]},
    )


WEIGHT_OPS = ("MatMul", "Gemm", "Conv", "ConvTranspose")  # a weight layer's op, its weight the second input


def quantized_count(counts: dict[str, int]) -> int:
    """Nodes that compute in INT8 in a graph the dynamic quantizer made (`onnx_tools.op_counts`): what it
    makes of a weight MatMul or Gemm."""
    return counts.get("MatMulInteger", 0) + counts.get("com.microsoft.DynamicQuantizeMatMul", 0)


def _run(ctx: RunContext, config: Int8DynamicConfig, inputs: dict[str, ArtifactRecord]) -> StageResult:
    target = ctx.path(FILE)
    ctx.report("int8_dynamic: quantizing weights")
    with tempfile.TemporaryDirectory(prefix="int8-dynamic-") as tmp, captured(ctx.path(LOG)):
        try:
            quantize(inputs["onnx-fp32"].path, Path(tmp) / FILE)
        except StageError:
            raise
        except Exception as exc:  # noqa: BLE001 - this variant's failure, with the quantizer's message
            raise StageError(f"int8_dynamic: quantization failed: {type(exc).__name__}: {exc}") from exc
        model = onnx_tools.load(Path(tmp) / FILE)
        # the quantizer orders nodes by their own inputs only: a Loop or If body's captured names can end up
        # produced after the node that holds the body (an EmbeddingBag's weight rows)
        onnx_tools.topological_sort(model.graph)
        try:
            check_graph(model)
        except GraphRejected as exc:
            raise StageError(f"int8_dynamic: the quantized graph is unusable: {exc}") from exc
    counts = onnx_tools.op_counts(model)
    quantized = quantized_count(counts)
    if not quantized:  # an "INT8" artifact that is its FP32 graph would be timed and chosen as INT8
        floats = counts.get("MatMul", 0) + counts.get("Gemm", 0)
        found = (
            f"none of this graph's {floats} MatMul/Gemm node(s) has a float32 weight"
            if floats
            else "this graph has no MatMul or Gemm node"
        )
        raise StageError(
            f"int8_dynamic: nothing was quantized: this variant quantizes MatMul and Gemm nodes with float32 "
            f"weights, and {found} (convolutions are quantized by onnx-int8, with calibration)"
        )
    onnx_tools.save(model, target)
    details = {
        "target": "onnxruntime",
        "quantized_count": quantized,
        # beside quantized_count, how much of the model the 8 bits cover: the weight layers left in float
        # (a CNN's dynamic INT8 quantizes its classifier's Gemm and none of its convolutions)
        "weight_layers": quantized + len(onnx_tools.weight_ops(model, WEIGHT_OPS)),
        "dynamic_quantize_linear": counts.get("DynamicQuantizeLinear", 0),
        "float_matmuls": counts.get("MatMul", 0) + counts.get("Gemm", 0),
        "op_counts": counts,
        "settings": SETTINGS,
    }
    return StageResult(
        outputs=[Output(FILE, "onnx", "onnx-int8-dynamic", "int8", details), Output(LOG, "log")],
        details=details,
    )


def stages(recipe: Recipe, recipe_dir: Path, variants: list[Variant]) -> list[Stage]:
    if not any(v.name == "onnx-int8-dynamic" for v in variants):
        return []
    return [
        Stage(
            name="int8_dynamic",
            version=5,  # CHANGELOG.md, "Stage versions"
            config=Int8DynamicConfig(settings=SETTINGS),
            run=_run,
            environment=onnx_tools.onnx_environment,
            consumes=("onnx-fp32",),
            produces=("onnx-int8-dynamic",),
        )
    ]
