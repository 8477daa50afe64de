"""Defaults by model family: BERT-only defaults reach only transformer recipes; sequence lengths come from the
recipe's own dims; INT8 patterns name the module that owns a quantized op, also for a folded Conv+BatchNorm."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from pipeline.recipe.family import FAMILY_DEFAULTS
from pipeline.recipe.loader import load
from pipeline.toolchain import onnx_tools

ROOT = Path(__file__).resolve().parents[2]
CNN = ROOT / "recipes/examples/cnn/cnn.yaml"
BERT_ONLY = FAMILY_DEFAULTS["transformer"]


def _resolved(recipe) -> dict[str, object]:
    return {
        "export.int8.op_types": recipe.export.int8.op_types,
        "export.int8.exclude_feed_forward": recipe.export.int8.exclude_feed_forward,
        "export.optimize.model_type": recipe.export.optimize.model_type,
    }


def test_cnn_recipe_resolves_no_bert_only_default() -> None:
    recipe = load(CNN).recipe
    resolved = _resolved(recipe)
    assert all(resolved[key] != value for key, value in BERT_ONLY.items()), resolved
    assert "Conv" in recipe.export.int8.op_types and recipe.export.int8.exclude == []
    assert recipe.export.optimize.model_type is None and recipe.benchmark.sequence_lengths == []


def test_huggingface_recipe_keeps_the_encoder_defaults(tmp_path: Path) -> None:
    raw = yaml.safe_load((ROOT / "recipes/bert.yaml").read_text())
    del raw["export"]["int8"], raw["export"]["optimize"], raw["benchmark"]["sequence_lengths"]
    path = tmp_path / "bert.yaml"
    path.write_text(yaml.safe_dump(raw))
    (tmp_path / "data").symlink_to(ROOT / "recipes/data")
    recipe = load(path).recipe
    assert _resolved(recipe) == BERT_ONLY
    assert recipe.benchmark.sequence_lengths == [raw["dims"]["sequence"]["opt"]]


def test_declared_family_and_declared_values_win(tmp_path: Path) -> None:
    recipe = load(CNN, ["model.family=transformer"]).recipe
    assert _resolved(recipe) == BERT_ONLY
    mine = load(CNN, ["export.int8.exclude=['*head*']", "export.optimize.model_type=vit"]).recipe
    assert mine.export.int8.exclude == ["*head*"] and mine.export.optimize.model_type == "vit"


@pytest.mark.parametrize("seq_name", ["sequence", "frames"])
def test_sequence_lengths_default_from_the_dims(seq_name: str) -> None:
    """Any dim may be the sequence dim by declaration; its opt is the default length, whatever its range."""
    overrides = [
        f"inputs[0].shape=[batch, 3, 16, {seq_name}]",
        f"dims.{seq_name}={{min: 8, opt: 20, max: 40}}",
    ]
    if seq_name != "sequence":
        overrides.append(f"benchmark.sequence_dim={seq_name}")
    recipe = load(CNN, overrides).recipe
    assert recipe.benchmark.sequence_lengths == [20]


def test_an_explicitly_empty_length_list_is_an_error(tmp_path: Path) -> None:
    from pipeline.core.errors import RecipeError

    with pytest.raises(RecipeError, match="benchmark.sequence_lengths: must name at least one length"):
        load(ROOT / "tests/recipes/tiny.yaml", ["benchmark.sequence_lengths=[]"])


def test_int8_patterns_name_the_conv_not_the_folded_batchnorm(tmp_path: Path) -> None:
    """The dynamo exporter folds BatchNorm into the Conv before it and gives the Conv the BatchNorm's scope."""
    from recipes.examples.cnn.model import build

    torch.manual_seed(0)
    model = build().eval()
    program = torch.onnx.export(
        model,
        (torch.randn(2, 3, 16, 16),),
        dynamo=True,
        dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=8)},),
        input_names=["images"],
        verbose=False,
    )
    program.save(str(tmp_path / "cnn.onnx"), external_data=False)
    graph = onnx_tools.load(tmp_path / "cnn.onnx")
    convs = [n for n in graph.graph.node if n.op_type == "Conv"]
    assert [onnx_tools.module_path(n) for n in convs] == ["1", "5"]  # the BatchNorms' scopes
    selection = onnx_tools.select_nodes(graph, ["Conv", "Gemm"], True, include=["0", "9"], exclude=["1"])
    assert sorted(selection.label(n) for n in selection.quantize) == ["0", "9"]
    assert {selection.label(n) for n in selection.excluded} == {"4"}
