"""One deploy: pre-flight, lock, plan, run in a work folder, sign off, publish atomically."""

from __future__ import annotations

import errno
import getpass
import json
import os
import re
import shlex
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from pipeline.check.served import served_rates
from pipeline.check.speed import figure_text, fmt_qps
from pipeline.core.errors import Interrupted, PipelineError, reason_line
from pipeline.core.files import sha256_file, storage_failure
from pipeline.core.stored import read_or_none
from pipeline.decide.verdict import SignOff
from pipeline.preflight import checks as preflight
from pipeline.recipe.loader import LoadedRecipe
from pipeline.release.manifest import resolved_recipe, write_manifest
from pipeline.release.promotion import make_latest, recipe_changes, same_recipe
from pipeline.release.promotion import record as record_promotion
from pipeline.release.store import MANIFEST, Store
from pipeline.release.tracking import ensure_logged, log_run
from pipeline.report.plots import settle_matplotlib_dirs
from pipeline.run.executor import Executor
from pipeline.run.freshness import Freshness
from pipeline.run.plan import plan_stages
from pipeline.run.progress import StageProgress
from pipeline.stages.base import Release, RunContext, Stage
from pipeline.stages.record import StageRecord, read_records
from pipeline.stages.signoff import VERDICT


def _setup(loaded: LoadedRecipe) -> tuple[list[Stage], Store]:
    preflight.check(loaded)
    stages = plan_stages(loaded.recipe, loaded.path.parent.resolve())
    return stages, Store(Path(loaded.recipe.output.root), loaded.recipe.name)


def plan(
    loaded: LoadedRecipe, console: Console, rebench: bool = False, retry_failed: bool = False
) -> list[tuple[Stage, Freshness]]:
    """Print each stage as fresh or stale and why; touches nothing."""
    stages, store = _setup(loaded)
    changes = recipe_changes(loaded)
    latest = _base(store, loaded, changes, console)  # as the deploy will judge it
    executor = Executor(stages, store, [(latest, read_records(latest))] if latest else [], retry_failed)
    verdicts = executor.plan(rebench)
    against = f"{loaded.recipe.name}/{latest.name}" if latest else "no signed-off version yet"
    console.print(f"plan for {loaded.recipe.name} (against {against}):")
    if changes:
        console.print(f"a candidate: --set changes {', '.join(changes)} (latest moves only with --promote)")
    for stage, verdict in verdicts:
        state = "[green]fresh[/green]" if verdict.fresh else "[yellow]stale[/yellow]"
        failed = _failed_error(verdict)
        if failed:
            state = f"[red]fresh (failed: {escape(failed)})[/red]"
        behind = " (runs in the background)" if stage.background and not verdict.fresh else ""
        console.print(
            f"  {state}  {stage.name:<24} {escape(verdict.why)}{behind}", highlight=False, markup=True
        )
    changed = _signoff_changes(verdicts) if latest else None
    if changed:
        console.print(f"sign-off changes ({changed}): deploy makes a new version reusing every stage")
    return verdicts


def _signoff_changes(verdicts: list[tuple[Stage, Freshness]]) -> str | None:
    """Why sign-off alone is stale (a sign-off setting such as export.triton changed), else None."""
    if all(v.fresh or stage.final for stage, v in verdicts):
        return next((v.why for stage, v in verdicts if not v.fresh), None)
    return None


def _failed_error(verdict: Freshness) -> str | None:
    """A stage reused as failed is fresh, but it will produce nothing: its error, for the plan to say so."""
    record = verdict.record
    if not verdict.fresh or record is None or record.status != "failed":
        return None
    return reason_line(record.error or "unknown error", 200)


@dataclass
class Outcome:
    """What one deploy did, for the exit code and for `deploy --json`."""

    exit_code: int
    version: Path
    up_to_date: bool = False
    signed_off: bool = True
    reasons: list[str] = field(default_factory=list)
    records: list[StageRecord] = field(default_factory=list)
    tracking: dict[str, str] | None = None

    def document(self, name: str) -> dict[str, Any]:
        def read(rel: str) -> dict[str, Any] | None:
            path = self.version / rel
            return json.loads(path.read_text()) if path.is_file() else None

        stage_keys = ("name", "status", "duration_s", "why", "reused_from", "error")
        manifest = read("manifest.json") or {}
        return {
            "name": name,
            "status": "up_to_date"
            if self.up_to_date
            else ("signed_off" if self.signed_off else "not_signed_off"),
            "version": self.version.name,
            "path": str(self.version.resolve()),
            "signed_off": self.signed_off,
            "reasons": self.reasons,
            "headline": manifest.get("headline"),
            "failed": manifest.get("failed") or [],
            "warnings": manifest.get("warnings") or [],
            "provisional": bool(manifest.get("provisional")),
            "winner": read("winner.json"),
            "stages": [{k: asdict(r)[k] for k in stage_keys} for r in self.records],
            "report": str(self.version.resolve() / "reports" / "signoff.html"),
            "tracking": self.tracking,
        }


def deploy(loaded: LoadedRecipe, console: Console, rebench: bool = False, retry_failed: bool = False) -> int:
    return run_deploy(loaded, console, rebench, retry_failed).exit_code


@dataclass(frozen=True)
class Display:
    """Where a deploy's words go: progress (stage lines, heartbeats; stderr, so that `deploy | tee` keeps the
    result) apart from the result; quiet drops progress and the summary table; verbose gives every message a
    stage reports its own line."""

    progress: Console | None = None  # None: the result's console
    quiet: bool = False
    verbose: bool = False


def run_deploy(
    loaded: LoadedRecipe,
    console: Console,
    rebench: bool = False,
    retry_failed: bool = False,
    promote: bool = False,
    display: Display | None = None,
) -> Outcome:
    """promote: a candidate (its --set overrides change the recipe) becomes `latest` when it signs off, as a
    deploy of the recipe file does (pipeline/release/promotion.py)."""
    display = display or Display()
    stages, store = _setup(loaded)
    name = loaded.recipe.name
    changes = recipe_changes(loaded)
    unwritable = store.write_problem()
    if unwritable:  # a read-only root: nothing can be published, but "up to date" needs no writing
        latest = _base(store, loaded, changes, console)
        executor = Executor(stages, store, [(latest, read_records(latest))] if latest else [], retry_failed)
        if latest and all(v.fresh for _, v in executor.plan(rebench)):
            console.print(f"up to date: {name}/{latest.name}")
            return Outcome(0, latest, up_to_date=True)
        raise PipelineError(
            problems=[loaded.problem("output.root", f"{unwritable}; a new version cannot be written")]
        )
    uncreatable = store.create_problem()
    if uncreatable:
        raise PipelineError(problems=[loaded.problem("output.root", uncreatable)])
    with store.lock(loaded.recipe.output.lock_timeout_s):
        store.clean_temp_files()
        store.separate_cache()
        recovered = store.recover_latest()
        if recovered:
            console.print(
                f"recovered: {name}/latest -> {recovered} (a deploy was stopped after publishing it, before moving latest)"
            )
        latest = _base(store, loaded, changes, console)
        from_latest = [(latest, read_records(latest))] if latest else []
        executor = Executor(stages, store, from_latest, retry_failed)
        verdicts = executor.plan(rebench) if latest else []
        if latest and all(v.fresh for _, v in verdicts):
            if changes:
                _promote_up_to_date(store, latest, promote, console)
            tracked = ensure_logged(loaded.recipe, latest, console)
            console.print(f"up to date: {name}/{latest.name}")
            code = _tracking_code(0, tracked, loaded, [], console)
            return Outcome(code, latest, up_to_date=True, tracking=tracked)
        changed = _signoff_changes(verdicts)
        if changed:
            console.print(f"every stage is fresh, but the sign-off changes ({changed}): a new version")
        latest = store.latest()  # a damaged latest still lends its verified files and its reports' history
        executor.previous = _reuse_candidates(store, latest)
        work = store.new_work_dir()
        _keep_compiler_cache()
        settle_matplotlib_dirs()  # before the temp folder moves into the store: it must outlive the deploy
        try:
            with store.temp_dir():
                version = store.next_version()
                release = Release(
                    version,
                    resolved_recipe(loaded),
                    loaded.path,
                    tuple(loaded.overrides),
                    latest,
                    folder=store.version_folder(version),
                    started_in=Path.cwd().resolve(),
                )
                context = RunContext(work, cache_dir=store.cache_dir, release=release)
                records = _run_with_progress(executor, context, rebench, display.progress or console, display)
                signoff: SignOff = executor.values[VERDICT]
                verdict = signoff.verdict
                promoted = verdict.signed_off and (not changes or promote)
                write_manifest(work, loaded, signoff, {"recipe_changes": changes, "promoted": promoted})
                lost = missing_from_version(work, records, verdict.signed_off)
                if lost:
                    raise Interrupted(
                        f"interrupted: the work folder {work} lost what the version must hold before it was "
                        f"published ({'; '.join(lost[:5])}{'; …' if len(lost) > 5 else ''}): nothing was "
                        "published (run the deploy again to build it)"
                    )
                target = store.publish(work, version, promoted)
                if promoted:
                    record_promotion(store, version, "deploy --promote" if changes else "deploy")
        except PipelineError:
            shutil.rmtree(work, ignore_errors=True)  # a user error found mid-run: nothing half-made stays
            raise
        except Exception as exc:
            failure = storage_failure(exc)
            if failure is None:
                raise
            raise PipelineError(
                problems=[loaded.problem("output.root", _storage_message(failure, exc, work))]
            ) from exc
        store.discard_work()
    _print_summary(console, target, signoff, executor.values, loaded, table=not display.quiet)
    if changes and verdict.signed_off and not promoted:
        console.print(
            f"candidate: {name}/{target.name} is not latest (--set changes {', '.join(changes)}); promote it "
            f"with: python -m pipeline promote {shlex.quote(str(loaded.path))} {target.name}{_where(loaded)}",
            highlight=False,
            soft_wrap=True,
        )
    tracked = log_run(loaded.recipe, target, console)
    reasons = list(verdict.reasons)
    code = _tracking_code(0 if verdict.signed_off else 1, tracked, loaded, reasons, console)
    return Outcome(code, target, False, verdict.signed_off, reasons, records, tracked)


def _tracking_code(
    code: int, tracked: dict[str, str] | None, loaded: LoadedRecipe, reasons: list[str], console: Console
) -> int:
    """Exit 1 when the run record the recipe requires is missing (the version stays published)."""
    tracking = loaded.recipe.tracking
    if tracked is not None or tracking.mlflow is None or not tracking.required:
        return code
    reasons.append("the run could not be logged and tracking.required is true (the version stays published)")
    console.print(f"[red]exit 1[/red]: {escape(reasons[-1])}", highlight=False, markup=True)
    return 1


VERSION_FILES = ("stages.json", "recipe.yaml", "reproduce.sh", "manifest.json")


def missing_from_version(work: Path, records: list[StageRecord], signed_off: bool) -> list[str]:
    """What the version must hold and the work folder does not, as `path: why`: every output a stage recorded
    (artifacts, reports, logs) with the sha256 it recorded, the run record, the resolved recipe, reproduce.sh,
    the manifest, and winner.json when signed off. A work folder emptied under the deploy would otherwise be
    published as a version holding only what sign-off wrote after it (the manifest lists what exists)."""
    lost = []
    for record in records:
        for out in record.outputs:
            path = work / out["path"]
            if not path.is_file():
                lost.append(f"{out['path']} ({record.name}): missing")
            elif out.get("sha256") and sha256_file(path) != out["sha256"]:
                lost.append(f"{out['path']} ({record.name}): changed since it was recorded")
    required = [*VERSION_FILES, *(["winner.json"] if signed_off else [])]
    lost += [f"{rel}: missing" for rel in required if not (work / rel).is_file()]
    return lost


def _keep_compiler_cache() -> None:
    """TorchInductor keeps its cache under the temp folder, which a deploy points into the output root for
    its own duration (Store.temp_dir): pin the cache where it was, so compiled kernels outlive the run. The
    folder is TorchInductor's default (torch/_inductor/runtime/cache_dir_utils.py), worked out here: importing
    that module imports torch._inductor and TorchDynamo, 1.8 s of every deploy that compiles nothing."""
    if "TORCHINDUCTOR_CACHE_DIR" in os.environ:
        return
    try:
        user = getpass.getuser()
    except (KeyError, ModuleNotFoundError, OSError):
        user = f"uid_{os.getuid()}"
    user = re.sub(r'[\\/:*?"<>|]', "_", user)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(tempfile.gettempdir(), f"torchinductor_{user}")


def _base(store: Store, loaded: LoadedRecipe, changes: list[str], console: Console) -> Path | None:
    """What this deploy is judged "up to date" against: `latest` for the recipe file as written; for a
    candidate (its overrides change the recipe), the newest intact version deployed from the same recipe,
    else `latest` too (what it changes is then stale against it)."""
    for version in reversed(store.versions()) if changes else []:
        folder = store.base / version
        manifest = read_or_none(folder / MANIFEST)
        signed = bool(manifest) and manifest.get("signed_off") is True
        if signed and same_recipe(manifest, loaded) and not store.verify(folder):
            return folder
    return _verified_latest(store, console)


def _verified_latest(store: Store, console: Console) -> Path | None:
    """`latest`, re-hashed against its manifest; a damaged one is reported and not trusted for "up to date"
    (a new version is built; the damaged one is never repaired in place)."""
    latest = store.latest()
    if latest is None:
        return None
    damage = store.verify(latest)
    if not damage:
        return latest
    console.print(
        "[red]damaged[/red]: "
        + escape(
            f"{latest} ({len(damage)} file(s)): "
            + "; ".join(damage[:5])
            + ("; …" if len(damage) > 5 else "")
            + " — building a new version"
        ),
        highlight=False,
        markup=True,
        soft_wrap=True,  # whole, however long the path: the damaged files' names come last
    )
    return None


def _where(loaded: LoadedRecipe) -> str:
    """The overrides that say where the store is (output.*), as --set arguments: a command printed for the
    user must find the same store."""
    kept = [o for o in loaded.overrides if o.partition("=")[0].strip().startswith("output.")]
    return "".join(f" --set {shlex.quote(o)}" for o in kept)


def _promote_up_to_date(store: Store, version: Path, promote: bool, console: Console) -> None:
    """A candidate found up to date is promoted where asked (under the deploy lock, which the caller holds;
    `_base` only returns a version that is signed off and intact)."""
    current = store.latest()
    if not promote or (current is not None and current.name == version.name):
        return
    make_latest(store, version.name, "deploy --promote")
    console.print(f"promoted: {store.base.name}/latest -> {version.name}", highlight=False)


def _storage_message(failure: OSError, exc: BaseException, work: Path) -> str:
    """`no space left on device while writing <file>`: the file from the error (or the work folder)."""
    filename = failure.filename or getattr(exc, "filename", None) or work
    what = "no space left on device" if failure.errno != errno.EROFS else "read-only file system"
    return f"{what} while writing {filename} (free space and re-run: the work folder {work} is resumed)"


def _reuse_candidates(store: Store, latest: Path | None) -> list[tuple[Path, dict[str, StageRecord]]]:
    """Where fresh outputs may come from: latest, then the newest version even if its sign-off failed (its
    exports are as good), then folders of killed runs. "Up to date" is still judged against latest only."""
    folders = [latest] if latest else []
    versions = store.versions()
    if versions and (latest is None or versions[-1] != latest.name):
        folders.append(store.base / versions[-1])
    folders += store.leftover_work_dirs()
    return [(folder, read_records(folder)) for folder in folders]


def _run_with_progress(
    executor: Executor, ctx: RunContext, rebench: bool, console: Console, display: Display
) -> list[StageRecord]:
    if display.quiet:
        console = Console(quiet=True)
    with StageProgress(console, len(executor.stages), every_message=display.verbose) as progress:
        ctx.report = progress.report
        return executor.run(ctx, rebench, progress.on_start, progress.on_done)


def _print_summary(
    console: Console,
    target: Path,
    signoff: SignOff,
    values: dict[str, Any],
    loaded: LoadedRecipe,
    table: bool = True,
) -> None:
    """The closing lines: the table of every requested variant (failed ones included), then the verdict with
    its reasons, failures and warnings, the winner, and where the report is."""
    from pipeline.report.summary import summary_table

    verdict, winner = signoff.verdict, signoff.winner
    accuracy, speed = values.get("report:accuracy"), values.get("report:speed")
    failed = [f.to_json() for f in verdict.failures]
    objective = loaded.recipe.selection.objective
    if table:
        console.print(
            summary_table(
                accuracy, speed, winner, objective.batch, failed, objective_metric=objective.metric
            ),
            highlight=False,
        )
    tone = "green" if verdict.signed_off else "red"
    console.print(
        f"[{tone}]{escape(verdict.headline())}[/{tone}]: {escape(str(target))}", highlight=False, markup=True
    )
    for reason in verdict.reasons:
        console.print(f"  - {escape(reason)}", highlight=False, markup=True)
    for failure in verdict.failures:
        console.print(f"  [red]✗[/red] {escape(failure.describe())}", highlight=False, markup=True)
    for warning in verdict.warnings:
        console.print(f"  [yellow]warning[/yellow] {escape(warning)}", highlight=False, markup=True)
    if winner:
        console.print(
            escape(
                f"winner: {winner['artifact']} ({winner['runtime']}, {winner['io']} I/O, "
                f"{figure_text(winner['value'], winner['unit'])}): {winner['reason']}"
            ),
            highlight=False,
            markup=True,
        )
    for row in served_rates(values.get("report:load")):
        figure = (
            f"{'≥ ' if row.bounded else ''}{fmt_qps(row.max_qps)} requests/s"
            if row.max_qps is not None
            else (row.error or row.missed)
        )
        target_ms = f" at p99 ≤ {row.p99_target_ms:g} ms" if row.p99_target_ms else ""
        console.print(
            escape(f"server scenario: {row.label}{target_ms}: {figure}"), highlight=False, markup=True
        )
    console.print(f"report: {target / 'reports' / 'signoff.html'}", highlight=False)
