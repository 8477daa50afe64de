"""The int8_mixed stage on the tiny encoder's real ONNX export: every weight layer's sensitivity measured, the
layers quantized least sensitive first up to the most the recipe's INT8 gate allows, the mixes timed side by
side, and a gate no layer can meet refused with the numbers. No timing is asserted."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pipeline.check.accuracy import cosine
from pipeline.core.artifacts import ArtifactRecord
from pipeline.core.errors import StageError
from pipeline.report.blocks import Document
from pipeline.report.markdown import markdown_from
from pipeline.report.mixed import mixed_precision_section
from pipeline.stages.base import StageResult
from pipeline.stages.int8_mixed import FILE, choose
from pipeline.toolchain import onnx_tools
from tests.stage_env import StageEnv
from tests.unit.stages.onnx_fixtures import run_onnx, tiny_context, tiny_onnx

MIXED = ["onnx-int8-mixed"]
TIGHT = "validation.tolerances.int8={cosine: 0.999995}"  # some layers alone pass, all of them do not


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> ArtifactRecord:
    return tiny_onnx(tmp_path_factory)


def _deploy(workdir: Path, source: ArtifactRecord, *overrides: str) -> tuple[StageEnv, StageResult]:
    ctx = tiny_context(workdir, *overrides)
    return ctx, ctx.run_named("int8_mixed", {"onnx-fp32": source}, variants=MIXED)


@pytest.fixture(scope="module")
def tight(tmp_path_factory: pytest.TempPathFactory, source: ArtifactRecord) -> tuple[StageEnv, StageResult]:
    return _deploy(tmp_path_factory.mktemp("mixed-tight"), source, TIGHT)


def test_the_bisection_finds_the_largest_passing_count_and_its_neighbours() -> None:
    asked: list[int] = []

    def passes(count: int) -> bool:
        asked.append(count)
        return count <= 23

    best, timed = choose(36, passes, step=4)
    assert best == 23 and timed == [0, 19, 23, 27, 36]
    assert len(asked) <= 7  # one try of every layer, then a bisection: not one build per count
    assert choose(12, lambda count: True, step=1) == (12, [0, 11, 12])


def test_the_layers_quantized_are_the_least_sensitive_and_the_mix_meets_the_gate(
    tight: tuple[StageEnv, StageResult], source: ArtifactRecord
) -> None:
    ctx, result = tight
    details = result.outputs[0].details
    layers = details["layers"]
    count = details["quantized_count"]
    assert len(layers) == 12 and all(isinstance(layer["sensitivity"], float) for layer in layers)
    assert 0 < count < len(layers), [layer["sensitivity"] for layer in layers]
    quantized = [layer["sensitivity"] for layer in layers if layer["quantized"]]
    kept = [layer["sensitivity"] for layer in layers if not layer["quantized"]]
    assert max(quantized) <= min(kept)
    mixes = {m["quantized"]: m for m in details["mixes"]}
    assert mixes[count]["chosen"] and mixes[count]["passes"]
    assert not mixes[len(layers)]["passes"]  # every layer quantized is past this gate
    assert all(m["p50_ms"] > 0 for m in mixes.values()) and mixes[0]["vs_float"] == 1.0
    # the file is that mix: as many MatMulInteger as layers quantized, and within the gate on the calibration data
    graph = onnx_tools.load(ctx.workdir / FILE)
    assert onnx_tools.op_counts(graph).get("MatMulInteger", 0) == count
    for feeds in ctx.dataset().calibration_feeds(batch=8):
        want, got = run_onnx(source.path, feeds), run_onnx(ctx.workdir / FILE, feeds)
        assert cosine(want["pooled"], got["pooled"]) >= 0.999995


def test_a_loose_gate_lets_every_layer_pass_and_noise_decides_for_accuracy(
    source: ArtifactRecord, tmp_path: Path
) -> None:
    """With every mix passing, the kept one is the fastest beyond the noise, or else the most accurate of those
    within noise of the fastest: never a slower, less accurate one."""
    _, result = _deploy(tmp_path, source)
    details = result.outputs[0].details
    mixes = {m["quantized"]: m for m in details["mixes"]}
    assert mixes[12]["passes"] and set(mixes) == {0, 11, 12}
    kept = next(m for m in mixes.values() if m["chosen"])
    fastest = min((m for k, m in mixes.items() if k > 0), key=lambda m: m["p50_ms"])
    if kept is not fastest:
        low, high = fastest["p50_ci95_ms"]
        assert kept["p50_ci95_ms"][0] <= high and kept["p50_ci95_ms"][1] >= low
        assert kept["tolerance_share"] <= fastest["tolerance_share"]
    assert details["why"].startswith(
        ("the fastest passing mix", "the most accurate of the passing mixes", "the only passing mix timed")
    )


def test_a_gate_no_layer_meets_is_refused_with_the_least_sensitive_layers_share(
    source: ArtifactRecord, tmp_path: Path
) -> None:
    with pytest.raises(
        StageError, match=r"no layer can be quantized within the INT8 gate: the least sensitive"
    ):
        _deploy(tmp_path, source, "validation.tolerances.int8={cosine: 0.9999999999, max_abs: 1e-9}")
    assert not (tmp_path / FILE).exists()


def test_the_recipe_plans_it_alone_after_the_export(tmp_path: Path) -> None:
    stage = tiny_context(tmp_path).stage("int8_mixed", MIXED)
    assert (stage.consumes, stage.produces, stage.alone) == (("onnx-fp32",), ("onnx-int8-mixed",), True)
    assert stage.config.tolerance.cosine == 0.98 and np.isclose(stage.config.batch, 1)


def test_the_sign_off_section_says_what_the_stage_measured(tight: tuple[StageEnv, StageResult]) -> None:
    details = tight[1].outputs[0].details
    section = mixed_precision_section({"artifacts": [{"name": "onnx-int8-mixed", "details": details}]})
    text = markdown_from(Document("t", "s", True, [section]))
    count = details["quantized_count"]
    assert f"onnx-int8-mixed quantizes {count} of its 12 weight layers" in text
    assert f"Kept: {details['why']}." in text
    kept = next(m for m in details["mixes"] if m["chosen"])
    none = next(m for m in details["mixes"] if m["quantized"] == 0)
    overlap = (
        kept["p50_ci95_ms"][0] <= none["p50_ci95_ms"][1] and none["p50_ci95_ms"][0] <= kept["p50_ci95_ms"][1]
    )
    assert ("within noise of the float graph" in text) == overlap
    layers = [line.split(" | ")[0].strip("| ") for line in text.splitlines() if line.startswith("| node_")]
    by_sensitivity = sorted(details["layers"], key=lambda layer: -layer["sensitivity"])
    assert layers == [layer["node"] for layer in by_sensitivity]


def test_a_single_passing_mix_is_not_said_to_win_beyond_the_noise() -> None:
    """With one passing mix timed there is no noise to be beyond (a 3-D volume model's sign-off said so)."""
    from pipeline.stages.int8_mixed import fastest_within_noise

    one = {3: {"p50_ms": 1.0, "p50_ci95_ms": [0.9, 1.1]}}
    assert fastest_within_noise(one, {3: 0.5}) == (3, "the only passing mix timed")
    two = {3: {"p50_ms": 1.0, "p50_ci95_ms": [0.9, 1.1]}, 2: {"p50_ms": 1.05, "p50_ci95_ms": [0.95, 1.15]}}
    chosen, why = fastest_within_noise(two, {3: 0.5, 2: 0.1})
    assert chosen == 2 and why.endswith("within noise of the fastest (which quantizes 3 layers)")
