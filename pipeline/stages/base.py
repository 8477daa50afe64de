"""What every stage is: declared inputs and outputs, a config slice, environment keys, and run()."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pipeline.data import Dataset
    from pipeline.models import LoadedModel
    from pipeline.recipe import Recipe


@dataclass(frozen=True)
class Output:
    """A file (or folder) a stage wrote under the work folder; `artifact` names deployable artifacts only."""

    path: str
    kind: str  # torchscript | onnx | engine | report | log
    artifact: str | None = None
    precision: str | None = None
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ArtifactRecord:
    """An artifact as downstream stages see it: where it lies in this run's folder, and what it is."""

    name: str
    path: Path
    kind: str
    precision: str | None
    sha256: str
    stage: str
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class StageResult:
    outputs: list[Output]
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class RunContext:
    """What a running stage may use: the recipe, its own work folder, and lazily loaded model and data."""

    recipe: Recipe
    recipe_dir: Path
    workdir: Path
    report: Callable[[str], None] = lambda message: None  # progress text for the live display
    cache_dir: Path | None = None  # the store's cache (e.g. TensorRT timing caches), never a version folder
    _cache: dict[str, Any] = field(default_factory=dict)

    def model(self) -> LoadedModel:
        if "model" not in self._cache:
            from pipeline.models import load_model

            self._cache["model"] = load_model(self.recipe, self.recipe_dir)
        return self._cache["model"]

    def dataset(self) -> Dataset:
        if "dataset" not in self._cache:
            from pipeline.data import Dataset

            tokenizer = self.model().tokenizer if self.recipe.data.samples.source == "text" else None
            self._cache["dataset"] = Dataset(self.recipe, self.recipe_dir, tokenizer)
        return self._cache["dataset"]

    def path(self, relative: str) -> Path:
        target = self.workdir / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        return target


@dataclass(frozen=True)
class Stage:
    """One node of the plan.

    consumes: artifact names that must exist (a failed one skips this stage);
    consumes_any: artifact names used when present (validate/benchmark work on whatever was built);
    produces: the artifact names this stage may create; critical: a failure is a bug (exit 3), not a variant's;
    volatile: results are measurements (benchmark), re-made on --rebench.
    """

    name: str
    version: int
    run: Callable[[RunContext, dict[str, ArtifactRecord]], StageResult]
    config: dict[str, Any] = field(default_factory=dict)
    environment: Callable[[], dict[str, Any]] = dict
    consumes: tuple[str, ...] = ()
    consumes_any: tuple[str, ...] = ()
    produces: tuple[str, ...] = ()
    critical: bool = False
    volatile: bool = False
    always_run: bool = False


def model_data_slice(recipe: Recipe, recipe_dir: Path) -> dict[str, Any]:
    """What every stage that runs the model on the recipe's data depends on besides its own settings: the
    weights, the I/O signature, the dims, and the data (whose fingerprint covers inputs, dims and tokenizer)."""
    from pipeline.data import data_fingerprint
    from pipeline.models import model_fingerprint

    return {
        "model": model_fingerprint(recipe, recipe_dir),
        "inputs": [s.model_dump() for s in recipe.inputs],
        "dims": {k: v.model_dump() for k, v in recipe.dims.items()},
        "outputs": list(recipe.outputs),
        "data": data_fingerprint(recipe, recipe_dir),
    }


@functools.cache
def package_version(name: str) -> str | None:
    """Version of an installed distribution or module, None when absent (for environment keys)."""
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None
