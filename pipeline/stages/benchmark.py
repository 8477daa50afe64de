"""Benchmark stage: the cells of the matrix of work the validate stage planned (pipeline/bench/matrix.py: which
artifact on which runtime and I/O, at which batches, the PyTorch reference among them) on the same input
batches, with the same timer, warm-up and window policy, interleaved per shape (docs/benchmarking.md). Writes
reports/speed.json.

Per shape every candidate is activated and given the same prepared inputs; windows then run A B C A B C
until each candidate is stable or capped (on a GPU host the GPU candidates among themselves, then the CPU
reference: its threads would spin on the cores the GPU candidates launch from); afterwards every candidate is
released (sessions dropped, gc, CUDA cache emptied) before the next shape, so that no candidate runs in
another's leftovers.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pipeline.bench import gpu_split, hosts
from pipeline.bench.device import MemoryProbe, throughput
from pipeline.bench.environment import capture_environment
from pipeline.bench.matrix import MatrixReport, timed_batches
from pipeline.bench.profile import profile_row
from pipeline.bench.rows import failure, flags, one_line, speed_row
from pipeline.bench.shapes import BenchShape, benchmark_shapes
from pipeline.bench.timer import Timer, on_gpu, timer_for
from pipeline.bench.windows import Measurement, WindowPolicy, measure_interleaved, measure_more
from pipeline.check.results import REPORTS, SpeedReport
from pipeline.check.speed import THROUGHPUT
from pipeline.check.timings import Timing
from pipeline.core import host
from pipeline.core.artifacts import ArtifactRecord
from pipeline.core.children import Cancelled
from pipeline.core.files import write_report
from pipeline.core.heap import frozen_heap
from pipeline.core.packages import package_version
from pipeline.core.variants import REFERENCE
from pipeline.decide.selection import SelectionPolicy, unsettled_contenders
from pipeline.inputs.specs import DataSpec, ModelSpec, RunnerSettings
from pipeline.recipe import BenchmarkConfig, Recipe, ServerLoad
from pipeline.runners.base import NotRunnable, Runner
from pipeline.runners.compiled import release_all
from pipeline.runners.registry import reference_runners, runners_for, runtime_environment
from pipeline.stages import benchmark_worker
from pipeline.stages.base import ALONE, Output, RunContext, Stage, StageConfig, StageResult

SCHEMA_VERSION = 1
REPORT = REPORTS["report:speed"]
NAME = "benchmark"
ACCURACY = "report:accuracy"  # read to know which candidate would win (an unstable one is measured again)
MATRIX = "report:matrix"  # what is timed, at which batches (pipeline/bench/matrix.py)


class BenchmarkStageConfig(StageConfig):
    benchmark: BenchmarkConfig
    selection: SelectionPolicy  # the would-be winner is measured again when it is unstable
    runners: RunnerSettings
    model: ModelSpec  # the reference
    data: DataSpec
    gpu_only: list[str]  # variants.gpu not built on a host without a GPU: reported as not run
    artifacts: list[str]  # in report order; whichever of them were built are timed

    @classmethod
    def from_recipe(cls, recipe: Recipe, recipe_dir: Path, artifacts: list[str]) -> BenchmarkStageConfig:
        return cls(
            benchmark=_measured_here(recipe.benchmark),
            selection=SelectionPolicy.from_recipe(recipe),
            runners=RunnerSettings.from_recipe(recipe),
            model=ModelSpec.from_recipe(recipe, recipe_dir),
            data=DataSpec.from_recipe(recipe, recipe_dir),
            gpu_only=hosts.gpu_only_variants(recipe),
            artifacts=list(artifacts),
        )


def _measured_here(bench: BenchmarkConfig) -> BenchmarkConfig:
    """The benchmark settings this stage measures by: the server scenario is the load stage's, so asking for it
    or changing its settings leaves the latency rows fresh."""
    scenarios = [s for s in bench.scenarios if s != "server"]
    return bench.model_copy(update={"server": ServerLoad(), "scenarios": scenarios})


Key = tuple[str, str, str]  # (artifact, runtime, io)


@dataclass
class Candidate:
    runner: Runner
    precision: str | None
    timer: Timer | None = None
    memory: dict[str, Any] | None = None  # GPU candidates: peak device memory (pipeline/bench/device.py)
    throughput: dict[str, Any] | None = None
    load_s: float | None = None  # activation, preparation and the first call at this shape (outside timing)

    @property
    def key(self) -> Key:
        return (self.runner.artifact, self.runner.runtime, self.runner.io)


def stage(recipe: Recipe, recipe_dir: Path, artifacts: list[str]) -> Stage:
    return Stage(
        name=NAME,
        version=17,  # what each version changed: CHANGELOG.md, "Stage versions"
        config=BenchmarkStageConfig.from_recipe(recipe, recipe_dir, artifacts),
        run=run,
        environment=_environment,
        consumes=(MATRIX,),
        consumes_any=(*artifacts, ACCURACY),
        produces=("report:speed",),
        critical=True,
        volatile=True,
        placement=ALONE,  # it times: no background stage (the AOTInductor compile) may run beside it
    )


def _environment() -> dict[str, Any]:
    return {
        "torch": package_version("torch"),
        "onnxruntime": package_version("onnxruntime") or package_version("onnxruntime-gpu"),
        **runtime_environment(),
    }


def run(ctx: RunContext, config: BenchmarkStageConfig, inputs: dict[str, ArtifactRecord]) -> StageResult:
    policy = WindowPolicy.from_config(config.benchmark)
    artifacts = {name: record for name, record in inputs.items() if not name.startswith("report:")}
    work: MatrixReport = inputs[MATRIX].report()
    found = candidates(ctx, config, artifacts, work)
    not_run = list(work["not_run"]) + hosts.skipped_gpu_variants(config.gpu_only, work["gpu_host"])
    shapes = shapes_of(ctx, config)
    phases = _PhaseClock()
    try:
        with frozen_heap():  # the collections after each shape walk only what the candidates made
            with phases("gpu_workers"):  # several GPUs: each worker times and profiles its own rows
                here, elsewhere = _share_out(ctx, config, inputs, found, work)
            with phases("measure"):
                results, failed, measured = measure_shapes(ctx, config, here, shapes, policy, work)
            results, failed = elsewhere.results + results, elsewhere.failed + failed
            if ACCURACY in inputs:
                accuracy = inputs[ACCURACY].report()
                with phases("confirm_winner"):
                    results = confirm_winner(ctx, config, results, accuracy, found, shapes, measured, policy)
            if config.benchmark.profile:  # the rows without one: a GPU worker profiled its own
                bare = {(r["artifact"], r["runtime"], r["io"]) for r in results if "profile" not in r}
                with phases("profile"):
                    profile_rows(ctx, config, [c for c in found if c.key in bare], shapes, results)
    finally:  # the compiled modules kept since validation (pipeline.runners.compiled)
        release_all()
        _free_memory()
    report: SpeedReport = {
        "schema_version": SCHEMA_VERSION,
        "conditions": {
            **_conditions(config, policy, shapes),
            "cuda_graphs": "per row (cuda_graph); captured outside the timed windows",
            "runtimes_timed": {**work["policy"], "not_timed": work["not_timed"]},
            **({"parallel_gpus": elsewhere.describe()} if config.benchmark.parallel_gpus > 1 else {}),
            "phase_seconds": phases.seconds,
        },
        "results": results,
        "not_run": not_run,  # artifacts this host cannot run at all
        "failed": failed,  # candidates that raised at a shape: (artifact, runtime, io, shape, reason)
        "flags": flags(results),
    }
    write_report(ctx.path(REPORT), report)
    details = {
        "rows": len(results),
        "not_run": len(not_run),
        "failed": len(failed),
        "flags": len(report["flags"]),
        "remeasured": [r["artifact"] for r in results if r.get("remeasured")],
    }
    return StageResult(outputs=[Output(REPORT, "report", "report:speed", value=report)], details=details)


class _PhaseClock:
    """Seconds per phase of the stage, kept in the report: a slow benchmark says whether its time went on
    the timed windows, on confirming the winner or on the per-row profiles (each loads its rows again)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] = round(time.perf_counter() - started, 2)


def shapes_of(ctx: RunContext, config: BenchmarkStageConfig) -> list[BenchShape]:
    return benchmark_shapes(config.benchmark, config.data.dims, _token_lengths(ctx, config))


def measure_shapes(
    ctx: RunContext,
    config: BenchmarkStageConfig,
    candidates: list[Candidate],
    shapes: list[BenchShape],
    policy: WindowPolicy,
    work: MatrixReport,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[BenchShape, dict[Key, Measurement]]]:
    """Every shape's rows and failures (the matrix's cells at that shape's batch), and the measurements."""
    results: list[dict[str, Any]] = []
    failed: list[dict[str, Any]] = []
    measured: dict[BenchShape, dict[Key, Measurement]] = {}
    batches = timed_batches(work)
    for shape in shapes:
        timed = [c for c in candidates if shape.batch in batches.get(c.key, ())]
        rows, failures, measured[shape] = _measure_shape(ctx, config, shape, timed, policy)
        results += rows
        failed += failures
    return results, failed, measured


@dataclass
class Elsewhere:
    """The cells timed by GPU workers (`benchmark.parallel_gpus`), or why none were."""

    asked: int = 1
    gpus: int = 0
    groups: list[dict[str, Any]] = field(default_factory=list)  # per worker: its GPU and its cells
    note: str | None = None
    results: list[dict[str, Any]] = field(default_factory=list)
    failed: list[dict[str, Any]] = field(default_factory=list)

    def describe(self) -> dict[str, Any]:
        return {
            "asked": self.asked,
            "gpus_on_host": self.gpus,
            "workers": self.groups,
            "isolation": "one process per GPU, which sees that GPU alone (CUDA_VISIBLE_DEVICES), on CPU cores of "
            "its own; an artifact's runtimes on one GPU; the CPU rows timed after the workers ended; a would-be "
            "winner that is unstable timed again in this process beside its contenders, on one GPU",
            **({"note": self.note} if self.note else {}),
        }


def _share_out(
    ctx: RunContext,
    config: BenchmarkStageConfig,
    inputs: dict[str, ArtifactRecord],
    found: list[Candidate],
    work: MatrixReport,
) -> tuple[list[Candidate], Elsewhere]:
    """The candidates this process times, and what GPU workers timed of the others (all of them before this
    process times its own: a CPU runtime's threads would spin on the cores the workers launch from)."""
    asked = config.benchmark.parallel_gpus
    if asked <= 1:
        return found, Elsewhere()
    names = host.gpu_names()
    count = len(names)
    gpu = [c for c in found if on_gpu(c.runner)]
    groups = gpu_split.split([c.key for c in gpu], min(asked, count)) if count >= 2 else []
    elsewhere = Elsewhere(asked, count, note=gpu_split.plan_note(asked, count, len(groups)))
    if len(groups) >= 2 and len(set(names)) > 1:  # rows of unlike GPUs would be ranked against each other
        elsewhere.note = f"benchmark.parallel_gpus is {asked}, but this host's GPUs differ ({', '.join(names)}): timed on one"
        groups = []
    if len(groups) < 2:
        return found, elsewhere
    devices = gpu_split.visible_gpus(count)
    ctx.report(f"benchmark: timing {len(gpu)} GPU cells on {len(groups)} GPUs, one worker each")
    outcomes = benchmark_worker.run_workers(
        ctx, config, inputs, work, list(zip(devices, groups, strict=False))
    )
    if ctx.cancel.is_set():  # the run is stopping: its workers are gone
        raise Cancelled()
    batches = timed_batches(work)
    for device, keys, outcome in outcomes:
        elsewhere.groups.append({"visible_device": device, "cells": [list(k) for k in keys]})
        if outcome.get("ok"):
            elsewhere.results += outcome["results"]
            elsewhere.failed += outcome["failed"]
            continue
        reason = f"the benchmark worker on GPU {device} failed: {outcome.get('error')}"
        elsewhere.failed += [
            {"artifact": a, "runtime": r, "io": io, "batch": batch, "reason": reason}
            for a, r, io in keys
            for batch in sorted(batches.get((a, r, io), ()))
        ]
    timed = {key for _, keys, _ in outcomes for key in keys}
    return [c for c in found if c.key not in timed], elsewhere


def confirm_winner(
    ctx: RunContext,
    config: BenchmarkStageConfig,
    results: list[dict[str, Any]],
    accuracy: dict[str, Any],
    candidates: list[Candidate],
    shapes: list[BenchShape],
    measured: dict[BenchShape, dict[Key, Measurement]],
    policy: WindowPolicy,
) -> list[dict[str, Any]]:
    """An unstable would-be winner is measured again before it is chosen: the rows contending with it
    (selection.unsettled_contenders) get more windows (interleaved, earlier windows kept, a second full
    budget), and their rows are rebuilt. Selection then decides on the new rows (provisionally, if still
    unstable). Contenders some of which a GPU worker timed are timed afresh here, side by side on one GPU."""
    contenders = unsettled_contenders(config.selection, {"results": results}, accuracy)
    if not contenders:
        return results
    chosen = contenders[0]
    shape = next(s for s in shapes if (s.batch, s.sequence) == (chosen.batch, chosen.recorded_sequence))
    keys = {(r.artifact, r.runtime, r.io) for r in contenders}
    again = [c for c in candidates if c.key in keys]
    before = measured.get(shape, {})
    earlier = before if all(c.key in before for c in again) else None
    ctx.report(f"benchmark: the would-be winner {chosen.artifact} is unstable; measuring {len(again)} again")
    rebuilt, _, _ = _measure_shape(ctx, config, shape, again, policy, earlier=earlier)
    fresh = {Timing.read(r).id: r for r in rebuilt}
    return [fresh.get(Timing.read(r).id, r) for r in results]


def _token_lengths(ctx: RunContext, config: BenchmarkStageConfig) -> list[int]:
    return ctx.dataset(config.data).token_lengths() if config.benchmark.sequence_lengths == "data" else []


def candidates(
    ctx: RunContext, config: BenchmarkStageConfig, inputs: dict[str, ArtifactRecord], work: MatrixReport
) -> list[Candidate]:
    """A candidate per cell of the matrix, in the recipe's order (the reference first, if the recipe times
    it: benchmark.include_reference)."""
    cells = timed_batches(work)
    candidates: list[Candidate] = []
    if config.benchmark.include_reference:
        model = functools.partial(ctx.model, config.model)
        candidates += [Candidate(r, "fp32") for r in reference_runners(config.runners, model)]
    order = config.artifacts
    for name in [n for n in order if n in inputs] + [n for n in inputs if n not in order]:
        runners = runners_for(inputs[name], config.runners)
        if not isinstance(runners, NotRunnable):
            candidates += [Candidate(r, inputs[name].precision) for r in runners]
    return [c for c in candidates if c.key in cells]


def _measure_shape(
    ctx: RunContext,
    config: BenchmarkStageConfig,
    shape: BenchShape,
    candidates: list[Candidate],
    policy: WindowPolicy,
    earlier: dict[Key, Measurement] | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[Key, Measurement]]:
    """Activate all, interleave windows, release all; a candidate that fails here is reported, not fatal.
    With `earlier` measurements, their windows are kept and more are added (measure_more)."""
    feeds = ctx.dataset(config.data).feeds_at(shape.dims(config.benchmark, config.data.dims))
    shapes = {name: list(array.shape) for name, array in feeds.items()}
    where = {"batch": shape.batch, "sequence_length": shape.sequence, "shapes": shapes}
    active, failures = [], []
    for c in candidates:
        ctx.report(
            f"benchmark {c.runner.artifact} ({c.runner.runtime}, {c.runner.io}) {shape.label()}: loading"
        )
        try:
            started = time.perf_counter()
            probe = MemoryProbe() if on_gpu(c.runner) and host.has_cuda() else None
            c.runner.activate()
            c.runner.prepare(feeds)
            if probe is not None:
                c.runner.infer_prepared()
                c.memory = probe.stop(held_bytes=getattr(c.runner, "details", {}).get("resident_bytes", 0))
            c.load_s = round(time.perf_counter() - started, 3)
            c.timer = timer_for(c.runner)
            active.append(c)
        except Exception as exc:  # this candidate cannot run at this shape: report it, measure the others
            failures.append(failure(c.runner, where, one_line(f"{type(exc).__name__}: {exc}")))
            _release(c)
    by_key = {c.key: c for c in active}

    def progress(key: Key, m: Measurement) -> None:
        last = m.window_medians[-1] if m.window_medians else float("nan")
        again = " (again)" if m.windows_before_remeasure is not None else ""
        ctx.report(
            f"benchmark {key[0]} ({key[1]}, {key[2]}) {shape.label()}{again}: window {len(m.window_medians)}, p50 {last:.3f} ms"
        )

    measured: dict[Key, Measurement] = {}
    for group in _interleave_groups(active):
        workloads = {c.key: functools.partial(c.timer.measure, c.runner) for c in group}
        if earlier is None:
            measured |= measure_interleaved(workloads, policy, on_window=progress)
        else:
            measured |= measure_more(workloads, earlier, policy, on_window=progress)
    every_row = config.selection.objective.metric == THROUGHPUT  # the objective ranks every row's run
    offline = "offline" in config.benchmark.scenarios  # the throughput run: GPU rows, or every row
    for c in active:
        if offline and (c.memory is not None or every_row) and measured[c.key].error is None:
            try:
                c.throughput = throughput(
                    c.runner,
                    shape.batch,
                    config.benchmark.throughput_s,
                    config.benchmark.stable_within,
                    measured[c.key].wall_p50_ms() / 1000,
                )
            except Exception as exc:  # the latency row stands; the throughput run says why it has none
                c.throughput = {"error": one_line(f"{type(exc).__name__}: {exc}")}
    rows = []
    for key, m in measured.items():
        c = by_key[key]
        if m.error is not None:
            failures.append(failure(c.runner, where, one_line(m.error)))
        else:
            rows.append(
                speed_row(c.runner, c.precision, c.timer, m, where, policy, c.memory, c.throughput, c.load_s)
            )
    for c in candidates:
        _release(c)
    _free_memory()
    return rows, failures, measured


def profile_rows(
    ctx: RunContext,
    config: BenchmarkStageConfig,
    candidates: list[Candidate],
    shapes: list[BenchShape],
    results: list[dict[str, Any]],
) -> None:
    """A profile for each row (pipeline/bench/profile.py), added to it: every GPU row, and the CPU rows at the
    objective's batch (an ONNX Runtime profile builds a session of its own: seconds for a large graph). Run
    after every timing window of the stage, since a profiler may leave tracing set up behind it, and no timed
    call may run in that: each shape's candidates are loaded again, profiled and released."""
    objective = config.selection.objective.batch
    rows = {(r["artifact"], r["runtime"], r["io"], r["batch"], r.get("sequence_length")): r for r in results}
    for shape in shapes:
        chosen = [
            (c, row)
            for c in candidates
            if (row := rows.get((*c.key, shape.batch, shape.sequence))) is not None
            and (on_gpu(c.runner) or objective is None or shape.batch == objective)
        ]
        if not chosen:
            continue
        feeds = ctx.dataset(config.data).feeds_at(shape.dims(config.benchmark, config.data.dims))
        for c, row in chosen:
            ctx.report(
                f"benchmark {c.runner.artifact} ({c.runner.runtime}, {c.runner.io}) {shape.label()}: profile"
            )
            try:
                c.runner.activate()
                c.runner.prepare(feeds)
                c.runner.infer_prepared()  # the first call at this shape (a CUDA graph's capture) outside it
                c.runner.synchronize()
                row["profile"] = profile_row(
                    c.runner, row.get("wall_p50_ms") or row.get("p50_ms"), on_gpu(c.runner)
                )
            except Exception as exc:  # the row stands without its profile, which says why
                row["profile"] = {"unavailable": one_line(f"{type(exc).__name__}: {exc}")}
            finally:
                _release(c)
        _free_memory()


def _interleave_groups(active: list[Candidate]) -> list[list[Candidate]]:
    """The GPU candidates of a shape interleaved with each other, then the CPU ones with each other: a CPU
    runtime's intra-op threads would otherwise still spin on the cores the GPU candidates launch from."""
    gpu = [c for c in active if on_gpu(c.runner)]
    cpu = [c for c in active if not on_gpu(c.runner)]
    return [group for group in (gpu, cpu) if group]


def _release(c: Candidate) -> None:
    with contextlib.suppress(Exception):  # a runner that never activated holds nothing to release
        c.runner.deactivate()
    c.timer = None
    c.memory = c.throughput = None
    c.load_s = None


def _free_memory() -> None:
    gc.collect()
    try:
        import torch
    except ImportError:
        return
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# ---------------------------------------------------------------- conditions


def _conditions(
    config: BenchmarkStageConfig, policy: WindowPolicy, shapes: list[BenchShape]
) -> dict[str, Any]:
    env = capture_environment()
    torch_info = env.get("torch") or {}
    return {
        "intra_op_threads": config.runners.threads,
        "inter_op_threads": 1,
        "device": {"cpu": env["cpu"], "gpu": env["gpu"]},
        "versions": {
            key: env[key]
            for key in ("python", "torch", "onnx", "onnxruntime", "polygraphy", "tensorrt", "numpy")
        },
        "policy": policy.describe(),
        "timer": {
            "cpu": "time.perf_counter around a call that has returned its outputs",
            "gpu": "CUDA events on the runtime's stream, after a synchronize",
        },
        "inputs": "the same batches for every candidate (validation split, fixed order), prepared once per shape",
        "shapes": [{"batch": s.batch, "sequence_length": s.sequence} for s in shapes],
        "sequence_lengths": config.benchmark.sequence_lengths,
        "reference": REFERENCE if config.benchmark.include_reference else None,
        "onnxruntime_thread_spinning": False,
        "onnxruntime_cuda_tf32": False,
        "tf32": {k: torch_info[k] for k in ("tf32_matmul", "tf32_cudnn") if k in torch_info} or None,
        "measured_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "host": env["hostname"],
    }
