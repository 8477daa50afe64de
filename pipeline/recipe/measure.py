"""How artifacts are judged: accuracy tolerances and validation, the benchmark, selection, and the GPU
execution modes measured as runtimes of their own."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from pipeline.recipe.base import (
    MAX_BENCH_S,
    MAX_DIM,
    METRICS,
    Batch,
    BenchSeconds,
    CompileMode,
    Dim,
    ErrorBound,
    Iterations,
    Metric,
    Precision,
    Ratio,
    Runtime,
    Strict,
    Threads,
)

# Benchmark shapes, each list at most this long: every entry multiplies the rows timed (per artifact and
# runtime, each up to benchmark.max_s), so 32 batch sizes by 32 lengths is already a day of measuring.
MAX_SHAPES = 32


class Tolerance(Strict):
    """Thresholds per metric (None: not checked); metrics listed as informational are reported, never gate.

    `neighbours` is the lowest acceptable nearest-neighbour agreement of an embedding output over the held-out
    data (the share of each sample's top-k neighbours that the candidate's embeddings keep)."""

    max_abs: ErrorBound | None = Field(
        None, description="largest absolute difference to the reference (at most 1e6: past it nothing fails)"
    )
    mean_abs: ErrorBound | None = Field(None, description="largest mean absolute difference (at most 1e6)")
    max_rel: ErrorBound | None = Field(None, description="largest relative difference (at most 1e6)")
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


DEFAULT_TOLERANCES: dict[str, dict[str, Any]] = {
    "fp32": {"max_abs": 1e-3, "cosine": 0.9999},
    "fp16": {"max_abs": 5e-2, "cosine": 0.999, "informational": ["max_abs"]},
    "int8": {"max_abs": 1.0, "cosine": 0.98, "informational": ["max_abs"]},
    "fp8": {"max_abs": 1.0, "cosine": 0.98, "informational": ["max_abs"]},  # 8 bits, as INT8
    # BF16 must be as accurate as FP16 to be chosen: the same gate by default
    "bf16": {"max_abs": 5e-2, "cosine": 0.999, "informational": ["max_abs"]},
}


def _default_tolerances() -> dict[str, Tolerance]:
    return {precision: Tolerance(**fields) for precision, fields in DEFAULT_TOLERANCES.items()}


def merged_tolerances(given: Any) -> Any:
    """The recipe's tolerances laid over the defaults key by key: a precision the recipe leaves out keeps its
    default gates, and one it writes keeps every default field it does not name (a metric is dropped only
    by writing it as null); a threshold it writes gates unless it lists the metric as informational itself.
    Anything but a mapping is left for validation to report."""
    if not isinstance(given, dict):
        return given
    merged: dict[Any, Any] = {p: dict(fields) for p, fields in DEFAULT_TOLERANCES.items()}
    for precision, fields in given.items():
        if isinstance(fields, dict) and precision in merged:
            default = merged[precision]
            if "informational" not in fields:  # a threshold the recipe writes gates unless it says otherwise
                kept = [m for m in default.get("informational", []) if m not in fields]
                default = {**default, "informational": kept}
            merged[precision] = {**default, **fields}
        else:
            merged[precision] = fields
    return merged


class ValidationConfig(Strict):
    tolerances: dict[Precision, Tolerance] = Field(
        default_factory=_default_tolerances,
        description="thresholds per precision (fp32, fp16, int8, bf16, fp8), merged key by key into the defaults "
        "(fp32 max_abs 1e-3 and cosine 0.9999; fp16 and bf16 cosine 0.999, max_abs 0.05 informational; int8 "
        "and fp8 cosine 0.98, max_abs 1.0 informational): write a metric as null to drop its gate",
    )

    @model_validator(mode="before")
    @classmethod
    def _merge_tolerances(cls, data: Any) -> Any:
        if isinstance(data, dict) and "tolerances" in data:
            return {**data, "tolerances": merged_tolerances(data["tolerances"])}
        return data

    corners: list[Literal["min", "opt", "max"]] = Field(
        ["min", "opt", "max"],
        description="shape corners checked besides the held-out data; leaving out min or max warns that "
        "those dims are not validated",
    )
    corner_batches: dict[Literal["min", "opt", "max"], Batch] = Field(
        {"min": 2, "opt": 2, "max": 1},
        description="batch size used at each corner (at most 65536); the default is brought within the batch "
        "dim's range",
    )
    data_batch: Batch = Field(8, description="batch size for the held-out validation split (at most 65536)")
    padding_mask: str | None = Field(
        "attention_mask",
        description="the input that marks padded positions (validation.padding_value): per-token outputs are "
        "compared on real tokens only (no masking when no input has this name; null turns masking off)",
    )
    padding_value: Annotated[int, Field(ge=0, le=1)] = Field(
        0,
        description="the padding mask's value at padded positions: 0 for an attention mask (1 marks a real "
        "token), 1 for a key-padding mask (true marks padding, as nn.TransformerEncoder takes it)",
    )
    neighbours_k: Annotated[int, Field(gt=0, le=1024)] = Field(
        5, description="top-k of the nearest-neighbour agreement of embeddings (at most 1024 neighbours)"
    )


Scenario = Literal["single_stream", "offline", "server"]


class ServerLoad(Strict):
    """MLPerf's Server scenario (docs/benchmarking.md, "Load scenarios"): Poisson arrivals of the recipe's
    validation samples, each candidate behind a dynamic batcher, searched for the highest rate whose p99 meets
    the target."""

    p99_ms: Annotated[float, Field(gt=0, le=MAX_BENCH_S * 1000)] = Field(
        100.0,
        description="the latency target: a rate passes when the p99 of its requests, queueing included, is at most this",
    )
    max_batch: Batch | None = Field(
        None, description="the batcher's largest batch (null: the largest benchmark batch size)"
    )
    max_queue_delay_ms: Annotated[float, Field(ge=0, le=10_000)] = Field(
        1.0, description="how long the batcher holds the oldest request for a fuller batch, ms"
    )
    candidates: Annotated[int, Field(gt=0, le=16)] = Field(
        3, description="how many of the best candidates by the objective run it, plus the throughput leader"
    )
    run_s: BenchSeconds = Field(
        2.0, description="seconds of arrivals per LoadGen run (LoadGen's min_duration); at most 600"
    )
    runs: Annotated[int, Field(ge=2, le=64)] = Field(
        8, description="LoadGen runs per candidate at most: the rate search stops there"
    )
    repeats: Annotated[int, Field(ge=1, le=16)] = Field(
        3, description="runs at the highest passing rate, for the interval of its p99 and of the served rate"
    )
    through: Literal["in_process", "triton"] = Field(
        "in_process",
        description="in_process: requests go to the candidate through a dynamic batcher in the deploy's process; "
        "triton: through a real Triton server on localhost (PyTriton, the serve extra) over gRPC, with "
        "Triton's own dynamic batcher",
    )


class BenchmarkConfig(Strict):
    batch_sizes: Annotated[list[Batch], Field(max_length=MAX_SHAPES)] = Field(
        [1, 8],
        description="batch sizes to measure (at most 32 of them, each at most 65536); the default is brought "
        "within the batch dim's range",
    )
    sequence_lengths: Annotated[list[Dim], Field(max_length=MAX_SHAPES)] | Literal["data"] = Field(
        [],
        description="sequence lengths to measure (at most 32), or 'data' (median and p90 of the data's token "
        "lengths); default: the opt of the sequence dim",
    )
    batch_dim: str = Field("batch", description="the dim (under dims) that is the batch axis")
    sequence_dim: str | None = Field(
        "sequence", description="the dim (under dims) that is the sequence axis; null: none"
    )
    intra_op_threads: Threads | None = Field(
        None,
        description="CPU threads per runtime, at most 1024 (default: OMP_NUM_THREADS if set, else the "
        "cores this deploy may run on)",
    )
    warmup_iters: Iterations = Field(
        10, description="warm-up iterations at least (first call discarded), at most 1000000"
    )
    warmup_s: BenchSeconds = Field(0.2, description="warm-up seconds at least (at most 600: minutes per row)")
    window_s: BenchSeconds = Field(0.2, description="length of one measurement window, seconds (at most 600)")
    stable_windows: Annotated[int, Field(ge=2, le=100)] = Field(
        3, description="consecutive window medians that must agree (at most 100)"
    )
    stable_within: Annotated[float, Field(gt=0, lt=1)] = Field(
        0.05, description="relative spread within which window medians agree"
    )
    min_iters: Iterations = Field(20, description="timed iterations at least, per row (at most 1000000)")
    min_s: BenchSeconds = Field(1.0, description="timed seconds at least, per row (at most 600)")
    max_windows: Annotated[int, Field(gt=0, le=1000)] = Field(
        10, description="windows at most, per row (then stable: false); at most 1000"
    )
    max_s: BenchSeconds = Field(
        15.0,
        description="timed seconds at most, per row (then stable: false); at most 600, as every row is timed "
        "up to this long",
    )
    include_reference: bool = Field(True, description="also time the eager PyTorch reference")
    parallel_gpus: Annotated[int, Field(ge=1, le=64)] = Field(
        1,
        description="time the GPU candidates on up to this many GPUs of this host at once, one process per GPU "
        "that sees that GPU alone (CUDA_VISIBLE_DEVICES), an artifact's runtimes on one GPU; 1: on one GPU, "
        "all interleaved. The GPUs must be alike: rows of different GPUs are compared with each other",
    )
    profile: bool = Field(
        True,
        description="profile each timed row after its windows (kernel count, top kernels, time split, launch-, "
        "compute- or memory-bound): a fraction of a second per row",
    )
    runtimes: list[Runtime] | None = Field(
        None,
        description="which runtimes are timed, at every batch and in both I/O modes; null: on a GPU host the "
        "GPU runtimes (host I/O at the smallest and the objective's batch only, no device-I/O rows of a mode "
        "whose faster twin of the same artifact is timed) plus the CPU reference at the smallest batch, on a "
        "CPU host the CPU runtimes",
    )
    throughput_s: BenchSeconds = Field(
        0.3,
        description="per GPU row (every row under a sequences_per_s objective): seconds of back-to-back "
        "requests for sequences/s, in 5 synchronized segments whose rates give its 95% interval (at most 600)",
    )
    scenarios: Annotated[list[Scenario], Field(min_length=1, max_length=3)] = Field(
        ["single_stream", "offline"],
        description="load scenarios: single_stream (latency per shape, one request at a time), offline "
        "(the throughput run), server (Poisson arrivals through a dynamic batcher, searched for the highest "
        "rate that meets benchmark.server.p99_ms; driven by MLPerf LoadGen, the load extra)",
    )
    server: ServerLoad = Field(ServerLoad(), description="the server scenario's target, batcher and search")


class Objective(Strict):
    metric: Literal["p50_ms", "p90_ms", "p99_ms", "mean_ms", "sequences_per_s", "max_qps_at_p99"] = Field(
        "p50_ms",
        description="latency statistic to minimize, or sequences_per_s: throughput (from the benchmark's "
        "throughput run of each row, back-to-back requests) to maximize; pair it with a large batch; or "
        "max_qps_at_p99: the highest rate served within the p99 target under MLPerf's Server scenario "
        "(needs benchmark.scenarios to hold server)",
    )
    p99_ms: Annotated[float, Field(gt=0, le=MAX_BENCH_S * 1000)] | None = Field(
        None,
        description="with max_qps_at_p99 only: the p99 target, ms (default: benchmark.server.p99_ms; where both "
        "are given they must agree)",
    )
    batch: Batch = Field(
        1,
        description="batch size the winner is chosen at; the default is brought within the batch dim's range",
    )
    sequence_length: Dim | None = Field(
        None, description="sequence length the winner is chosen at (default: the shortest measured)"
    )
    io: Literal["host", "device"] | None = Field(
        None, description="only rows of this I/O mode compete (default: either)"
    )


class RegressionBudget(Strict):
    """What `compare A B` counts as a regression of B against A (exit 1)."""

    max_slowdown: Ratio = Field(
        0.1,
        description="largest relative slowdown of the shipped objective value (B's winner against A's "
        "winner: a longer latency, or for sequences_per_s a lower throughput, relative to A's) tolerated when "
        "their confidence intervals do not overlap; 0.1 = 10 %, at most 100 (a hundredfold)",
    )
    max_accuracy_loss: Ratio = Field(
        0.25,
        description="largest growth, per required accuracy check of the shipped artifact, of the share of "
        "its tolerance it uses (error/threshold, or (1 - cosine)/(1 - threshold)); 0.25 = a quarter of the "
        "tolerance; at most 100",
    )


class SelectionConfig(Strict):
    objective: Objective = Field(Objective(), description="what the winner is best at")
    max_p99_ms: Annotated[float, Field(gt=0, le=MAX_BENCH_S * 1000)] | None = Field(
        None,
        description="rows with a higher p99 cannot win; at most 600000 (a call longer than a row's longest "
        "timing, benchmark.max_s, is never measured)",
    )
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
    multiple: Dim | None = Field(
        None,
        description="trimmed lengths are rounded up to this multiple (null: 16 on the GPU, where each plan of "
        "lengths is a CUDA graph of its own, and 1 on the CPU, where a sentence runs at its real length)",
    )
    max_groups: Annotated[int, Field(gt=0, le=1024)] = Field(
        4, description="at most this many length groups per batch (1024 at most)"
    )
    group_overhead_tokens: Annotated[int, Field(ge=0, le=MAX_DIM)] = Field(
        512,
        description="the fixed cost of one more call, in tokens (when splitting a batch pays); at most a "
        "dim's largest size",
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
