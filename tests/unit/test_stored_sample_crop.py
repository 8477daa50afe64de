"""Stored samples cropped to a shorter corner keep their real tokens: a left-padded sample (real tokens at the
end, as decoder-only models are fed) cropped from its start held padding only at the min corner, so every
check there compared nothing and passed. The crop now keeps the first window of the most real tokens (where a
left-padded text begins); a right-padded sample keeps its start, as before."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipeline.recipe.loader import load
from tests.stage_env import StageEnv

RECIPE = """
name: cropped
model: {source: entrypoint, entrypoint: "tests.models.tiny:encoder"}
inputs:
  - {name: input_ids, dtype: int64, shape: [batch, sequence], low: 1, high: 99}
  - {name: attention_mask, dtype: int64, shape: [batch, sequence], low: 0, high: 1}
dims:
  batch: {min: 1, opt: 2, max: 4}
  sequence: {min: 4, opt: 8, max: 16}
outputs: [hidden]
data:
  samples: {source: npz, path: samples.npz}
  calibration: 4
  validation: 4
variants:
  build: [onnx-fp32]
  required: []
benchmark:
  batch_sizes: [1]
"""


def _dataset(folder: Path, left: bool, *overrides: str) -> tuple[StageEnv, np.ndarray, np.ndarray]:
    """Eight samples of 12 positions, each real on 6 to 9 tokens, padded on the left or the right."""
    folder.mkdir()
    lengths = np.array([6, 7, 8, 9] * 2)
    positions = np.arange(12)[None]
    real = positions >= 12 - lengths[:, None] if left else positions < lengths[:, None]
    ids = np.where(real, np.arange(1, 13)[None] + 20 * np.arange(8)[:, None], 0)
    np.savez(folder / "samples.npz", input_ids=ids, attention_mask=real.astype(np.int64))
    (folder / "cropped.yaml").write_text(RECIPE)
    env = StageEnv(load(folder / "cropped.yaml", list(overrides)).recipe, folder, folder)
    return env, ids, real


def test_a_left_padded_sample_cropped_to_the_min_corner_keeps_its_first_real_tokens(tmp_path: Path) -> None:
    env, ids, real = _dataset(tmp_path / "left", left=True)
    feeds = env.dataset().corner_feeds("min", 4)
    assert feeds["attention_mask"].shape == (4, 4) and feeds["attention_mask"].all()  # real tokens only
    for row, picked in zip(feeds["input_ids"], env.dataset().validation_index, strict=False):
        start = int(np.argmax(real[picked]))  # where its text begins: ids and mask cropped alike from there
        assert list(row) == list(ids[picked, start : start + 4])


def test_a_right_padded_sample_keeps_its_start_and_is_padded_after_its_end(tmp_path: Path) -> None:
    env, ids, real = _dataset(tmp_path / "right", left=False)
    dataset = env.dataset()
    feeds = dataset.corner_feeds("min", 4)
    assert feeds["attention_mask"].all()
    assert [list(r) for r in feeds["input_ids"]] == [list(ids[i, :4]) for i in dataset.validation_index[:4]]
    longer = dataset.corner_feeds("max", 4)  # 16 positions: the stored 12 and 4 of filler, marked padding
    assert longer["attention_mask"].shape == (4, 16) and not longer["attention_mask"][:, 12:].any()


def test_without_a_padding_mask_the_crop_starts_at_the_start(tmp_path: Path) -> None:
    env, ids, _ = _dataset(tmp_path / "off", True, "validation.padding_mask=null")
    dataset = env.dataset()
    feeds = dataset.corner_feeds("min", 4)
    assert [list(r) for r in feeds["input_ids"]] == [list(ids[i, :4]) for i in dataset.validation_index[:4]]
