"""The fleet file: which recipes a release deploys, on which targets (a label and the resources its deploys
need), and where the versions land. Every problem is reported with its place in the file, as a recipe's are."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, ValidationError, field_validator

from pipeline.core.errors import PipelineError, Problem
from pipeline.recipe.base import Strict
from pipeline.recipe.yaml_source import read_mapping

NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"  # a folder name on every file system, and a Ray label


class GpuNeed(Strict):
    type: str | None = Field(
        None, description="Ray's accelerator type (H200, H100, A100, L4, …); null: any GPU"
    )
    count: Annotated[int, Field(ge=1, le=8)] = Field(1, description="GPUs the deploy holds")


class Target(Strict):
    name: Annotated[str, Field(pattern=NAME)] = Field(description="the target's label, and its store folder")
    cpu: Annotated[int, Field(ge=1, le=1024)] = Field(1, description="CPUs the deploy holds on its node")
    gpu: GpuNeed | None = Field(None, description="the GPU the deploy needs; null: a CPU target")
    set: list[str] = Field([], description="recipe overrides for this target (key=value, as deploy --set)")

    def resources(self) -> dict[str, float]:
        """What a node must offer, in Ray's resource names."""
        need: dict[str, float] = {"CPU": float(self.cpu)}
        if self.gpu is not None:
            need["GPU"] = float(self.gpu.count)
            if self.gpu.type:
                need[f"accelerator_type:{self.gpu.type}"] = 0.001
        return need

    def label(self) -> str:
        """'cpu', 'gpu' or 'gpu:H200': what the target asks for, in a sentence."""
        if self.gpu is None:
            return "cpu"
        return f"gpu:{self.gpu.type}" if self.gpu.type else "gpu"


class RecipeEntry(Strict):
    path: str = Field(description="the recipe file, relative to the fleet file")
    set: list[str] = Field([], description="recipe overrides on every target")


class Fleet(Strict):
    name: Annotated[str, Field(pattern=NAME)]
    address: str | None = Field(None, description="a Ray cluster's address; null: start a local Ray instance")
    root: str = Field(
        "artifacts",
        description="the shared store: versions land at ROOT/TARGET/RECIPE/vNNNN (every node must see it, "
        "unless store: copy)",
    )
    recipes: Annotated[list[str | RecipeEntry], Field(min_length=1, max_length=256)]
    targets: Annotated[list[Target], Field(min_length=1, max_length=64)]
    retries: Annotated[int, Field(ge=0, le=5)] = Field(
        1, description="runs again of a deploy whose worker died (a crashed node, a killed process)"
    )
    timeout_s: Annotated[float, Field(gt=0, le=86_400)] = Field(
        7200, description="the longest one deploy may take, seconds"
    )
    promote: bool = Field(False, description="move each target's latest to the version it signs off")
    store: Literal["shared", "copy"] = Field(
        "shared",
        description="shared: every node writes its versions into root itself (a file system all nodes see); "
        "copy: each deploy runs into a scratch store on its node's own disk, seeded with the shared store's "
        "latest and newest versions, and the driver publishes its new version into root after checking every "
        "file's sha256 against the version's manifest (a mismatch publishes nothing and runs the deploy again)",
    )

    @field_validator("targets")
    @classmethod
    def _unique_targets(cls, targets: list[Target]) -> list[Target]:
        names = [t.name for t in targets]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"target names must be unique: {', '.join(twice)} more than once")
        return targets

    @field_validator("recipes")
    @classmethod
    def _unique_recipes(cls, recipes: list[str | RecipeEntry]) -> list[str | RecipeEntry]:
        paths = [r if isinstance(r, str) else r.path for r in recipes]
        twice = sorted({p for p in paths if paths.count(p) > 1})
        if twice:  # one store per recipe name and target: two entries would deploy into the same folder
            raise ValueError(f"a recipe may be listed once: {', '.join(twice)} more than once")
        return recipes

    def entries(self) -> list[RecipeEntry]:
        return [RecipeEntry(path=r) if isinstance(r, str) else r for r in self.recipes]


def load_fleet(path: Path) -> Fleet:
    """The fleet file, validated; paths in it are made absolute from its folder."""
    raw, positions, shown = read_mapping(
        path, PipelineError, "cannot read the fleet file", "a fleet file is a mapping of keys"
    )
    try:
        fleet = Fleet.model_validate(raw)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and p in ("str", "RecipeEntry")))
            line, col = positions.find(loc, key=err["type"] == "extra_forbidden")
            key = ".".join(str(p) for p in loc) or "(root)"
            problems.append(Problem(f"{shown}:{line}:{col}", key, _message(err)))
        raise PipelineError(problems=_unique(problems)) from None
    base = path.parent.resolve()
    entries = [e.model_copy(update={"path": str((base / e.path).resolve())}) for e in fleet.entries()]
    missing = [
        Problem(
            f"{shown}:{positions.find(('recipes', i))[0]}:1", f"recipes.{i}", f"no recipe file at {e.path}"
        )
        for i, e in enumerate(entries)
        if not Path(e.path).is_file()
    ]
    if missing:
        raise PipelineError(problems=missing)
    return fleet.model_copy(update={"recipes": entries, "root": str((base / fleet.root).resolve())})


def _message(err: dict) -> str:
    if err["type"] == "extra_forbidden":
        return f"unknown key '{err['loc'][-1]}'"
    if err["type"] == "string_pattern_mismatch":
        return "letters, digits, '.', '_' and '-' only (at most 64), starting with a letter or digit"
    return re.sub(r"^Value error, ", "", str(err["msg"]))


def _unique(problems: list[Problem]) -> list[Problem]:
    seen: dict[str, Problem] = {}
    for p in problems:
        seen.setdefault(f"{p.where}{p.key}", p)
    return list(seen.values())
