"""A split in batches the recipe's batch range allows, on the tiny recipe's real data: a graph exported for a
fixed batch holds that size, so a batch of another size would fail it for the recipe's sake. Validation, INT8
calibration and the optimizer's check all feed graphs batches within the range; the corner batches' defaults
fit themselves to it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pipeline.core.errors import RecipeError
from pipeline.inputs.data import Dataset
from pipeline.inputs.specs import DataSpec
from pipeline.recipe.loader import load

TINY = Path(__file__).resolve().parents[1] / "recipes" / "tiny.yaml"


def _dataset(batch: int | None = None) -> Dataset:
    """The tiny recipe, its batch fixed where given (with the corners and the benchmark at that size)."""
    fixed = f"{{min: {batch}, opt: {batch}, max: {batch}}}"
    overrides = (
        [
            f"dims.batch={fixed}",
            f"validation.corner_batches={fixed}",
            f"benchmark.batch_sizes=[{batch}]",
            f"selection.objective.batch={batch}",
        ]
        if batch
        else []
    )
    return Dataset(DataSpec.from_recipe(load(TINY, overrides).recipe, TINY.parent))


def _sizes(feeds: list[dict[str, np.ndarray]]) -> list[int]:
    return [len(f["input_ids"]) for f in feeds]


def _rows(feeds: list[dict[str, np.ndarray]]) -> set[bytes]:
    return {row.tobytes() for f in feeds for row in f["input_ids"]}


def test_a_remainder_under_a_fixed_batch_is_left_out_where_whole_batches_exist() -> None:
    """The tiny recipe's 8 held-out samples come in six shapes (random lengths), two of them twice: at a batch
    fixed at 2 those two batches are validated, and the samples alone in their shape left out."""
    dataset = _dataset(2)
    assert _sizes(dataset.validation_feeds(batch=2)) == [1, 1, 2, 2, 1, 1]
    feeds = dataset.split_feeds("validation", 4)
    assert _sizes(feeds) == [2, 2]


def test_a_split_with_no_batch_as_large_as_a_fixed_batch_is_filled_up_with_its_own_samples() -> None:
    """At a batch fixed at 3 no shape has three samples: the batches of one and two failed the static graph.
    Each is filled up to 3 with its own samples again, so every held-out sample is still checked, in the graph's
    one shape."""
    dataset = _dataset(3)
    feeds = dataset.split_feeds("validation", 4)
    assert _sizes(feeds) == [3] * 6
    assert _rows(feeds) == _rows(dataset.validation_feeds(batch=3))


def test_the_calibration_split_comes_in_batches_of_a_fixed_batch_too() -> None:
    """INT8 calibration asked for batches of 8 whatever the range: a static graph of batch 3 refused them."""
    feeds = _dataset(3).split_feeds("calibration", 8)
    assert feeds and set(_sizes(feeds)) == {3}


def test_the_default_corner_batches_fit_a_fixed_batch_and_given_ones_are_checked_as_written(tmp_path) -> None:
    text = TINY.read_text()
    recipe = tmp_path / "tiny.yaml"
    recipe.write_text("\n".join(line for line in text.splitlines() if "corner_batches" not in line) + "\n")
    fixed = [
        "dims.batch={min: 4, opt: 4, max: 4}",
        "benchmark.batch_sizes=[4]",
        "selection.objective.batch=4",
    ]
    loaded = load(recipe, fixed).recipe
    assert loaded.validation.corner_batches == {"min": 4, "opt": 4, "max": 4}
    assert load(recipe).recipe.validation.corner_batches == {"min": 2, "opt": 2, "max": 1}  # within 1..8
    with pytest.raises(RecipeError, match=r"validation.corner_batches.min: must lie within dims.batch 4..4"):
        load(TINY, fixed)  # the tiny recipe gives its own (1, 2, 1)


def test_the_default_benchmark_and_objective_batches_fit_the_batch_range(tmp_path) -> None:
    """A hold-out encoder-decoder with batches 1..4 and no benchmark of its own was refused: "benchmark.
    batch_sizes[1]: must lie within dims.batch 1..4 (got 8)", at line 1 of a recipe that never wrote 8."""
    text = "\n".join(
        line
        for line in TINY.read_text().splitlines()
        if not line.strip().startswith(("batch_sizes:", "selection:", "objective:", "corner_batches:"))
    )
    recipe = tmp_path / "tiny.yaml"
    recipe.write_text(text + "\n")
    loaded = load(recipe, ["dims.batch={min: 1, opt: 2, max: 4}"]).recipe
    assert loaded.benchmark.batch_sizes == [1, 4] and loaded.selection.objective.batch == 1
    fixed = load(recipe, ["dims.batch={min: 4, opt: 4, max: 4}"]).recipe
    assert fixed.benchmark.batch_sizes == [4] and fixed.selection.objective.batch == 4
    assert load(recipe).recipe.benchmark.batch_sizes == [1, 8]  # within 1..8: as they are
    with pytest.raises(RecipeError, match=r"benchmark.batch_sizes\[0\]: must lie within dims.batch 4..4"):
        load(recipe, ["dims.batch={min: 4, opt: 4, max: 4}", "benchmark.batch_sizes=[1]"])
