"""Recipe errors: one located line per problem, in the contract's format."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.core.errors import RecipeError
from pipeline.recipe.loader import load

ROOT = Path(__file__).resolve().parents[2]
TINY = (ROOT / "tests/recipes/tiny.yaml").read_text()


def _problems(tmp_path: Path, text: str, overrides: tuple[str, ...] = ()) -> list[str]:
    path = tmp_path / "r.yaml"
    path.write_text(text)
    with pytest.raises(RecipeError) as info:
        load(path, overrides)
    return info.value.lines()


def test_shipped_recipes_load() -> None:
    for name in ("recipes/bert.yaml", "tests/recipes/tiny.yaml"):
        assert load(ROOT / name).recipe.name


def test_unknown_key_names_its_line_and_suggests(tmp_path: Path) -> None:
    text = TINY.replace("benchmark:\n", "benchmark:\n  batch_size: [1]\n")
    lines = _problems(tmp_path, text)
    line_no = text.splitlines().index("  batch_size: [1]") + 1
    assert lines == [
        f"{tmp_path / 'r.yaml'}:{line_no}:3: benchmark.batch_size: unknown key 'batch_size'; did you mean 'batch_sizes'?"
    ]


def test_wrong_type(tmp_path: Path) -> None:
    text = TINY.replace("calibration: 8", "calibration: many")
    [line] = _problems(tmp_path, text)
    assert line.endswith("data.calibration: must be an integer (got 'many')")
    assert f":{text.splitlines().index('  calibration: many') + 1}:16:" in line


def test_negative_batch_size(tmp_path: Path) -> None:
    text = TINY.replace("batch_sizes: [1, 2]", "batch_sizes: [1, -4]")
    [line] = _problems(tmp_path, text)
    assert line.endswith("benchmark.batch_sizes[1]: must be a positive integer (got -4)")


def test_min_greater_than_max_is_a_cross_field_problem(tmp_path: Path) -> None:
    text = TINY.replace("batch: {min: 1, opt: 2, max: 8}", "batch: {min: 9, opt: 2, max: 8}")
    lines = _problems(tmp_path, text)
    assert any("dims.batch.min: must not exceed max (9 > 8)" in line for line in lines)


def test_batch_size_outside_dynamic_range(tmp_path: Path) -> None:
    text = TINY.replace("batch_sizes: [1, 2]", "batch_sizes: [1, 16]")
    lines = _problems(tmp_path, text)
    assert any("benchmark.batch_sizes[1]: must lie within dims.batch 1..8 (got 16)" in line for line in lines)


def test_broken_yaml(tmp_path: Path) -> None:
    [line] = _problems(tmp_path, TINY.replace("outputs: [hidden, pooled]", "outputs: [hidden, pooled"))
    assert "(yaml): invalid YAML" in line and line.startswith(str(tmp_path / "r.yaml") + ":")


def test_override_error_names_the_override(tmp_path: Path) -> None:
    lines = _problems(tmp_path, TINY, ("benchmark.batch_sizes=[1,-8]",))
    assert lines == [
        "--set benchmark.batch_sizes=[1,-8]: benchmark.batch_sizes[1]: must be a positive integer (got -8)"
    ]


def test_override_applies(tmp_path: Path) -> None:
    path = tmp_path / "r.yaml"
    path.write_text(TINY)
    loaded = load(path, ["output.root=/tmp/elsewhere", "benchmark.batch_sizes=[1]"])
    assert loaded.recipe.output.root == "/tmp/elsewhere"
    assert loaded.recipe.benchmark.batch_sizes == [1]


def test_all_problems_reported_at_once(tmp_path: Path) -> None:
    text = TINY.replace("calibration: 8", "calibration: -1").replace("validation: 8", "validation: x")
    lines = _problems(tmp_path, text)
    assert len(lines) == 2


def test_recipe_is_frozen() -> None:
    recipe = load(ROOT / "tests/recipes/tiny.yaml").recipe
    with pytest.raises(Exception):  # noqa: B017 - pydantic raises ValidationError on frozen assignment
        recipe.name = "other"


def test_more_cross_field_checks(tmp_path: Path) -> None:
    text = TINY.replace("low: 1, high: 999", "low: 1000, high: 999").replace(
        "corner_batches: {min: 1, opt: 2, max: 1}", "corner_batches: {min: 1, opt: 2, max: 100}"
    )
    lines = _problems(tmp_path, text, ("selection.objective.sequence_length=99",))
    joined = "\n".join(lines)
    assert "inputs[0].low: must not exceed high (1000 > 999)" in joined
    assert "validation.corner_batches.max: must lie within dims.batch 1..8 (got 100)" in joined
    assert (
        "selection.objective.sequence_length: must be one of benchmark.sequence_lengths [16] (got 99)"
        in joined
    )


def test_scenarios_need_single_stream_and_a_throughput_objective_needs_offline(tmp_path: Path) -> None:
    [line] = _problems(tmp_path, TINY, ("benchmark.scenarios=[server]",))
    assert line.endswith(
        "benchmark.scenarios: must hold single_stream: its latency rows are what selection ranks"
    )
    [line] = _problems(
        tmp_path,
        TINY,
        ("benchmark.scenarios=[single_stream, server]", "selection.objective.metric=sequences_per_s"),
    )
    assert line.endswith("must hold offline: the objective sequences_per_s ranks its throughput runs")
    (tmp_path / "ok.yaml").write_text(TINY)
    loaded = load(tmp_path / "ok.yaml", ("benchmark.scenarios=[single_stream, server]",))
    assert loaded.recipe.benchmark.scenarios == ["single_stream", "server"]


def test_the_served_objective_needs_the_server_scenario_and_one_p99_target(tmp_path: Path) -> None:
    served = "selection.objective={metric: max_qps_at_p99, p99_ms: 20}"
    [line] = _problems(tmp_path, TINY, (served,))
    assert line.endswith(
        "benchmark.scenarios: must hold server: the objective max_qps_at_p99 ranks the server scenario's served rates"
    )
    [line] = _problems(tmp_path, TINY, ("selection.objective.p99_ms=20",))
    assert "selection.objective.p99_ms: belongs to the metric max_qps_at_p99 only (got metric p50_ms)" in line
    with_server = ("benchmark.scenarios=[single_stream, server]", served)
    [line] = _problems(tmp_path, TINY, (*with_server, "benchmark.server.p99_ms=30"))
    assert "must agree with benchmark.server.p99_ms, the same target (20 ≠ 30)" in line
    (tmp_path / "ok.yaml").write_text(TINY)
    recipe = load(tmp_path / "ok.yaml", with_server).recipe
    assert recipe.p99_target_ms() == 20  # the objective's target is the server scenario's
    recipe = load(tmp_path / "ok.yaml", (*with_server, "benchmark.server.p99_ms=20")).recipe
    assert recipe.p99_target_ms() == 20
    plain = load(tmp_path / "ok.yaml", ("benchmark.scenarios=[single_stream, server]",)).recipe
    assert plain.p99_target_ms() == plain.benchmark.server.p99_ms == 100


def test_float_fields_say_number_and_unknown_mapping_keys_are_named(tmp_path: Path) -> None:
    lines = _problems(tmp_path, TINY, ("validation.tolerances={int4: {cosine: 0.5}}",))
    assert lines == [
        "--set validation.tolerances={int4: {cosine: 0.5}}: validation.tolerances.int4: unknown key 'int4'; expected 'fp32', 'fp16', 'bf16', 'int8' or 'fp8'"
    ]
    [line] = _problems(tmp_path, TINY, ("validation.tolerances.fp32.max_abs=0",))
    assert line.endswith("must be a positive number (got 0)")


def test_a_recipe_that_is_not_text_is_a_user_error(tmp_path: Path) -> None:
    path = tmp_path / "r.yaml"
    path.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(RecipeError) as info:
        load(path)
    assert info.value.lines() == [
        f"{path}:1:1: (file): not UTF-8 text: byte 0xff at byte offset 0 (invalid start byte)"
    ]


def test_a_tolerance_that_cannot_fail_anything_is_a_located_error(tmp_path: Path) -> None:
    text = TINY.replace(
        "validation:\n",
        "validation:\n  tolerances:\n    fp16: {max_abs: 0.1, cosine: null, informational: [max_abs]}\n",
    )
    [line] = _problems(tmp_path, text)
    line_no = text.splitlines().index("    fp16: {max_abs: 0.1, cosine: null, informational: [max_abs]}") + 1
    assert line.startswith(f"{tmp_path / 'r.yaml'}:{line_no}:11: validation.tolerances.fp16: no metric gates")


def test_an_output_threshold_alone_makes_a_tolerance_gate(tmp_path: Path) -> None:
    text = TINY.replace(
        "validation:\n",
        "validation:\n  tolerances:\n    fp16: {informational: [cosine], cosine: 0.9, outputs: {pooled: {cosine: 0.99}}}\n",
    )
    path = tmp_path / "r.yaml"
    path.write_text(text)
    tolerance = load(path).recipe.validation.tolerances["fp16"]
    assert tolerance.resolved("pooled")["cosine"] == (0.99, False)
    assert tolerance.resolved("hidden")["cosine"] == (0.9, True)


def test_paths_are_absolute_once_loaded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "recipes").mkdir()
    path = tmp_path / "recipes" / "r.yaml"
    path.write_text(TINY.replace("{source: random, samples: 24}", "{source: npz, path: data/x.npz}"))
    monkeypatch.chdir(tmp_path / "recipes")
    recipe = load("r.yaml", ["output.root=out"]).recipe
    assert recipe.data.samples.path == str(tmp_path / "recipes" / "data" / "x.npz")
    assert recipe.output.root == str(tmp_path / "recipes" / "out")


def test_schema_and_cross_field_problems_are_reported_in_one_pass(tmp_path: Path) -> None:
    text = TINY.replace("calibration: 8", "calibration: many").replace(
        "batch_sizes: [1, 2]", "batch_sizes: [1, 16]"
    )
    lines = _problems(tmp_path, text)
    assert any(line.endswith("data.calibration: must be an integer (got 'many')") for line in lines)
    assert any("benchmark.batch_sizes[1]: must lie within dims.batch 1..8 (got 16)" in line for line in lines)
    assert len(lines) == 2


def test_an_aliased_mapping_keeps_its_merged_keys(tmp_path: Path) -> None:
    """Aliases are copies (to be located where they stand); each copy still folds in its own merge keys."""
    text = TINY.replace(
        "  sequence: {min: 4, opt: 16, max: 32}", "  sequence: &s {<<: {min: 4}, opt: 16, max: 32}"
    ).replace("export:\n", "export:\n  tensorrt: {profiles: [{dims: {sequence: *s}}]}\n")
    path = tmp_path / "r.yaml"
    path.write_text(text)
    recipe = load(path).recipe
    assert recipe.dims["sequence"].min == 4
    assert recipe.export.tensorrt.profiles[0].dims["sequence"] == recipe.dims["sequence"]


def test_a_problem_is_located_for_programs() -> None:
    from pipeline.core.errors import Problem

    found = Problem(
        "recipes/r.yaml:17:29",
        "variants.build[1]",
        "unknown 'onnx-fp23': did you mean 'onnx-fp32'? (one of …)",
    ).located()
    assert found == {
        "file": "recipes/r.yaml",
        "line": 17,
        "column": 29,
        "key": "variants.build[1]",
        "message": "unknown 'onnx-fp23': did you mean 'onnx-fp32'? (one of …)",
        "suggestion": "onnx-fp32",
        "override": None,
    }


def test_a_batch_dim_that_is_not_the_first_axis_is_refused_where_it_is_written(tmp_path: Path) -> None:
    """Time-major inputs ([sequence, batch, ...]) were batched on their first axis all the same: the validation
    corners ran the sequence at 1, below its min, and the sign-off printed shapes and lengths it never ran."""
    text = TINY.replace(
        "{name: input_ids, dtype: int64, shape: [batch, sequence]",
        "{name: input_ids, dtype: int64, shape: [sequence, batch]",
    )
    lines = _problems(tmp_path, text)
    assert any(
        ":6:" in line
        and "inputs[0].shape: the batch dim 'batch' is axis 1: the pipeline batches, pads and times requests on the "
        "first axis; put it first"
        in line
        for line in lines
    ), lines


def test_a_versions_resolved_recipe_loads_again_for_a_model_without_an_attention_mask(tmp_path: Path) -> None:
    """`serve` reads a version's recipe.yaml back; it writes the default padding mask out, and every model
    without an input of that name (images, tabular) was refused there."""
    import yaml

    from pipeline.release.manifest import resolved_recipe
    from tests.unit.test_random_samples import RECIPE

    first = tmp_path / "r.yaml"
    first.write_text(RECIPE)
    resolved = resolved_recipe(load(first))
    assert resolved["validation"]["padding_mask"] == "attention_mask"
    again = tmp_path / "recipe.yaml"
    again.write_text(yaml.safe_dump(resolved))
    assert load(again).recipe.name == "images"
    # a name the user chose is still checked
    lines = _problems(tmp_path, RECIPE + "validation: {padding_mask: mask}\n")
    assert any("validation.padding_mask: no such input 'mask' (inputs: pixels)" in line for line in lines)
