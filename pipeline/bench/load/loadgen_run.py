"""One MLPerf LoadGen run of the Server scenario: Poisson arrivals at a target rate, each query one request of the
pool, answered by its target (the in-process dynamic batcher, or a Triton server); LoadGen times every request
from its issue to its answer and writes its own logs (mlperf_log_summary.txt, mlperf_log_detail.txt), which are read back here.

LoadGen is set by its TestSettings fields alone (no mlperf.conf: the recipe decides the run's length), run for
`run_s` seconds of arrivals (min_query_count 1), and bounded twice: LoadGen ends a run early once more queries
are outstanding than the target could answer within the latency target several times over
(server_max_async_queries), and a run that does not return within its time budget is abandoned with a clear
error (LoadGen cannot be interrupted; its thread is a daemon). Short runs are rarely VALID by MLPerf's early
stopping rule (which needs hundreds of queries); the run records LoadGen's verdict and reason as they are and
the search judges the p99 itself."""

from __future__ import annotations

import functools
import json
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from pipeline.bench.load.batcher import DynamicBatcher
from pipeline.bench.load.buckets import ShapeBuckets
from pipeline.bench.load.requests import RequestPool
from pipeline.bench.load.serving_thread import ServingThread
from pipeline.runners.base import Runner

DETAIL = "mlperf_log_detail.txt"
SUMMARY = "mlperf_log_summary.txt"
GRACE_S = 30.0  # beyond the run's own length: activation of LoadGen, the drain of the queue, its logs


class LoadGenStuck(RuntimeError):
    """LoadGen did not return within the run's budget: its thread is left behind, so no later run may start."""


@dataclass(frozen=True)
class RunSettings:
    """What every run of one candidate shares: the target, the run's length and the batcher."""

    p99_ms: float
    run_s: float
    max_batch: int
    max_delay_s: float


@dataclass(frozen=True)
class ServerRun:
    """What one run measured, in LoadGen's own terms."""

    target_qps: float
    completed_qps: float | None
    p50_ms: float | None
    p99_ms: float | None
    queries: int
    duration_met: bool  # LoadGen issued for the whole run (it ends an overloaded run early)
    valid: bool  # LoadGen's verdict (early stopping included)
    invalid_reason: str | None
    mean_batch: float | None
    error: str | None  # the model raised: the run measured nothing
    seconds: float
    log_dir: str
    time_split: dict[str, float] | None = None  # where a request's time went (through Triton: its counters)

    def meets(self, p99_ms: float) -> bool:
        """Whether the rate held: the whole run was issued, every request answered without error, and the
        p99 of request latency, queueing included, is within the target."""
        return self.error is None and self.duration_met and self.p99_ms is not None and self.p99_ms <= p99_ms

    def to_json(self) -> dict[str, Any]:
        """The run as load.json records it."""
        return {
            "target_qps": round(self.target_qps, 3),
            "completed_qps": self.completed_qps,
            "p50_ms": self.p50_ms,
            "p99_ms": self.p99_ms,
            "queries": self.queries,
            "duration_met": self.duration_met,
            "loadgen_result": "VALID" if self.valid else "INVALID",
            "invalid_reason": self.invalid_reason,
            "mean_batch": None if self.mean_batch is None else round(self.mean_batch, 2),
            "error": self.error,
            "seconds": round(self.seconds, 2),
            **({"time_split": self.time_split} if self.time_split else {}),
        }


class Target(Protocol):
    """Where a run's requests go: the in-process batcher (batcher.py) or a Triton server (triton_target.py).
    It answers every request it is given, even when serving it failed (then `error` says why)."""

    error: str | None

    def submit(self, requests: Sequence[tuple[int, int]]) -> None: ...

    def close(self, timeout_s: float = 30.0) -> None: ...

    @property
    def mean_batch(self) -> float | None: ...

    @property
    def time_split(self) -> dict[str, float] | None: ...


Connect = Callable[[Callable[[Sequence[int]], None]], Target]  # the answer callback -> a target for one run


def in_process(
    runner: Runner,
    pool: RequestPool,
    run: RunSettings,
    buckets: ShapeBuckets | None = None,
    thread: ServingThread | None = None,
) -> Connect:
    """Requests through a dynamic batcher in this process, straight to the runner; with `buckets`, each batch
    padded up to its bucket shape (a CUDA-graph runner replays the graph captured for it). With `thread`, every
    run's batcher runs on that one thread (serving_thread.py: the one its warm-up ran on)."""
    key = None if pool.batchable else pool.key
    collate = functools.partial(pool.collate, buckets=buckets)
    return lambda answer: DynamicBatcher(
        runner.infer, collate, key, answer, run.max_batch, run.max_delay_s, thread
    )


def server_run(
    connect: Connect, pool: RequestPool, qps: float, run: RunSettings, log_dir: Path, seed: int = 0
) -> ServerRun:
    """One Server-scenario run at `qps` requests/s against the target `connect` makes. `seed` draws the run's
    arrival times and requests: runs repeated at one rate get other arrivals, so their spread is the
    candidate's, not one schedule replayed. Raises LoadGenStuck if LoadGen never returns."""
    import mlperf_loadgen as lg

    p99_ms, run_s = run.p99_ms, run.run_s

    log_dir.mkdir(parents=True, exist_ok=True)
    lock = threading.Lock()

    def answer(queries: Sequence[int]) -> None:
        with lock:  # LoadGen's completion is thread-safe; one caller at a time keeps its log order
            lg.QuerySamplesComplete([lg.QuerySampleResponse(q, 0, 0) for q in queries])

    target = connect(answer)

    def issue(queries: Any) -> None:
        try:  # an exception escaping into LoadGen's thread ends the process: answer instead
            target.submit([(q.id, q.index) for q in queries])
        except Exception:
            answer([q.id for q in queries])

    sut = lg.ConstructSUT(issue, lambda: None)
    qsl = lg.ConstructQSL(len(pool), len(pool), lambda _: None, lambda _: None)
    settings = lg.TestSettings()
    settings.scenario = lg.TestScenario.Server
    settings.mode = lg.TestMode.PerformanceOnly
    settings.server_target_qps = qps
    settings.server_target_latency_ns = int(p99_ms * 1e6)
    settings.server_target_latency_percentile = 0.99
    settings.min_duration_ms = int(run_s * 1000)
    settings.min_query_count = 1
    settings.max_duration_ms = int(run_s * 1000 * 2)
    # an overloaded run: stop issuing once this many are outstanding (the queue could not drain in time)
    settings.server_max_async_queries = max(64, math.ceil(qps * p99_ms / 1000 * 4))
    settings.schedule_rng_seed = settings.sample_index_rng_seed = settings.qsl_rng_seed = seed
    log = lg.LogSettings()
    log.log_output.outdir = str(log_dir)
    log.log_output.copy_summary_to_stdout = False
    log.enable_trace = False
    started = time.perf_counter()
    thread = threading.Thread(
        target=lg.StartTestWithLogSettings, args=(sut, qsl, settings, log, ""), name="loadgen", daemon=True
    )
    thread.start()
    thread.join(run_s * 2 + p99_ms / 1000 * 4 + GRACE_S)
    seconds = time.perf_counter() - started
    if thread.is_alive():
        target.close(timeout_s=1.0)
        raise LoadGenStuck(
            f"LoadGen did not finish a {run_s:g} s run at {qps:.1f} requests/s within {seconds:.0f} s "
            f"(a request the model never answered); no later load run can start in this process"
        )
    target.close()
    lg.DestroyQSL(qsl)
    lg.DestroySUT(sut)
    detail = read_detail(log_dir / DETAIL)
    return ServerRun(
        target_qps=qps,
        completed_qps=_number(detail.get("result_completed_samples_per_sec")),
        p50_ms=_ms(detail.get("result_50.00_percentile_latency_ns")),
        p99_ms=_ms(detail.get("result_99.00_percentile_latency_ns")),
        queries=int(detail.get("result_query_count") or 0),
        duration_met=bool(detail.get("result_min_duration_met")),
        valid=detail.get("result_validity") == "VALID",
        invalid_reason=_invalid_reason(detail),
        mean_batch=target.mean_batch,
        error=target.error,
        seconds=seconds,
        log_dir=str(log_dir),
        time_split=target.time_split,
    )


def read_detail(path: Path) -> dict[str, Any]:
    """LoadGen's detail log, key by key (`:::MLLOG {json}` lines; the last value of a key wins)."""
    found: dict[str, Any] = {}
    if not path.is_file():
        return found
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith(":::MLLOG "):
            try:
                record = json.loads(line[len(":::MLLOG ") :])
            except json.JSONDecodeError:
                continue
            found[str(record.get("key"))] = record.get("value")
    return found


def _invalid_reason(detail: dict[str, Any]) -> str | None:
    if detail.get("result_validity") == "VALID":
        return None
    reasons = []
    if detail.get("result_invalid_reason"):
        reasons.append(str(detail["result_invalid_reason"]))
    if detail.get("result_min_duration_met") is False:
        reasons.append("ended early: too many requests outstanding")
    if detail.get("early_stopping_met") is False:
        reasons.append("too few requests for MLPerf's early-stopping estimate of the p99")
    if detail.get("result_perf_constraints_met") is False:
        reasons.append("p99 over the target")
    return "; ".join(reasons) or "LoadGen gave no reason"


def _number(found: Any) -> float | None:
    return float(found) if isinstance(found, int | float) and not isinstance(found, bool) else None


def _ms(found: Any) -> float | None:
    value = _number(found)
    return None if value is None else value / 1e6
