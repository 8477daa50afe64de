"""The load stage (benchmark.scenarios holds `server`): MLPerf's Server scenario for the best few candidates,
driven by LoadGen (pipeline/bench/load/). Each candidate serves the recipe's validation samples, arriving at
random (Poisson) times, through a dynamic batcher, and the highest rate whose p99 meets `benchmark.server.p99_ms`
is searched for and run again for its interval. Writes reports/load.json, and per candidate LoadGen's own summary
and detail logs of its last run at that rate under reports/loadgen/.

Which candidates: the best `benchmark.server.candidates` by the objective (one row per artifact, as selection
ranks them: passed validation on that runtime), plus the throughput leader (the highest sequences/s of any
passing row, else the highest batch/p50). A candidate whose model fails under load gets a row with the error; a
LoadGen run that never returns ends the stage's runs with that error (LoadGen cannot start again in this
process)."""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from pipeline.bench.load.loadgen_run import DETAIL, SUMMARY, LoadGenStuck, ServerRun, server_run
from pipeline.bench.load.requests import RequestPool
from pipeline.bench.load.search import search
from pipeline.bench.rows import one_line
from pipeline.check.results import REPORTS, Timing, records, timings
from pipeline.check.speed import THROUGHPUT
from pipeline.core.artifacts import ArtifactRecord
from pipeline.core.files import write_report
from pipeline.decide.selection import SelectionPolicy, candidates
from pipeline.inputs.specs import DataSpec, RunnerSettings
from pipeline.recipe import Recipe, ServerLoad
from pipeline.runners.base import NotRunnable, Runner
from pipeline.runners.registry import runners_for
from pipeline.stages.base import ALONE, Output, RunContext, Stage, StageConfig, StageResult

NAME = "load"
REPORT = REPORTS["report:load"]
LOGS = "reports/loadgen"
SCHEMA_VERSION = 1


class LoadStageConfig(StageConfig):
    server: ServerLoad
    max_batch: int  # the batcher's largest batch
    selection: SelectionPolicy
    runners: RunnerSettings
    data: DataSpec

    @classmethod
    def from_recipe(cls, recipe: Recipe, recipe_dir: Path) -> LoadStageConfig:
        bench = recipe.benchmark
        batch = recipe.dims.get(bench.batch_dim)
        largest = max(bench.batch_sizes) if batch is not None else 1
        return cls(
            server=bench.server,
            max_batch=min(bench.server.max_batch or largest, batch.max if batch is not None else 1),
            selection=SelectionPolicy.from_recipe(recipe),
            runners=RunnerSettings.from_recipe(recipe),
            data=DataSpec.from_recipe(recipe, recipe_dir),
        )


def stage(recipe: Recipe, recipe_dir: Path, artifacts: list[str]) -> Stage | None:
    if "server" not in recipe.benchmark.scenarios:
        return None
    return Stage(
        name=NAME,
        version=1,  # CHANGELOG.md, "Stage versions"
        config=LoadStageConfig.from_recipe(recipe, recipe_dir),
        run=run,
        consumes=("report:speed", "report:accuracy"),
        consumes_any=tuple(artifacts),
        produces=("report:load",),
        volatile=True,
        placement=ALONE,  # it times: nothing may run beside it
    )


def pick(policy: SelectionPolicy, speed: Any, accuracy: Any, count: int) -> list[Timing]:
    """The best `count` candidates by the objective, then the throughput leader if it is not among them."""
    ranked = candidates(policy, speed, accuracy)
    chosen = ranked[:count]
    entries = records(accuracy)
    passing = [
        r for r in timings(speed) if r.artifact in entries and entries[r.artifact].passed_on(r.runtime)
    ]
    leader = max(passing, key=_rate, default=None)
    if leader is not None and (leader.artifact, leader.runtime, leader.io) not in {_key(r) for r in chosen}:
        chosen.append(leader)
    return chosen


def _rate(row: Timing) -> float:
    """Sequences per second: the throughput run's, else one batch per p50."""
    found = row.value(THROUGHPUT)
    if found is not None:
        return found
    return 1000.0 * (row.batch or 1) / row.p50_ms if row.p50_ms else 0.0


def _key(row: Timing) -> tuple[str, str, str]:
    return (row.artifact, row.runtime, row.io)


def run(ctx: RunContext, config: LoadStageConfig, inputs: dict[str, ArtifactRecord]) -> StageResult:
    speed, accuracy = inputs["report:speed"].report(), inputs["report:accuracy"].report()
    built = {name: record for name, record in inputs.items() if not name.startswith("report:")}
    chosen = pick(config.selection, speed, accuracy, config.server.candidates)
    pool = RequestPool.from_dataset(ctx.dataset(config.data))
    rows: list[dict[str, Any]] = []
    outputs: list[Output] = []
    stuck: str | None = None
    with tempfile.TemporaryDirectory(prefix="loadgen-") as scratch:
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
        "through": "in_process",
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
    summary = {f"{r['artifact']} ({r['runtime']}, {r['io']} I/O)": r.get("max_qps") for r in rows}
    return StageResult([Output(REPORT, "report", "report:load", value=report), *outputs], summary)


def _serve(
    ctx: RunContext,
    config: LoadStageConfig,
    row: Timing,
    built: dict[str, ArtifactRecord],
    pool: RequestPool,
    scratch: Path,
) -> tuple[dict[str, Any], list[str]]:
    """One candidate's rate search; its row and the LoadGen logs kept for it."""
    runner = _runner(row, built, config.runners)
    if isinstance(runner, str):
        return _row(config, row, error=runner), []
    server = config.server
    slug = f"{row.artifact}__{row.runtime}__{row.io}"
    count = 0

    def run_at(qps: float) -> ServerRun:
        nonlocal count
        count += 1
        ctx.report(f"load: {row.label} at {qps:.1f} requests/s (run {count})")
        return server_run(
            runner,
            pool,
            qps,
            server.p99_ms,
            server.run_s,
            config.max_batch,
            server.max_queue_delay_ms / 1000,
            scratch / slug / str(count),
        )

    started = time.perf_counter()
    try:
        runner.activate()
        runner.infer(pool.collate([0]))  # loading and the first call stay out of every run
        found = search(run_at, _start_rate(row), server.p99_ms, server.runs, server.repeats)
    except LoadGenStuck:
        raise
    except Exception as exc:
        return _row(config, row, error=one_line(f"{type(exc).__name__}: {exc}")), []
    finally:
        runner.deactivate()
    kept = (found.repeats or found.runs)[-1:] if found.runs else []
    files = []
    for last in kept:
        for name in (SUMMARY, DETAIL):
            source = Path(last.log_dir) / name
            if source.is_file():
                target = ctx.path(f"{LOGS}/{slug}/{name}")
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source, target)
                files.append(f"{LOGS}/{slug}/{name}")
    out = _row(config, row)
    served = found.served()
    out |= {
        "max_qps": served["qps"] if served else None,
        "ci95": served["ci95"] if served else None,
        "served": served,
        "missed": found.miss(),
        "runs": [r.to_json() for r in found.runs],
        "repeats": [r.to_json() for r in found.repeats],
        "loadgen_logs": f"{LOGS}/{slug}" if files else None,
        "loadgen_result": kept[0].to_json()["loadgen_result"] if kept else None,
        "seconds": round(time.perf_counter() - started, 1),
    }
    return out, files


def _row(config: LoadStageConfig, row: Timing, error: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "artifact": row.artifact,
        "runtime": row.runtime,
        "io": row.io,
        "cuda_graph": row.cuda_graph,
        "precision": row.precision,
        "p99_target_ms": config.server.p99_ms,
    }
    if error is not None:
        out |= {"max_qps": None, "ci95": None, "error": error, "runs": [], "repeats": []}
    return out


def _runner(row: Timing, built: dict[str, ArtifactRecord], settings: RunnerSettings) -> Runner | str:
    """The runner of the candidate's row, or why there is none."""
    record = built.get(row.artifact)
    if record is None:
        return f"{row.artifact} was not built in this deploy"
    found = runners_for(record, settings)
    if isinstance(found, NotRunnable):
        return found.reason
    for runner in found:
        if (runner.runtime, runner.io, runner.cuda_graph) == (row.runtime, row.io, row.cuda_graph):
            return runner
    return f"no {row.runtime} runner with {row.io} I/O for {row.artifact} here"


def _start_rate(row: Timing) -> float:
    """Half the rate the benchmark's row could sustain, one batch per p50."""
    return max(1.0, _rate(row) / 2)
