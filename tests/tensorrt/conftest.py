"""Fixtures for engine builds: the tiny encoder exported to ONNX at fp32, fp16 (float16 graph) and int8 (Q/DQ)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from pipeline.core.artifacts import ArtifactRecord
from pipeline.recipe.loader import load
from pipeline.run.plan import needed_variants
from pipeline.stages.base import RunContext, Stage
from pipeline.stages.tensorrt import stages
from pipeline.toolchain.trt.flavour import installed_flavours

TINY = Path(__file__).parents[1] / "recipes" / "tiny.yaml"
ONNX_FILES = {"fp32": "model.onnx", "fp16": "model.fp16.onnx", "int8": "model.int8.onnx"}

needs_rtx = pytest.mark.skipif(
    "tensorrt-rtx" not in installed_flavours(),
    reason="TensorRT-RTX builder not installed (pip install 'deploy-pipeline[tensorrt-rtx]')",
)


def tiny_recipe(*overrides: str):
    base = [
        "variants.build=[onnx-fp32, onnx-fp16, onnx-int8, tensorrt-rtx-fp32, tensorrt-rtx-fp16, tensorrt-rtx-int8]"
    ]
    return load(TINY, [*base, *overrides]).recipe


def record(name: str, path: Path, precision: str) -> ArtifactRecord:
    return ArtifactRecord(
        name, path, "onnx", precision, hashlib.sha256(path.read_bytes()).hexdigest(), "test", {}
    )


def context(recipe, root: Path) -> RunContext:
    """A context laid out like the store's: <root>/<name>/.work/<run-id>."""
    return RunContext(root / recipe.name / ".work" / "run-1")


def engine_stages(recipe, recipe_dir: Path = TINY.parent) -> dict[str, Stage]:
    """The engine stages the plan makes for the recipe, by name."""
    return {s.name: s for s in stages(recipe, recipe_dir, needed_variants(recipe))}


def run(stage: Stage, ctx: RunContext, inputs: dict[str, ArtifactRecord]):
    return stage.run(ctx, stage.config, inputs)


def _export(recipe, path: Path) -> None:
    import torch

    from pipeline.inputs.models import load_model
    from pipeline.inputs.specs import ModelSpec

    module = load_model(ModelSpec.from_recipe(recipe, TINY.parent)).module.eval()
    ids = torch.randint(1, 999, (2, 16))
    dynamic = {n: {0: "batch", 1: "sequence"} for n in ("input_ids", "attention_mask")}
    torch.onnx.export(
        module,
        (ids, torch.ones_like(ids)),
        str(path),
        input_names=["input_ids", "attention_mask"],
        output_names=list(recipe.outputs),
        dynamic_axes=dynamic,
        opset_version=18,
        dynamo=False,
    )


def _fp16(recipe, src: Path, dst: Path) -> None:
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = convert_float_to_float16(
        onnx.load(str(src)), keep_io_types=True, op_block_list=list(recipe.export.fp16.block_ops)
    )
    onnx.save(model, str(dst))


def _int8(src: Path, dst: Path) -> None:
    """Static Q/DQ in the form TensorRT accepts: no int32 bias DequantizeLinear (QuantizeBias False)."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    rng = np.random.default_rng(0)
    batches = [
        {
            "input_ids": rng.integers(1, 999, (2, 16)).astype(np.int64),
            "attention_mask": np.ones((2, 16), np.int64),
        }
        for _ in range(4)
    ]

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.batches = iter(batches)

        def get_next(self):
            return next(self.batches, None)

    quantize_static(
        str(src),
        str(dst),
        Reader(),
        quant_format=QuantFormat.QDQ,
        activation_type=QuantType.QInt8,
        weight_type=QuantType.QInt8,
        per_channel=True,
        op_types_to_quantize=["MatMul"],
        extra_options={
            "QuantizeBias": False,
            "ActivationSymmetric": True,
            "WeightSymmetric": True,
            "AddQDQPairToWeight": True,
            "DedicatedQDQPair": True,
        },
    )


@pytest.fixture(scope="session")
def tiny_onnx(tmp_path_factory) -> dict[str, ArtifactRecord]:
    """onnx-fp32, onnx-fp16 and onnx-int8 records of the tiny encoder."""
    folder = tmp_path_factory.mktemp("tiny-onnx")
    recipe = tiny_recipe()
    paths = {p: folder / f for p, f in ONNX_FILES.items()}
    _export(recipe, paths["fp32"])
    _fp16(recipe, paths["fp32"], paths["fp16"])
    _int8(paths["fp32"], paths["int8"])
    return {f"onnx-{p}": record(f"onnx-{p}", path, p) for p, path in paths.items()}
