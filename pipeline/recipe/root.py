"""The recipe as a whole: the only thing users write. Validates and never acts (no I/O, no environment
changes); where artifacts are stored and how runs are tracked live here too."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, model_validator

from pipeline.recipe.base import MAX_BUILD_S, Strict
from pipeline.recipe.export import ExportConfig, VariantsConfig
from pipeline.recipe.measure import BenchmarkConfig, RuntimeConfig, SelectionConfig, ValidationConfig
from pipeline.recipe.sources import DataConfig, DimRange, InputSpec, ModelSource, corner_shape

# A name is a folder name (the store's, Triton's model folder) and part of file names beside it: at most 100
# ASCII characters, well within the 255 bytes a file system allows a name.
MAX_NAME = 100


class OutputConfig(Strict):
    root: Annotated[str, Field(min_length=1)] = Field(
        "artifacts",
        description="store root: versions go to <root>/<name>/vNNNN; a relative root is taken from the "
        "working directory the command starts in (data and model paths: from the recipe's folder)",
    )
    lock_timeout_s: Annotated[float, Field(ge=0, le=MAX_BUILD_S)] = Field(
        0, description="seconds to wait for another deploy of the same name; at most 86400 (a day)"
    )


class MlflowTracking(Strict):
    uri: str = Field(
        "mlruns",
        description="MLflow tracking URI; a plain path is a local file store, relative to the working "
        "directory",
    )
    experiment: str | None = Field(None, description="experiment name (default: the recipe name)")


class TrackingConfig(Strict):
    mlflow: MlflowTracking | None = Field(
        None, description="log each deploy as an MLflow run (needs the mlflow extra)"
    )
    required: bool = Field(
        False,
        description="a deploy whose run could not be logged exits 1 (the version stays published); false: the "
        "failure is printed and the exit code stands",
    )


class Recipe(Strict):
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=MAX_NAME)] = Field(
        description="release name: the store folder <output.root>/<name>; at most 100 characters"
    )
    model: ModelSource = Field(description="where the PyTorch model comes from")
    inputs: Annotated[list[InputSpec], Field(min_length=1)] = Field(
        description="model inputs, in the order the model takes them"
    )
    dims: dict[str, DimRange] = Field({}, description="min/opt/max of every dynamic dim named in shapes")
    outputs: Annotated[list[str], Field(min_length=1)] = Field(
        description="names of the model's outputs, in order"
    )
    data: DataConfig = Field(description="representative inputs and their calibration/validation split")
    variants: VariantsConfig = Field(VariantsConfig(), description="which artifacts to build")
    export: ExportConfig = Field(ExportConfig(), description="settings per export format")
    validation: ValidationConfig = Field(ValidationConfig(), description="accuracy checks and tolerances")
    benchmark: BenchmarkConfig = Field(BenchmarkConfig(), description="shapes and measurement policy")
    selection: SelectionConfig = Field(SelectionConfig(), description="how the winner is chosen")
    runtime: RuntimeConfig = Field(RuntimeConfig(), description="GPU execution modes of the PyTorch runtimes")
    output: OutputConfig = Field(OutputConfig(), description="where versions are stored")
    tracking: TrackingConfig = Field(TrackingConfig(), description="run tracking (MLflow)")

    @model_validator(mode="before")
    @classmethod
    def _family_defaults(cls, data: Any) -> Any:
        from pipeline.recipe.family import with_family_defaults

        return with_family_defaults(data)

    @model_validator(mode="after")
    def _default_batches_within_the_batch(self) -> Recipe:
        """The default batches (corner batches 2, 2, 1; benchmark batches 1 and 8; the objective's batch 1)
        brought within the batch dim's range, each where the recipe gives none: a fixed batch of 4 was refused
        for corner batches the user never wrote, and a range of 1..4 for the default benchmark batch of 8.
        Batches the recipe gives are checked as written (recipe.checks)."""
        rng = self.dims.get(self.benchmark.batch_dim)
        if rng is None or rng.min > rng.max:
            return self
        validation, benchmark, selection = self.validation, self.benchmark, self.selection
        if "corner_batches" not in validation.model_fields_set:
            fitted = {k: rng.clamp(v) for k, v in validation.corner_batches.items()}
            validation = validation.model_copy(update={"corner_batches": fitted})
        if "batch_sizes" not in benchmark.model_fields_set:
            sizes = list(dict.fromkeys(rng.clamp(b) for b in benchmark.batch_sizes))
            benchmark = benchmark.model_copy(update={"batch_sizes": sizes})
        objective = selection.objective
        if "objective" not in selection.model_fields_set or "batch" not in objective.model_fields_set:
            objective = objective.model_copy(update={"batch": rng.clamp(objective.batch)})
            selection = selection.model_copy(update={"objective": objective})
        for name, value in (("validation", validation), ("benchmark", benchmark), ("selection", selection)):
            if value != getattr(self, name):
                object.__setattr__(self, name, value)
        return self

    def p99_target_ms(self) -> float:
        """The server scenario's one latency target: the max_qps_at_p99 objective's where it names one, else
        benchmark.server.p99_ms (the recipe checks refuse two that differ)."""
        objective = self.selection.objective
        if objective.metric == "max_qps_at_p99" and objective.p99_ms is not None:
            return objective.p99_ms
        return self.benchmark.server.p99_ms

    def dim_names(self) -> set[str]:
        return {d for spec in self.inputs for d in spec.shape if isinstance(d, str)}

    def corner_shape(
        self, spec: InputSpec, corner: str, overrides: dict[str, int] | None = None
    ) -> list[int]:
        """Concrete shape of one input at a corner (min/opt/max), with some dims pinned by `overrides`."""
        return corner_shape(spec, self.dims, corner, overrides)
