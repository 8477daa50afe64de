"""Stored samples are validated at a shape between the corners as well: an export that froze a size-dependent
branch (Swin pads its image to a multiple of its window) agreed with eager at every round, square corner
(32×32, 40×40, 48×48) and was signed off, then failed at 36×44 in use."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from tests.integration.test_deploy_cli import cli

RECIPE = """
name: window
model: {source: entrypoint, entrypoint: "tests.models.tiny:window_padded"}
inputs:
  - {name: pixel_values, dtype: float32, shape: [batch, 3, height, width]}
dims:
  batch: {min: 1, opt: 2, max: 4}
  height: {min: 32, opt: 40, max: 48}
  width: {min: 32, opt: 40, max: 48}
outputs: [features]
data:
  samples: {source: npz, path: images.npz}
  calibration: 4
  validation: 4
variants:
  build: [onnx-fp32]
  required: [onnx-fp32]
benchmark:
  batch_sizes: [1]
  warmup_s: 0.02
  min_s: 0.05
  window_s: 0.02
  max_s: 0.2
"""


def test_stored_samples_are_checked_between_the_corners(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "images.npz", pixel_values=rng.standard_normal((8, 3, 48, 48)).astype(np.float32))
    (tmp_path / "window.yaml").write_text(RECIPE)
    result = cli("deploy", str(tmp_path / "window.yaml"), root=tmp_path / "out")
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    assert "required variant onnx-fp32 failed at validate" in result.stdout
    accuracy = json.loads((tmp_path / "out" / "window" / "v0001" / "reports" / "accuracy.json").read_text())
    checks = accuracy["artifacts"]["onnx-fp32"]["checks"]
    failing = {c["inputs"] for c in checks if not c["passed"] and not c["informational"]}
    assert failing == {"off-corner"}, failing  # every corner agreed: only the shape between them shows it
    assert any(
        c["inputs"] == "off-corner" and c["metric"] == "cosine" for c in checks
    )  # judged there like anywhere else
    card = (tmp_path / "out" / "window" / "v0001" / "reports" / "signoff.md").read_text()
    assert (
        "inputs (shape corners min/opt/max, a shape between them (off-corner) and the held-out data)" in card
    )
