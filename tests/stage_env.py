"""A recipe with a run context, for tests that run stages and runners outside a deploy: the slices the plan
builds (model, data, runner settings) and the stages themselves, from the one place the plan builds them."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.inputs.specs import DataSpec, ModelSpec, RunnerSettings
from pipeline.recipe import Recipe
from pipeline.run.plan import plan_stages
from pipeline.stages.base import RunContext, Stage, StageResult

if TYPE_CHECKING:
    from pipeline.core.artifacts import ArtifactRecord
    from pipeline.inputs.data import Dataset
    from pipeline.inputs.models import LoadedModel


@dataclass
class StageEnv:
    recipe: Recipe
    recipe_dir: Path
    workdir: Path
    ctx: RunContext = field(init=False)

    def __post_init__(self) -> None:
        self.ctx = RunContext(self.workdir)

    @property
    def model_spec(self) -> ModelSpec:
        return ModelSpec.from_recipe(self.recipe, self.recipe_dir)

    @property
    def data_spec(self) -> DataSpec:
        return DataSpec.from_recipe(self.recipe, self.recipe_dir)

    @property
    def settings(self) -> RunnerSettings:
        return RunnerSettings.from_recipe(self.recipe)

    def model(self) -> LoadedModel:
        return self.ctx.model(self.model_spec)

    def dataset(self) -> Dataset:
        return self.ctx.dataset(self.data_spec)

    def path(self, relative: str) -> Path:
        return self.ctx.path(relative)

    def stage(self, name: str, variants: list[str] | None = None) -> Stage:
        """The stage `name` as the plan builds it, for this recipe with `variants` built (default: the
        recipe's own)."""
        recipe = self.recipe
        if variants is not None:
            update = {"build": variants, "required": [], "gpu": []}
            recipe = recipe.model_copy(update={"variants": recipe.variants.model_copy(update=update)})
        stages = {s.name: s for s in plan_stages(recipe, self.recipe_dir)}
        return stages[name]

    def run(self, stage: Stage, inputs: dict[str, ArtifactRecord] | None = None) -> StageResult:
        return stage.run(self.ctx, stage.config, inputs or {})

    def run_named(self, name: str, inputs: dict[str, Any] | None = None, **kwargs: Any) -> StageResult:
        return self.run(self.stage(name, **kwargs), inputs)
