"""Runs the plan: skips fresh stages (pipeline/run/freshness.py) reusing their files through the cache, keeps
going past a failed variant and skips what depends on it, places each stage as it says (Stage.placement,
Stage.takes_late; the run's state in pipeline/run/scheduling.py), and writes the run record after every
stage."""

from __future__ import annotations

import functools
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from pipeline.core.artifacts import ArtifactRecord
from pipeline.core.children import Cancelled
from pipeline.core.errors import Interrupted
from pipeline.core.files import read_report, sha256_file, storage_failure, write_json_atomic
from pipeline.core.test_hooks import kill_point, lose_point
from pipeline.core.user_code import StoppedByModel, UserCodeExit, contained
from pipeline.release.store import Store
from pipeline.run.freshness import Freshness, Judge, fingerprint
from pipeline.run.scheduling import BackgroundJob, RunState, lane_job
from pipeline.stages.base import RUN_STAGES, Late, Output, RunContext, Stage, StageResult
from pipeline.stages.record import RUN_RECORD, StageRecord

STOP_WAIT_S = 30.0  # how long a stopping run waits for a background stage to kill its child and end


class Executor:
    def __init__(
        self,
        stages: list[Stage],
        store: Store,
        previous: list[tuple[Path, dict[str, StageRecord]]],
        retry_failed: bool = False,
    ):
        """previous: (folder, records) candidates for reuse, the latest version first, then killed runs.
        A failed stage with an unchanged fingerprint is reused as failed (as far as the fingerprint can tell
        its failure is deterministic) unless retry_failed asks to run it again (timeouts, crashes)."""
        self.stages = stages
        self.store = store
        self.freshness = Judge(store, previous, retry_failed)
        self.values: dict[str, Any] = {}  # what the stages that ran handed on in memory, by declared name

    @property
    def previous(self) -> list[tuple[Path, dict[str, StageRecord]]]:
        return self.freshness.previous

    @previous.setter
    def previous(self, found: list[tuple[Path, dict[str, StageRecord]]]) -> None:
        self.freshness.previous = found

    def environment(self, stage: Stage) -> dict[str, Any]:
        return self.freshness.environment(stage)

    def judge(self, stage: Stage, inputs: dict[str, str], force_stale: bool = False) -> Freshness:
        return self.freshness.judge(stage, inputs, force_stale)

    # ------------------------------------------------------------ planning (no side effects)

    def plan(self, rebench: bool = False) -> list[tuple[Stage, Freshness]]:
        """Predict each stage's freshness, assuming stale stages will produce new files."""
        known: dict[str, str | None] = {}  # artifact -> sha256; None: will be rebuilt; absent: unavailable
        result = []
        for stage in self.stages:
            names = [*stage.consumes, *stage.consumes_any]
            pending = [n for n in names if n in known and known[n] is None]
            absent = [n for n in stage.consumes if n not in known]
            if pending:
                verdict = Freshness(False, "input will be rebuilt: " + ", ".join(pending))
            elif absent:
                verdict = Freshness(True, "skipped again: input unavailable: " + ", ".join(absent))
            else:
                inputs = {n: known[n] for n in names if known.get(n)}
                verdict = self.judge(stage, inputs, force_stale=rebench and stage.volatile)
            if not verdict.fresh:
                known.update(dict.fromkeys(stage.produces))
            elif verdict.record:
                for out in verdict.record.outputs:
                    if out.get("artifact"):
                        known[out["artifact"]] = out["sha256"]
            result.append((stage, verdict))
        return result

    # ------------------------------------------------------------ running

    def run(
        self,
        ctx: RunContext,
        rebench: bool,
        on_start: Callable[[Stage, str], None],
        on_done: Callable[[StageRecord], None],
    ) -> list[StageRecord]:
        run = RunState(ctx, on_done)
        try:
            self._start_lanes(run)
            self._run(run, rebench, on_start)
        except BaseException:  # nothing goes on working in the folder the caller removes or leaves next
            self._stop_background(run)
            raise
        finally:
            for worker in run.lane_workers():
                worker.close()
        return run.records

    def _start_lanes(self, run: RunState) -> None:
        """Start the worker of each lane in the plan now: its interpreter imports and loads the model while the
        stages before the lane's first one run (a worker left without a job, every lane stage reused, is killed
        at the end)."""
        for lane in sorted({stage.lane for stage in self.stages if stage.lane}):
            run.worker(lane)

    def _run(self, run: RunState, rebench: bool, on_start: Callable[[Stage, str], None]) -> None:
        ctx = run.ctx
        for stage in self.stages:
            blocking = self._blocking(stage, run)
            if stage.lane and blocking and all(job.stage.lane == stage.lane for job in blocking):
                # its inputs are still being made on its own lane: it waits for them in its own job
                after = ", ".join(job.stage.name for job in blocking)
                on_start(stage, f"queued on the {stage.lane} lane after {after}")
                work = functools.partial(self._chained, stage, run, blocking, rebench)
                run.jobs.append(lane_job(run, stage, None, work))
                continue
            for job in blocking:
                self._join(job, run)
            skipped = self._skipped(stage, run)
            if skipped is not None:
                self._finish(stage, skipped, run)
                continue
            inputs, shas = self._inputs(stage, run)
            late = self._late(stage, run)
            if RUN_STAGES in stage.consumes_any:  # in memory and outside the fingerprint: the run
                # record says what the fingerprints and outputs of the stages before already say
                inputs[RUN_STAGES] = self._run_stages(ctx.workdir, run.records)
            if late:
                verdict = Freshness(False, "input still building in the background: " + ", ".join(late))
            else:
                verdict = self.judge(stage, shas, force_stale=rebench and stage.volatile)
            record, why = self._reused(stage, verdict, ctx.workdir, shas)
            if stage.final and verdict.fresh:
                why = "runs in every new version"
            if record is None:
                on_start(stage, why)
                if stage.lane:
                    work = functools.partial(self._on_lane, stage, run, inputs, shas)
                    run.jobs.append(lane_job(run, stage, why, work))
                    continue
                if stage.background:
                    quiet = replace(ctx, report=lambda message: None)  # the live line belongs to the front
                    work = functools.partial(self._execute, stage, quiet, inputs, shas)
                    run.jobs.append(BackgroundJob(stage, why, work, run.off_lane))
                    continue
                record = self._execute(stage, ctx, {**inputs, **late}, shas)
                if late:
                    self._settle_late(stage, record, shas, late, run)
            record.why = why
            self._finish(stage, record, run)
        for job in run.jobs:
            self._join(job, run)

    def _skipped(self, stage: Stage, run: RunState) -> StageRecord | None:
        """The record of a stage skipped for an input that failed or was not built, or None."""
        missing = [n for n in stage.consumes if n not in run.artifacts]
        if not missing:
            return None
        why = "; ".join(f"{n}: {run.unavailable.get(n, 'not built')}" for n in missing)
        self._mark_unavailable(stage, run.unavailable, f"skipped: {why}")
        return StageRecord(
            stage.name,
            stage.version,
            None,
            "skipped",
            stage.config.fingerprinted(),
            error=f"input unavailable ({why})",
        )

    def _chained(
        self, stage: Stage, run: RunState, blocking: list[BackgroundJob], rebench: bool
    ) -> StageRecord:
        """A lane stage whose inputs its lane is still making: wait for them here, then skip, reuse or run it
        as the front would have."""
        for job in blocking:
            self._join(job, run)
        if run.ctx.cancel.is_set():
            raise Cancelled(f"lane {stage.lane}: {stage.name}: the run is stopping")
        skipped = self._skipped(stage, run)
        if skipped is not None:
            return skipped
        inputs, shas = self._inputs(stage, run)
        verdict = self.judge(stage, shas, force_stale=rebench and stage.volatile)
        record, why = self._reused(stage, verdict, run.ctx.workdir, shas)
        if record is None:
            record = self._on_lane(stage, run, inputs, shas)
        record.why = why
        return record

    def _on_lane(
        self, stage: Stage, run: RunState, inputs: dict[str, Any], shas: dict[str, str]
    ) -> StageRecord:
        """Run the stage in its lane's worker process when the lane's earlier stages are done (its recorded
        time starts then)."""
        assert stage.lane is not None
        run.wait_turn(stage)
        quiet = replace(run.ctx, report=lambda message: None)  # the live line belongs to the front
        lane, job = stage.lane, (stage.run, stage.config, inputs)

        # the worker is taken (or started) inside _execute, so that its failure is recorded as the stage's
        def call() -> StageResult:
            return run.worker(lane).run(stage.name, job, run.ctx.cancel)

        return self._execute(stage, quiet, inputs, shas, call)

    @staticmethod
    def _inputs(stage: Stage, run: RunState) -> tuple[dict[str, Any], dict[str, str]]:
        """The stage's inputs built so far, and their digests (what its fingerprint is taken on)."""
        names = (*stage.consumes, *stage.consumes_any)
        inputs: dict[str, Any] = {n: run.artifacts[n] for n in names if n in run.artifacts}
        return inputs, {n: a.sha256 for n, a in inputs.items()}

    def _reused(
        self, stage: Stage, verdict: Freshness, workdir: Path, shas: dict[str, str]
    ) -> tuple[StageRecord | None, str]:
        """The reused record of a fresh stage (None when it must run: stale, final, or its cached outputs
        could not be fetched), and the reason to record."""
        reusable = verdict.fresh and not stage.final
        record = self._reuse(stage, verdict, workdir, shas) if reusable else None
        why = verdict.why if record is not None or not reusable else "cached outputs could not be fetched"
        return record, why

    @staticmethod
    def _stop_background(run: RunState) -> None:
        """The run is stopping: background stages kill their children (RunContext.cancel) and are waited for."""
        run.ctx.cancel.set()
        for worker in run.lane_workers():  # after the cancel: no worker starts from here on
            worker.stop()
        for job in run.jobs:
            job.stopped(STOP_WAIT_S)

    def _blocking(self, stage: Stage, run: RunState) -> list[BackgroundJob]:
        """The background jobs this stage must wait for: those making what it consumes (unless it takes them
        late), and all of them before a stage placed alone, one that reads the run record or one that runs in every
        version."""
        waiting = [job for job in run.jobs if not job.joined]
        if stage.alone or stage.final or RUN_STAGES in stage.consumes_any:
            return waiting
        needed = set(stage.consumes) | (set() if stage.takes_late else set(stage.consumes_any))
        return [job for job in waiting if needed & set(job.stage.produces)]

    def _late(self, stage: Stage, run: RunState) -> dict[str, Late]:
        """What a takes_late stage gets for the inputs still building: a Late that joins their job."""
        if not stage.takes_late:
            return {}
        late: dict[str, Late] = {}
        for job in run.jobs:
            if job.joined:
                continue
            for name in set(stage.consumes_any) & set(job.stage.produces):

                def wait(job: BackgroundJob = job, name: str = name) -> ArtifactRecord | None:
                    self._join(job, run)
                    return run.artifacts.get(name)

                late[name] = Late(name, wait)
        return late

    def _settle_late(
        self, stage: Stage, record: StageRecord, shas: dict[str, str], late: dict[str, Late], run: RunState
    ) -> None:
        """After a takes_late stage ran: its inputs and fingerprint are what it consumed in the end."""
        for name, item in late.items():
            built = item.wait()  # a stage that never resolved a Late still waits for it here
            if built is not None:
                shas[name] = built.sha256
        record.inputs = dict(shas)
        record.fingerprint = fingerprint(stage, shas, self.environment(stage))

    def _join(self, job: BackgroundJob, run: RunState) -> None:
        """Wait for a background stage and take in its record as if it had just run in front."""
        record = job.result()  # a critical failure in the job is raised here, every time it is joined
        with run.lock:  # a lane job joins the jobs it waits for from its own thread
            if job.joined:
                return
            job.joined = True
            record.why = job.why or record.why
            self._finish(job.stage, record, run)

    def _finish(self, stage: Stage, record: StageRecord, run: RunState) -> None:
        """What follows every stage, in front or joined: its artifacts become inputs (or unavailable), the
        run record is rewritten, the display told."""
        with run.lock:
            self._finish_locked(stage, record, run)

    def _finish_locked(self, stage: Stage, record: StageRecord, run: RunState) -> None:
        if record.status == "failed" or (record.status == "reused" and record.error):
            self._mark_unavailable(stage, run.unavailable, f"failed: {record.error}")
        for out in record.outputs:
            if out.get("artifact"):
                run.artifacts[out["artifact"]] = self._record(run.ctx.workdir, stage, out)
        record.produces = list(stage.produces)
        run.records.append(record)
        write_json_atomic(
            run.ctx.workdir / RUN_RECORD, {"schema_version": 1, "stages": [asdict(r) for r in run.records]}
        )
        run.on_done(record)
        kill_point(f"stage:{stage.name}")
        lose_point(f"stage:{stage.name}", run.ctx.workdir)

    @staticmethod
    def _run_stages(workdir: Path, records: list[StageRecord]) -> ArtifactRecord:
        path = workdir / RUN_RECORD
        return ArtifactRecord(RUN_STAGES, path, "record", None, "", "executor", value=list(records))

    def _record(self, workdir: Path, stage: Stage, out: dict[str, Any]) -> ArtifactRecord:
        """How consumers see an output; a report comes with its content, in memory when its stage ran now
        and read once from its file when the stage was reused."""
        name, path = out["artifact"], workdir / out["path"]
        value = None
        if out["kind"] == "report":
            value = self.values[name] if name in self.values else read_report(path)
            self.values[name] = value
        return ArtifactRecord(
            name,
            path,
            out["kind"],
            out.get("precision"),
            out["sha256"],
            stage.name,
            out.get("details", {}),
            value,
        )

    @staticmethod
    def _mark_unavailable(stage: Stage, unavailable: dict[str, str], why: str) -> None:
        for name in stage.produces:
            unavailable.setdefault(name, f"{stage.name} {why}")

    def _reuse(
        self, stage: Stage, verdict: Freshness, workdir: Path, shas: dict[str, str]
    ) -> StageRecord | None:
        prev = verdict.record
        assert prev is not None and verdict.source is not None
        for out in prev.outputs:
            problem = self.store.fetch(out["sha256"], workdir / out["path"], [verdict.source / out["path"]])
            if problem:
                return None
        reused_from = prev.reused_from or verdict.source.name
        return StageRecord(
            stage.name,
            stage.version,
            prev.fingerprint,
            "reused" if prev.status != "failed" else "failed",
            stage.config.fingerprinted(),
            self.environment(stage),
            shas,
            prev.outputs,
            prev.error,
            0.0,
            prev.details,
            reused_from,
            prev.finished,
        )

    def _execute(
        self,
        stage: Stage,
        ctx: RunContext,
        inputs: dict[str, ArtifactRecord],
        shas: dict[str, str],
        call: Callable[[], StageResult] | None = None,
    ) -> StageRecord:
        """Run the stage (in this process, or through `call`: its lane's worker) and record how it went.

        A sys.exit or KeyboardInterrupt the model's code raised itself (user_code.UserCodeExit) is that
        stage's failure, like any other exception the model raises there: the stage alone cannot build its
        variant, the variants that do not need it are still worth building and judging, and the sign-off
        weighs the failure (exit 1 when a required variant is lost). It is not a user error of the recipe:
        pre-flight has built and run the same model, so only a model that behaves differently while a stage
        runs it gets here. In a critical stage, whose failure stops the run, it is the user's error (exit 2,
        nothing published), not a bug of the pipeline's (exit 3). A real Ctrl-C still stops the run."""
        env = self.environment(stage)
        fp = fingerprint(stage, shas, env)
        started = time.perf_counter()
        record = StageRecord(stage.name, stage.version, fp, "ran", stage.config.fingerprinted(), env, shas)
        ensure_inputs(stage, inputs)
        try:
            with contained():
                result = call() if call is not None else stage.run(ctx, stage.config, inputs)
        except Exception as exc:
            if stage.critical and isinstance(exc, UserCodeExit):
                raise StoppedByModel(stage.name, exc) from exc
            if stage.critical or storage_failure(exc):
                raise  # a bug, or a full / read-only disk: the run stops (and can be resumed), no variant failed
            record.status = "failed"
            record.error = f"{type(exc).__name__}: {exc}".strip()
            record.details = dict(getattr(exc, "details", None) or {})
            log = ctx.path(f"logs/{stage.name}.error.txt")
            log.write_text(traceback.format_exc())
            record.outputs = [self._describe(ctx.workdir, f"logs/{stage.name}.error.txt", {"kind": "log"})]
        else:
            ensure_inputs(stage, inputs)  # what it judged may have vanished under it: its results neither
            record.details = result.details
            record.outputs = [self._output(ctx.workdir, o) for o in result.outputs]
            self.values.update(result.values)
        record.duration_s = round(time.perf_counter() - started, 3)
        record.finished = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        if not stage.final:  # never reused: its files name the version they are in
            for out in record.outputs:
                self.store.cache_put(ctx.workdir / out["path"], out["sha256"])
        return record

    def _output(self, workdir: Path, output: Output) -> dict[str, Any]:
        """An output as the run record lists it; a report's content stays in memory for its consumers."""
        meta = asdict(replace(output, value=None))
        del meta["value"]
        if output.value is not None:
            self.values[meta["artifact"]] = output.value
        return self._describe(workdir, output.path, meta)

    @staticmethod
    def _describe(workdir: Path, path: str, meta: dict[str, Any]) -> dict[str, Any]:
        full = workdir / path
        if not full.is_file():
            raise RuntimeError(f"stage declared output {path} but did not write it")
        return {**meta, "path": path, "sha256": sha256_file(full), "bytes": full.stat().st_size}


def ensure_inputs(stage: Stage, inputs: dict[str, Any]) -> None:
    """Stop the run when a file the stage consumes is gone from the work folder (deleted by something else
    while the deploy ran): the stage would record a failure (or, for validation, a failed artifact) that is
    not the variant's and that the next deploy would reuse. Interrupted publishes and records nothing, so
    the next deploy builds the files again."""
    gone = [
        f"{name} ({record.path})"
        for name, record in inputs.items()
        if isinstance(record, ArtifactRecord) and record.value is None and not record.path.exists()
    ]
    if gone:
        raise Interrupted(
            f"interrupted: {stage.name}: its input {', '.join(gone)} vanished from the work folder while the "
            "deploy ran; nothing was published or recorded as failed (run the deploy again to rebuild it)"
        )
