"""The TorchScript trace check compares what validation compares: per-token outputs on real tokens only
(validation.padding_mask). A model that writes 0 at padded positions by a decision in Python (as
nn.TransformerEncoder's fast path does) had its trace refused for padded positions no one reads, and was said to
depend on the input shape. And stored samples padded to a longer corner are padded as padding: a key-padding
mask (True marks padding) padded with False marked the filler as real tokens after the padding, a mask no
caller sends, on which nn.TransformerEncoder's eager run and its trace take different paths."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pipeline.core.errors import StageError
from pipeline.recipe.loader import load
from tests.stage_env import StageEnv

RECIPE = """
name: padded
model: {{source: entrypoint, entrypoint: "tests.models.tiny:{model}"}}
inputs:
  - {{name: tokens, dtype: int64, shape: [batch, sequence]}}
  - {{name: {mask}, dtype: {dtype}, shape: [batch, sequence]}}
dims:
  batch: {{min: 1, opt: 2, max: 4}}
  sequence: {{min: 4, opt: 8, max: 16}}
outputs: [hidden]
data:
  samples: {{source: npz, path: samples.npz}}
  calibration: 8
  validation: 8
variants:
  build: [torchscript-fp32]
  required: []
validation:
  padding_mask: {mask}
  corner_batches: {{min: 1, opt: 2, max: 4}}
benchmark:
  batch_sizes: [1]
"""


def _env(folder: Path, model: str, mask: str, real: np.ndarray, *overrides: str) -> StageEnv:
    """Stored samples of `real`'s length (its rows: True on real tokens), checked at 4, 8 and 16 tokens."""
    folder.mkdir()
    rng = np.random.default_rng(0)
    marks = real if mask == "attention_mask" else ~real
    np.savez(
        folder / "samples.npz",
        tokens=rng.integers(0, 500, size=real.shape),
        **{mask: marks.astype(np.int64 if mask == "attention_mask" else bool)},
    )
    dtype = "int64" if mask == "attention_mask" else "bool"
    (folder / "padded.yaml").write_text(RECIPE.format(model=model, mask=mask, dtype=dtype))
    return StageEnv(load(folder / "padded.yaml", list(overrides)).recipe, folder, folder)


def _real(lengths: list[int], width: int) -> np.ndarray:
    return np.arange(width)[None] < np.array(lengths)[:, None]


# every sample real on its first 8 tokens (the trace's example has no padding), padded after
AFTER_EIGHT = _real([16, 9, 12, 10, 16, 11, 13, 9] * 3, 16)


def test_padded_positions_are_left_out_of_the_trace_check(tmp_path: Path) -> None:
    env = _env(tmp_path / "masked", "padding_zeroed_in_python", "attention_mask", AFTER_EIGHT)
    assert not env.dataset().corner_feeds("max", 4)["attention_mask"].all()  # the check sees padding at max
    details = env.run_named("export_torchscript").outputs[0].details
    assert details["check_on"] == "real tokens"
    assert details["check_max_abs"]["max"] <= details["check_tolerance"]["max"]


def test_without_a_padding_mask_every_position_is_compared(tmp_path: Path) -> None:
    env = _env(
        tmp_path / "unmasked",
        "padding_zeroed_in_python",
        "attention_mask",
        AFTER_EIGHT,
        "validation.padding_mask=null",
    )
    with pytest.raises(StageError) as raised:
        env.run_named("export_torchscript")
    assert str(raised.value).startswith("traced module (cpu) disagrees with eager: max abs diff "), (
        raised.value
    )


def test_a_disagreement_on_real_tokens_says_that_padding_was_left_out(tmp_path: Path) -> None:
    """A model whose trace differs from eager on real tokens too (a Python branch on the length): the check
    fails, and says what it compared."""
    env = _env(tmp_path / "longer", "longer_scaled", "attention_mask", AFTER_EIGHT)
    with pytest.raises(StageError) as raised:
        env.run_named("export_torchscript")
    assert str(raised.value).startswith(
        "traced module (cpu) disagrees with eager on real tokens (padded positions of attention_mask left out, "
        "as validation leaves them out): max abs diff "
    ), raised.value


def test_a_key_padding_mask_is_padded_with_padding(tmp_path: Path) -> None:
    """The hold-out's case: samples of 12 tokens checked at 16. Padded with False, the mask read
    [real ×6, padding ×6, real ×4]; eager left its fast path for it and the trace did not, and they differed
    on real tokens too. Padded with True, the trace agrees with eager at every corner."""
    real = _real([6, 9, 12, 7, 10, 12, 8, 11] * 3, 12)
    env = _env(
        tmp_path / "keypad",
        "key_padding_encoder",
        "src_key_padding_mask",
        real,
        "validation.padding_value=1",
    )
    mask = env.dataset().corner_feeds("max", 4)["src_key_padding_mask"]
    assert mask.shape == (4, 16) and mask[:, 12:].all()  # the filler is padding
    details = env.run_named("export_torchscript").outputs[0].details
    assert all(d <= details["check_tolerance"][c] for c, d in details["check_max_abs"].items()), details
