"""The recipe schema: the only thing users write. Validates and never acts (no I/O, no environment changes)."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

PositiveInt = Annotated[int, Field(gt=0)]
PositiveFloat = Annotated[float, Field(gt=0)]
Fraction = Annotated[float, Field(ge=0, le=1)]
Precision = Literal["fp32", "fp16", "bf16", "int8"]
Metric = Literal["max_abs", "mean_abs", "max_rel", "cosine"]
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


class HuggingFaceSource(Strict):
    """A transformers encoder: a local directory, a directory shipped inside a Python package, or a hub id."""

    source: Literal["huggingface"]
    id: str | None = None
    path: str | None = None
    package: str | None = Field(default=None, description="'python_package/sub/dir' shipped in site-packages")
    offline: bool = True
    pooling: Literal["mean", "none"] = "mean"
    normalize: bool = True


class TorchvisionSource(Strict):
    source: Literal["torchvision"]
    name: str
    weights: str | None = None


class EntrypointSource(Strict):
    """Any `package.module:factory` that returns an nn.Module; kwargs are passed through."""

    source: Literal["entrypoint"]
    entrypoint: Annotated[str, Field(pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")]
    kwargs: dict[str, object] = {}
    seed: int = 0


class TorchScriptSource(Strict):
    source: Literal["torchscript"]
    path: str


ModelSource = Annotated[
    HuggingFaceSource | TorchvisionSource | EntrypointSource | TorchScriptSource,
    Field(discriminator="source"),
]

# ---------------------------------------------------------------- inputs, outputs, data


class DimRange(Strict):
    min: PositiveInt
    opt: PositiveInt
    max: PositiveInt


class InputSpec(Strict):
    name: Annotated[str, Field(min_length=1)]
    dtype: Literal["float32", "float16", "int64", "int32", "bool"] = "float32"
    shape: list[PositiveInt | Annotated[str, Field(pattern=r"^[A-Za-z_]\w*$")]]
    low: float = 0.0
    high: float = 1.0


class TextData(Strict):
    """Sentences (JSONL with a text field, or one per line) tokenized with the model's own tokenizer."""

    source: Literal["text"]
    path: str
    field: str = "text"


class NpzData(Strict):
    """An .npz holding one array per input, samples along the first axis."""

    source: Literal["npz"]
    path: str


class RandomData(Strict):
    """Seeded synthetic samples drawn in each input's low..high range at its opt shape."""

    source: Literal["random"]
    samples: PositiveInt = 64


class DataConfig(Strict):
    samples: Annotated[TextData | NpzData | RandomData, Field(discriminator="source")]
    calibration: PositiveInt = 64
    validation: PositiveInt = 32
    seed: int = 0


# ---------------------------------------------------------------- export settings


class TorchScriptExport(Strict):
    check_corners: list[Literal["min", "opt", "max"]] = ["min", "opt", "max"]
    check_atol: PositiveFloat = 1e-4
    freeze: bool = True


class OnnxExport(Strict):
    exporter: Literal["dynamo", "legacy"] = "dynamo"
    fallback: bool = True
    opset: Annotated[int, Field(ge=13, le=23)] = 18


class Fp16Export(Strict):
    keep_io_types: bool = True
    block_ops: list[str] = ["ReduceMean", "ReduceSum", "Pow", "Sqrt", "Softmax", "Exp", "Log", "Erf"]


class Int8Export(Strict):
    calibration: Literal["minmax", "entropy", "percentile"] = "minmax"
    percentile: Annotated[float, Field(gt=90, le=100)] = 99.99
    op_types: list[str] = ["MatMul"]
    weights_only_matmul: bool = True
    include: list[str] = []
    # fnmatch's * crosses dots: '*.layer.*[0-9].output.dense' is the FFN down-projection, not attention.output.dense
    exclude: list[str] = ["*.intermediate.dense", "*.layer.*[0-9].output.dense"]
    quantizer: Literal["onnxruntime", "modelopt"] = "onnxruntime"


class OptimizeExport(Strict):
    model_type: str = "bert"
    opt_level: Annotated[int, Field(ge=0, le=2)] = 2
    # onnxscript's ONNX Runtime fusions (Attention, SkipLayerNormalization, BiasGelu on dynamo exports) run
    # first, then ONNX Runtime's transformers optimizer (which finds no Attention in a dynamo export)
    fusions: list[Literal["onnxscript", "transformers"]] = ["onnxscript", "transformers"]


class EngineProfile(Strict):
    """Dims not named here take the recipe's top-level min/opt/max."""

    dims: dict[str, DimRange] = {}


class TensorRTExport(Strict):
    flavour: Literal["auto", "tensorrt", "tensorrt-rtx"] = "auto"
    optimization_level: Annotated[int, Field(ge=0, le=5)] = 3
    workspace_mb: PositiveInt = 2048
    compute_capabilities: list[Annotated[str, Field(pattern=r"^sm\d{2,3}$")]] = ["sm89"]
    profiles: list[EngineProfile] = [EngineProfile()]
    build_timeout_s: PositiveInt = 900


class Pt2Export(Strict):
    """torch.export / AOTInductor settings. `attention`: the attention kernel a transformers model is exported
    with (sdpa lowers to fused flash / memory-efficient kernels; the ONNX exports keep eager)."""

    attention: Literal["sdpa", "eager"] = "sdpa"
    device: Literal["auto", "cpu", "cuda"] = "auto"  # AOTInductor target; auto: cuda where present
    max_autotune: bool = False  # AOTInductor GEMM autotuning: minutes of compile for a few percent
    fuse_projections: bool = True  # one GEMM for linears reading one tensor (Q, K, V): fewer launches


class ExportConfig(Strict):
    torchscript: TorchScriptExport = TorchScriptExport()
    onnx: OnnxExport = OnnxExport()
    fp16: Fp16Export = Fp16Export()
    int8: Int8Export = Int8Export()
    optimize: OptimizeExport = OptimizeExport()
    tensorrt: TensorRTExport = TensorRTExport()
    pt2: Pt2Export = Pt2Export()


class VariantsConfig(Strict):
    build: list[VariantName] = ["torchscript-fp32", "onnx-fp32"]
    required: list[VariantName] = []
    gpu: list[VariantName] = Field(
        default=[], description="built only where the deploy host has a CUDA GPU (else reported as not built)"
    )


# ---------------------------------------------------------------- validation, benchmark, selection, output


class Tolerance(Strict):
    """Thresholds per metric (None: not checked); metrics listed as informational are reported, never gate."""

    max_abs: PositiveFloat | None = None
    mean_abs: PositiveFloat | None = None
    max_rel: PositiveFloat | None = None
    cosine: Annotated[float, Field(gt=0, le=1)] | None = None
    informational: list[Metric] = []
    outputs: dict[str, Tolerance] = {}


def _default_tolerances() -> dict[str, Tolerance]:
    return {
        "fp32": Tolerance(max_abs=1e-3, cosine=0.9999),
        "fp16": Tolerance(max_abs=5e-2, cosine=0.999, informational=["max_abs"]),
        "int8": Tolerance(max_abs=1.0, cosine=0.98, informational=["max_abs"]),
        # BF16 must be as accurate as FP16 to be chosen: the same gate by default
        "bf16": Tolerance(max_abs=5e-2, cosine=0.999, informational=["max_abs"]),
    }


class ValidationConfig(Strict):
    tolerances: dict[Precision, Tolerance] = Field(default_factory=_default_tolerances)
    corners: list[Literal["min", "opt", "max"]] = ["min", "opt", "max"]
    corner_batches: dict[Literal["min", "opt", "max"], PositiveInt] = {"min": 2, "opt": 2, "max": 1}
    data_batch: PositiveInt = 8


class BenchmarkConfig(Strict):
    batch_sizes: list[PositiveInt] = [1, 8]
    sequence_lengths: list[PositiveInt] | Literal["data"] = [128]
    batch_dim: str = "batch"
    sequence_dim: str | None = "sequence"
    intra_op_threads: PositiveInt | None = None
    warmup_iters: PositiveInt = 10
    warmup_s: PositiveFloat = 0.2
    window_s: PositiveFloat = 0.2
    stable_windows: Annotated[int, Field(ge=2)] = 3
    stable_within: Annotated[float, Field(gt=0, lt=1)] = 0.05
    min_iters: PositiveInt = 20
    min_s: PositiveFloat = 1.0
    max_windows: PositiveInt = 10
    max_s: PositiveFloat = 15.0
    include_reference: bool = True
    # which runtimes are timed; None: on a GPU host the GPU runtimes plus the CPU reference at batch 1 only,
    # on a CPU host the CPU runtimes (pipeline/bench/hosts.py)
    runtimes: list[Runtime] | None = None
    throughput_s: PositiveFloat = 0.3  # per GPU row: back-to-back requests for sequences/s


class Objective(Strict):
    metric: Literal["p50_ms", "p90_ms", "p99_ms", "mean_ms"] = "p50_ms"
    batch: PositiveInt = 1
    sequence_length: PositiveInt | None = None


class SelectionConfig(Strict):
    objective: Objective = Objective()
    max_p99_ms: PositiveFloat | None = None
    runtimes: list[Runtime] = []


class PaddingConfig(Strict):
    """Padding-aware execution: each batch is split by real length (from the mask input) into at most
    `max_groups` groups, each trimmed to its longest member (rounded up to `multiple`), run, and scattered
    back. Exact on every real token and on pooled outputs; per-token outputs at padded positions are not the
    padded model's values (zero beyond a group's length), so they must be masked by their consumers."""

    mask_input: str = "attention_mask"
    per_token_outputs: list[str] = []
    multiple: PositiveInt = 16
    max_groups: PositiveInt = 4
    group_overhead_tokens: Annotated[int, Field(ge=0)] = 512  # fixed cost of one more call, in tokens


class RuntimeConfig(Strict):
    """Execution modes the GPU runtimes offer as rows of their own (validated and timed like any other)."""

    torch_compile: list[CompileMode] = ["reduce-overhead"]
    cuda_graphs: bool = True
    padding: PaddingConfig | None = None


class OutputConfig(Strict):
    root: str = "artifacts"
    version_scheme: Literal["sequential"] = "sequential"
    lock_timeout_s: Annotated[float, Field(ge=0)] = 0


class Recipe(Strict):
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")]
    model: ModelSource
    inputs: Annotated[list[InputSpec], Field(min_length=1)]
    dims: dict[str, DimRange] = {}
    outputs: Annotated[list[str], Field(min_length=1)]
    data: DataConfig
    variants: VariantsConfig = VariantsConfig()
    export: ExportConfig = ExportConfig()
    validation: ValidationConfig = ValidationConfig()
    benchmark: BenchmarkConfig = BenchmarkConfig()
    selection: SelectionConfig = SelectionConfig()
    runtime: RuntimeConfig = RuntimeConfig()
    output: OutputConfig = OutputConfig()

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
    for precision, tolerance in recipe.validation.tolerances.items():
        for name in tolerance.outputs:
            if name not in recipe.outputs:
                problems.append(
                    (
                        f"validation.tolerances.{precision}.outputs.{name}",
                        f"no such output (outputs: {', '.join(recipe.outputs)})",
                    )
                )
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
