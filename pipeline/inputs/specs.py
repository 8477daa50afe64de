"""Typed slices of the recipe that several stages share: the model, the data, and how runners run artifacts.

Each is built from the recipe in one place (`from_recipe`) and sits in the config of every stage that uses it,
so that its JSON is part of that stage's fingerprint: a stage that loads the model or the data is invalidated
by what they depend on, because it cannot load them without naming them. Where things lie (a source path, the
recipe's folder) is left out of that JSON (`exclude=True`); `digest` hashes what they hold instead, so that
moving a checkout does not make stages stale. No torch here: building a slice never loads a model.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from pipeline.core.errors import RecipeError
from pipeline.core.variants import Variant, parse
from pipeline.recipe import (
    DataConfig,
    DimRange,
    EntrypointSource,
    HuggingFaceSource,
    InputSpec,
    ModelSource,
    NpzData,
    Recipe,
    RuntimeConfig,
    TextData,
    TorchScriptSource,
    corner_shape,
)

DATA_LAYOUT = 5  # 2: random samples spread over each dynamic dim's range, batches grouped by shape; 3: dims
# out of lockstep (combinations, not only squares); 4: bool inputs keep to their low..high; 5: a random sample
# fitted to a longer shape is extended with random values, not zeros


class Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# ---------------------------------------------------------------- the model


PREFLIGHT_ONLY = 1  # what a stage's copy of the source holds for pre-flight's own settings


class ModelSpec(Spec):
    """Where the model comes from and its I/O signature: the inputs in the order it takes them, the dims
    their dynamic axes range over, and the outputs in the order it returns them."""

    source: ModelSource = Field(exclude=True)
    recipe_dir: Path = Field(exclude=True)
    inputs: list[InputSpec]
    dims: dict[str, DimRange]
    outputs: list[str]
    digest: str  # what defines the weights: the files of a local model, the source of a factory

    @classmethod
    def from_recipe(cls, recipe: Recipe, recipe_dir: Path) -> ModelSpec:
        return cls(
            # the family only picks defaults; the build timeout bounds pre-flight alone
            source=recipe.model.model_copy(update={"family": None, "build_timeout_s": PREFLIGHT_ONLY}),
            recipe_dir=recipe_dir,
            inputs=list(recipe.inputs),
            dims=dict(recipe.dims),
            outputs=list(recipe.outputs),
            digest=model_digest(recipe.model, recipe_dir),
        )

    @property
    def input_names(self) -> list[str]:
        return [s.name for s in self.inputs]


def huggingface_dir(source: HuggingFaceSource, recipe_dir: Path) -> str:
    """Where transformers should load from: a local path, a package's shipped copy, or the hub id."""
    if source.path:
        return str(resolve(source.path, recipe_dir))
    if source.package:
        package, _, sub = source.package.partition("/")
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise RecipeError(
                f"model.package: Python package '{package}' is not installed (pip install {package.replace('_', '-')})"
            )
        return str(Path(next(iter(spec.submodule_search_locations))) / sub)
    assert source.id
    return source.id


def resolve(path: str, recipe_dir: Path) -> Path:
    p = Path(path)
    return p if p.is_absolute() else recipe_dir / p


def model_digest(source: ModelSource, recipe_dir: Path) -> str:
    """Hash of what defines the weights: files of a local model, the source spec for entrypoints (seeded)."""
    return _model_digest(source.model_dump_json(), str(recipe_dir.resolve()))


@functools.cache
def _model_digest(source_json: str, recipe_dir_text: str) -> str:
    recipe_dir = Path(recipe_dir_text)
    src = TypeAdapter(ModelSource).validate_json(source_json)
    # where the files lie, the defaults family and pre-flight's time bound do not change the weights
    h = hashlib.sha256(src.model_dump_json(exclude={"path", "package", "family", "build_timeout_s"}).encode())
    folder: Path | None = None
    if isinstance(src, HuggingFaceSource):
        location = Path(huggingface_dir(src, recipe_dir))
        folder = location if location.is_dir() else None
    elif isinstance(src, TorchScriptSource):
        h.update(resolve(src.path, recipe_dir).read_bytes())
    elif isinstance(src, EntrypointSource):
        module = importlib.import_module(src.entrypoint.split(":")[0])
        if getattr(module, "__file__", None):
            h.update(Path(module.__file__).read_bytes())
    if folder is not None:
        for f in sorted(p for p in folder.rglob("*") if p.is_file()):
            h.update(str(f.relative_to(folder)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()


def dim_sizes(inputs: list[InputSpec], feeds: Mapping[str, Any]) -> dict[str, int]:
    """The size of every symbolic dim in these feeds, read from the recipe's input shapes."""
    return {
        dim: int(feeds[spec.name].shape[axis])
        for spec in inputs
        if spec.name in feeds
        for axis, dim in enumerate(spec.shape)
        if isinstance(dim, str)
    }


# ---------------------------------------------------------------- the data


class DataSpec(Spec):
    """The representative samples and how they are split and shaped: the inputs and dims (padding and
    cropping), the batch and sequence axes, and for text the model whose tokenizer reads it."""

    data: DataConfig = Field(exclude=True)  # its settings and the file's bytes are in `digest`
    recipe_dir: Path = Field(exclude=True)
    inputs: list[InputSpec]
    dims: dict[str, DimRange]
    batch_dim: str
    sequence_dim: str | None
    model: ModelSpec | None  # text samples: the tokenizer; a huggingface model: its vocabulary
    digest: str
    # the padding mask and its value at padded positions (validation.padding_mask, padding_value), where the
    # mask is an input and the samples are arrays fitted to each shape: a sample cropped to a shorter corner
    # keeps the first window of its most real tokens (a left-padded one the start of its text), and one padded
    # to a longer corner is padded with padding (for a key-padding mask, zeros would mark the filler as real
    # tokens); in `digest`
    padding: tuple[str, int] | None = Field(None, exclude=True)

    @property
    def fill(self) -> dict[str, int]:
        """Each input's value where a stored sample is padded, where it is not 0."""
        return {self.padding[0]: self.padding[1]} if self.padding and self.padding[1] else {}

    @classmethod
    def from_recipe(cls, recipe: Recipe, recipe_dir: Path) -> DataSpec:
        # text samples need the model's tokenizer; a huggingface model's random token ids its vocabulary
        needs_model = recipe.data.samples.source == "text" or isinstance(recipe.model, HuggingFaceSource)
        model = ModelSpec.from_recipe(recipe, recipe_dir) if needs_model else None
        fields = {
            "inputs": list(recipe.inputs),
            "dims": dict(recipe.dims),
            "batch_dim": recipe.benchmark.batch_dim,
            "sequence_dim": recipe.benchmark.sequence_dim,
        }
        mask, value = recipe.validation.padding_mask, recipe.validation.padding_value
        arrays = recipe.data.samples.source != "text"  # text is tokenized to each shape, not fitted
        padding = (mask, value) if arrays and any(s.name == mask for s in recipe.inputs) else None
        digest = data_digest(
            recipe.data, recipe_dir, model.digest if model else None, **fields, padding=padding
        )
        return cls(
            data=recipe.data, recipe_dir=recipe_dir, model=model, digest=digest, padding=padding, **fields
        )

    @property
    def file(self) -> Path | None:
        return data_file(self.data, self.recipe_dir)

    def corner_dims(self, corner: str) -> dict[str, int]:
        return {name: getattr(rng, corner) for name, rng in self.dims.items()}

    def corner_shape(
        self, spec: InputSpec, corner: str, overrides: dict[str, int] | None = None
    ) -> list[int]:
        return corner_shape(spec, self.dims, corner, overrides)


def data_file(data: DataConfig, recipe_dir: Path) -> Path | None:
    samples = data.samples
    return resolve(samples.path, recipe_dir) if isinstance(samples, TextData | NpzData) else None


def data_digest(
    data: DataConfig,
    recipe_dir: Path,
    model: str | None,
    inputs: list[InputSpec],
    dims: dict[str, DimRange],
    batch_dim: str,
    sequence_dim: str | None,
    padding: tuple[str, int] | None = None,
) -> str:
    """Everything the feeds depend on: the sample file's content, the split settings, the inputs (dtype,
    shape, random range), the dims (padding and truncation), the padding mask arrays are cropped and padded
    by (absent where there is none, so that the digests of recipes without one stay as they were) and the
    model (its tokenizer)."""
    settings = {
        "layout": DATA_LAYOUT,
        "data": data.model_dump(exclude={"samples": {"path"}}),
        "inputs": [s.model_dump() for s in inputs],
        "dims": {k: v.model_dump() for k, v in dims.items()},
        "batch_dim": batch_dim,
        "sequence_dim": sequence_dim,
        "model": model,
    }
    if padding:
        settings["padding"] = list(padding)
    h = hashlib.sha256(json.dumps(settings, sort_keys=True).encode())
    path = data_file(data, recipe_dir)
    if path is not None:
        h.update(path.read_bytes())
    return h.hexdigest()


# ---------------------------------------------------------------- runners


class RunnerSettings(Spec):
    """What running an artifact depends on besides its file: the I/O signature, the CPU threads every CPU
    runtime is pinned to, and the GPU execution modes offered as runtimes of their own."""

    inputs: list[InputSpec]
    dims: dict[str, DimRange]
    outputs: list[str]
    sequence_dim: str | None
    intra_op_threads: int | None
    runtime: RuntimeConfig

    @classmethod
    def from_recipe(cls, recipe: Recipe) -> RunnerSettings:
        return cls(
            inputs=list(recipe.inputs),
            dims=dict(recipe.dims),
            outputs=list(recipe.outputs),
            sequence_dim=recipe.benchmark.sequence_dim,
            # resolved here, so that the count the rows ran at is in every fingerprint built from these
            # settings: the default depends on the environment and the CPU affinity, not on the recipe alone
            intra_op_threads=recipe.benchmark.intra_op_threads or default_threads(),
            runtime=recipe.runtime,
        )

    @property
    def input_names(self) -> list[str]:
        return [s.name for s in self.inputs]

    @property
    def threads(self) -> int:
        """Threads every CPU runtime is pinned to: the recipe's setting, else OMP_NUM_THREADS where the
        environment sets it (the limit torch itself takes, as a batch system or a shared CI host sets it), else
        the cores this process may run on (a container's cpuset or `taskset` leaves fewer than the machine has:
        more threads than cores would only take turns)."""
        return self.intra_op_threads or default_threads()


def default_threads() -> int:
    """A CPU runtime's threads where the recipe names none: OMP_NUM_THREADS, else the cores this process may
    run on."""
    return omp_threads() or available_cores()


def omp_threads() -> int | None:
    """OMP_NUM_THREADS as OpenMP reads it for the outermost level (its first item: "4,2" is 4), at most 1024
    like the recipe's own setting; None where unset or unreadable, so that the default falls to the cores."""
    first = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    return min(int(first), 1024) if first.isdigit() and int(first) > 0 else None


def available_cores() -> int:
    """The cores in this process's CPU affinity (a container's cpuset, `taskset`), which os.cpu_count() ignores:
    more threads than those cores would only take turns."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # no affinity call on this OS (macOS): every core
        return os.cpu_count() or 1


def resolved_variant(recipe: Recipe, name: str) -> Variant:
    """A recipe's variant name parsed, an `engine-<p>` resolved to the flavour export.tensorrt.flavour names
    (`auto`: the installed one)."""
    found = parse(name)
    if found.flavour_from_setting:
        from pipeline.toolchain.trt.flavour import resolve_flavour

        found = parse(name, resolve_flavour(recipe.export.tensorrt.flavour))
    return found
