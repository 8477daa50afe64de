"""The recipe schema: the only thing users write. Validates and never acts (no I/O, no environment changes)."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

PositiveInt = Annotated[int, Field(gt=0)]
PositiveFloat = Annotated[float, Field(gt=0)]
Fraction = Annotated[float, Field(ge=0, le=1)]
Precision = Literal["fp32", "fp16", "bf16", "int8"]
Metric = Literal["max_abs", "mean_abs", "max_rel", "cosine", "neighbours"]
METRICS: tuple[str, ...] = ("max_abs", "mean_abs", "max_rel", "cosine", "neighbours")
Runtime = Literal[
    "torch-cpu",
    "torch-cuda",
    "torchscript-cpu",
    "torchscript-cuda",
    "torch-compile-cuda",
    "onnxruntime-cpu",
    "onnxruntime-cuda",
    "tensorrt",
    "tensorrt-rtx",
    # execution modes of the GPU runtimes (pipeline/runners/pt2.py, ort_cuda_graph.py): rows of their own
    "torch-compile-cuda-reduce-overhead",
    "torch-compile-cuda-max-autotune",
    "torch-compile-cuda-max-autotune-no-cudagraphs",
    "torch-aoti-cpu",
    "torch-aoti-cuda",
    "torch-aoti-cuda-bucketed",
    "torch-aoti-cuda-graph",
    "torch-aoti-cuda-graph-bucketed",
    "torch-cpu-bucketed",
    "onnxruntime-cuda-graph",
]
CompileMode = Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]

VARIANTS = (
    "torchscript-fp32",
    "onnx-fp32",
    "onnx-fp16",
    "onnx-int8",
    "onnx-int8-dynamic",
    "onnx-optimized-fp32",
    "onnx-optimized-fp16",
    "engine-fp32",
    "engine-fp16",
    "engine-int8",
    "tensorrt-fp32",
    "tensorrt-fp16",
    "tensorrt-int8",
    "tensorrt-rtx-fp32",
    "tensorrt-rtx-fp16",
    "tensorrt-rtx-int8",
    "exported-fp32",  # torch.export ExportedProgram (pipeline/stages/export_pt2.py)
    "exported-fp16",
    "exported-bf16",
    "aoti-fp32",  # AOTInductor package compiled for this host's device
    "aoti-fp16",
    "aoti-bf16",
)
VariantName = Literal[VARIANTS]  # type: ignore[valid-type]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# ---------------------------------------------------------------- model sources

Family = Literal["transformer", "generic"]


class ModelSourceBase(Strict):
    family: Family | None = Field(
        None,
        description="Model family whose defaults apply (INT8 op types and exclusions, optimizer model type): "
        "transformer (BERT-style encoder defaults) or generic; default transformer for a huggingface source, "
        "generic for every other source",
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


class TorchvisionSource(ModelSourceBase):
    source: Literal["torchvision"] = Field(description="a torchvision model (needs the torchvision extra)")
    name: str = Field(description="torchvision.models.get_model name, e.g. resnet18")
    weights: str | None = Field(None, description="torchvision weights enum name; none: random init")


class EntrypointSource(ModelSourceBase):
    """Any `package.module:factory` that returns an nn.Module; kwargs are passed through."""

    source: Literal["entrypoint"] = Field(description="a Python factory that returns an nn.Module")
    entrypoint: Annotated[str, Field(pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")] = Field(
        description="'package.module:factory', importable from the working directory or PYTHONPATH"
    )
    kwargs: dict[str, object] = Field({}, description="keyword arguments passed to the factory")
    seed: Annotated[int, Field(ge=0)] = Field(
        0, description="torch.manual_seed before the factory runs (reproducible random init)"
    )


class TorchScriptSource(ModelSourceBase):
    source: Literal["torchscript"] = Field(description="a saved TorchScript module")
    path: str = Field(description="the .pt/.ts file, relative to the recipe file")


ModelSource = Annotated[
    HuggingFaceSource | TorchvisionSource | EntrypointSource | TorchScriptSource,
    Field(discriminator="source"),
]

# ---------------------------------------------------------------- inputs, outputs, data


class DimRange(Strict):
    min: PositiveInt = Field(description="smallest size the artifacts must accept")
    opt: PositiveInt = Field(
        description="the typical size (export example, engine optimum, default benchmark)"
    )
    max: PositiveInt = Field(description="largest size the artifacts must accept")


class InputSpec(Strict):
    name: Annotated[str, Field(min_length=1)] = Field(
        description="input name (the model's positional argument order)"
    )
    dtype: Literal["float32", "float16", "int64", "int32", "bool"] = Field(
        "float32", description="element type"
    )
    shape: list[PositiveInt | Annotated[str, Field(pattern=r"^[A-Za-z_]\w*$")]] = Field(
        description="sizes: an integer for a fixed axis, a name for a dynamic one (its range under dims)"
    )
    low: float = Field(0.0, description="smallest value of random samples (data.samples.source: random)")
    high: float = Field(1.0, description="largest value of random samples (integers: inclusive)")


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
    samples: PositiveInt | None = Field(
        None, description="number of samples to draw (default: calibration + validation)"
    )


class DataConfig(Strict):
    samples: Annotated[TextData | NpzData | RandomData, Field(discriminator="source")] = Field(
        description="where representative inputs come from"
    )
    calibration: PositiveInt = Field(64, description="samples in the calibration split (INT8 only)")
    validation: PositiveInt = Field(32, description="samples in the held-out validation split")
    seed: Annotated[int, Field(ge=0)] = Field(0, description="seed of the deterministic, disjoint split")


# ---------------------------------------------------------------- export settings


class TorchScriptExport(Strict):
    check_corners: list[Literal["min", "opt", "max"]] = Field(
        ["min", "opt", "max"], description="shape corners at which the traced module is checked against eager"
    )
    check_atol: PositiveFloat = Field(1e-4, description="largest absolute difference the trace check allows")
    freeze: bool = Field(True, description="torch.jit.freeze the traced module")


class OnnxExport(Strict):
    exporter: Literal["dynamo", "legacy"] = Field("dynamo", description="torch.onnx exporter to use")
    fallback: bool = Field(True, description="fall back to the legacy exporter when dynamo fails")
    opset: Annotated[int, Field(ge=13, le=23)] = Field(18, description="ONNX opset version")


class Fp16Export(Strict):
    keep_io_types: bool = Field(True, description="keep FP32 graph inputs and outputs (casts inside)")
    block_ops: list[str] = Field(
        ["ReduceMean", "ReduceSum", "Pow", "Sqrt", "Softmax", "Exp", "Log", "Erf"],
        description="op types kept in FP32 (they overflow or lose precision in FP16)",
    )


class Int8Export(Strict):
    calibration: Literal["minmax", "entropy", "percentile"] = Field(
        "minmax", description="calibration method (on the calibration split only)"
    )
    percentile: Annotated[float, Field(gt=90, le=100)] = Field(
        99.99, description="percentile kept by percentile calibration"
    )
    op_types: list[str] = Field(
        ["Conv", "MatMul", "Gemm"],
        description="op types to quantize; default by model family: transformer [MatMul], generic "
        "[Conv, MatMul, Gemm]",
    )
    weights_only_matmul: bool = Field(
        True, description="quantize only MatMuls with a constant (weight) input, not activation x activation"
    )
    include: list[str] = Field(
        [],
        description="fnmatch patterns on the module path that owns each op ('*' crosses dots); when given, "
        "only matching ops are quantized",
    )
    exclude: list[str] = Field(
        [],
        description="fnmatch patterns on the owning module path of ops kept in float; default by model "
        "family: transformer ['*.intermediate.dense', '*.layer.*[0-9].output.dense'] (BERT feed-forward "
        "layers), generic []",
    )
    quantizer: Literal["onnxruntime", "modelopt"] = Field("onnxruntime", description="quantization library")


class OptimizeExport(Strict):
    model_type: str | None = Field(
        None,
        description="ONNX Runtime transformer optimizer model type (bert, gpt2, vit, ...); null: ONNX "
        "Runtime's graph optimizations only; default by model family: transformer bert, generic null",
    )
    opt_level: Annotated[int, Field(ge=0, le=2)] = Field(2, description="ONNX Runtime optimization level")
    fusions: list[Literal["onnxscript", "transformers"]] = Field(
        ["onnxscript", "transformers"],
        description="graph fusions, in order: onnxscript's ONNX Runtime fusions (Attention, "
        "SkipLayerNormalization, BiasGelu on dynamo exports), then ONNX Runtime's transformers optimizer",
    )


class EngineProfile(Strict):
    """Dims not named here take the recipe's top-level min/opt/max."""

    dims: dict[str, DimRange] = Field({}, description="min/opt/max per dim for this optimization profile")


class TensorRTExport(Strict):
    flavour: Literal["auto", "tensorrt", "tensorrt-rtx"] = Field(
        "auto", description="auto: tensorrt if installed, else tensorrt-rtx"
    )
    optimization_level: Annotated[int, Field(ge=0, le=5)] = Field(3, description="builder optimization level")
    workspace_mb: PositiveInt = Field(2048, description="builder workspace memory limit, MiB")
    compute_capabilities: list[Annotated[str, Field(pattern=r"^sm\d{2,3}$")]] = Field(
        ["sm89"], description="TensorRT-RTX ahead-of-time targets (sm75 ... sm121)"
    )
    profiles: list[EngineProfile] = Field(
        [EngineProfile()], description="optimization profiles (one by default: the recipe's dims)"
    )
    build_timeout_s: PositiveInt = Field(900, description="a build running longer fails its variant")


class Pt2Export(Strict):
    """torch.export / AOTInductor settings. `attention`: the attention kernel a transformers model is exported
    with (sdpa lowers to fused flash / memory-efficient kernels; the ONNX exports keep eager)."""

    attention: Literal["sdpa", "eager"] = Field(
        "sdpa", description="attention implementation the model is exported with (sdpa: fused kernels)"
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="AOTInductor target device; auto: cuda where present, else cpu"
    )
    max_autotune: bool = Field(
        False, description="AOTInductor GEMM autotuning: minutes of compile for a few percent"
    )
    fuse_projections: bool = Field(
        True, description="one GEMM for linears reading one tensor (Q, K, V): fewer kernel launches"
    )


class ExportConfig(Strict):
    torchscript: TorchScriptExport = Field(TorchScriptExport(), description="TorchScript trace settings")
    onnx: OnnxExport = Field(OnnxExport(), description="ONNX export settings")
    fp16: Fp16Export = Field(Fp16Export(), description="FP16 conversion settings")
    int8: Int8Export = Field(Int8Export(), description="INT8 quantization settings")
    optimize: OptimizeExport = Field(OptimizeExport(), description="ONNX Runtime optimizer settings")
    tensorrt: TensorRTExport = Field(TensorRTExport(), description="TensorRT engine build settings")
    pt2: Pt2Export = Field(Pt2Export(), description="torch.export and AOTInductor settings")
    triton: bool = Field(
        False,
        description="write a Triton Inference Server model repository of the winner under triton/ in the "
        "version folder",
    )


class VariantsConfig(Strict):
    build: Annotated[list[VariantName], Field(min_length=1)] = Field(
        ["torchscript-fp32", "onnx-fp32"],
        description="variants to build; engine-<precision> takes the resolved TensorRT flavour",
    )
    required: list[VariantName] = Field(
        [], description="variants whose failure fails the sign-off (exit 1); each must be in build"
    )
    allow_failed: bool = Field(
        True,
        description="false: any requested variant that fails to build, validate or benchmark fails the "
        "sign-off (exit 1); true: failures are listed and the rest may still be signed off",
    )
    gpu: list[VariantName] = Field(
        default=[], description="built only where the deploy host has a CUDA GPU (else reported as not built)"
    )


# ---------------------------------------------------------------- validation, benchmark, selection, output


class Tolerance(Strict):
    """Thresholds per metric (None: not checked); metrics listed as informational are reported, never gate.

    `neighbours` is the lowest acceptable nearest-neighbour agreement of an embedding output over the held-out
    data (the share of each sample's top-k neighbours that the candidate's embeddings keep)."""

    max_abs: PositiveFloat | None = Field(None, description="largest absolute difference to the reference")
    mean_abs: PositiveFloat | None = Field(None, description="largest mean absolute difference")
    max_rel: PositiveFloat | None = Field(None, description="largest relative difference")
    cosine: Annotated[float, Field(gt=0, le=1)] | None = Field(
        None, description="smallest cosine similarity to the reference (per sample, flattened)"
    )
    neighbours: Annotated[float, Field(gt=0, le=1)] | None = Field(
        None,
        description="smallest nearest-neighbour agreement of an embedding output over the held-out data "
        "(share of each sample's top-k neighbours kept); reported always, gating when set here",
    )
    informational: list[Metric] = Field([], description="metrics reported but never gating")
    outputs: dict[str, Tolerance] = Field(
        {},
        description="per-output overrides, by output name; a threshold written here gates unless the "
        "override lists the metric as informational itself",
    )

    def resolved(self, output: str) -> dict[str, tuple[float | None, bool]]:
        """metric -> (threshold, informational) for one output. A per-output override replaces the fields it
        sets: a threshold written there gates unless that override itself lists the metric as informational,
        and an informational list written there replaces the precision's. A metric without a threshold is
        informational."""
        override = self.outputs.get(output)
        resolved = {}
        for metric in METRICS:
            threshold = getattr(self, metric)
            informational = metric in self.informational
            if override is not None:
                own = override.model_fields_set
                if metric in own:
                    threshold = getattr(override, metric)
                    informational = metric in override.informational
                elif "informational" in own:
                    informational = metric in override.informational
            resolved[metric] = (threshold, informational or threshold is None)
        return resolved

    def gates(self, outputs: list[str]) -> bool:
        """Whether any metric of any output can fail an artifact (a tolerance that cannot is a mistake)."""
        return any(not info for o in outputs for _, info in self.resolved(o).values())


def _default_tolerances() -> dict[str, Tolerance]:
    return {
        "fp32": Tolerance(max_abs=1e-3, cosine=0.9999),
        "fp16": Tolerance(max_abs=5e-2, cosine=0.999, informational=["max_abs"]),
        "int8": Tolerance(max_abs=1.0, cosine=0.98, informational=["max_abs"]),
        # BF16 must be as accurate as FP16 to be chosen: the same gate by default
        "bf16": Tolerance(max_abs=5e-2, cosine=0.999, informational=["max_abs"]),
    }


class ValidationConfig(Strict):
    tolerances: dict[Precision, Tolerance] = Field(
        default_factory=_default_tolerances, description="thresholds per precision (fp32, fp16, int8)"
    )
    corners: list[Literal["min", "opt", "max"]] = Field(
        ["min", "opt", "max"],
        description="shape corners checked besides the held-out data; leaving out min or max warns that "
        "those dims are not validated",
    )
    corner_batches: dict[Literal["min", "opt", "max"], PositiveInt] = Field(
        {"min": 2, "opt": 2, "max": 1}, description="batch size used at each corner"
    )
    data_batch: PositiveInt = Field(8, description="batch size for the held-out validation split")
    padding_mask: str | None = Field(
        "attention_mask",
        description="the input whose zeros mark padded positions: per-token outputs are compared on real "
        "tokens only (no masking when no input has this name; null turns masking off)",
    )
    neighbours_k: PositiveInt = Field(5, description="top-k of the nearest-neighbour agreement of embeddings")


class BenchmarkConfig(Strict):
    batch_sizes: list[PositiveInt] = Field([1, 8], description="batch sizes to measure")
    sequence_lengths: list[PositiveInt] | Literal["data"] = Field(
        [],
        description="sequence lengths to measure, or 'data' (median and p90 of the data's token lengths); "
        "default: the opt of the sequence dim",
    )
    batch_dim: str = Field("batch", description="the dim (under dims) that is the batch axis")
    sequence_dim: str | None = Field(
        "sequence", description="the dim (under dims) that is the sequence axis; null: none"
    )
    intra_op_threads: PositiveInt | None = Field(
        None, description="CPU threads per runtime (default: the available cores)"
    )
    warmup_iters: PositiveInt = Field(10, description="warm-up iterations at least (first call discarded)")
    warmup_s: PositiveFloat = Field(0.2, description="warm-up seconds at least")
    window_s: PositiveFloat = Field(0.2, description="length of one measurement window, seconds")
    stable_windows: Annotated[int, Field(ge=2)] = Field(
        3, description="consecutive window medians that must agree"
    )
    stable_within: Annotated[float, Field(gt=0, lt=1)] = Field(
        0.05, description="relative spread within which window medians agree"
    )
    min_iters: PositiveInt = Field(20, description="timed iterations at least, per row")
    min_s: PositiveFloat = Field(1.0, description="timed seconds at least, per row")
    max_windows: PositiveInt = Field(10, description="windows at most, per row (then stable: false)")
    max_s: PositiveFloat = Field(15.0, description="timed seconds at most, per row (then stable: false)")
    include_reference: bool = Field(True, description="also time the eager PyTorch reference")
    runtimes: list[Runtime] | None = Field(
        None,
        description="which runtimes are timed; null: on a GPU host the GPU runtimes plus the CPU reference "
        "at batch 1 only, on a CPU host the CPU runtimes",
    )
    throughput_s: PositiveFloat = Field(
        0.3, description="per GPU row: seconds of back-to-back requests for sequences/s"
    )


class Objective(Strict):
    metric: Literal["p50_ms", "p90_ms", "p99_ms", "mean_ms"] = Field(
        "p50_ms", description="latency statistic to minimize"
    )
    batch: PositiveInt = Field(1, description="batch size the winner is chosen at")
    sequence_length: PositiveInt | None = Field(
        None, description="sequence length the winner is chosen at (default: the shortest measured)"
    )
    io: Literal["host", "device"] | None = Field(
        None, description="only rows of this I/O mode compete (default: either)"
    )


class RegressionBudget(Strict):
    """What `compare A B` counts as a regression of B against A (exit 1)."""

    max_slowdown: Annotated[float, Field(ge=0)] = Field(
        0.1,
        description="largest relative slowdown of the shipped objective value (B's winner against A's "
        "winner) tolerated when their confidence intervals do not overlap; 0.1 = 10 %",
    )
    max_accuracy_loss: Annotated[float, Field(ge=0)] = Field(
        0.25,
        description="largest growth, per required accuracy check of the shipped artifact, of the share of "
        "its tolerance it uses (error/threshold, or (1 - cosine)/(1 - threshold)); 0.25 = a quarter of the "
        "tolerance",
    )


class SelectionConfig(Strict):
    objective: Objective = Field(Objective(), description="what the winner is fastest at")
    max_p99_ms: PositiveFloat | None = Field(None, description="rows with a higher p99 cannot win")
    runtimes: list[Runtime] = Field([], description="runtimes allowed to win (default: all)")
    regression: RegressionBudget = Field(
        RegressionBudget(), description="regression budget for `compare` (CI release gates)"
    )


class PaddingConfig(Strict):
    """Padding-aware execution: each batch is split by real length (from the mask input) into at most
    `max_groups` groups, each trimmed to its longest member (rounded up to `multiple`), run, and scattered
    back. Exact on every real token and on pooled outputs; per-token outputs at padded positions are not the
    padded model's values (zero beyond a group's length), so they must be masked by their consumers."""

    mask_input: str = Field("attention_mask", description="the input whose zeros mark padded positions")
    per_token_outputs: list[str] = Field(
        [], description="outputs with one value per token (scattered back to the padded layout)"
    )
    multiple: PositiveInt = Field(16, description="trimmed lengths are rounded up to this multiple")
    max_groups: PositiveInt = Field(4, description="at most this many length groups per batch")
    group_overhead_tokens: Annotated[int, Field(ge=0)] = Field(
        512, description="the fixed cost of one more call, in tokens (when splitting a batch pays)"
    )


class RuntimeConfig(Strict):
    """Execution modes the GPU runtimes offer as rows of their own (validated and timed like any other)."""

    torch_compile: list[CompileMode] = Field(
        ["reduce-overhead"], description="torch.compile modes timed as runtimes of their own"
    )
    cuda_graphs: bool = Field(True, description="also time CUDA-graph modes (captured per benchmarked shape)")
    padding: PaddingConfig | None = Field(
        None, description="padding-aware execution modes (split each batch by real length); null: off"
    )


class OutputConfig(Strict):
    root: Annotated[str, Field(min_length=1)] = Field(
        "artifacts", description="store root: versions go to <root>/<name>/vNNNN"
    )
    version_scheme: Literal["sequential"] = Field("sequential", description="version naming")
    lock_timeout_s: Annotated[float, Field(ge=0)] = Field(
        0, description="seconds to wait for another deploy of the same name"
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


class Recipe(Strict):
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")] = Field(
        description="release name: the store folder <output.root>/<name>"
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
        from pipeline.recipe_family import with_family_defaults

        return with_family_defaults(data)

    def dim_names(self) -> set[str]:
        return {d for spec in self.inputs for d in spec.shape if isinstance(d, str)}

    def corner_shape(
        self, spec: InputSpec, corner: str, overrides: dict[str, int] | None = None
    ) -> list[int]:
        """Concrete shape of one input at a corner (min/opt/max), with some dims pinned by `overrides`."""
        overrides = overrides or {}
        return [
            d if isinstance(d, int) else overrides.get(d, getattr(self.dims[d], corner)) for d in spec.shape
        ]


def cross_field_problems(recipe: Recipe) -> list[tuple[str, str]]:
    """Pure consistency checks across fields: (dotted key path, message) for each problem found."""
    problems: list[tuple[str, str]] = []
    for name, rng in recipe.dims.items():
        if rng.min > rng.max:
            problems.append((f"dims.{name}.min", f"must not exceed max ({rng.min} > {rng.max})"))
        elif not rng.min <= rng.opt <= rng.max:
            problems.append(
                (f"dims.{name}.opt", f"must lie within min..max ({rng.min}..{rng.max}, got {rng.opt})")
            )
    used = recipe.dim_names()
    for i, spec in enumerate(recipe.inputs):
        for j, d in enumerate(spec.shape):
            if isinstance(d, str) and d not in recipe.dims:
                problems.append(
                    (f"inputs[{i}].shape[{j}]", f"dynamic dim '{d}' has no min/opt/max under dims")
                )
    for name in recipe.dims:
        if name not in used:
            problems.append((f"dims.{name}", "not used by any input shape"))
    names = [s.name for s in recipe.inputs]
    for i, n in enumerate(names):
        if n in names[:i]:
            problems.append((f"inputs[{i}].name", f"duplicate input name '{n}'"))
    for i, n in enumerate(recipe.outputs):
        if n in recipe.outputs[:i]:
            problems.append((f"outputs[{i}]", f"duplicate output name '{n}'"))
    for i, spec in enumerate(recipe.inputs):
        if spec.low > spec.high:
            problems.append((f"inputs[{i}].low", f"must not exceed high ({spec.low:g} > {spec.high:g})"))
        problems += _range_problems(i, spec)
    samples = recipe.data.samples
    wanted = recipe.data.calibration + recipe.data.validation
    if isinstance(samples, RandomData) and samples.samples is not None and samples.samples < wanted:
        problems.append(
            (
                "data.samples.samples",
                f"must be at least data.calibration + data.validation = {wanted} (got {samples.samples})",
            )
        )
    for precision, tolerance in recipe.validation.tolerances.items():
        for name in tolerance.outputs:
            if name not in recipe.outputs:
                problems.append(
                    (
                        f"validation.tolerances.{precision}.outputs.{name}",
                        f"no such output (outputs: {', '.join(recipe.outputs)})",
                    )
                )
    for precision, tolerance in recipe.validation.tolerances.items():
        if not tolerance.gates(list(recipe.outputs)):
            problems.append(
                (
                    f"validation.tolerances.{precision}",
                    "no metric gates: every threshold is absent or informational for every output, so nothing "
                    "could fail this precision (give at least one threshold that is not informational)",
                )
            )
    mask = recipe.validation.padding_mask
    if "padding_mask" in recipe.validation.model_fields_set and mask is not None and mask not in names:
        problems.append(("validation.padding_mask", f"no such input '{mask}' (inputs: {', '.join(names)})"))
    batch_rng = recipe.dims.get(recipe.benchmark.batch_dim)
    if batch_rng is not None and batch_rng.min <= batch_rng.max:
        for corner, size in recipe.validation.corner_batches.items():
            if not batch_rng.min <= size <= batch_rng.max:
                problems.append(
                    (
                        f"validation.corner_batches.{corner}",
                        f"must lie within dims.{recipe.benchmark.batch_dim} {batch_rng.min}..{batch_rng.max} (got {size})",
                    )
                )
    problems += _benchmark_problems(recipe)
    problems += _runtime_problems(recipe)
    for i, v in enumerate(recipe.variants.required):
        if v not in recipe.variants.build:
            problems.append(
                (f"variants.required[{i}]", f"'{v}' is required but not listed in variants.build")
            )
    src = recipe.model
    if isinstance(src, HuggingFaceSource) and not (src.id or src.path or src.package):
        problems.append(("model", "a huggingface source needs one of id, path or package"))
    if recipe.data.samples.source == "text" and not isinstance(src, HuggingFaceSource):
        problems.append(("data.samples.source", "text samples need a huggingface model (its tokenizer)"))
    return problems


# The values each input dtype can hold (random samples are drawn in low..high and cast to the dtype).
DTYPE_RANGES = {
    "int64": (-(2**63), 2**63 - 1),
    "int32": (-(2**31), 2**31 - 1),
    "float16": (-65504.0, 65504.0),
    "float32": (-3.4028234663852886e38, 3.4028234663852886e38),
    "bool": (0, 1),
}


def _range_problems(i: int, spec: InputSpec) -> list[tuple[str, str]]:
    """low and high must be finite and representable in the input's dtype (an int64 input cannot be drawn
    up to 1e30)."""
    lo, hi = DTYPE_RANGES[spec.dtype]
    problems = []
    for key, value in (("low", spec.low), ("high", spec.high)):
        if value != value or value in (float("inf"), float("-inf")):
            problems.append((f"inputs[{i}].{key}", f"must be a finite number (got {value})"))
        elif not lo <= value <= hi:
            problems.append(
                (
                    f"inputs[{i}].{key}",
                    f"must lie within what {spec.dtype} holds ({lo:g}..{hi:g}, got {value:g})",
                )
            )
    return problems


def _runtime_problems(recipe: Recipe) -> list[tuple[str, str]]:
    padding, problems = recipe.runtime.padding, []
    if padding is None:
        return problems
    names = [s.name for s in recipe.inputs]
    if padding.mask_input not in names:
        problems.append(("runtime.padding.mask_input", f"no such input (inputs: {', '.join(names)})"))
    for i, name in enumerate(padding.per_token_outputs):
        if name not in recipe.outputs:
            problems.append(
                (
                    f"runtime.padding.per_token_outputs[{i}]",
                    f"no such output (outputs: {', '.join(recipe.outputs)})",
                )
            )
    if not recipe.benchmark.sequence_dim or recipe.benchmark.sequence_dim not in recipe.dims:
        problems.append(("runtime.padding", "padding-aware execution needs a sequence dim under dims"))
    return problems


def _benchmark_problems(recipe: Recipe) -> list[tuple[str, str]]:
    bench, problems = recipe.benchmark, []
    consistent = {
        n: r for n, r in recipe.dims.items() if r.min <= r.max
    }  # a broken range is reported once, above
    batch = consistent.get(bench.batch_dim)
    if batch is None:
        if bench.batch_sizes != [1] and bench.batch_dim not in recipe.dims:
            problems.append(("benchmark.batch_dim", f"'{bench.batch_dim}' is not a dynamic dim under dims"))
    else:
        for i, b in enumerate(bench.batch_sizes):
            if not batch.min <= b <= batch.max:
                problems.append(
                    (
                        f"benchmark.batch_sizes[{i}]",
                        f"must lie within dims.{bench.batch_dim} {batch.min}..{batch.max} (got {b})",
                    )
                )
    seq = consistent.get(bench.sequence_dim) if bench.sequence_dim else None
    if bench.sequence_dim and bench.sequence_dim not in recipe.dims and recipe.dims:
        if bench.sequence_dim != "sequence":
            problems.append(
                ("benchmark.sequence_dim", f"'{bench.sequence_dim}' is not a dynamic dim under dims")
            )
    elif seq is not None and bench.sequence_lengths == []:
        problems.append(
            ("benchmark.sequence_lengths", f"must name at least one length of dims.{bench.sequence_dim}")
        )
    elif seq is not None and isinstance(bench.sequence_lengths, list):
        for i, s in enumerate(bench.sequence_lengths):
            if not seq.min <= s <= seq.max:
                problems.append(
                    (
                        f"benchmark.sequence_lengths[{i}]",
                        f"must lie within dims.{bench.sequence_dim} {seq.min}..{seq.max} (got {s})",
                    )
                )
    obj = recipe.selection.objective
    if (
        obj.sequence_length is not None
        and isinstance(bench.sequence_lengths, list)
        and obj.sequence_length not in bench.sequence_lengths
    ):
        problems.append(
            (
                "selection.objective.sequence_length",
                f"must be one of benchmark.sequence_lengths {bench.sequence_lengths} (got {obj.sequence_length})",
            )
        )
    if obj.batch not in bench.batch_sizes:
        problems.append(
            (
                "selection.objective.batch",
                f"must be one of benchmark.batch_sizes {bench.batch_sizes} (got {obj.batch})",
            )
        )
    return problems


def dotted(loc: tuple) -> str:
    """('benchmark', 'batch_sizes', 2) -> 'benchmark.batch_sizes[2]'."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def split_dotted(key: str) -> list[str | int]:
    """Inverse of dotted() for --set keys: 'a.b[2].c' -> ['a', 'b', 2, 'c']."""
    parts: list[str | int] = []
    for token in key.split("."):
        m = re.fullmatch(r"([^\[\]]*)((?:\[\d+\])*)", token)
        if not m or (not m.group(1) and not m.group(2)):
            raise ValueError(f"not a dotted key: {key!r}")
        if m.group(1):
            parts.append(m.group(1))
        parts += [int(i) for i in re.findall(r"\[(\d+)\]", m.group(2))]
    return parts
