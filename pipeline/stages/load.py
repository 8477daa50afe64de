"""The load stage (benchmark.scenarios holds `server`): MLPerf's Server scenario for the winner and the best few
candidates, driven by LoadGen (pipeline/bench/load/). Each candidate serves the recipe's validation samples,
arriving at random (Poisson) times, through a dynamic batcher, and the highest rate whose p99 meets
`benchmark.server.p99_ms` is searched for and confirmed. Writes reports/load.json, and per candidate LoadGen's own
summary and detail logs of its last confirming run under reports/loadgen/.

Which candidates: the winner, the best `benchmark.server.candidates` by single-stream latency (p50 at the
objective's batch, as selection filters rows: passed validation on that runtime, within its constraints), and the
throughput leader (the highest sequences/s of those rows at any batch, else the highest batch/p50). A server hands
its model host arrays (copied through pinned host memory where the runner stages them). A CUDA-graph runtime
that captures a shape cheaply (Runtime.graphs_under_load) serves as a server with graphs does: every batch padded
up to one of a few bucket shapes (pipeline/bench/load/buckets.py), each captured before the first run; another
CUDA-graph runtime is replaced by the same artifact's fastest runtime without graphs, and the row says so. A candidate whose model fails under load gets a row with the error; a LoadGen run that never returns
ends the stage's runs (LoadGen cannot start again in this process)."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pipeline.bench.load.buckets import ShapeBuckets
from pipeline.bench.load.loadgen_run import (
    DETAIL,
    SUMMARY,
    Connect,
    LoadGenStuck,
    RunSettings,
    ServerRun,
    in_process,
    server_run,
)
from pipeline.bench.load.requests import RequestPool
from pipeline.bench.load.search import search
from pipeline.bench.load.serving_thread import ServingThread
from pipeline.bench.rows import one_line
from pipeline.check.results import REPORTS, Row
from pipeline.check.speed import SERVED, THROUGHPUT
from pipeline.check.timings import Timing, timings
from pipeline.check.verdicts import records
from pipeline.core.artifacts import ArtifactRecord
from pipeline.core.files import write_report
from pipeline.decide.selection import SelectionPolicy, candidates, objective_rows
from pipeline.inputs.specs import DataSpec, RunnerSettings
from pipeline.recipe import Recipe, ServerLoad
from pipeline.runners.base import NotRunnable, Runner
from pipeline.runners.registry import runners_for, runtimes
from pipeline.stages.base import ALONE, Output, RunContext, Stage, StageConfig, StageResult

NAME = "load"
REPORT = REPORTS["report:load"]
LOGS = "reports/loadgen"
SCHEMA_VERSION = 1


class LoadStageConfig(StageConfig):
    server: ServerLoad
    max_batch: int  # the batcher's largest batch
    batched: bool  # the inputs have the batch dim first
    selection: SelectionPolicy
    runners: RunnerSettings
    data: DataSpec

    @classmethod
    def from_recipe(cls, recipe: Recipe, recipe_dir: Path) -> LoadStageConfig:
        bench = recipe.benchmark
        batch = recipe.dims.get(bench.batch_dim)
        largest = bench.server.max_batch or max(bench.batch_sizes)
        return cls(
            server=bench.server.model_copy(update={"p99_ms": recipe.p99_target_ms()}),
            max_batch=min(largest, batch.max) if batch is not None else 1,
            batched=batch is not None
            and all(s.shape and s.shape[0] == bench.batch_dim for s in recipe.inputs),
            selection=SelectionPolicy.from_recipe(recipe),
            runners=RunnerSettings.from_recipe(recipe),
            data=DataSpec.from_recipe(recipe, recipe_dir),
        )


def stage(recipe: Recipe, recipe_dir: Path, artifacts: list[str]) -> Stage | None:
    """Only where the recipe asks for the server scenario; after selection, so that the winner is among the
    candidates, except where selection ranks what this stage measures (objective max_qps_at_p99)."""
    if "server" not in recipe.benchmark.scenarios:
        return None
    served = recipe.selection.objective.metric == SERVED
    return Stage(
        name=NAME,
        version=2,  # CHANGELOG.md, "Stage versions"
        config=LoadStageConfig.from_recipe(recipe, recipe_dir),
        run=run,
        consumes=("report:speed", "report:accuracy"),
        consumes_any=tuple(artifacts) if served else (*artifacts, "report:selection"),
        produces=("report:load",),
        volatile=True,
        placement=ALONE,  # it times: nothing may run beside it
    )


def pick(
    policy: SelectionPolicy, speed: Row, accuracy: Row, winner: Row | None, count: int, graphs: bool = True
) -> list[Timing]:
    """The winner's row, the best `count` by single-stream latency, then the throughput leader: one row per
    (artifact, runtime), on a runtime that can serve every request shape."""
    latency = policy.by_p50()
    ranked = [_without_graphs(r, speed, accuracy, graphs) for r in candidates(latency, speed, accuracy)]
    chosen = [r for r in ranked if r is not None][:count]
    if winner:
        mine = next(
            (r for r in candidates(policy, speed, accuracy) if r.artifact == winner.get("artifact")), None
        )
        found = _without_graphs(mine, speed, accuracy, graphs) if mine is not None else None
        if found is not None:
            chosen.insert(0, found)
    rows = [r for r in _all_batches(latency, speed, accuracy) if not r.cuda_graph]
    leader = max(rows, key=_rate, default=None)
    if leader is not None:
        chosen.append(leader)
    unique: dict[tuple[str, str], Timing] = {}
    for row in chosen:
        unique.setdefault((row.artifact, row.runtime), row)
    return list(unique.values())


def _all_batches(policy: SelectionPolicy, speed: Row, accuracy: Row) -> list[Timing]:
    """Rows selection would consider, at every batch the benchmark measured."""
    batches = sorted({r.batch for r in timings(speed) if r.batch is not None})
    rows: list[Timing] = []
    for batch in batches:
        at = policy.model_copy(update={"objective": policy.objective.model_copy(update={"batch": batch})})
        rows += objective_rows(at, speed, accuracy)
    return rows


def _without_graphs(row: Timing | None, speed: Row, accuracy: Row, graphs: bool = True) -> Timing | None:
    """The row itself where its runtime serves under load, else (a CUDA-graph row whose runtime cannot
    capture the buckets cheaply) the same artifact's fastest passing row without graphs."""
    if row is None or not row.cuda_graph or (graphs and _bucketed(row)):
        return row
    entries = records(accuracy)
    entry = entries.get(row.artifact)
    others = [
        r
        for r in timings(speed)
        if r.artifact == row.artifact
        and not r.cuda_graph
        and entry is not None
        and entry.passed_on(r.runtime)
    ]
    return min(others, key=lambda r: r.p50_ms or float("inf"), default=None)


def _rate(row: Timing) -> float:
    """Sequences per second: the throughput run's, else one batch per p50."""
    found = row.value(THROUGHPUT)
    if found is not None:
        return found
    return 1000.0 * (row.batch or 1) / row.p50_ms if row.p50_ms else 0.0


def run(ctx: RunContext, config: LoadStageConfig, inputs: dict[str, ArtifactRecord]) -> StageResult:
    speed, accuracy = inputs["report:speed"].report(), inputs["report:accuracy"].report()
    selected = inputs["report:selection"].report() if "report:selection" in inputs else None
    winner = (selected or {}).get("winner")
    built = {name: record for name, record in inputs.items() if not name.startswith("report:")}
    graphs = config.server.through == "in_process"  # Triton's batcher hands the model its own batch shapes
    chosen = pick(config.selection, speed, accuracy, winner, config.server.candidates, graphs)
    pool = RequestPool.from_dataset(ctx.dataset(config.data))
    rows: list[dict[str, Any]] = []
    outputs: list[Output] = []
    stuck: str | None = None
    with tempfile.TemporaryDirectory(prefix="loadgen-", ignore_cleanup_errors=True) as scratch:
        for row in chosen:
            if stuck is not None:
                rows.append(_row(config, row, error=f"not run: {stuck}"))
                continue
            try:
                found, files = _serve(ctx, config, row, built, pool, Path(scratch))
            except LoadGenStuck as exc:
                stuck = str(exc)
                rows.append(_row(config, row, error=stuck))
                continue
            rows.append(found)
            outputs += [Output(path, "report") for path in files]
    report = {
        "schema_version": SCHEMA_VERSION,
        "scenario": "server",
        "through": config.server.through,
        "conditions": {
            "p99_ms": config.server.p99_ms,
            "max_batch": config.max_batch,
            "max_queue_delay_ms": config.server.max_queue_delay_ms,
            "run_s": config.server.run_s,
            "requests": len(pool),
            "arrivals": "Poisson (MLPerf LoadGen, Server scenario, PerformanceOnly)",
            "latency": "per request, from LoadGen's issue to the batcher's answer: queueing, the batch wait, "
            "padding, host I/O and inference",
        },
        "results": rows,
    }
    write_report(ctx.path(REPORT), report)
    summary = {f"{r['artifact']} ({r['runtime']})": r.get("max_qps") for r in rows}
    return StageResult([Output(REPORT, "report", "report:load", value=report), *outputs], summary)


def _serve(
    ctx: RunContext,
    config: LoadStageConfig,
    row: Timing,
    built: dict[str, ArtifactRecord],
    pool: RequestPool,
    scratch: Path,
) -> tuple[dict[str, Any], list[str]]:
    """One candidate's rate search: its row, and the LoadGen logs kept for it."""
    runner = _runner(row, built, config.runners)
    if isinstance(runner, str):
        return _row(config, row, error=runner), []
    buckets = _buckets(config, pool) if row.cuda_graph and _bucketed(row) else None
    server = config.server
    settings = RunSettings(server.p99_ms, server.run_s, config.max_batch, server.max_queue_delay_ms / 1000)
    slug = f"{row.artifact}__{row.runtime}"
    started = time.perf_counter()
    stuck = False
    # in process, the runner's every call under load (warm-up included) is on one thread, as a server's worker
    thread = ServingThread(f"serving {row.artifact}") if server.through == "in_process" else None
    try:
        # the first call at each request shape (every bucket's capture), and LoadGen's start, stay out of the
        # search
        warm = pool.bucket_feeds(buckets) if buckets else [pool.collate([i]) for i in range(len(pool))]
        if buckets is not None:
            runner.keep_graphs(len(warm))
            ctx.report(f"load: {row.artifact} ({row.runtime}) capturing {len(warm)} bucket shapes")
        runner.activate()
        for feeds in warm:
            if thread is not None:
                thread.call(runner.infer, feeds)
            else:
                runner.infer(feeds)
        captured = runner.captures
        with _target(config, runner, pool, settings, buckets, thread) as connect:
            count = 0

            def run_at(qps: float) -> ServerRun:
                nonlocal count
                count += 1
                ctx.report(f"load: {row.artifact} ({row.runtime}) at {qps:.1f} requests/s (run {count})")
                return server_run(connect, pool, qps, settings, scratch / slug / str(count), seed=count)

            run_at(_start_rate(row))
            found = search(run_at, _start_rate(row), server.p99_ms, server.runs, server.repeats)
        during = runner.captures - captured
    except LoadGenStuck:
        stuck = True  # a call may still be running in the batcher's thread: the runner is left as it is
        raise
    except Exception as exc:
        return _row(config, row, error=one_line(f"{type(exc).__name__}: {exc}")), []
    finally:
        if thread is not None:
            thread.stop(timeout_s=0.0 if stuck else 30.0)
        if not stuck:
            runner.deactivate()
    files = _keep_logs(ctx, (found.repeats or found.runs)[-1], slug) if found.runs else []
    served = found.served()
    out = _row(config, row) | {
        "buckets": buckets.describe() if buckets else None,
        # graphs captured before the runs, and during them (a request that waited for a capture: none expected)
        "graphs": {"before_runs": captured, "during_runs": during} if buckets else None,
        "max_qps": served["qps"] if served else None,
        "ci95": served["ci95"] if served else None,
        "bounded": found.bounded,
        "served": served,
        "missed": found.miss(),
        "confirmations": [vars(c) for c in found.tried],
        "runs": [r.to_json() for r in found.runs],
        "repeats": [r.to_json() for r in found.repeats],
        "loadgen_logs": f"{LOGS}/{slug}" if files else None,
        "loadgen_result": (found.repeats or found.runs)[-1].to_json()["loadgen_result"]
        if found.runs
        else None,
        "seconds": round(time.perf_counter() - started, 1),
    }
    return out, files


@contextlib.contextmanager
def _target(
    config: LoadStageConfig,
    runner: Runner,
    pool: RequestPool,
    settings: RunSettings,
    buckets: ShapeBuckets | None = None,
    thread: ServingThread | None = None,
) -> Iterator[Connect]:
    """Where the runs send their requests: the in-process batcher (on the candidate's serving thread), or a
    Triton server serving the runner for the candidate's whole search (started once: its start-up is not a
    request's)."""
    if config.server.through == "in_process":
        yield in_process(runner, pool, settings, buckets, thread)
        return
    from pipeline.bench.load.triton_target import TritonTarget
    from pipeline.release.triton_server import HOST, Batching, Ports, triton_serving

    sample = pool.samples[0]
    batching = Batching(config.max_batch if config.batched else 0, config.server.max_queue_delay_ms)
    ports = Ports.free()
    with triton_serving("candidate", runner, sample, runner.infer(sample), batching, ports) as running:
        url = f"{HOST}:{ports.grpc}"
        yield lambda answer: TritonTarget(url, "candidate", running.counters, pool, answer)


def _keep_logs(ctx: RunContext, last: ServerRun, slug: str) -> list[str]:
    files = []
    for name in (SUMMARY, DETAIL):
        source = Path(last.log_dir) / name
        if source.is_file():
            shutil.copyfile(source, ctx.path(f"{LOGS}/{slug}/{name}"))
            files.append(f"{LOGS}/{slug}/{name}")
    return files


def _row(config: LoadStageConfig, row: Timing, error: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "artifact": row.artifact,
        "runtime": row.runtime,
        "io": "host",  # a server hands its model host arrays
        "cuda_graph": row.cuda_graph,
        "through": config.server.through,
        "precision": row.precision,
        "p99_target_ms": config.server.p99_ms,
    }
    if error is not None:
        out |= {"max_qps": None, "ci95": None, "error": error, "runs": [], "repeats": []}
    return out


def _runner(row: Timing, built: dict[str, ArtifactRecord], settings: RunnerSettings) -> Runner | str:
    """The candidate's runner (every runner takes host arrays; its host-I/O one where it has both), or why there
    is none."""
    record = built.get(row.artifact)
    if record is None:
        return f"{row.artifact} was not built in this deploy"
    found = runners_for(record, settings)
    if isinstance(found, NotRunnable):
        return found.reason
    mine = [r for r in found if (r.runtime, r.cuda_graph) == (row.runtime, row.cuda_graph)]
    if not mine:
        return f"no {row.runtime} runner for {row.artifact} here"
    return min(mine, key=lambda r: r.io != "host")


def _bucketed(row: Timing) -> bool:
    """Whether the row's runtime serves under load in captured bucket shapes."""
    found = runtimes().get(row.runtime)
    return bool(found and found.graphs_under_load)


def _buckets(config: LoadStageConfig, pool: RequestPool) -> ShapeBuckets:
    """The shapes a CUDA-graph candidate serves: the batcher's batches, and (text) lengths from the padding
    step up to the longest request, within the sequence dim's range."""
    settings = config.runners
    padding = settings.runtime.padding
    step = (padding.multiple if padding is not None else None) or 16
    sequence = settings.dims.get(settings.sequence_dim) if settings.sequence_dim else None
    longest = pool.longest() if sequence is not None else None
    shortest, limit = (sequence.min, sequence.max) if sequence is not None else (1, None)
    return ShapeBuckets.powers(config.max_batch, longest, step, shortest, limit)


def _start_rate(row: Timing) -> float:
    """Half the rate the benchmark's row could sustain, one batch per p50."""
    return max(1.0, _rate(row) / 2)
