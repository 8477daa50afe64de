"""MiniLM (recipes/bert.yaml) exported with the dynamo exporter, built as a TensorRT-RTX FP32 engine for sm89."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.recipe.loader import load

from .conftest import context, engine_stages, needs_rtx, record, run

pytestmark = [pytest.mark.tensorrt, pytest.mark.slow, needs_rtx]

RECIPES = Path(__file__).parents[2] / "recipes"


def test_minilm_fp32_engine(tmp_path):
    import torch

    from pipeline.inputs.models import load_model
    from pipeline.inputs.specs import ModelSpec

    recipe = load(RECIPES / "bert.yaml", ["variants.build=[onnx-fp32, tensorrt-rtx-fp32]"]).recipe
    module = load_model(ModelSpec.from_recipe(recipe, RECIPES)).module.eval()
    args = tuple(torch.ones(2, 16, dtype=torch.int64) for _ in recipe.inputs)
    batch, seq = torch.export.Dim("batch", min=1, max=64), torch.export.Dim("sequence", min=2, max=256)
    onnx_path = tmp_path / "model.onnx"
    torch.onnx.export(
        module,
        args,
        str(onnx_path),
        input_names=[i.name for i in recipe.inputs],
        output_names=list(recipe.outputs),
        dynamic_shapes=(tuple({0: batch, 1: seq} for _ in recipe.inputs),),
        dynamo=True,
        external_data=False,
        opset_version=18,
    )

    stage = engine_stages(recipe, RECIPES)["tensorrt-rtx-fp32"]
    ctx = context(recipe, tmp_path / "store")
    result = run(stage, ctx, {"onnx-fp32": record("onnx-fp32", onnx_path, "fp32")})
    engine = ctx.workdir / "model.tensorrt-rtx.fp32.engine"
    assert engine.stat().st_size > 50_000_000  # the weights alone are ~90 MB at fp32
    build = json.loads((ctx.workdir / "logs/tensorrt-rtx-fp32.build.json").read_text())
    assert build["profiles"][0]["token_type_ids"] == [[1, 8], [8, 128], [64, 256]]
    assert build["compute_capabilities"] == ["sm89"] and build["layer_count"] > 10
    print(f"MiniLM tensorrt-rtx-fp32: {engine.stat().st_size} bytes, built in {result.details['build_s']} s")
