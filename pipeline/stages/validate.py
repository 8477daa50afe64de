"""Validation: every artifact against the eager PyTorch FP32 reference, on the recipe's shape corners and the
held-out validation split, all driven through Polygraphy's Comparator so that every runtime sees the same feeds.

The reference runs once; its outputs are kept and every artifact is compared against them output by output
with the metrics and tolerances of pipeline.check.accuracy. An artifact with no runtime here goes to not_run; one
whose runtime raises fails with the error as its reason (the stage itself goes on)."""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pipeline.bench import hosts
from pipeline.bench.matrix import ArtifactPlan, Matrix
from pipeline.check.accuracy import (
    EXACT,
    GATED_NOTES,
    SCALED,
    SPREAD,
    ArtifactAccuracy,
    Check,
    evaluate,
    off_the_mask_axis,
    real_tokens,
    reference_nonfinite,
    second_axis_dims,
)
from pipeline.check.results import REPORTS, AccuracyReport, artifact_entry
from pipeline.core import host
from pipeline.core.artifacts import ArtifactRecord
from pipeline.core.errors import PipelineError, plain
from pipeline.core.files import write_report
from pipeline.core.heap import frozen_heap
from pipeline.core.packages import package_version
from pipeline.core.variants import REFERENCE
from pipeline.decide.verdict import WEIGHTS
from pipeline.inputs.data import Dataset
from pipeline.inputs.specs import DataSpec, ModelSpec, RunnerSettings, dim_sizes
from pipeline.recipe import DimRange, Recipe, Tolerance, ValidationConfig
from pipeline.recipe.measure import DEFAULT_TOLERANCES
from pipeline.runners.base import Feeds, NotRunnable, Runner
from pipeline.runners.polygraphy_adapter import PolygraphyRunner, polygraphy_verdict
from pipeline.runners.registry import runtime_environment
from pipeline.stages.base import Late, Output, RunContext, Stage, StageConfig, StageResult

if TYPE_CHECKING:  # the locator imports ONNX's graph tools: loaded when a failure is explained
    from pipeline.check.divergence import NotLocated

REPORT = REPORTS["report:accuracy"]
MATRIX = REPORTS["report:matrix"]
ERROR_CHARS = 400


class ValidateConfig(StageConfig):
    validation: ValidationConfig
    model: ModelSpec  # the reference
    data: DataSpec
    runners: RunnerSettings
    timing: hosts.HostTiming  # the validate stage plans the matrix of work the benchmark times
    artifacts: list[str]  # in report order; whichever of them were built are validated

    @classmethod
    def from_recipe(cls, recipe: Recipe, recipe_dir: Path, artifacts: list[str]) -> ValidateConfig:
        return cls(
            validation=recipe.validation,
            model=ModelSpec.from_recipe(recipe, recipe_dir),
            data=DataSpec.from_recipe(recipe, recipe_dir),
            runners=RunnerSettings.from_recipe(recipe),
            timing=hosts.HostTiming.from_recipe(recipe),
            artifacts=list(artifacts),
        )


@dataclass(frozen=True)
class Batch:
    """One inference of the validation run: which input set it belongs to, and its feeds."""

    inputs: str  # min | opt | max | data
    feeds: Feeds


# ---------------------------------------------------------------- inputs


OFF_CORNER = "off-corner"  # stored samples at a shape between the corners (Dataset.off_corner_feeds)
TIMED = "timed"  # the benchmark's largest batch, at the opt corner's shape


def validation_batches(dataset: Dataset, cfg: ValidationConfig, timed_batch: int = 1) -> list[Batch]:
    """The corners at the recipe's corner batch sizes (never larger), stored samples at a shape between them,
    the held-out split as 'data', and where the benchmark times a larger batch than all of these (`timed_batch`,
    its largest), that batch at the opt corner's shape: no row is timed at a batch larger than every batch its
    artifact was checked at (a graph or a runtime's batching that breaks past some size)."""
    batches = [
        Batch(corner, dataset.corner_feeds(corner, cfg.corner_batches.get(corner, 1)))
        for corner in cfg.corners
    ]
    between = dataset.off_corner_feeds(cfg.corner_batches.get("opt", 1))
    if between is not None:
        batches.append(Batch(OFF_CORNER, between))
    batches += [Batch("data", feeds) for feeds in dataset.split_feeds("validation", cfg.data_batch)]
    if timed_batch > largest_batch(dataset, batches):
        batches.append(Batch(TIMED, dataset.corner_feeds("opt", timed_batch)))
    return batches


def largest_batch(dataset: Dataset, batches: list[Batch]) -> int:
    """The largest batch size among the validation batches (1 for a model without a batch axis)."""
    return max((dataset.batch_of(b.feeds) or 1 for b in batches), default=1)


def _shape_text(batch: Batch) -> str:
    return " ".join(f"{name}{list(a.shape)}" for name, a in batch.feeds.items())


# ---------------------------------------------------------------- running through Polygraphy


class BatchFailure(Exception):
    """A runner raised on one batch (or while loading, before any batch): says where, keeps the cause."""

    def __init__(self, where: str, cause: BaseException):
        super().__init__(f"{where}: {_one_line(cause)}")
        self.where = where


def run_batches(
    ctx: RunContext, settings: RunnerSettings, runner: Runner, batches: list[Batch], label: str
) -> Any:
    """Comparator.run over all batches with one runner (activated and deactivated by the Comparator);
    returns Polygraphy's RunResults. Progress is reported per batch; a failure says at which batch."""
    from polygraphy.comparator import Comparator
    from polygraphy.logger import G_LOGGER

    started: list[int] = []

    def on_infer(i: int) -> None:
        started.append(i)
        _progress(ctx, label, batches, i)

    adapter = PolygraphyRunner(runner, settings, on_infer)
    ctx.report(f"validate {label}: loading")
    try:
        with G_LOGGER.verbosity(G_LOGGER.WARNING):
            return Comparator.run([adapter], data_loader=[b.feeds for b in batches])
    except Exception as err:
        where = (
            f"at {batches[started[-1]].inputs} ({_shape_text(batches[started[-1]])})"
            if started
            else "loading"
        )
        raise BatchFailure(where, err) from err
    finally:
        if adapter.is_active:
            adapter.deactivate()
        del adapter
        gc.collect()


def _progress(ctx: RunContext, label: str, batches: list[Batch], i: int) -> None:
    batch = batches[i]
    same = [k for k, b in enumerate(batches) if b.inputs == batch.inputs]
    part = f" ({same.index(i) + 1}/{len(same)})" if len(same) > 1 else ""
    ctx.report(f"validate {label} at {batch.inputs}{part}: {_shape_text(batch)}")


def unmasked_outputs(
    config: ValidateConfig, batches: list[Batch], reference: Any
) -> tuple[frozenset[str], list[str]]:
    """The outputs never compared on real tokens only (check.accuracy.off_the_mask_axis): those whose second
    axis the validation batches do not show to follow the padding mask's dim; and a warning for each such output
    whose axis had the mask dim's size throughout, beside another dim's (validation could not tell them apart,
    so padded positions are compared too)."""
    mask = next((s for s in config.model.inputs if s.name == config.validation.padding_mask), None)
    named = mask.shape[1] if mask is not None and len(mask.shape) > 1 else None
    mask_dim = named if isinstance(named, str) else None
    sizes: dict[str, list[dict[str, int]]] = {}
    for batch in batches:
        sizes.setdefault(batch.inputs, []).append(dim_sizes(config.model.inputs, batch.feeds))
    outputs = _by_inputs(reference, batches)
    unmasked = off_the_mask_axis(outputs, sizes, mask_dim, config.data.batch_dim)
    ties = {o: d for o, d in second_axis_dims(outputs, sizes, config.data.batch_dim).items() if o in unmasked}
    warnings = [
        f"output {output}: its second axis had the size of {' and of '.join(sorted(dims))} in every validation "
        f"batch, so it is compared at every position, padding included (give dims.{mask_dim} sizes the other "
        "dims do not have, to compare it on real tokens only)"
        for output, dims in ties.items()
        if mask_dim in dims
    ]
    return unmasked, warnings


def _by_inputs(run_results: Any, batches: list[Batch]) -> dict[str, list[dict[str, np.ndarray]]]:
    """The single runner's iterations regrouped by input set, in batch order."""
    ((_, iterations),) = run_results.items()
    grouped: dict[str, list[dict[str, np.ndarray]]] = {}
    for batch, iteration in zip(batches, iterations, strict=True):
        grouped.setdefault(batch.inputs, []).append(dict(iteration))
    return grouped


def padding_masks(cfg: ValidationConfig, batches: list[Batch]) -> dict[str, list[np.ndarray | None]]:
    """Per input set, each batch's real-token mask (from validation.padding_mask and padding_value), so that
    per-token outputs are judged on real tokens only."""
    grouped: dict[str, list[np.ndarray | None]] = {}
    for batch in batches:
        grouped.setdefault(batch.inputs, []).append(
            real_tokens(batch.feeds, cfg.padding_mask, cfg.padding_value)
        )
    return grouped


def coverage_warnings(
    cfg: ValidationConfig, dims: dict[str, DimRange], batch_dim: str | None = None, largest: int | None = None
) -> list[str]:
    """What the validation does not cover of the shape space the recipe declares (said in the report and on
    the console, never silently): a corner the recipe leaves out, and the batch range's max where every batch
    validation ran (`largest`, the largest of them) is smaller; the max corner runs its own batch size, which
    is small by default, as the longest sequences are the costly ones."""
    skipped = [c for c in ("min", "max") if c not in cfg.corners]
    found = [
        f"dims.{dim}.{corner} is not validated (validation.corners leaves out {corner})"
        for dim in dims
        for corner in skipped
    ]
    rng = dims.get(batch_dim or "")
    if rng is not None and largest is not None and largest < rng.max and "max" in cfg.corners:
        corner = "opt" if "opt" in cfg.corners else "max"
        found.append(
            f"dims.{batch_dim}.max ({rng.max}) is not validated: the largest batch validated is {largest} "
            f"(validation.corner_batches.{corner}: {rng.max} would validate it)"
        )
    return found


# ---------------------------------------------------------------- one artifact


def tolerance_for(cfg: ValidationConfig, precision: str | None) -> Tolerance:
    """The recipe's tolerance for this precision; the schema's default when the recipe leaves it out."""
    key = precision or "fp32"
    return cfg.tolerances.get(key) or ValidationConfig().tolerances[key]


def runtime_runners(runners: list[Runner]) -> list[Runner]:
    """One runner per runtime, host I/O preferred: device and host I/O of a runtime share one validation,
    since they run the same kernels and differ only in where inputs and outputs live."""
    chosen: dict[str, Runner] = {}
    for runner in runners:
        if runner.runtime not in chosen or (runner.io == "host" and chosen[runner.runtime].io != "host"):
            chosen[runner.runtime] = runner
    return list(chosen.values())


def offer(matrix: Matrix, record: ArtifactRecord, settings: RunnerSettings) -> list[Runner]:
    """Offer an artifact to the matrix: the ways this host runs it (or why it cannot), and the runtimes that
    decline it; returns its runners."""
    from pipeline.runners.registry import declined_runtimes, runners_for

    found = runners_for(record, settings)
    declined = declined_runtimes(record, settings)
    if isinstance(found, NotRunnable):
        matrix.cannot_run(record.name, found.reason, declined)
        return []
    matrix.offer(record.name, [(r.runtime, r.io) for r in found], declined)
    return found


def validate_artifact(
    ctx: RunContext,
    config: ValidateConfig,
    record: ArtifactRecord,
    batches: list[Batch],
    reference: Any,
    runners: list[Runner],
    plan: ArtifactPlan,
    onnx_reference: ArtifactRecord | None = None,
    unmasked: frozenset[str] = frozenset(),
) -> list[ArtifactAccuracy]:
    """Run one artifact over the batches on every runtime its plan validates it on (pipeline/bench/matrix.py),
    and check each; a runtime error is that runtime's failure, not a crash."""
    chosen = runtime_runners([r for r in runners if r.runtime in plan.validated])
    results = [validate_on(ctx, config, record, runner, batches, reference, unmasked) for runner in chosen]
    if onnx_reference is not None and record.kind == "onnx" and record.name != onnx_reference.name:
        for accuracy in results:
            if not accuracy and accuracy.error is None:
                tolerance = tolerance_for(config.validation, record.precision)
                accuracy.details["divergence"] = locate(
                    ctx, accuracy, record, onnx_reference, batches, tolerance
                )
    return results


DIVERGENCE_METRICS = ("max_abs", "mean_abs", "max_rel", "cosine")


def divergence_gate(worst: Check, tolerance: Tolerance) -> tuple[str, float, bool]:
    """The metric and threshold the divergence locator judges float tensors by, from the failing check it
    explains, and whether that threshold is a tolerance times each tensor's own scale (locate_divergence's
    `scaled`). The check's own metric, an absolute one on each tensor's scale: an output's 1e-3 x its largest
    value says nothing of a hidden tensor ten times larger. Except where the bound is the output kind's own
    (an integer's exact 0, which every quantized or FP16 node would exceed; a one-value-per-sample score's
    bound from its spread over the samples or as written): the tensors such an output is computed from are
    vectors, judged by the precision's cosine, the gate float outputs get. NaN/inf or incomparable outputs:
    any finite difference (the first non-finite value)."""
    if worst.reason in GATED_NOTES:
        cosine = tolerance.resolved(worst.output)["cosine"][0] or tolerance.cosine
        return "cosine", cosine if cosine is not None else DEFAULT_TOLERANCES["fp32"]["cosine"], False
    if worst.metric not in DIVERGENCE_METRICS or worst.threshold is None:
        return "max_abs", 1e30, False
    if worst.metric in SCALED and worst.scale > 0:
        return worst.metric, worst.threshold / worst.scale, True
    return worst.metric, worst.threshold, False


def locate(
    ctx: RunContext,
    accuracy: ArtifactAccuracy,
    record: ArtifactRecord,
    onnx_reference: ArtifactRecord,
    batches: list[Batch],
    tolerance: Tolerance,
) -> dict[str, Any]:
    """Where a failing ONNX artifact first departs from the FP32 ONNX graph, on the inputs of its worst failing
    check (a float output's where one fails), judged by divergence_gate."""
    from pipeline.check.divergence import NotLocated, locate_divergence

    failures = accuracy.failures()
    worst = next((c for c in failures if c.reason != EXACT), failures[0])  # a float output's, where one fails
    metric, threshold, scaled = divergence_gate(worst, tolerance)
    feeds = next(b.feeds for b in batches if b.inputs == worst.inputs)
    ctx.report(f"validate {record.name}: locating where it first diverges ({metric} at {worst.inputs})")
    try:
        found = locate_divergence(onnx_reference.path, record.path, feeds, metric, threshold, scaled=scaled)
    except Exception as err:  # the locator explains a failure; it must never cause one
        return {"text": None, "error": _one_line(err)}
    if isinstance(found, NotLocated):
        note = _not_located(found, worst, metric, threshold, accuracy.runtime, record.name)
        return {"text": None, "note": note}
    return {"text": found.describe(), **found.to_json()}


def _not_located(
    found: NotLocated,
    worst: Check,
    metric: str,
    threshold: float,
    runtime: str | None,
    artifact: str | None = None,
) -> str:
    """Why the locator named no node, in the report's words. It searched the first batch of the worst failing
    check's input set, which the note names."""
    from pipeline.check.divergence import NO_SHARED_TENSOR

    where = f"on the first batch at {worst.inputs}"
    if found.why == NO_SHARED_TENSOR:
        return "the graph shares no tensor name with the FP32 graph (its nodes were renamed or fused): not searched"
    if worst.reason in GATED_NOTES:  # judged by the precision's cosine: the float tensors stay within it
        note = (
            f"no float tensor {worst.output} is computed from falls below {metric} {threshold:g} {where} on the "
            "CPU provider"
        )
        if worst.reason == EXACT:  # the integer output flips on near ties
            return note + ": its values change where the reference nearly ties (close logits under an argmax)"
        if worst.reason == SPREAD:  # the error builds up along the path against the little the score varies
            return note + (
                f": no node departs by that measure; {worst.output}'s bound is set by how little it varies "
                "between samples, and the error the precision adds along the whole path exceeds it"
            )
        return note + f": no node departs by that measure; {worst.output}'s own bound is tighter"
    note = (
        f"{worst.output} passes when the graph runs as written {where} on ONNX Runtime's CPU provider, its graph "
        f"optimizations off (the locator marks tensors, which those optimizations would fuse away): the failure "
        f"comes with ONNX Runtime's optimizations of the graph, another batch, or the runtime it failed on "
        f"({runtime})"
    )
    # signed INT8 weights (the static graph's; the dynamic ones are unsigned): ONNX Runtime's u8s8 GEMM
    if artifact == "onnx-int8" and _onnxruntime_on_cpu(runtime) and host.x86_without_vnni():
        note += (
            "; this CPU has AVX2 but no VNNI, where the fused 8-bit kernels' 16-bit sums can saturate with signed "
            "weights: the same graph may pass on a CPU with VNNI"
        )
    return note


def _onnxruntime_on_cpu(runtime: str | None) -> bool:
    """ONNX Runtime computing on the CPU, by its descriptor (the runners own their names)."""
    from pipeline.runners.registry import runtime as descriptor

    try:
        found = descriptor(runtime or "")
    except KeyError:  # a name no runner declares: not one
        return False
    return found.package == "onnxruntime" and not found.on_gpu


def validate_on(
    ctx: RunContext,
    config: ValidateConfig,
    record: ArtifactRecord,
    runner: Runner,
    batches: list[Batch],
    reference: Any,
    unmasked: frozenset[str] = frozenset(),
) -> ArtifactAccuracy:
    cfg = config.validation
    tolerance = tolerance_for(cfg, record.precision)
    accuracy = ArtifactAccuracy(record.name, record.precision, runner.runtime)
    label = f"{record.name} on {runner.runtime}"
    started = time.perf_counter()
    try:
        actual = run_batches(ctx, config.runners, runner, batches, label)
    except BatchFailure as err:  # the artifact's runtime failed: its failure, recorded with the reason
        accuracy.error = f"{runner.runtime} failed {err}"
        return accuracy
    accuracy.details["run_s"] = round(time.perf_counter() - started, 2)  # loading and every batch
    evaluate(
        accuracy,
        _by_inputs(reference, batches),
        _by_inputs(actual, batches),
        config.runners.outputs,
        tolerance,
        padding_masks(cfg, batches),
        cfg.neighbours_k,
        unmasked,
    )
    try:
        masks = [real_tokens(b.feeds, cfg.padding_mask, cfg.padding_value) for b in batches]
        accuracy.details["polygraphy"] = polygraphy_verdict(
            reference, actual, config.runners.outputs, tolerance, masks, unmasked
        )
    except Exception as err:  # Polygraphy's cross-check is informational; never let it fail the artifact
        accuracy.details["polygraphy"] = {"error": _one_line(err)}
    return accuracy


def _one_line(err: BaseException) -> str:
    text = " ".join(plain(str(err)).split()) or type(err).__name__
    text = f"{type(err).__name__}: {text}"
    return text if len(text) <= ERROR_CHARS else text[: ERROR_CHARS - 1] + "…"


# ---------------------------------------------------------------- the stage


def accuracy_report(
    results: dict[str, list[ArtifactAccuracy]],
    not_run: list[NotRunnable],
    reference_runtime: str | None = None,
    warnings: list[str] | None = None,
    inputs: dict[str, Any] | None = None,
) -> AccuracyReport:
    """accuracy.json per the contract, each artifact with its record per runtime (plus the reference's
    runtime, the values each input covered, and what the validation does not cover)."""
    return {
        "schema_version": 1,
        "reference": REFERENCE,
        "reference_runtime": reference_runtime,
        "artifacts": {name: artifact_entry(records) for name, records in results.items()},
        "not_run": [{"artifact": n.artifact, "reason": n.reason} for n in not_run],
        "warnings": list(warnings or []),
        "inputs": dict(inputs or {}),
    }


class WeightsMismatch(RuntimeError):
    """An artifact was exported from other weights than the reference's: a bug or a model that does not build
    deterministically, never a validation failure of the artifact."""


def check_weights(record: ArtifactRecord, reference: str) -> None:
    """The export recorded the weights digest of the model it exported (in its own process); it must be the
    reference's, else every comparison below would judge a different model."""
    recorded = record.details.get(WEIGHTS)
    if recorded and recorded != reference:
        raise WeightsMismatch(
            f"{record.name} was exported from weights {recorded[:16]}…, but the reference model has weights "
            f"{reference[:16]}…: the processes that built the model did not build the same one (an unseeded "
            "random initialisation, or a factory that reads changing state); the artifact is not validated"
        )


def input_coverage(dataset: Dataset, batches: list[Batch]) -> tuple[dict[str, Any], list[str]]:
    """What each input's values covered over all validation batches, and a warning for each input whose
    held-out split holds fewer than two distinct values (a degenerate sample: token ids all 0, say)."""
    coverage = dataset.value_coverage([b.feeds for b in batches])
    held_out = dataset.value_coverage([b.feeds for b in batches if b.inputs == "data"])
    warnings = [
        f"input {name}: the held-out validation split holds {found['distinct']} distinct value(s) "
        f"({found['min']:g}); the artifacts were not checked on varied values of it"
        for name, found in held_out.items()
        if found["distinct"] < 2
    ]
    for name, found in coverage.items():
        found["held_out_distinct"] = held_out.get(name, {}).get("distinct")
    return coverage, warnings


def _run(ctx: RunContext, config: ValidateConfig, inputs: dict[str, ArtifactRecord]) -> StageResult:
    from pipeline.runners.registry import reference_runners

    order = config.artifacts
    # built ones first; those a background stage is still building (Late) once the others are checked
    present = [inputs[name] for name in order if name in inputs]
    ready = [r for r in present if not isinstance(r, Late)]
    late = [r for r in present if isinstance(r, Late)]
    results: dict[str, list[ArtifactAccuracy]] = {}
    not_run: list[NotRunnable] = []
    absent = [name for name in order if name not in inputs]
    reference_runtime = None
    coverage: dict[str, Any] = {}
    data_warnings: list[str] = []
    matrix = Matrix(config.timing, host.has_cuda())
    reference_runner, *_ = references = reference_runners(config.runners, lambda: ctx.model(config.model))
    matrix.offer(REFERENCE, [(r.runtime, r.io) for r in references])  # timed if benchmark.include_reference
    matrix.plan(REFERENCE)
    del references
    runners = {record.name: offer(matrix, record, config.runners) for record in ready}
    if present:
        batches = validation_batches(
            ctx.dataset(config.data), config.validation, max(config.timing.batch_sizes)
        )
        coverage, data_warnings = input_coverage(ctx.dataset(config.data), batches)
        reference_weights = ctx.model(config.model).weights_digest()
        reference_runtime = reference_runner.runtime
        reference = run_batches(ctx, config.runners, reference_runner, batches, REFERENCE)
        unmasked, mask_warnings = unmasked_outputs(config, batches, reference)
        data_warnings += mask_warnings
        broken = reference_nonfinite(
            _by_inputs(reference, batches),
            config.runners.outputs,
            padding_masks(config.validation, batches),
            unmasked,
        )
        if broken:  # every artifact would fail against it: the model, not the artifacts, is what to fix
            raise PipelineError(
                f"model: the model's own outputs are not finite on the recipe's validation inputs "
                f"({'; '.join(broken[:4])}): no artifact can be checked against them; fix the model or "
                "the inputs' ranges (inputs[].low/high, data)"
            )
        pending = {item.name: item for item in late}
        built: dict[str, ArtifactRecord | None] = {}

        def arrived(item: Late) -> ArtifactRecord | None:
            """Wait for a record building in the background (once), and offer it to the matrix."""
            if item.name not in built:
                ctx.report(f"validate: waiting for {item.name} (building in the background)")
                built[item.name] = record = item.wait()
                if record is not None:
                    runners[record.name] = offer(matrix, record, config.runners)
            return built[item.name]

        with frozen_heap():  # the collection after each runner walks only what came after the reference
            for item in [*ready, *late]:
                record = arrived(item) if isinstance(item, Late) else item
                if record is None:  # its build failed: absent, like any variant whose build failed
                    absent.append(item.name)
                    continue
                check_weights(record, reference_weights)
                if record.name in matrix.not_run:
                    not_run.append(NotRunnable(record.name, matrix.not_run[record.name]))
                    continue
                for twin in hosts.twin_artifacts(record.name):  # its plan depends on its twins
                    if twin in pending:
                        arrived(pending[twin])
                plan = matrix.plan(record.name)
                if plan.reason is not None:  # one the recipe leaves untimed is not "not runnable": not_timed
                    if not plan.runnable:
                        not_run.append(NotRunnable(record.name, plan.reason))
                    continue
                # the FP32 graph, once built (in the background: once it has arrived)
                onnx_reference = built.get("onnx-fp32") if "onnx-fp32" in pending else inputs.get("onnx-fp32")
                results[record.name] = validate_artifact(
                    ctx,
                    config,
                    record,
                    batches,
                    reference,
                    runners[record.name],
                    plan,
                    onnx_reference,
                    unmasked,
                )
                for accuracy in results[record.name]:  # a runtime that raised is not timed: it would again
                    if accuracy.error is not None and accuracy.runtime is not None:
                        matrix.failed_validation(record.name, accuracy.runtime)
        del reference
        gc.collect()
    del reference_runner
    results = {name: results[name] for name in order if name in results}  # report order: the recipe's
    largest = largest_batch(ctx.dataset(config.data), batches) if present else None
    warnings = coverage_warnings(config.validation, config.model.dims, config.data.batch_dim, largest)
    warnings += data_warnings
    report = accuracy_report(results, not_run, reference_runtime, warnings, coverage)
    write_report(ctx.path(REPORT), report, allow_nan=False)
    work = matrix.report(order)
    write_report(ctx.path(MATRIX), work)
    entries = report["artifacts"]
    summary = {
        "passed": [name for name, e in entries.items() if e["passed"]],
        "failed": {name: e["reason"] for name, e in entries.items() if not e["passed"]},
        "not_run": {n.artifact: n.reason for n in not_run},
        "absent": [name for name in order if name in absent],
        "accuracy_warnings": report["warnings"],  # in the report; not stage warnings (said once)
    }
    return StageResult(
        outputs=[
            Output(REPORT, "report", "report:accuracy", details=summary, value=report),
            Output(MATRIX, "report", "report:matrix", value=work),
        ],
        details=summary,
    )


def stage(recipe: Recipe, recipe_dir: Path, artifacts: list[str]) -> Stage:
    """The validate stage over whichever of `artifacts` were built (consumes_any)."""
    return Stage(
        name="validate",
        version=17,  # what each version changed: CHANGELOG.md, "Stage versions"
        config=ValidateConfig.from_recipe(recipe, recipe_dir, artifacts),
        run=_run,
        environment=lambda: {
            **{name: package_version(name) for name in ("torch", "onnxruntime", "polygraphy", "numpy")},
            **runtime_environment(),
        },
        consumes_any=tuple(artifacts),
        produces=("report:accuracy", "report:matrix"),
        critical=True,
        takes_late=True,
    )
