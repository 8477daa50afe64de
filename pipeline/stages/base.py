"""What every stage is: a typed config, declared inputs and outputs, environment keys, and run().

A stage's config is built from the recipe in one place (its module's `from_recipe`), and `run(ctx, config,
inputs)` never sees the recipe: what a stage reads is its config, and its fingerprint is that config's JSON
(pipeline/run/executor.py), so what a stage reads and what invalidates it cannot drift apart. The run context
holds no recipe either: the model and the data are loaded from the slices a config names (pipeline/inputs/specs.py).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

from pipeline.core.artifacts import ArtifactRecord

if TYPE_CHECKING:
    from pipeline.inputs.data import Dataset
    from pipeline.inputs.models import LoadedModel
    from pipeline.inputs.specs import DataSpec, ModelSpec


class StageConfig(BaseModel):
    """What a stage reads. Its JSON (`model_dump`) is fingerprinted: a field marked `exclude=True` is read
    but does not invalidate the stage, and must say why where it is declared."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    def fingerprinted(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


@dataclass(frozen=True)
class Output:
    """A file (or folder) a stage wrote under the work folder; `artifact` names deployable artifacts only."""

    path: str
    kind: str  # torchscript | onnx | engine | exported | aoti | report | log
    artifact: str | None = None
    precision: str | None = None
    details: dict[str, Any] = field(default_factory=dict)
    value: Any = None  # a report's content, handed to the stages that consume it in memory


@dataclass
class StageResult:
    outputs: list[Output]
    details: dict[str, Any] = field(default_factory=dict)
    values: dict[str, Any] = field(default_factory=dict)  # results with no file of their own, by name


@dataclass(frozen=True)
class Release:
    """What a deploy records about itself in the version it makes (sign-off writes it down). None of it is a
    stage setting: the version's name, the recipe as resolved and as given, and the version before it."""

    version: str
    recipe: dict[str, Any]  # the resolved recipe, every default filled in (recipe.yaml)
    recipe_path: Path  # the recipe file as given
    overrides: tuple[str, ...]
    previous: Path | None  # the latest version: what the report's "changes since" compares with
    folder: Path  # where the version will appear once published
    started_in: Path  # the working directory the deploy was started from (reproduce.sh runs from there)


@dataclass
class RunContext:
    """What a running stage may use besides its config and inputs: its work folder, a progress line, the
    store's cache, the release being made, and the model and data, loaded once per slice and shared by the
    stages that name it."""

    workdir: Path
    report: Callable[[str], None] = lambda message: None  # progress text for the live display
    cache_dir: Path | None = None  # the store's cache (e.g. TensorRT timing caches), never a version folder
    release: Release | None = None
    _loaded: dict[str, Any] = field(default_factory=dict)
    # set when the run stops early (a user error, a critical failure, Ctrl-C): a background stage's child
    # process is killed then, before the deploy removes or leaves its work folder (pipeline.core.children.run_job)
    cancel: threading.Event = field(default_factory=threading.Event)

    def model(self, spec: ModelSpec) -> LoadedModel:
        key = "model:" + spec.model_dump_json()
        if key not in self._loaded:
            from pipeline.inputs.models import load_model

            self._loaded[key] = load_model(spec)
        return self._loaded[key]

    def dataset(self, spec: DataSpec) -> Dataset:
        key = "data:" + spec.model_dump_json()
        if key not in self._loaded:
            from pipeline.inputs.data import Dataset

            model = self.model(spec.model) if spec.model is not None else None
            tokenizer, config = (model.tokenizer, model.config) if model is not None else (None, None)
            self._loaded[key] = Dataset(spec, tokenizer, config)
        return self._loaded[key]

    def path(self, relative: str) -> Path:
        target = self.workdir / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        return target


RunFunction = Callable[[RunContext, Any, dict[str, ArtifactRecord]], StageResult]
RUN_STAGES = "run:stages"  # a consumable name: the run record so far, handed on in memory by the executor


FRONT = "front"  # runs in the deploy's own thread, in plan order
ALONE = "alone"  # in front, once every background stage has finished: it times its own work
BACKGROUND = "background"  # in a worker thread while the stages after it go on
LANE = "lane:"  # + a name: in that lane's worker process


def on_lane(name: str) -> str:
    """The placement of a stage on the named lane."""
    return LANE + name


@dataclass(frozen=True)
class Stage:
    """One node of the plan.

    consumes: artifact names that must exist (a failed one skips this stage);
    consumes_any: artifact names used when present (validate/benchmark work on whatever was built);
    produces: the artifact names this stage may create; critical: a failure is a bug (exit 3), not a variant's;
    volatile: results are measurements (benchmark), re-made on --rebench; final: runs in every new version
    (sign-off: its files name the version), though `plan` judges it fresh or stale like any other.

    placement, where and when it runs:
    - FRONT: in the deploy's thread, in plan order.
    - ALONE: in front, after every background stage has finished, since it times its own work (the benchmark;
      TensorRT times its tactics on the GPU: a compile beside it would skew which tactic wins).
    - BACKGROUND: in a worker thread while the stages after it go on (its heavy work must run in a child
      process: nothing process-wide may change under the stages in front).
    - on_lane(name): in that lane's worker process (pipeline/run/lane_worker.py), one stage at a time, in plan
      order as their inputs arrive; one whose inputs its lane is still making waits for them in its own job
      instead of in front (the plan puts the ONNX builds on a lane on a GPU host, pipeline/run/plan.py).
    A stage that consumes what a background or lane stage produces waits for it first, unless it `takes_late`
    those inputs: it then starts at once and gets a `Late` for each, which it resolves (waits for) when it
    comes to it (validate checks the others meanwhile).
    """

    name: str
    version: int
    config: StageConfig
    run: RunFunction
    environment: Callable[[], dict[str, Any]] = dict
    consumes: tuple[str, ...] = ()
    consumes_any: tuple[str, ...] = ()
    produces: tuple[str, ...] = ()
    critical: bool = False
    volatile: bool = False
    final: bool = False
    placement: str = FRONT
    takes_late: bool = False

    @property
    def background(self) -> bool:
        """Whether it runs beside the stages after it (in a worker thread or on a lane)."""
        return self.placement == BACKGROUND or self.lane is not None

    @property
    def lane(self) -> str | None:
        """The lane it runs on, if any."""
        return self.placement.removeprefix(LANE) if self.placement.startswith(LANE) else None

    @property
    def alone(self) -> bool:
        return self.placement == ALONE


@dataclass
class Late:
    """An input still being built by a background stage: `wait()` blocks until it is done and returns its
    record, or None when the stage failed (the artifact is then absent, as if never built)."""

    name: str
    wait: Callable[[], ArtifactRecord | None]
