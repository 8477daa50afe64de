"""Run records: each published version logged as one MLflow run (`tracking.mlflow`, the `mlflow` extra).

The run holds the resolved recipe as parameters, accuracy and latency per artifact as metrics, the winner and
the sign-off state as tags, the winner as an MLflow model with its signature (pipeline/release/mlflow_model.py),
and the sign-off files (reports, winner.json, recipe.yaml, manifest.json) as
artifacts; it is written from the published folder, so it says exactly what the version says. A release does
not depend on its record: a tracking failure is printed and the deploy's exit code stands."""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from pipeline.check.timings import timings
from pipeline.check.verdicts import records
from pipeline.recipe import MlflowTracking, Recipe
from pipeline.release.mlflow_model import log_winner

SIGNOFF_FILES = ("winner.json", "recipe.yaml", "manifest.json", "stages.json")
PARAM_LIMIT = 500  # characters; MLflow's own limit is larger in recent versions
BATCH = 100  # MLflow accepts at most 100 params and 1000 metrics per log_batch call
LATENCY_STATS = ("p50_ms", "p90_ms", "p99_ms", "mean_ms")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+:")
_UNSAFE = re.compile(r"[^\w\-. /]")


def tracking_uri(uri: str) -> str:
    """A URI as given; a plain path becomes a file: URI (relative to the working directory)."""
    return uri if _SCHEME.match(uri) else Path(uri).resolve().as_uri()


def flatten(data: Any, prefix: str = "") -> dict[str, str]:
    """Nested recipe data as dotted keys ('benchmark.batch_sizes': '[1, 8]')."""
    if isinstance(data, dict) and data:
        out: dict[str, str] = {}
        for key, value in data.items():
            out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: json.dumps(data)[:PARAM_LIMIT]} if prefix else {}


def metrics(version: Path) -> dict[str, float]:
    """Accuracy per artifact and check, latency per row, and the winner's objective value."""
    out: dict[str, float] = {}
    for name, entry in records(_read(version / "reports/accuracy.json")).items():
        out[f"accuracy.{name}.passed"] = float(entry.passed)
        for check in entry.checks:
            if check.value is not None:
                out[f"accuracy.{name}.{check.output}.{check.inputs}.{check.metric}"] = check.value
    for row in timings(_read(version / "reports/speed.json")):
        shape = f"b{row.batch}" + (f".s{row.recorded_sequence}" if row.recorded_sequence else "")
        for stat in LATENCY_STATS:
            if stat in row.latency_ms:
                out[f"latency.{row.artifact}.{row.runtime}.{row.io}.{shape}.{stat}"] = row.latency_ms[stat]
    winner = _read(version / "winner.json")
    if winner:
        out[f"winner.{winner['objective']['metric']}"] = float(winner["value"])
    return {_UNSAFE.sub("_", k): v for k, v in out.items()}


def tags(version: Path) -> dict[str, str]:
    manifest = _read(version / "manifest.json") or {}
    winner = _read(version / "winner.json") or {}
    found = {
        "pipeline.name": manifest.get("name"),
        "pipeline.version": version.name,
        "pipeline.path": str(version.resolve()),
        "pipeline.signed_off": str(bool(manifest.get("signed_off"))).lower(),
        "pipeline.winner": winner.get("artifact"),
        "pipeline.winner_runtime": winner.get("runtime"),
        "mlflow.source.git.commit": manifest.get("git_revision"),
    }
    return {k: str(v) for k, v in found.items() if v is not None}


def log_run(recipe: Recipe, version: Path, console: Console) -> dict[str, str] | None:
    """Log the published version when the recipe asks for it; returns where the run went ({"mlflow_run_id",
    "experiment", "uri"}), None when the recipe does not track or tracking failed."""
    cfg = recipe.tracking.mlflow
    if cfg is None:
        return None
    try:
        where = _log(cfg, recipe.name, version)
    except Exception as exc:  # noqa: BLE001 - a tracking server or store failing does not undo a release
        _failed(console, exc)
        return None
    console.print(
        f"tracking: mlflow run {where['mlflow_run_id']} (experiment '{where['experiment']}', {where['uri']}); "
        f"{where['model']}",
        highlight=False,
    )
    return where


def ensure_logged(recipe: Recipe, version: Path, console: Console) -> dict[str, str] | None:
    """For a deploy found up to date: the version's existing run, else the run logged now (an earlier deploy
    may have failed to log it); None when the recipe does not track or tracking failed."""
    cfg = recipe.tracking.mlflow
    if cfg is None:
        return None
    try:
        found = _existing_run(cfg, recipe.name, version)
    except Exception as exc:  # noqa: BLE001 - a store that cannot be searched is a tracking failure
        _failed(console, exc)
        return None
    if found is not None:
        console.print(
            f"tracking: not logged: up to date (run {found['mlflow_run_id']} of {version.name} stands)",
            highlight=False,
        )
        return found
    return log_run(recipe, version, console)


def _store(cfg: MlflowTracking, name: str) -> tuple[Any, str, str]:
    """An MLflow client of the recipe's store, its URI and the experiment's name."""
    from mlflow import MlflowClient

    uri = tracking_uri(cfg.uri)
    if uri.startswith("file:"):
        # MLflow 3 keeps the file store in maintenance mode and refuses it unless opted in; a recipe that
        # names a local path asks for exactly that store.
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    return MlflowClient(tracking_uri=uri), uri, cfg.experiment or name


def _existing_run(cfg: MlflowTracking, name: str, version: Path) -> dict[str, str] | None:
    client, uri, experiment_name = _store(cfg, name)
    experiment = client.get_experiment_by_name(experiment_name)
    if experiment is None:
        return None
    runs = client.search_runs(
        [experiment.experiment_id], filter_string=f"tags.`pipeline.version` = '{version.name}'"
    )
    path = str(version.resolve())
    for run in runs:
        if run.data.tags.get("pipeline.path") == path and run.info.status == "FINISHED":
            return {"mlflow_run_id": run.info.run_id, "experiment": experiment_name, "uri": uri}
    return None


def _log(cfg: MlflowTracking, name: str, version: Path) -> dict[str, str]:
    client, uri, experiment_name = _store(cfg, name)
    experiment = client.get_experiment_by_name(experiment_name)
    experiment_id = (
        experiment.experiment_id
        if experiment
        else client.create_experiment(experiment_name, artifact_location=_artifact_location(uri))
    )
    run = client.create_run(experiment_id, run_name=f"{name}/{version.name}", tags=tags(version))
    run_id = run.info.run_id
    try:
        model = _fill(client, run_id, version)
    except BaseException:
        client.set_terminated(run_id, status="FAILED")  # never left RUNNING by a failure half-way
        raise
    client.set_terminated(run_id, status="FINISHED")
    return {"mlflow_run_id": run_id, "experiment": experiment_name, "uri": uri, "model": model}


def _fill(client: Any, run_id: str, version: Path) -> str:
    """Params, metrics, files and the winner's model into the run; returns what became of the model."""
    from mlflow.entities import Metric, Param

    now = int(time.time() * 1000)
    recipe_params = flatten((_read(version / "manifest.json") or {}).get("recipe", {}))
    params = [Param(k, v) for k, v in recipe_params.items()]
    values = [Metric(k, v, now, 0) for k, v in metrics(version).items()]
    for chunk in _chunks(params, BATCH):
        client.log_batch(run_id, params=chunk)
    for chunk in _chunks(values, BATCH):
        client.log_batch(run_id, metrics=chunk)
    if (version / "reports").is_dir():
        client.log_artifacts(run_id, str(version / "reports"), "reports")
    for rel in SIGNOFF_FILES:
        if (version / rel).is_file():
            client.log_artifact(run_id, str(version / rel))
    return log_winner(client, run_id, version) if (version / "winner.json").is_file() else "no winner to log"


def _artifact_location(uri: str) -> str | None:
    """A sqlite store keeps its files beside the database (mlartifacts/), not in whatever folder the deploy was
    started from (MLflow's default for a database store); other stores choose their own."""
    if not uri.startswith("sqlite:///"):
        return None
    database = Path(uri.removeprefix("sqlite:///"))
    database = database if database.is_absolute() else Path.cwd() / database
    return (database.parent / "mlartifacts").resolve().as_uri()


def _chunks(items: list[Any], size: int) -> Iterator[list[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _read(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.is_file() else None


def _failed(console: Console, exc: Exception) -> None:
    console.print(
        f"[yellow]tracking failed[/yellow] (the release stands): {escape(f'{type(exc).__name__}: {exc}')}",
        highlight=False,
        markup=True,
    )
