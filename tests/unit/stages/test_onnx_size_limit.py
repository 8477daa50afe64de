"""An ONNX export past protobuf's 2 GB limit fails with the export stage's own reason, not onnx's checker's
"Call check_model with model path instead". A real graph past 2 GB costs over 4 GB of memory to build: the
limit is lowered to the tiny model's measured size instead, and the real export runs against it."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from pipeline.core.errors import StageError
from pipeline.stages import export_onnx
from tests.unit.stages.onnx_fixtures import tiny_context


def test_an_export_over_the_limit_says_how_large_and_which_weights(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = tiny_context(tmp_path / "fits")
    env.run_named("export_onnx")
    model = onnx.load(str(env.path(export_onnx.FILE)))
    size = model.ByteSize()
    largest = max(model.graph.initializer, key=lambda t: t.ByteSize())

    monkeypatch.setattr(export_onnx, "PROTOBUF_LIMIT", size)  # at the limit: the graph is kept
    tiny_context(tmp_path / "at").run_named("export_onnx")

    monkeypatch.setattr(export_onnx, "PROTOBUF_LIMIT", size - 1)
    with pytest.raises(StageError) as raised:
        tiny_context(tmp_path / "over").run_named("export_onnx")
    message = str(raised.value)
    assert message.startswith(
        f"onnx: the exported graph (model.onnx) is 0.00 GiB ({size} bytes), which exceeds "
    )
    assert "the 2 GB limit of a self-contained ONNX file" in message
    assert "leave the ONNX variants out of variants.build" in message
    assert f"(the largest: {largest.name} {list(largest.dims)} " in message


def test_a_dynamo_graph_over_the_limit_fails_without_falling_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The legacy exporter would make a graph of the same weights: the size is no reason to try it."""
    monkeypatch.setattr(export_onnx, "PROTOBUF_LIMIT", 1000)
    with pytest.raises(StageError) as raised:
        tiny_context(tmp_path, "export.onnx.exporter=dynamo").run_named("export_onnx")
    assert str(raised.value).startswith("onnx: the exported graph's weights (model.onnx) are "), raised.value
    assert "legacy" not in str(raised.value)
