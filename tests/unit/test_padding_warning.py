"""The sign-off warns that the winner may not be the fastest graph when, at the winner's shape, a padded row beat
its padding-aware twin (the other graphs' padded rows were left out on the opposite evidence); a flag at another
shape stays in the Flags section only."""

from __future__ import annotations

from pipeline.bench.rows import flags
from pipeline.stages.signoff import _padding_warnings


def _row(runtime: str, batch: int, p50: float) -> dict:
    return {
        "artifact": "onnx-fp32",
        "precision": "fp32",
        "runtime": runtime,
        "io": "host",
        "batch": batch,
        "sequence_length": 16,
        "shapes": {"input_ids": [batch, 16]},
        "p50_ms": p50,
        "p50_ci95_ms": [p50 * 0.99, p50 * 1.01],
        "stable": True,
        "cv": 0.01,
        "stop_reason": "stable",
    }


def test_the_warning_is_for_the_winners_shape_only() -> None:
    rows = [
        _row("onnxruntime-cpu", 1, 0.10),
        _row("onnxruntime-cpu-bucketed", 1, 0.15),  # padded faster at batch 1
        _row("onnxruntime-cpu", 8, 3.0),
        _row("onnxruntime-cpu-bucketed", 8, 1.0),  # padding-aware faster at batch 8
    ]
    speed = {"flags": flags(rows)}
    at_one = {"winner": {"shapes": {"input_ids": [1, 16]}}}
    at_eight = {"winner": {"shapes": {"input_ids": [8, 16]}}}
    [warning] = _padding_warnings(speed, at_one)  # type: ignore[arg-type]
    assert warning.startswith(
        "the winner may not be the fastest graph: onnx-fp32 on onnxruntime-cpu (padded)"
    )
    assert _padding_warnings(speed, at_eight) == []  # type: ignore[arg-type]
    assert _padding_warnings(speed, None) == []
