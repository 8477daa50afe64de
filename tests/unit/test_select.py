"""Selection: objective shape, noise-aware ranking, sign-off verdict (on report dicts as the stages write them)."""

from __future__ import annotations

from pathlib import Path

from pipeline.recipe_loader import load
from pipeline.stages.select import choose, signoff_verdict

ROOT = Path(__file__).resolve().parents[2]


def _row(artifact: str, p50: float, ci: tuple[float, float], seq: int = 16, batch: int = 1) -> dict:
    return {
        "artifact": artifact,
        "runtime": "onnxruntime-cpu",
        "io": "host",
        "batch": batch,
        "sequence_length": seq,
        "shapes": {"input_ids": [batch, seq]},
        "p50_ms": p50,
        "p99_ms": p50 * 2,
        "p50_ci95_ms": list(ci),
        "stable": True,
    }


ACCURACY = {
    "artifacts": {
        "onnx-fp32": {"passed": True},
        "onnx-int8": {"passed": True},
        "onnx-fp16": {"passed": False, "reason": "x"},
    }
}


def _recipe(*overrides: str):
    return load(ROOT / "tests/recipes/tiny.yaml", ["benchmark.sequence_lengths=[8,16]", *overrides]).recipe


def test_fastest_passing_artifact_wins_when_beyond_noise() -> None:
    speed = {
        "results": [
            _row("onnx-fp32", 10, (9.5, 10.5)),
            _row("onnx-int8", 5, (4.8, 5.2)),
            _row("onnx-fp16", 1, (0.9, 1.1)),
        ]
    }
    winner = choose(_recipe(), speed, ACCURACY)
    assert winner["artifact"] == "onnx-int8" and winner["runner_up"]["artifact"] == "onnx-fp32"


def test_within_noise_the_simpler_artifact_wins() -> None:
    speed = {"results": [_row("onnx-fp32", 10, (9.0, 11.0)), _row("onnx-int8", 9.8, (9.5, 10.5))]}
    winner = choose(_recipe(), speed, ACCURACY)
    assert winner["artifact"] == "onnx-fp32" and "simpler" in winner["reason"]


def test_objective_sequence_length_is_honoured() -> None:
    speed = {"results": [_row("onnx-int8", 1, (0.9, 1.1), seq=8), _row("onnx-fp32", 10, (9.5, 10.5), seq=16)]}
    assert (
        choose(_recipe("selection.objective.sequence_length=16"), speed, ACCURACY)["artifact"] == "onnx-fp32"
    )
    assert choose(_recipe(), speed, ACCURACY)["artifact"] == "onnx-int8"  # default: the shortest benchmarked


def test_required_variant_failing_blocks_signoff() -> None:
    recipe = _recipe("variants.build=[onnx-fp32, onnx-fp16]", "variants.required=[onnx-fp16]")
    reasons = signoff_verdict(recipe, ACCURACY, {"artifact": "onnx-fp32"}, {"onnx-fp16": "onnx-fp16"})
    assert reasons == ["required variant onnx-fp16 failed validation: x"]
