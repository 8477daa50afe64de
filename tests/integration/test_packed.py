"""Packed tokens: a padded batch run as one row of its real tokens reproduces the padded model on every real
token and on pooled outputs, for transformers models that number positions either way; a model that mixes
tokens outside attention is refused before export; a deploy builds, validates and times the packed graphs on
their own runtime, and says why a model it cannot pack is not packed."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.core.packing import Packing, grid_names
from pipeline.inputs.models import Bound
from pipeline.inputs.packed_model import PackedModel, check_exact, position_rule, why_not_packable
from tests.integration.test_deploy_cli import cli
from tests.zoo import models as zoo

NAMES = ["input_ids", "attention_mask"]


class _Spec:
    """The two fields Bound reads of a ModelSpec."""

    def __init__(self, outputs: list[str]):
        self.input_names = NAMES
        self.outputs = outputs
        self.inputs = [type("Input", (), {"name": n})() for n in NAMES]


def _padded(batch: int, full: int, seed: int, pad_id: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, full + 1, size=batch)
    lengths[0] = 0  # a row of padding only
    mask = (np.arange(full)[None] < lengths[:, None]).astype(np.int64)
    ids = rng.integers(3, 500, size=(batch, full)).astype(np.int64)
    ids[mask == 0] = pad_id
    return {"input_ids": ids, "attention_mask": mask}


def _bound(factory, outputs: list[str]) -> Bound:
    torch.manual_seed(0)
    return Bound(factory().eval(), _Spec(outputs), by_name=True).eval()  # type: ignore[arg-type]


def test_packing_lays_every_real_token_out_once() -> None:
    feeds = _padded(7, 12, seed=3)
    packing = Packing("attention_mask", ("input_ids",), groups=3, overhead=4)
    packed = packing.pack(feeds)
    real = feeds["attention_mask"] != 0
    real[:, 0] |= ~real.any(axis=1)  # the empty row keeps one token
    tokens = int(real.sum())
    assert packed["input_ids"].shape == (1, tokens)
    assert np.array_equal(packed["input_ids"][0], feeds["input_ids"][real])
    assert np.array_equal(packed["pack_positions"][0], np.nonzero(real)[1])  # each token's own column
    layout = packed["pack_layout"]
    assert np.array_equal(np.sort(layout[real]), np.arange(tokens)) and (layout[~real] == tokens).all()
    grids = [packed[name] for name in grid_names(3)]
    slots = np.concatenate([g.reshape(-1) for g in grids])
    assert np.array_equal(np.sort(slots[slots < tokens]), np.arange(tokens))  # every token in one grid slot
    assert np.array_equal(slots[packed["pack_tokens"]], np.arange(tokens))  # and pack_tokens finds it there
    for grid in grids:  # a grid holds whole sentences, each row one sentence's tokens in order
        for row in grid:
            mine = row[row < tokens]
            assert len(mine) == 0 or np.array_equal(mine, np.arange(mine[0], mine[0] + len(mine)))


@pytest.mark.parametrize("factory", [zoo.bert, zoo.roberta, zoo.distilbert], ids=lambda f: f.__name__)
@pytest.mark.parametrize("groups", [1, 4])
def test_the_packed_model_reproduces_the_padded_one(factory, groups: int) -> None:
    module = _bound(factory, ["last_hidden_state"])
    rule, offset = position_rule(module)
    if factory is zoo.roberta:
        assert (rule, offset) == (
            "offset",
            module.inner.config.pad_token_id + 1,
        )  # positions from padding_idx
    packing = Packing("attention_mask", ("input_ids",), rule, offset, None, groups, 4)
    assert why_not_packable(module, packing, ["last_hidden_state"], ["last_hidden_state"]) is None
    packed = PackedModel(module, packing, NAMES, ["last_hidden_state"]).eval()
    pad = module.inner.config.pad_token_id or 0
    with torch.inference_mode():
        for seed in range(3):
            assert (
                check_exact(module, packed, _padded(6, 16, seed, pad), packing, ["last_hidden_state"]) is None
            )


def test_wrong_positions_are_caught() -> None:
    """RoBERTa numbered by column: the check that runs before export finds the difference."""
    module = _bound(zoo.roberta, ["last_hidden_state"])
    packing = Packing("attention_mask", ("input_ids",), "column", 0)
    packed = PackedModel(module, packing, NAMES, ["last_hidden_state"]).eval()
    with torch.inference_mode():
        problem = check_exact(module, packed, _padded(4, 16, 0, 1), packing, ["last_hidden_state"])
    assert problem and problem.startswith("output 'last_hidden_state' differs by")


class _MixesTokens(torch.nn.Module):
    """A transformers encoder whose output adds the row's mean: tokens meet outside attention."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = zoo.bert()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.inner(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return hidden + hidden.mean(dim=1, keepdim=True)


def test_models_that_cannot_be_packed_say_why() -> None:
    packing = Packing("attention_mask", ("input_ids",))
    pooled = _bound(zoo.bert, ["last_hidden_state", "pooler_output"])
    why = why_not_packable(pooled, packing, ["last_hidden_state", "pooler_output"], ["last_hidden_state"])
    assert why and "output 'pooler_output' is not per-token" in why
    torch.manual_seed(0)
    mixed = Bound(_MixesTokens().eval(), _Spec(["out"]), by_name=True)  # type: ignore[arg-type]
    assert "_MixesTokens wraps BertModel in code of its own" in str(
        why_not_packable(mixed, packing, ["out"], ["out"])
    )  # a hold-out's pooling wrapper around DeBERTa read "this is not one"
    plain = Bound(torch.nn.Linear(4, 4), _Spec(["out"]), by_name=False)  # type: ignore[arg-type]
    assert "needs a transformers model" in str(why_not_packable(plain, packing, ["out"], ["out"]))


def test_a_model_that_mixes_tokens_outside_attention_is_refused() -> None:
    from transformers import BertModel

    class MeanOverRow(BertModel):
        """A transformers encoder that adds the row's mean to every token: the packed row is every sentence."""

        def forward(self, input_ids=None, attention_mask=None, position_ids=None, **kwargs):
            out = super().forward(
                input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, **kwargs
            )
            out.last_hidden_state = out.last_hidden_state + out.last_hidden_state.mean(dim=1, keepdim=True)
            return out

    torch.manual_seed(0)
    mixing = Bound(MeanOverRow(zoo.bert().config).eval(), _Spec(["last_hidden_state"]), by_name=True).eval()  # type: ignore[arg-type]
    packing = Packing("attention_mask", ("input_ids",))
    assert why_not_packable(mixing, packing, ["last_hidden_state"], ["last_hidden_state"]) is None
    packed = PackedModel(mixing, packing, NAMES, ["last_hidden_state"]).eval()
    with torch.inference_mode():
        problem = check_exact(mixing, packed, _padded(4, 16, 1), packing, ["last_hidden_state"])
    assert problem and "differs by" in problem


RECIPE = """
name: packed
model: {{source: entrypoint, entrypoint: "tests.zoo.models:{model}", family: transformer}}
inputs:
  - {{name: input_ids, dtype: int64, shape: [batch, sequence]}}
  - {{name: attention_mask, dtype: int64, shape: [batch, sequence]}}
dims:
  batch: {{min: 1, opt: 4, max: 8}}
  sequence: {{min: 4, opt: 16, max: 16}}
outputs: [{outputs}]
data:
  samples: {{source: npz, path: samples.npz}}
  calibration: 8
  validation: 16
variants:
  build: [onnx-fp32, onnx-packed-fp32, onnx-packed-fp16]
  required: [onnx-fp32]
validation:
  corner_batches: {{min: 1, opt: 2, max: 1}}
  data_batch: 4
  padding_mask: attention_mask
benchmark:
  batch_sizes: [1, 8]
  warmup_s: 0.02
  min_s: 0.05
  window_s: 0.02
  max_s: 0.2
selection:
  objective: {{metric: p50_ms, batch: 8}}
runtime:
  padding: {{mask_input: attention_mask, per_token_outputs: [last_hidden_state]}}
"""


def _recipe(folder: Path, model: str, outputs: str) -> Path:
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 17, size=40)
    mask = (np.arange(16)[None] < lengths[:, None]).astype(np.int64)
    ids = rng.integers(3, 500, size=(40, 16)).astype(np.int64) * mask
    np.savez(folder / "samples.npz", input_ids=ids, attention_mask=mask)
    path = folder / "packed.yaml"
    path.write_text(RECIPE.format(model=model, outputs=outputs))
    return path


def test_a_deploy_builds_validates_and_times_the_packed_graphs(tmp_path: Path) -> None:
    result = cli("deploy", str(_recipe(tmp_path, "roberta", "last_hidden_state")), root=tmp_path / "out")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    version = tmp_path / "out" / "packed" / "v0001"
    manifest = json.loads((version / "manifest.json").read_text())
    kinds = {a["name"]: a["kind"] for a in manifest["artifacts"]}
    assert kinds["onnx-packed-fp32"] == kinds["onnx-packed-fp16"] == "onnx-packed"
    packed = next(a for a in manifest["artifacts"] if a["name"] == "onnx-packed-fp32")
    assert packed["details"]["packing"]["positions"] == "offset"  # RoBERTa's numbering, found from the model
    accuracy = json.loads((version / "reports" / "accuracy.json").read_text())
    for name in ("onnx-packed-fp32", "onnx-packed-fp16"):
        validated = accuracy["artifacts"][name]["runtimes"]["onnxruntime-cpu-packed"]
        assert validated["passed"] is True
        # Polygraphy's cross-check compares real tokens only, as the gates do (padded positions are zeros)
        assert validated["polygraphy"]["last_hidden_state"]["passed"] is True
    speed = json.loads((version / "reports" / "speed.json").read_text())
    rows = [r for r in speed["results"] if r["artifact"] == "onnx-packed-fp32" and r["batch"] == 8]
    assert rows and rows[0]["runtime"] == "onnxruntime-cpu-packed"
    assert rows[0]["runtime_details"]["packing"]["packed"] == "on every call"
    real, padded = (
        rows[0]["runtime_details"]["packing"]["real_tokens"],
        rows[0]["runtime_details"]["packing"]["padded_tokens"],
    )
    assert 0 < real < padded == 8 * 16


def test_a_model_it_cannot_pack_fails_that_variant_with_the_reason(tmp_path: Path) -> None:
    result = cli(
        "deploy",
        str(_recipe(tmp_path, "bert", "last_hidden_state, pooler_output")),
        "--set",
        "variants.build=[onnx-fp32, onnx-packed-fp32]",
        root=tmp_path / "out",
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "onnx-packed: output 'pooler_output' is not per-token" in result.stdout


def test_a_packed_variant_needs_the_padding_settings(tmp_path: Path) -> None:
    recipe = _recipe(tmp_path, "bert", "last_hidden_state")
    recipe.write_text(recipe.read_text().split("runtime:")[0])
    result = cli("validate", str(recipe))
    assert result.returncode == 2
    assert "variants.build[1]: onnx-packed-fp32 packs each batch's real tokens: it needs runtime.padding" in (
        result.stdout + result.stderr
    )


def _llama(window: int | None = None) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaModel, MistralConfig, MistralModel

    sizes = dict(
        vocab_size=512,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,  # grouped-query attention
        max_position_embeddings=64,
    )
    if window is None:
        return LlamaModel(LlamaConfig(**sizes))
    return MistralModel(MistralConfig(**sizes, sliding_window=window))


@pytest.mark.parametrize(("factory", "output"), [(zoo.gpt2, "logits"), (_llama, "last_hidden_state")])
def test_causal_models_pack_with_a_causal_grid(factory, output: str) -> None:
    """A decoder's attention module is causal: each grid row attends to its sentence's earlier tokens only
    (the first version attended over the whole sentence and was refused with a reason that was not true)."""
    module = _bound(factory, [output])
    packing = Packing("attention_mask", ("input_ids",), *position_rule(module), None, 4, 4)
    assert why_not_packable(module, packing, [output], [output], 16) is None
    packed = PackedModel(module, packing, NAMES, [output]).eval()
    with torch.inference_mode():
        for seed in range(2):
            assert check_exact(module, packed, _padded(6, 16, seed), packing, [output]) is None


def test_a_local_attention_window_shorter_than_the_sequences_is_refused() -> None:
    module = _bound(lambda: _llama(window=8), ["last_hidden_state"])
    packing = Packing("attention_mask", ("input_ids",))
    why = why_not_packable(module, packing, ["last_hidden_state"], ["last_hidden_state"], 16)
    assert why == (
        "MistralModel attends within a local window of 8 tokens, shorter than the recipe's sequences (up to 16); "
        "the packed attention attends over whole sentences"
    )
    assert why_not_packable(module, packing, ["last_hidden_state"], ["last_hidden_state"], 8) is None
