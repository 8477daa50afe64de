"""Pure consistency checks across the recipe's fields: (dotted key path, message) per problem found."""

from __future__ import annotations

import math

from pipeline.recipe.base import MAX_ELEMENTS
from pipeline.recipe.root import Recipe
from pipeline.recipe.sources import HuggingFaceSource, InputSpec, RandomData


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
    batch = recipe.benchmark.batch_dim
    for i, spec in enumerate(recipe.inputs):
        if batch in spec.shape[1:]:  # the data, validation corners and timing all batch on the first axis
            problems.append(
                (
                    f"inputs[{i}].shape",
                    f"the batch dim '{batch}' is axis {list(spec.shape).index(batch)}: the pipeline batches, "
                    "pads and times requests on the first axis; put it first (a wrapper around the model can "
                    "transpose its inputs and outputs)",
                )
            )
    names = [s.name for s in recipe.inputs]
    for i, n in enumerate(names):
        if n in names[:i]:
            problems.append((f"inputs[{i}].name", f"duplicate input name '{n}'"))
    for i, n in enumerate(recipe.outputs):
        if n in recipe.outputs[:i]:
            problems.append((f"outputs[{i}]", f"duplicate output name '{n}'"))
    for i, spec in enumerate(recipe.inputs):
        if spec.low is not None and spec.high is not None and spec.low > spec.high:
            problems.append((f"inputs[{i}].low", f"must not exceed high ({spec.low:g} > {spec.high:g})"))
        problems += _range_problems(i, spec)
    problems += _size_problems(recipe)
    samples = recipe.data.samples
    if isinstance(samples, RandomData):
        problems += _random_range_problems(recipe)
    wanted = recipe.data.calibration + recipe.data.validation
    if isinstance(samples, RandomData) and samples.samples is not None and samples.samples < wanted:
        problems.append(
            (
                "data.samples.samples",
                f"must be at least data.calibration + data.validation = {wanted} (got {samples.samples})",
            )
        )
    problems += _scenario_problems(recipe)
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
    default = type(recipe.validation).model_fields["padding_mask"].default
    # the default names an input only where there is one (a version's resolved recipe writes it out for every
    # model, and `serve` reads that recipe back): only another name can be a mistake
    if mask not in (None, default) and mask not in names:
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
    "uint8": (0, 255),
    "float16": (-65504.0, 65504.0),
    "float32": (-3.4028234663852886e38, 3.4028234663852886e38),
    "bool": (0, 1),
}


# Integer inputs whose random samples need the recipe's range (a uint8's default is every value it holds).
INTEGER_DTYPES = ("int64", "int32")
# Inputs a Hugging Face source fills itself when random samples name no range (pipeline/inputs/data.py value_range).
HF_DEFAULT_RANGES = ("input_ids", "attention_mask", "token_type_ids", "decoder_input_ids")


def _random_range_problems(recipe: Recipe) -> list[tuple[str, str]]:
    """Random integer inputs need their range: drawn from the float default 0..1 they would be all 0 or 1,
    and a model of token ids would be validated and calibrated on two embedding rows."""
    hf = isinstance(recipe.model, HuggingFaceSource)
    problems = []
    for i, spec in enumerate(recipe.inputs):
        if spec.dtype not in INTEGER_DTYPES or (spec.low is not None and spec.high is not None):
            continue
        if hf and spec.name in HF_DEFAULT_RANGES:
            continue
        missing = " and ".join(k for k in ("low", "high") if getattr(spec, k) is None)
        problems.append(
            (
                f"inputs[{i}]",
                f"an integer input of random samples needs {missing}: the values the model accepts "
                "(token ids: 0 .. vocabulary size - 1; a mask: 1 .. 1)",
            )
        )
    return problems


def _largest(recipe: Recipe, spec: InputSpec) -> list[int]:
    """An input's shape with every dim at its max (a dim without a range counts 1: reported above)."""
    return [d if isinstance(d, int) else (recipe.dims[d].max if d in recipe.dims else 1) for d in spec.shape]


def _size_problems(recipe: Recipe) -> list[tuple[str, str]]:
    """Sizes pass their bounds one by one, but what is allocated is their product: each input at its largest
    shape must fit one tensor, and random samples (drawn up to the dims' max) at most as many elements."""
    problems = []
    for i, spec in enumerate(recipe.inputs):
        elements = math.prod(_largest(recipe, spec))
        if elements > MAX_ELEMENTS:
            problems.append(
                (
                    f"inputs[{i}].shape",
                    f"holds {elements} elements with every dim at its max; one tensor holds at most {MAX_ELEMENTS}",
                )
            )
    samples, data = recipe.data.samples, recipe.data
    if isinstance(samples, RandomData) and not problems:
        count = samples.samples or data.calibration + data.validation
        each = sum(math.prod(_largest(recipe, spec)[1:]) for spec in recipe.inputs)
        if count * each > MAX_ELEMENTS:
            problems.append(
                (
                    "data.samples.samples" if samples.samples else "data.samples",
                    f"{count} samples of up to {each} elements each are more than {MAX_ELEMENTS} elements to draw",
                )
            )
    return problems


def _range_problems(i: int, spec: InputSpec) -> list[tuple[str, str]]:
    """low and high must be finite and representable in the input's dtype (an int64 input cannot be drawn
    up to 1e30); a bool's are 0 or 1, since 0.5 could be read as a probability of True and would be rounded."""
    lo, hi = DTYPE_RANGES[spec.dtype]
    problems = []
    for key, value in (("low", spec.low), ("high", spec.high)):
        if value is None:
            continue
        if value != value or value in (float("inf"), float("-inf")):
            problems.append((f"inputs[{i}].{key}", f"must be a finite number (got {value})"))
        elif spec.dtype == "bool" and value not in (0, 1):
            problems.append(
                (f"inputs[{i}].{key}", f"must be 0 (False) or 1 (True) for a bool input (got {value:g})")
            )
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
        listed = [("build", recipe.variants.build), ("gpu", recipe.variants.gpu)]
        for key, names in listed:
            for i, name in enumerate(names):
                if "-packed-" not in name:
                    continue
                problems.append(
                    (
                        f"variants.{key}[{i}]",
                        f"{name} packs each batch's real tokens: it needs runtime.padding (the mask input "
                        "and the per-token outputs)",
                    )
                )
        return problems
    names = [s.name for s in recipe.inputs]
    validation = recipe.validation
    if validation.padding_value != 0 and validation.padding_mask == padding.mask_input:
        problems.append(
            (
                "runtime.padding.mask_input",
                f"'{padding.mask_input}' marks padding with {validation.padding_value} (validation.padding_value), "
                "but padding-aware and packed runs read a mask's zeros as padding: give them an attention mask "
                "(1 on real tokens), or leave runtime.padding out",
            )
        )
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


def _scenario_problems(recipe: Recipe) -> list[tuple[str, str]]:
    """single_stream's rows are what every objective ranks by; a throughput objective needs the offline run."""
    scenarios = recipe.benchmark.scenarios
    problems = []
    if "single_stream" not in scenarios:
        problems.append(
            ("benchmark.scenarios", "must hold single_stream: its latency rows are what selection ranks")
        )
    if recipe.selection.objective.metric == "sequences_per_s" and "offline" not in scenarios:
        problems.append(
            (
                "benchmark.scenarios",
                "must hold offline: the objective sequences_per_s ranks its throughput runs",
            )
        )
    objective, server = recipe.selection.objective, recipe.benchmark.server
    if objective.metric == "max_qps_at_p99" and "server" not in scenarios:
        problems.append(
            (
                "benchmark.scenarios",
                "must hold server: the objective max_qps_at_p99 ranks the server scenario's served rates",
            )
        )
    if objective.p99_ms is not None and objective.metric != "max_qps_at_p99":
        problems.append(
            (
                "selection.objective.p99_ms",
                f"belongs to the metric max_qps_at_p99 only (got metric {objective.metric}); a latency "
                "ceiling for any objective is selection.max_p99_ms",
            )
        )
    stated = "p99_ms" in server.model_fields_set and "server" in recipe.benchmark.model_fields_set
    if objective.p99_ms is not None and stated and objective.p99_ms != server.p99_ms:
        problems.append(
            (
                "selection.objective.p99_ms",
                f"must agree with benchmark.server.p99_ms, the same target ({objective.p99_ms:g} ≠ "
                f"{server.p99_ms:g}): give it once",
            )
        )
    return problems
