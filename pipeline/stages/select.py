"""The select stage: the winner by the recipe's objective (pipeline/decide/selection.py), written to
reports/selection.json with the reasons nothing could be chosen, if none could."""

from __future__ import annotations

from pathlib import Path

from pipeline.check.results import REPORTS, Selection
from pipeline.core.artifacts import ArtifactRecord
from pipeline.core.files import write_json_atomic
from pipeline.decide.selection import SelectionPolicy, choose, selection_problems
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
    winner = choose(config.policy, speed, accuracy, files)
    selection: Selection = {"reasons": selection_problems(accuracy, winner), "winner": winner}
    write_json_atomic(ctx.path(REPORT), selection)
    outputs = [Output(REPORT, "report", "report:selection", value=selection)]
    return StageResult(
        outputs, {"winner": winner["artifact"] if winner else None, "reasons": selection["reasons"]}
    )


def stage(recipe: Recipe, recipe_dir: Path, artifacts: list[str]) -> Stage:
    return Stage(
        name="select",
        version=2,  # CHANGELOG.md, "Stage versions"
        config=SelectConfig.from_recipe(recipe),
        run=_run,
        consumes=("report:accuracy", "report:speed"),
        consumes_any=tuple(artifacts),
        produces=("report:selection",),
        critical=True,
    )
