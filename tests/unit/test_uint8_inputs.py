"""uint8 inputs (an image's bytes) from the recipe to the feeds: a range within what a byte holds, random samples
over every byte value unless the recipe narrows them, and stored samples kept as bytes. The deploy of a real
uint8 CNN is tests/integration/test_uint8_images.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pipeline.core.errors import RecipeError
from pipeline.inputs.data import Dataset, random_values, value_range
from pipeline.inputs.specs import DataSpec
from pipeline.preflight.data_check import sample_file_problems
from pipeline.recipe.loader import LoadedRecipe, load

RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "byte_images.yaml"
SPLITS = ("data.calibration=4", "data.validation=4")  # eight stored images hold both splits


def _load(*overrides: str) -> LoadedRecipe:
    return load(RECIPE, [*SPLITS, *overrides])


def test_random_bytes_cover_every_value_unless_the_recipe_narrows_them() -> None:
    """Drawn in a float's default 0..1, every image would be black."""
    rng = np.random.default_rng(0)
    (spec,) = _load().recipe.inputs
    assert value_range(spec) == (0.0, 255.0)
    values = random_values(spec, [64, 64], rng)
    assert values.dtype == np.uint8 and values.min() == 0 and values.max() == 255
    (spec,) = _load("inputs[0].low=10", "inputs[0].high=20").recipe.inputs
    values = random_values(spec, [64, 64], rng)
    assert values.min() == 10 and values.max() == 20
    (spec,) = _load("inputs[0].low=200").recipe.inputs
    assert value_range(spec) == (200.0, 255.0)


def test_a_uint8_range_must_lie_within_a_byte() -> None:
    with pytest.raises(RecipeError) as info:
        _load("inputs[0].low=-1", "inputs[0].high=256")
    assert info.value.lines() == [
        "--set inputs[0].low=-1: inputs[0].low: must lie within what uint8 holds (0..255, got -1)",
        "--set inputs[0].high=256: inputs[0].high: must lie within what uint8 holds (0..255, got 256)",
    ]


def test_stored_bytes_feed_as_bytes_and_values_past_a_byte_are_refused(tmp_path: Path) -> None:
    images = np.random.default_rng(0).integers(0, 256, size=(8, 3, 24, 24), dtype=np.uint8)
    np.savez(tmp_path / "images.npz", image=images)
    loaded = _load(f"data.samples={{source: npz, path: {tmp_path / 'images.npz'}}}")
    assert sample_file_problems(loaded, tmp_path / "images.npz") == []
    dataset = Dataset(DataSpec.from_recipe(loaded.recipe, tmp_path))
    for feeds in (*dataset.validation_feeds(batch=2), dataset.corner_feeds("min")):
        assert feeds["image"].dtype == np.uint8
    (first, *_) = dataset.validation_feeds(batch=2)
    assert any(np.array_equal(first["image"][0], sample) for sample in images)

    np.savez(tmp_path / "images.npz", image=images.astype(np.int64) + 45)  # up to 300
    [problem] = sample_file_problems(loaded, tmp_path / "images.npz")
    assert "holds values outside what uint8 holds (0..255)" in problem.message
