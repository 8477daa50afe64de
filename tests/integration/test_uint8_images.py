"""An image model fed its bytes (uint8 [batch, 3, height, width], tests/models/images.py) deploys end to end:
random samples drawn over every byte value, uint8 graph inputs in the FP32, FP16 and INT8 exports (the FP16
graph without FP32 I/O turns its float output to float16, never the bytes in), and each artifact answers real
bytes in a real ONNX Runtime session or TorchScript as the model does."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from pipeline.inputs.models import load_model
from pipeline.inputs.specs import ModelSpec
from pipeline.recipe.loader import load
from tests.claims import problems
from tests.integration.test_deploy_cli import cli

RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "byte_images.yaml"
GRAPHS = {"onnx-fp32": "model.onnx", "onnx-fp16": "model.fp16.onnx", "onnx-int8": "model.int8.onnx"}
FLOAT, HALF, UINT8 = onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.UINT8


@pytest.fixture(scope="module")
def deployed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the recipe, the signed-off version folder)."""
    folder = tmp_path_factory.mktemp("bytes")
    result = cli("deploy", str(RECIPE), root=folder / "out")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return RECIPE, folder / "out/bytes/v0001"


@pytest.fixture(scope="module")
def images() -> np.ndarray:
    """Bytes at a shape between the corners, every value 0..255 among them."""
    return np.random.default_rng(1).integers(0, 256, size=(3, 3, 20, 28), dtype=np.uint8)


def test_the_image_model_signs_off_with_every_artifact_validated(deployed: tuple[Path, Path]) -> None:
    _, version = deployed
    accuracy = json.loads((version / "reports/accuracy.json").read_text())
    for name in ("torchscript-fp32", *GRAPHS):
        assert accuracy["artifacts"][name]["passed"], (name, accuracy["artifacts"][name]["reason"])
    assert problems(version) == []


def test_random_samples_cover_every_byte_value(deployed: tuple[Path, Path]) -> None:
    """No low/high in the recipe: drawn in a float's default 0..1, every image would be black (0 or 1)."""
    _, version = deployed
    image = json.loads((version / "reports/accuracy.json").read_text())["inputs"]["image"]
    assert image["dtype"] == "uint8" and image["min"] == 0 and image["max"] == 255, image
    assert image["distinct"] == 256, image


def test_every_graph_takes_uint8_and_answers_bytes_as_the_model_does(
    deployed: tuple[Path, Path], images: np.ndarray
) -> None:
    recipe, version = deployed
    model = load_model(ModelSpec.from_recipe(load(recipe).recipe, recipe.parent)).module
    with torch.no_grad():
        (expected,) = model(torch.from_numpy(images))
    for name, file in GRAPHS.items():
        graph = onnx.load(str(version / file))
        (image,), (logits,) = graph.graph.input, graph.graph.output
        assert image.type.tensor_type.elem_type == UINT8, name
        assert logits.type.tensor_type.elem_type == (HALF if name == "onnx-fp16" else FLOAT), name
        session = ort.InferenceSession(str(version / file), providers=["CPUExecutionProvider"])
        (got,) = session.run(None, {"image": images})
        cosine = torch.nn.functional.cosine_similarity(torch.from_numpy(got).float(), expected).min().item()
        assert cosine > {"onnx-fp32": 0.99999, "onnx-fp16": 0.999, "onnx-int8": 0.98}[name], (name, cosine)
    scripted = torch.jit.load(str(version / "model.ts"))
    with torch.no_grad():
        (traced,) = scripted(torch.from_numpy(images))
    torch.testing.assert_close(traced, expected)
