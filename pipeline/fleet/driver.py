"""`python -m pipeline fleet FLEET.yaml`: every (recipe, target) deploy as a Ray task on a node with the target's
resources, each into its target's folder of the shared store, and one fleet report at the end.

With no address the driver starts a local Ray instance (the same command on a laptop), and stops it at the end.
A target no node can run is reported at once and its deploys are not submitted; a worker that dies mid-deploy
is run again (`retries`); Ctrl-C stops every running deploy before it publishes.

With `store: copy` (nodes that do not see the root) each deploy runs into a scratch store on its node, seeded
with the shared store's latest versions, and its new version comes back through Ray's object store; the
driver publishes it after checking every file against its manifest, and runs the deploy again (`retries`)
when a copy does not match (pipeline/fleet/copy_back.py, copy_publish.py)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from pipeline.core.errors import Interrupted, PipelineError
from pipeline.fleet.copy_back import run_job_copying_back
from pipeline.fleet.copy_publish import CopyFailed, publish_copy
from pipeline.fleet.placement import missing_node
from pipeline.fleet.report import FleetReport, why_not, write_report
from pipeline.fleet.seed import make_seed
from pipeline.fleet.spec import Fleet, Target, load_fleet
from pipeline.fleet.task import STOP_S, Job, run_job
from pipeline.recipe.loader import load
from pipeline.release.store import Store

HEARTBEAT_S = 30.0


@dataclass
class Outcome:
    exit_code: int
    report: FleetReport
    paths: dict[str, str] = field(default_factory=dict)


def run_fleet(path: Path, console: Console) -> Outcome:
    fleet = load_fleet(path)
    _check_recipes(fleet)
    ray = _ray()
    local = fleet.address is None
    console.print(
        f"fleet {fleet.name}: starting {'a local Ray instance' if local else 'at ' + fleet.address}"
    )
    ray.init(
        address=fleet.address,
        include_dashboard=False,
        logging_level=logging.ERROR,
        log_to_driver=False,
        configure_logging=True,
    )
    state = Path(fleet.root) / ".fleet" / f"{fleet.name}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
    try:
        report = FleetReport(fleet.name, fleet.root, [e.path for e in fleet.entries()], fleet.targets)
        runnable, nodes = [], ray.nodes()
        for target in fleet.targets:
            why = missing_node(target, nodes)
            if why:
                console.print(
                    f"[red]{escape(f'target {target.name}: {why}')}[/red]; its deploys are not run",
                    highlight=False,
                    markup=True,
                )
                report.unplaced[target.name] = why
            else:
                runnable.append(target)
        jobs = [
            _job(ray, fleet, target, entry.path, entry.set, state)
            for target in runnable
            for entry in fleet.entries()
        ]
        report.results = _run(ray, fleet, jobs, console)
    finally:
        if local:
            ray.shutdown()
        shutil.rmtree(state, ignore_errors=True)
        with contextlib.suppress(OSError):
            state.parent.rmdir()  # the last fleet run's state gone: no empty folder left in the store
    paths = write_report(report)
    console.print(f"fleet report: {paths['markdown']}", highlight=False)
    return Outcome(0 if report.all_signed_off() else 1, report, paths)


def _check_recipes(fleet: Fleet) -> None:
    """Every recipe with its own and each target's overrides, validated here before Ray starts: a typo is one
    located error now, not a failed deploy per target later (what a node has is its deploy's pre-flight)."""
    problems = []
    for target in fleet.targets:
        for entry in fleet.entries():
            try:
                load(entry.path, [*entry.set, *target.set])
            except PipelineError as exc:
                where = f" (recipe {Path(entry.path).name} on target {target.name})"
                problems += [replace(p, message=p.message + where) for p in exc.problems]
    if problems:
        raise PipelineError(problems=list(dict.fromkeys(problems)))


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise PipelineError(
            "fleet needs Ray: pip install 'deploy-pipeline[fleet]' (or pip install ray)"
        ) from None
    return ray


def _job(ray: Any, fleet: Fleet, target: Target, recipe: str, sets: list[str], state: Path) -> Job:
    root = Path(fleet.root) / target.name
    job = Job(
        target.name,
        recipe,
        (*sets, *target.set),
        fleet.promote,
        os.getcwd(),
        fleet.timeout_s,
        str(state),
        target.gpu is not None,
    )
    if fleet.store == "copy":  # the task adds its scratch store's root
        return _seeded(ray, fleet, job)
    return replace(job, sets=(*job.sets, f"output.root={json.dumps(str(root))}"))  # quoted: a YAML value


def _seeded(ray: Any, fleet: Fleet, job: Job) -> Job:
    """The job with the shared store's current state of its recipe (again before a retry: it may have moved)."""
    loaded = load(job.recipe, list(job.sets))
    store = Store(Path(fleet.root) / job.target, loaded.recipe.name)
    return replace(job, seed=make_seed(ray, store, loaded.recipe.output.lock_timeout_s))


def _run(ray: Any, fleet: Fleet, jobs: list[Job], console: Console) -> list[dict[str, Any]]:
    """Submit every job, print each as it ends, and return their results in the jobs' order. A copy that
    does not match its manifest runs its deploy again, as many times as a dead worker's would be."""
    targets = {t.name: t for t in fleet.targets}
    in_place, copying = ray.remote(run_job), ray.remote(run_job_copying_back)

    def submit(job: Job) -> Any:
        target = targets[job.target]
        options: dict[str, Any] = {
            "num_cpus": target.cpu,
            "max_retries": fleet.retries,
            "retry_exceptions": False,
        }
        if target.gpu is not None:
            options["num_gpus"] = target.gpu.count
            if target.gpu.type:
                options["accelerator_type"] = target.gpu.type
        if job.seed is not None:  # a streaming generator: the result, then the version's chunks
            return copying.options(**options, num_returns="streaming").remote(job)
        return in_place.options(**options).remote(job)

    jobs = list(jobs)  # a retried copy's job is seeded afresh in place
    refs = {submit(job): index for index, job in enumerate(jobs)}
    console.print(f"fleet: {len(jobs)} deploys submitted", highlight=False)
    results: dict[int, dict[str, Any]] = {}
    copies_failed = [0] * len(jobs)
    pending = list(refs)
    last = time.monotonic()
    try:
        while pending:
            done, pending = ray.wait(pending, num_returns=1, timeout=1.0)
            for ref in done:
                index = refs.pop(ref)
                job = jobs[index]
                result = _copied(ray, ref, job, fleet) if job.seed else _result(ray, ref, job)
                if result.get("copy_failed") and copies_failed[index] < fleet.retries:
                    copies_failed[index] += 1
                    console.print(f"{_line(result)}; running it again", highlight=False)
                    jobs[index] = _seeded(ray, fleet, job)
                    again = submit(jobs[index])
                    refs[again] = index
                    pending.append(again)
                    continue
                results[index] = result
                console.print(_line(result), highlight=False)
            if time.monotonic() - last > HEARTBEAT_S:
                last = time.monotonic()
                running = ", ".join(
                    f"{jobs[refs[r]].target}/{Path(jobs[refs[r]].recipe).stem}" for r in pending
                )
                console.print(f"fleet: {len(pending)} deploys running ({running})", highlight=False)
    except KeyboardInterrupt:
        stopped = _cancel(ray, pending, console)
        finished = len(jobs) - stopped
        raise Interrupted(
            f"interrupted: the {stopped} running deploys were stopped before publishing; "
            f"{finished} finished (their versions stand)"
        ) from None
    return [results[index] for index in range(len(jobs))]


def _result(ray: Any, ref: Any, job: Job) -> dict[str, Any]:
    try:
        return dict(ray.get(_first(ray, ref)))
    except Exception as exc:  # noqa: BLE001 - a worker that died after its retries, a node lost: the row says so
        return {
            "target": job.target,
            "recipe": job.recipe,
            "exit_code": None,
            "document": None,
            "stderr_tail": [],
            "error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
            "attempt": None,
        }


def _first(ray: Any, ref: Any) -> Any:
    """The task's result: a plain task's return, or a streaming generator's first object."""
    return next(ref) if isinstance(ref, ray.ObjectRefGenerator) else ref


def _copied(ray: Any, generator: Any, job: Job, fleet: Fleet) -> dict[str, Any]:
    """A copy-mode deploy's result, its version received, checked and published into the shared store; a
    copy that does not match its manifest is the cell's error (`copy_failed`: it runs again)."""
    result = _result(ray, generator, job)
    if "copy" not in result:  # the task itself failed: nothing was sent
        return result
    assert job.seed is not None
    store = Store(Path(fleet.root) / job.target, job.seed.name)
    chunks = (ray.get(ref) for ref in generator)
    try:
        return publish_copy(chunks, result, store, job.seed)
    except CopyFailed as exc:
        return result | {"document": None, "error": str(exc), "copy_failed": True}


def _line(result: dict[str, Any]) -> str:
    recipe = Path(result["recipe"]).stem
    doc = result.get("document") or {}
    attempt = f", attempt {result['attempt']}" if (result.get("attempt") or 1) > 1 else ""
    if doc.get("signed_off"):
        status = doc["status"].replace("_", " ")
        return f"done: {recipe} on {result['target']}: {status} {doc['version']}{attempt}"
    return f"done: {recipe} on {result['target']}: not signed off ({why_not(result)}){attempt}"


def _cancel(ray: Any, pending: list[Any], console: Console) -> int:
    """Ask every running deploy to stop as at a Ctrl-C (it publishes nothing), then force what is left; how
    many were stopped (a deploy that ended on its own meanwhile published its version)."""
    console.print(f"fleet: stopping {len(pending)} running deploys", highlight=False)
    for ref in pending:
        ray.cancel(ref, force=False)
    done, left = ray.wait(pending, num_returns=len(pending), timeout=STOP_S + 5) if pending else ([], [])
    for ref in left:
        ray.cancel(ref, force=True)
    stopped = len(left)
    for ref in done:
        try:
            ray.get(_first(ray, ref), timeout=5)
        except Exception:  # noqa: BLE001 - TaskCancelledError (or the worker lost as it stopped): not published
            stopped += 1
    return stopped
