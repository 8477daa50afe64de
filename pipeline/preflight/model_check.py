"""Pre-flight model check: instantiate the model from its source and run it on the CPU, once at the min shape,
once at a batch of 2 where validation runs batches of 2 or more from a min of 1, and once per other dynamic dim
at its max (on the recipe's samples where it has them, as the deploy feeds them; else on synthetic inputs in each
input's value range), so that a model that cannot be built, rejects its inputs or returns something other than the
recipe's `outputs` is a located user error before any work starts. Cheap by design (the batch at its min or
2); the deploy loads the model again but never repeats this. Pre-flight calls it in a child process bounded in
time (pipeline/preflight/model_child.py): this is the user's code, which may hang or crash."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import numpy as np

from pipeline.core.errors import Problem, RecipeError
from pipeline.core.user_code import contained
from pipeline.preflight.determinism_check import changing_outputs
from pipeline.preflight.memory_check import (
    MAX_PROBE,
    available_memory,
    elements,
    input_memory_problems,
    peak_rss,
    run_memory_problems,
)
from pipeline.preflight.probe_inputs import SAMPLES, SYNTHETIC, ProbeInputs
from pipeline.recipe import EntrypointSource, HuggingFaceSource, Recipe, TorchScriptSource
from pipeline.recipe.loader import LoadedRecipe

HF_OUTPUTS = ("last_hidden_state", "sentence_embedding")


def source_key(recipe: Recipe) -> str:
    """The recipe key that names where the model comes from (where a failure to build it is reported)."""
    src = recipe.model
    if isinstance(src, EntrypointSource):
        return "model.entrypoint"
    if isinstance(src, TorchScriptSource):
        return "model.path"
    if isinstance(src, HuggingFaceSource):
        return "model.path" if src.path else "model.package" if src.package else "model.id"
    return "model.name"


def model_problems(loaded: LoadedRecipe, data_ok: bool, kinds: dict[str, str] | None = None) -> list[Problem]:
    """Everything found by building and running the model; [] when it matches the recipe. `kinds` is filled
    with each output's kind (pipeline.check.accuracy.output_kind: what decides how it is gated) when the model
    ran and its outputs match the recipe."""
    recipe, recipe_dir = loaded.recipe, loaded.path.parent.resolve()
    problems = _static_problems(loaded)
    if any(p.key.startswith("model.") for p in problems):
        return problems  # the factory cannot be called as the recipe says
    from pipeline.inputs.models import BindingError, load_model
    from pipeline.inputs.specs import ModelSpec

    try:
        model = load_model(ModelSpec.from_recipe(recipe, recipe_dir))
    except BindingError as exc:
        return [loaded.problem(exc.key, str(exc))]
    except RecipeError as exc:
        return [loaded.problem(source_key(recipe), line) for line in exc.lines()]
    except Exception as exc:  # noqa: BLE001 - the user's model failing to build is the user's to fix
        return [loaded.problem(source_key(recipe), f"building the model failed: {_short(exc)}")]
    problems += _config_problems(loaded, model.config)
    problems += pattern_problems(loaded, model.module)
    if problems:
        return problems
    use_samples = data_ok and recipe.data.samples.source != "random"
    probe = ProbeInputs(recipe, recipe_dir, model.tokenizer, model.config, use_samples)
    try:
        return _run_problems(loaded, model, probe, kinds)
    except _Refused as refused:
        return refused.problems


class _Refused(Exception):
    """The samples cannot make inputs at a shape pre-flight runs: these problems, and no further run."""

    def __init__(self, problems: list[Problem]):
        super().__init__("; ".join(p.message for p in problems))
        self.problems = problems


def _fed(loaded: LoadedRecipe, probe: ProbeInputs, dims: dict[str, int]) -> tuple[dict[str, np.ndarray], str]:
    """The probe's inputs at these dims, or _Refused with where the samples (or the tokenizer) went wrong."""
    try:
        return probe.at(dims)
    except RecipeError as exc:
        raise _Refused([loaded.problem("inputs", line) for line in exc.lines()]) from exc
    except Exception as exc:  # noqa: BLE001 - the samples (or the tokenizer) cannot make inputs
        raise _Refused(
            [loaded.problem("data.samples", f"cannot make inputs from the samples: {_short(exc)}")]
        ) from exc


def _run_problems(
    loaded: LoadedRecipe, model: Any, probe: ProbeInputs, kinds: dict[str, str] | None
) -> list[Problem]:
    """The runs at the min shape, at a batch of 2 and at each other dim's max, and what they found."""
    recipe = loaded.recipe
    min_dims = {name: rng.min for name, rng in recipe.dims.items()}
    feeds, fed = _fed(loaded, probe, min_dims)
    names, outputs, error = _run(model.module, recipe, feeds, hint=fed == SYNTHETIC)
    if error and fed == SAMPLES:  # the model's fault if it fails on synthetic inputs too, else the samples'
        _, _, synthetic_error = _run(model.module, recipe, probe.synthetic(min_dims), hint=True)
        if not synthetic_error:
            return [loaded.problem("data.samples", f"the model fails on the recipe's samples {error}")]
        error = synthetic_error
    if error:
        return [loaded.problem("model", f"the model fails at the min shape {error}")]
    problems = _output_problems(loaded, names, outputs)
    if problems:
        return problems
    changing = changing_outputs(recipe.outputs, outputs, lambda: _run(model.module, recipe, feeds)[1])
    if changing:
        return [
            loaded.problem(
                "model",
                f"the model's outputs change between two runs on the same inputs: {', '.join(changing)}; its "
                "forward draws random numbers in eval (a sampled latent, random masking, a dropout left on) "
                "or keeps state between calls, so no export can be checked against it: make forward "
                "deterministic for inference, or leave those outputs out of `outputs`",
            )
        ]
    found = output_kinds(recipe.outputs, outputs)
    never_finite, seen = _never_finite(outputs), {fed}
    two_problems, at_two = _at_batch_two(loaded, model, probe, min_dims, outputs)
    problems += two_problems
    if at_two is not None:
        never_finite &= _never_finite(at_two)
        merge_kinds(found, output_kinds(recipe.outputs, at_two))
    available = available_memory()
    for dim, rng in recipe.dims.items():
        key = f"dims.{dim}.max"
        at = {**min_dims, dim: rng.max}
        if dim == recipe.benchmark.batch_dim or rng.max == rng.min:
            continue  # the batch dim stays at its min
        if elements(recipe, at) > MAX_PROBE:  # too large to probe: the inputs alone must fit
            problems += input_memory_problems(loaded, key, dim, rng.max, at, available)
            continue
        feeds, fed = _fed(loaded, probe, at)
        peak = peak_rss()
        _, at_max, error = _run(model.module, recipe, feeds)
        grown = max(peak_rss() - peak, 0)
        on = " on the recipe's samples, padded to that size" if fed == SAMPLES else ""
        if error:
            problems.append(loaded.problem(key, f"the model fails when {dim} = {rng.max}{on} {error}"))
        elif not _same_ranks(at_max, outputs):
            problems.append(loaded.problem(key, f"the model's output ranks change when {dim} = {rng.max}"))
        else:
            problems += run_memory_problems(loaded, key, dim, rng.max, grown, available)
            never_finite &= _never_finite(at_max)
            merge_kinds(found, output_kinds(recipe.outputs, at_max))
            seen.add(fed)
    problems += _never_finite_problems(loaded, never_finite, seen)
    if kinds is not None:
        kinds.update(found)
    return problems


def _at_batch_two(
    loaded: LoadedRecipe, model: Any, probe: ProbeInputs, min_dims: dict[str, int], outputs: list
) -> tuple[list[Problem], list | None]:
    """The model's outputs at a batch of 2 (None where it is not run), and the problems that run found. An output
    of [batch, batch] (a CLIP-style similarity) is one value at a batch of 1, as a score is; an output's kind
    decides its gates, over every input set validation runs, so it is seen at 2 wherever validation runs a
    batch of 2 or more."""
    recipe = loaded.recipe
    batch = recipe.benchmark.batch_dim
    rng = recipe.dims.get(batch)
    if rng is None or rng.min != 1 or rng.max < 2 or largest_validated_batch(recipe) < 2:
        return [], None
    key = f"dims.{batch}.max"
    feeds, _ = _fed(loaded, probe, {**min_dims, batch: 2})
    _, at_two, error = _run(model.module, recipe, feeds)
    if error:
        return [loaded.problem(key, f"the model fails when {batch} = 2 {error}")], None
    if not _same_ranks(at_two, outputs):
        return [loaded.problem(key, f"the model's outputs (or their ranks) change when {batch} = 2")], None
    return [], at_two


def _same_ranks(run: list, outputs: list) -> bool:
    """As many outputs as the min-shape run's, each of the same rank (what the deploy's exports assume)."""
    return [getattr(o, "ndim", None) for o in run] == [o.ndim for o in outputs]


def largest_validated_batch(recipe: Recipe) -> int:
    """The largest batch validation runs: a corner's, the held-out split's (at most its sample count), for
    stored samples with a shape between the corners the off-corner run's (at the opt corner's batch, whether
    or not that corner is checked), or the benchmark's largest batch (pipeline/stages/validate.py
    validation_batches)."""
    from pipeline.inputs.data import off_corner_point

    validation = recipe.validation
    corners = [validation.corner_batches[c] for c in validation.corners if c in validation.corner_batches]
    if off_corner_point(recipe.data.samples, recipe.dims, recipe.benchmark.batch_dim) is not None:
        corners.append(validation.corner_batches.get("opt", 1))
    timed = recipe.benchmark.batch_sizes if recipe.benchmark.batch_dim in recipe.dims else []
    return max([*corners, min(validation.data_batch, recipe.data.validation), *timed])


def merge_kinds(found: dict[str, str], seen: dict[str, str]) -> None:
    """An output is one value per sample only if it is at every shape run ([batch, sequence] is one value at
    1 x 1, [batch, batch] at a batch of 1): another run's kind replaces that one, never the other way."""
    from pipeline.check.accuracy import PER_SAMPLE

    for name, kind in seen.items():
        if found[name] == PER_SAMPLE and kind != PER_SAMPLE:
            found[name] = kind


def _never_finite_problems(loaded: LoadedRecipe, never_finite: set[int], seen: set[str]) -> list[Problem]:
    """Outputs NaN/inf at every shape run: no artifact could ever be checked against them. What to fix depends
    on what was fed: the samples, or the value ranges synthetic inputs are drawn from."""
    fix = "the model, or the inputs' ranges (inputs[].low/high)" if SYNTHETIC in seen else "the model"
    if SAMPLES in seen:
        fix += ", or the samples"
    return [
        loaded.problem(
            f"outputs[{i}]",
            f"the model's output '{loaded.recipe.outputs[i]}' is NaN/inf everywhere at every shape pre-flight "
            f"ran ({' and '.join(sorted(seen))}): fix {fix}",
        )
        for i in sorted(never_finite)
    ]


def _never_finite(outputs: list) -> set[int]:
    """The floating outputs of one run without a single finite value. Every run must agree before pre-flight
    refuses one: a run at a shape whose padding mask happens to mask every token may give NaN alone."""
    return {
        i
        for i, value in enumerate(outputs)
        if getattr(value, "is_floating_point", lambda: False)() and not bool(value.isfinite().any())
    }


def output_kinds(names: list[str], outputs: list) -> dict[str, str]:
    """Each output's kind as the deploy's accuracy checks will see it (integer values, one value per sample,
    or values), from one run's tensors."""
    from pipeline.check.accuracy import output_kind

    kinds = {}
    for name, value in zip(names, outputs, strict=True):
        tensor = value.detach().cpu()
        kinds[name] = output_kind((tensor.float() if tensor.is_floating_point() else tensor).numpy())
    return kinds


def _static_problems(loaded: LoadedRecipe) -> list[Problem]:
    """What can be told without building the model: factory keyword arguments, Hugging Face output names."""
    src, problems = loaded.recipe.model, []
    if isinstance(src, EntrypointSource):
        import importlib

        module_name, _, factory_name = src.entrypoint.partition(":")
        factory = getattr(importlib.import_module(module_name), factory_name)
        try:
            params = inspect.signature(factory).parameters
        except (TypeError, ValueError):
            params = None
        if params is not None and not any(p.kind is p.VAR_KEYWORD for p in params.values()):
            for name in src.kwargs:
                if name not in params or params[name].kind is inspect.Parameter.POSITIONAL_ONLY:
                    accepted = ", ".join(n for n, p in params.items() if p.kind is not p.VAR_POSITIONAL)
                    problems.append(
                        loaded.problem(
                            f"model.kwargs.{name}",
                            f"'{src.entrypoint}' takes no argument '{name}' (it takes: {accepted or 'none'})",
                        )
                    )
    if isinstance(src, HuggingFaceSource):
        known = HF_OUTPUTS if src.pooling == "mean" else HF_OUTPUTS[:1]
        for i, name in enumerate(loaded.recipe.outputs):
            if name not in known:
                problems.append(
                    loaded.problem(
                        f"outputs[{i}]", f"the model has no output '{name}' (it provides {', '.join(known)})"
                    )
                )
    return problems


def _config_problems(loaded: LoadedRecipe, config: dict[str, Any]) -> list[Problem]:
    """Dims beyond what the model's config says it accepts (a BERT's position embeddings)."""
    limit = config.get("max_position_embeddings")
    seq = loaded.recipe.benchmark.sequence_dim
    rng = loaded.recipe.dims.get(seq or "")
    if isinstance(limit, int) and rng is not None and rng.max > limit:
        return [
            loaded.problem(
                f"dims.{seq}.max",
                f"must not exceed the model's max_position_embeddings ({limit}) (got {rng.max})",
            )
        ]
    return []


def pattern_problems(loaded: LoadedRecipe, module: Any) -> list[Problem]:
    """INT8 include/exclude patterns that match no module path of the model: a typo, or a pattern written for
    another model's names, would otherwise quietly quantize what it meant to keep in float."""
    int8 = loaded.recipe.export.int8
    if "onnx-int8" not in loaded.recipe.variants.build or not (int8.include or int8.exclude):
        return []
    from pipeline.toolchain.onnx_tools import matches

    paths = [name for name, _ in module.named_modules() if name]
    problems = []
    for key, patterns in (("include", int8.include), ("exclude", int8.exclude)):
        for i, pattern in enumerate(patterns):
            if not any(matches(path, [pattern]) for path in paths):
                examples = ", ".join(paths[1:4] or paths[:3])
                problems.append(
                    loaded.problem(
                        f"export.int8.{key}[{i}]",
                        f"'{pattern}' matches no module of the model (module paths read like: {examples})",
                    )
                )
    return problems


def _run(
    module: Any, recipe: Recipe, feeds: dict[str, np.ndarray], hint: bool = False
) -> tuple[list[str] | None, list, str]:
    """(output names if the module gives them, output values, '' or what went wrong) of one CPU run; `hint`:
    name the integer inputs' ranges when an index is past a table (the min-shape run: at a dim's max the
    located key, dims.<dim>.max, already points at a length past the model's positions)."""
    import torch

    args = tuple(torch.from_numpy(np.ascontiguousarray(feeds[s.name])) for s in recipe.inputs)
    call = getattr(module, "raw", module)  # what the user's module returns, before outputs are picked
    try:
        with torch.no_grad(), contained():
            raw = call(*args)
    except Exception as exc:  # noqa: BLE001 - the user's model failing on its inputs is the user's to fix
        shapes = ", ".join(f"{s.name} {list(feeds[s.name].shape)}" for s in recipe.inputs)
        return None, [], f"({shapes}): {_short(exc)}{_range_hint(recipe, feeds, exc) if hint else ''}"
    if isinstance(raw, torch.Tensor):
        return None, [raw], ""
    if isinstance(raw, Mapping):
        declared = list(recipe.outputs)
        if all(n in raw for n in declared):  # picked by name: extra entries are not deployed
            return declared, [raw[n] for n in declared], ""
        return [str(k) for k in raw], list(raw.values()), ""
    if isinstance(raw, tuple | list):
        return None, list(raw), ""
    return None, [raw], ""


def _output_problems(loaded: LoadedRecipe, names: list[str] | None, outputs: list) -> list[Problem]:
    import torch

    declared = list(loaded.recipe.outputs)
    if names and names != declared:  # a dict: outputs are picked by name, so every name must be there
        returned = dict(zip(names, outputs, strict=True))
        problems = []
        for i, name in enumerate(declared):
            if name in names:
                continue
            message = f"the model has no output '{name}' (it returns {', '.join(names)})"
            outer = next((n for n in names if name.startswith((f"{n}.", f"{n}["))), None)
            if outer is not None and _is_nested(returned[outer]):
                message += f": '{outer}' is {_nested(outer, returned[outer])}"
            problems.append(loaded.problem(f"outputs[{i}]", message))
        return problems
    if len(outputs) != len(declared):
        message = f"the model returns {len(outputs)} output(s) but outputs names {len(declared)}"
        nested = next((i for i, value in enumerate(outputs) if _is_nested(value)), None)
        if nested is not None:  # a user names the leaves of a nested output: say why they cannot be
            value = outputs[nested]
            # the names it suggests: output1_a for a dict's items, output1_0 for a tuple's
            base = f"output{nested}" if isinstance(value, Mapping) else f"output{nested}_"
            message += f"; its output {nested} is {_nested(base, value)}"
        nones = [i for i, value in enumerate(outputs) if value is None]
        if nones:  # a transformers model with return_dict=False leaves an output it did not compute as None
            message += f"; {_none_outputs(nones)}"
        return [loaded.problem("outputs", message)]
    problems = []
    for i, value in enumerate(outputs):
        label = f"'{names[i]}'" if names else str(i)
        if _is_nested(value):
            problems.append(
                loaded.problem(
                    f"outputs[{i}]", f"the model's output {label} is {_nested(declared[i], value)}"
                )
            )
        elif value is None:
            problems.append(loaded.problem(f"outputs[{i}]", _none_outputs([i])))
        elif not isinstance(value, torch.Tensor):
            problems.append(
                loaded.problem(
                    f"outputs[{i}]", f"the model's output {label} is a {type(value).__name__}, not a tensor"
                )
            )
        elif value.numel() == 0 and value.ndim > 0:
            problems.append(
                loaded.problem(
                    f"outputs[{i}]", f"the model's output {label} is empty (shape {list(value.shape)})"
                )
            )
        elif value.ndim == 0 or value.dtype.is_complex:
            problems.append(
                loaded.problem(
                    f"outputs[{i}]",
                    f"the model's output {label} is a {'0-d' if value.ndim == 0 else str(value.dtype)} tensor; "
                    "outputs must be real tensors with at least one dim",
                )
            )
    return problems


def _none_outputs(positions: list[int]) -> str:
    """Why a None among the returned values cannot be an output, and what to do: every output is a tensor that
    each exporter and runtime hands over, and a None has no graph output to become."""
    which = ", ".join(map(str, positions))
    said = f"output {which} is None" if len(positions) == 1 else f"outputs {which} are None"
    return (
        f"the model's {said} (nothing an exporter can return): drop it from what forward returns, or wrap the "
        "model in a module that returns only the tensors (outputs names those)"
    )


def _is_nested(value: Any) -> bool:
    return isinstance(value, Mapping | tuple | list)


def _nested(name: str, value: Any) -> str:
    """Why a tuple, list or dict cannot be an output, and the flat outputs that would replace it: exporters and
    runtimes hand over a flat list of named tensors, so an item inside an output has no name of its own."""
    if isinstance(value, Mapping):
        held, flat = f"a dict ({', '.join(map(str, value))})", [f"{name}_{key}" for key in value]
    else:
        held, flat = f"a {type(value).__name__} of {len(value)}", [f"{name}{j}" for j in range(len(value))]
    example = ", ".join(flat[:3]) + (", …" if len(flat) > 3 else "")
    return (
        f"{held}, not a tensor: outputs must be tensors, and an item inside one cannot be named; return "
        f"the items as outputs of their own ({example}), or wrap the model in a module that does"
    )


def _range_hint(recipe: Recipe, feeds: dict[str, np.ndarray], exc: BaseException) -> str:
    """Where an index past a table is likely the recipe's doing: integer inputs drawn up to inputs[].high
    (an embedding's vocabulary is the usual table), named with the largest value fed."""
    if not isinstance(exc, IndexError | RuntimeError) or "index out of range in self" not in str(exc):
        return ""  # an embedding's lookup (not "Dimension out of range": a wrong rank)
    ints = [
        f"inputs[{i}].high ({s.name} up to {int(feeds[s.name].max())})"
        for i, s in enumerate(recipe.inputs)
        if np.issubdtype(np.dtype(s.dtype), np.integer) and feeds[s.name].size
    ]
    return f"; an id past the model's table? check {', '.join(ints)}" if ints else ""


def _short(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}".rstrip(
        ": "
    )
    return text if len(text) <= 240 else text[:237] + "..."
