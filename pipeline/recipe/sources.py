"""Where the model and its representative inputs come from: model sources, inputs, dims and data."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from pipeline.recipe.base import Dim, FiniteData, Samples, Seed, Strict, Value

Family = Literal["transformer", "generic"]
MAX_MODEL_BUILD_S = 3600  # importing, building and running a model once at a few shapes: an hour is plenty


class ModelSourceBase(Strict):
    family: Family | None = Field(
        None,
        description="Model family whose defaults apply (INT8 op types and exclusions, optimizer model type): "
        "transformer (BERT-style encoder defaults) or generic; default transformer for a huggingface source, "
        "generic for every other source",
    )
    build_timeout_s: Annotated[int, Field(gt=0, le=MAX_MODEL_BUILD_S)] = Field(
        300,
        description="seconds pre-flight may take to import, build and run the model (in a child process: "
        "a model that hangs or kills its process is a located error, not a stuck or dead tool); read by "
        "pre-flight only, never part of a stage's fingerprint",
    )


class HuggingFaceSource(ModelSourceBase):
    """A transformers encoder: a local directory, a directory shipped inside a Python package, or a hub id."""

    source: Literal["huggingface"] = Field(description="a Hugging Face transformers text encoder")
    id: str | None = Field(None, description="hub id; used when neither path nor package is given")
    path: str | None = Field(None, description="local model directory, relative to the recipe file")
    package: str | None = Field(
        default=None,
        description="'python_package/sub/dir': a model directory shipped in an installed package",
    )
    offline: bool = Field(True, description="never download: load from local files or the local cache only")
    pooling: Literal["mean", "none"] = Field(
        "mean", description="mean: add the sentence embedding (mean over the attention mask) as an output"
    )
    normalize: bool = Field(True, description="L2-normalize the pooled sentence embedding")
    seed: Seed = Field(
        0, description="seed of any weight the checkpoint lacks (transformers initialises those at random)"
    )


class TorchvisionSource(ModelSourceBase):
    source: Literal["torchvision"] = Field(description="a torchvision model (needs the torchvision extra)")
    name: str = Field(description="torchvision.models.get_model name, e.g. resnet18")
    weights: str | None = Field(None, description="torchvision weights enum name; none: random init")
    seed: Seed = Field(
        0, description="seed of the random initialisation (every process that builds the model gets the same)"
    )


class EntrypointSource(ModelSourceBase):
    """Any `package.module:factory` that returns an nn.Module; kwargs are passed through."""

    source: Literal["entrypoint"] = Field(description="a Python factory that returns an nn.Module")
    entrypoint: Annotated[str, Field(pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")] = Field(
        description="'package.module:factory', importable from the working directory or PYTHONPATH"
    )
    kwargs: dict[str, FiniteData] = Field(
        {}, description="keyword arguments passed to the factory (data: numbers finite)"
    )
    seed: Seed = Field(0, description="torch.manual_seed before the factory runs (reproducible random init)")


class TorchScriptSource(ModelSourceBase):
    source: Literal["torchscript"] = Field(description="a saved TorchScript module")
    path: str = Field(description="the .pt/.ts file, relative to the recipe file")


ModelSource = Annotated[
    HuggingFaceSource | TorchvisionSource | EntrypointSource | TorchScriptSource,
    Field(discriminator="source"),
]

# ---------------------------------------------------------------- inputs, outputs, data


class DimRange(Strict):
    """Sizes of one dynamic axis, each at most 4194304 (2**22, some millions: base.MAX_DIM says why); an
    input's largest shape, the product of its sizes, is bounded as a whole too (checks.py)."""

    min: Dim = Field(description="smallest size the artifacts must accept")
    opt: Dim = Field(description="the typical size (export example, engine optimum, default benchmark)")
    max: Dim = Field(description="largest size the artifacts must accept")

    def clamp(self, size: int) -> int:
        """`size` brought within the range: a batch a stage picks for itself (2 to trace, 8 to calibrate) must
        still be one a graph exported for a fixed size accepts."""
        return max(self.min, min(size, self.max))


class InputSpec(Strict):
    name: Annotated[str, Field(min_length=1)] = Field(
        description="input name (the model's positional argument order)"
    )
    dtype: Literal["float32", "float16", "int64", "int32", "uint8", "bool"] = Field(
        "float32", description="element type (uint8: an image's bytes, normalized inside the model)"
    )
    shape: list[Dim | Annotated[str, Field(pattern=r"^[A-Za-z_]\w*$")]] = Field(
        description="sizes: an integer for a fixed axis, a name for a dynamic one (its range under dims)"
    )
    low: Value | None = Field(
        None,
        description="smallest value of random samples (data.samples.source: random); default 0 for float "
        "and uint8 inputs; required for int64 and int32 inputs (token ids, class indices), except a "
        "huggingface source's input_ids, attention_mask and token_type_ids (its vocabulary, all ones, its type "
        "vocabulary); bool inputs: 0 is False, 1 is True (default 0..1, half of each)",
    )
    high: Value | None = Field(
        None,
        description="largest value of random samples (integers: inclusive); default 1 for float and bool "
        "inputs, 255 for uint8 inputs",
    )


def corner_shape(
    spec: InputSpec, dims: dict[str, DimRange], corner: str, overrides: dict[str, int] | None = None
) -> list[int]:
    """Concrete shape of one input at a corner (min/opt/max), with some dims pinned by `overrides`."""
    overrides = overrides or {}
    return [d if isinstance(d, int) else overrides.get(d, getattr(dims[d], corner)) for d in spec.shape]


class TextData(Strict):
    """Sentences (JSONL with a text field, or one per line) tokenized with the model's own tokenizer."""

    source: Literal["text"] = Field(description="sentences, tokenized by the model's tokenizer")
    path: str = Field(description="JSONL (one object per line) or plain text (one sentence per line)")
    field: str = Field("text", description="the JSONL key that holds the sentence")


class NpzData(Strict):
    """An .npz holding one array per input, samples along the first axis."""

    source: Literal["npz"] = Field(description="arrays saved with numpy.savez")
    path: str = Field(
        description=".npz with one array per input name, samples along the first axis (each sample is the "
        "input's shape without the batch axis); relative to the recipe file"
    )


class RandomData(Strict):
    """Seeded synthetic samples drawn in each input's low..high range at its opt shape; as many as the
    calibration and validation splits need unless `samples` says more."""

    source: Literal["random"] = Field(description="seeded synthetic samples in each input's low..high")
    samples: Samples | None = Field(
        None, description="number of samples to draw, at most 100000 (default: calibration + validation)"
    )


class DataConfig(Strict):
    samples: Annotated[TextData | NpzData | RandomData, Field(discriminator="source")] = Field(
        description="where representative inputs come from"
    )
    calibration: Samples = Field(
        64,
        description="samples in the calibration split (INT8 and FP8 scales), at most 100000 (hours of CPU already)",
    )
    validation: Samples = Field(
        32, description="samples in the held-out validation split, at most 100000 (hours of CPU already)"
    )
    seed: Seed = Field(0, description="seed of the deterministic, disjoint split")
