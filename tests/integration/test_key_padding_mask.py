"""A key-padding mask (True marks padding, as nn.TransformerEncoder takes it): validation.padding_value 1 makes
per-token outputs compare on real tokens. Without it the deploy compared padded positions, where PyTorch's fast
path writes zeros and the exports compute real values, and failed every export of a model they reproduce."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.integration.test_deploy_cli import cli

RECIPE = """
name: keypad
model: {source: entrypoint, entrypoint: "tests.models.tiny:key_padding_encoder"}
inputs:
  - {name: tokens, dtype: int64, shape: [batch, sequence]}
  - {name: src_key_padding_mask, dtype: bool, shape: [batch, sequence]}
dims:
  batch: {min: 1, opt: 4, max: 4}
  sequence: {min: 16, opt: 16, max: 16}
outputs: [hidden]
data:
  samples: {source: npz, path: samples.npz}
  calibration: 8
  validation: 8
variants:
  build: [onnx-fp32]
  required: [onnx-fp32]
validation:
  padding_mask: src_key_padding_mask
  corner_batches: {min: 4, opt: 4, max: 4}
benchmark:
  batch_sizes: [1]
  warmup_s: 0.02
  min_s: 0.05
  window_s: 0.02
  max_s: 0.2
"""


def _recipe(folder: Path) -> Path:
    rng = np.random.default_rng(0)
    lengths = rng.integers(4, 16, size=16)
    lengths[0] = 16  # one row without padding: the fast path needs a batch that is not all full
    pad = np.arange(16)[None] >= lengths[:, None]
    np.savez(folder / "samples.npz", tokens=rng.integers(0, 500, size=(16, 16)), src_key_padding_mask=pad)
    (folder / "keypad.yaml").write_text(RECIPE)
    return folder / "keypad.yaml"


def test_a_key_padding_mask_compares_real_tokens_with_padding_value_one(tmp_path: Path) -> None:
    recipe = _recipe(tmp_path)
    marked = cli("deploy", str(recipe), "--set", "validation.padding_value=1", root=tmp_path / "one")
    assert marked.returncode == 0, marked.stdout[-3000:] + marked.stderr[-3000:]
    unmarked = cli("deploy", str(recipe), root=tmp_path / "zero")  # zeros read as padding: the real tokens
    assert unmarked.returncode == 1, unmarked.stdout[-3000:]
    assert "required variant onnx-fp32 failed at validate: hidden" in unmarked.stdout


def test_padding_aware_runs_refuse_a_key_padding_mask(tmp_path: Path) -> None:
    recipe = _recipe(tmp_path)
    result = cli(
        "validate",
        str(recipe),
        "--set",
        "validation.padding_value=1",
        "--set",
        "runtime.padding={mask_input: src_key_padding_mask, per_token_outputs: [hidden]}",
    )
    assert result.returncode == 2
    assert (
        "runtime.padding.mask_input: 'src_key_padding_mask' marks padding with 1"
        in result.stdout + result.stderr
    )
