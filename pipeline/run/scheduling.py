"""One run's scheduling state: what was built, the background jobs and their threads, and the lanes' queues
and worker processes (Stage.placement, pipeline/stages/base.py)."""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from pipeline.core.artifacts import ArtifactRecord
from pipeline.core.children import POLL_S, Cancelled
from pipeline.run.lane_worker import LaneWorker
from pipeline.stages.base import RunContext, Stage
from pipeline.stages.record import StageRecord


@dataclass
class RunState:
    """One run's state: what was built, what is unavailable and why, the records so far, background jobs."""

    ctx: RunContext
    on_done: Callable[[StageRecord], None]
    artifacts: dict[str, ArtifactRecord] = field(default_factory=dict)
    unavailable: dict[str, str] = field(default_factory=dict)  # artifact -> why
    records: list[StageRecord] = field(default_factory=list)
    jobs: list[BackgroundJob] = field(default_factory=list)
    off_lane: threading.Semaphore = field(  # background stages off a lane: two compiles at once on a big host
        default_factory=lambda: threading.BoundedSemaphore(background_slots())
    )
    workers: dict[str, LaneWorker] = field(default_factory=dict)  # Stage.lane -> its worker process
    queues: dict[str, list[str]] = field(default_factory=dict)  # Stage.lane -> its stages not done yet
    turns: threading.Condition = field(default_factory=threading.Condition)  # guards queues
    lock: threading.RLock = field(default_factory=threading.RLock)  # records and display, one stage at a time

    def enqueue(self, stage: Stage) -> None:
        """Take a lane stage's place in its lane's queue (plan order: the order validation wants them in)."""
        assert stage.lane is not None
        with self.turns:
            self.queues.setdefault(stage.lane, []).append(stage.name)

    def leave(self, stage: Stage) -> None:
        """A lane stage is done (ran, reused, skipped or failed): the next one in its lane may run."""
        with self.turns:
            queue = self.queues.get(stage.lane or "", [])
            if stage.name in queue:
                queue.remove(stage.name)
            self.turns.notify_all()

    def wait_turn(self, stage: Stage) -> None:
        """Block until the lane's earlier stages are done (raises Cancelled when the run stops meanwhile)."""
        assert stage.lane is not None
        with self.turns:
            while self.queues[stage.lane][0] != stage.name and not self.ctx.cancel.is_set():
                self.turns.wait(POLL_S)
        if self.ctx.cancel.is_set():
            raise Cancelled(f"lane {stage.lane}: {stage.name}: the run is stopping")

    def lane_workers(self) -> list[LaneWorker]:
        with self.lock:  # a worker being started in a job thread is in the list once this returns
            return list(self.workers.values())

    def worker(self, lane: str) -> LaneWorker:
        """The lane's worker process, started if it has not been or has died (its stage failed for it); none
        once the run is stopping."""
        with self.lock:
            if self.ctx.cancel.is_set():
                raise Cancelled(f"lane {lane}: the run is stopping")
            worker = self.workers.get(lane)
            if worker is None or not worker.alive():
                if worker is not None:
                    worker.close()
                worker = self.workers[lane] = LaneWorker(lane, self.ctx.workdir, self.ctx.cache_dir)
            return worker


def lane_job(run: RunState, stage: Stage, why: str | None, work: Callable[[], StageRecord]) -> BackgroundJob:
    """A lane stage's job: its place in the lane's queue, given up when the work ends however it ends."""
    run.enqueue(stage)
    return BackgroundJob(stage, why, work, None, functools.partial(run.leave, stage))


def background_slots(cores: int | None = None) -> int:
    """How many background stages off a lane run at once: two on a host of 16 cores or more, else one. On an
    H100 host's 16 cores the shipped recipe's two AOTInductor compiles took 38.7 s and 31.5 s side by side,
    where one after the other they had taken 36.1 s and 27.3 s; on a small host a second compile would only
    share the cores the stages in front are using. More than two at once was never measured (each holds its
    own memory)."""
    cores = cores or len(os.sched_getaffinity(0))
    return 2 if cores >= 16 else 1


class BackgroundJob:
    """A background stage's run in a daemon thread: at exit nobody waits for it, and its child process dies
    with the deploy (pipeline.core.children). Background stages off a lane wait for one of
    `background_slots()`, so that compiles never crowd out the stages in front."""

    def __init__(
        self,
        stage: Stage,
        why: str | None,
        work: Callable[[], StageRecord],
        turns: threading.Semaphore | None,
        done: Callable[[], None] = lambda: None,
    ):
        """`turns`: the slots background stages off a lane share; None for a lane stage (its worker
        process runs one stage at a time). `done` runs when the work ends, however it ends."""
        self.stage, self.why, self.joined = stage, why, False
        self._turns, self._done = turns, done
        self._record: StageRecord | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._work, args=(work,), name=f"stage-{stage.name}", daemon=True
        )
        self._thread.start()

    def _work(self, work: Callable[[], StageRecord]) -> None:
        try:
            with self._turns or contextlib.nullcontext():
                self._record = work()
        except BaseException as exc:  # a critical failure or a full disk: raised where the job is joined
            self._error = exc
        finally:
            self._done()

    def stopped(self, timeout_s: float) -> None:
        """Wait (bounded) for the thread to end, as it does soon after the run's cancel is set."""
        self._thread.join(timeout_s)

    def result(self) -> StageRecord:
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._record is not None
        return self._record
