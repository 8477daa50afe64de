"""The inputs pre-flight runs the model on: the recipe's own samples where it has them, cropped or padded to each
shape as the deploy feeds them, else synthetic inputs drawn in each input's value range. Inputs drawn in a range
can break a structure real samples keep (a box's corners in order, sorted ids), and a deploy never feeds them to
a recipe that has samples: a model refused on them alone would be refused for nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from pipeline.recipe import Recipe

SAMPLES = "the recipe's samples"
SYNTHETIC = "synthetic inputs in the recipe's ranges"

Feeds = dict[str, np.ndarray]


class ProbeInputs:
    """Inputs at given dims, and which kind they are (SAMPLES or SYNTHETIC), for the messages that name them."""

    def __init__(
        self, recipe: Recipe, recipe_dir: Path, tokenizer: Any, config: dict[str, Any], samples: bool
    ) -> None:
        """`samples`: use the recipe's samples, read at the first at() (reading them may raise there, where the
        caller says which key is wrong)."""
        self.recipe, self.recipe_dir, self.tokenizer, self.config = recipe, recipe_dir, tokenizer, config
        self.samples = samples
        self._dataset: Any = None

    def synthetic(self, dims: dict[str, int]) -> Feeds:
        """Seeded inputs in each input's value range at the given dims (int dims stay as declared)."""
        from pipeline.inputs.data import random_values, value_range

        rng = np.random.default_rng(0)
        return {
            spec.name: random_values(
                spec, self.recipe.corner_shape(spec, "min", dims), rng, value_range(spec, self.config)
            )
            for spec in self.recipe.inputs
        }

    def at(self, dims: dict[str, int]) -> tuple[Feeds, str]:
        """The samples at these dims where they take that shape; synthetic inputs where a dim is one the samples
        do not follow (text is tokenized to its sequence dim only), so that every dim is still probed at its max."""
        if not self.samples:
            return self.synthetic(dims), SYNTHETIC
        if self._dataset is None:
            from pipeline.inputs.data import Dataset
            from pipeline.inputs.specs import DataSpec

            self._dataset = Dataset(DataSpec.from_recipe(self.recipe, self.recipe_dir), self.tokenizer)
        feeds = self._dataset.feeds_at(dims, pool="all")
        if any(
            list(feeds[s.name].shape) != self.recipe.corner_shape(s, "min", dims) for s in self.recipe.inputs
        ):
            return self.synthetic(dims), SYNTHETIC
        return feeds, SAMPLES
