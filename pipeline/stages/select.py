"""The select stage: the winner by the recipe's objective (pipeline/decide/selection.py; by served rate,
pipeline/decide/served.py, after the load stage), written to reports/selection.json with the reasons nothing
could be chosen, if none could."""

from __future__ import annotations

from pathlib import Path

from pipeline.check.results import REPORTS, Selection
from pipeline.check.speed import SERVED
from pipeline.core.artifacts import ArtifactRecord
from pipeline.core.files import write_json_atomic
from pipeline.decide.selection import SelectionPolicy, choose, selection_problems
from pipeline.decide.served import choose_served, served_problems
from pipeline.recipe import Recipe
from pipeline.stages.base import Output, RunContext, Stage, StageConfig, StageResult

REPORT = REPORTS["report:selection"]


class SelectConfig(StageConfig):
    policy: SelectionPolicy

    @classmethod
    def from_recipe(cls, recipe: Recipe) -> SelectConfig:
        return cls(policy=SelectionPolicy.from_recipe(recipe))


def _run(ctx: RunContext, config: SelectConfig, inputs: dict[str, ArtifactRecord]) -> StageResult:
    accuracy, speed = inputs["report:accuracy"].report(), inputs["report:speed"].report()
    files = {
        name: record.path.relative_to(ctx.workdir).as_posix()
        for name, record in inputs.items()
        if not name.startswith("report:") and record.path.is_relative_to(ctx.workdir)
    }
    if config.policy.objective.metric == SERVED:
        load = inputs["report:load"].report() if "report:load" in inputs else None
        winner = choose_served(config.policy, load, speed, accuracy, files)
        reasons = served_problems(load, accuracy, winner)
    else:
        winner = choose(config.policy, speed, accuracy, files)
        reasons = selection_problems(accuracy, winner)
    selection: Selection = {"reasons": reasons, "winner": winner}
    write_json_atomic(ctx.path(REPORT), selection)
    outputs = [Output(REPORT, "report", "report:selection", value=selection)]
    return StageResult(
        outputs, {"winner": winner["artifact"] if winner else None, "reasons": selection["reasons"]}
    )


def stage(recipe: Recipe, recipe_dir: Path, artifacts: list[str]) -> Stage:
    """By served rate, after the load stage (its report is what is ranked); else before it."""
    served = recipe.selection.objective.metric == SERVED
    return Stage(
        name="select",
        version=6,  # CHANGELOG.md, "Stage versions"
        config=SelectConfig.from_recipe(recipe),
        run=_run,
        consumes=("report:accuracy", "report:speed"),
        consumes_any=(*artifacts, "report:load") if served else tuple(artifacts),
        produces=("report:selection",),
        critical=True,
    )
