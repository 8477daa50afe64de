"""The sign-off stage, the last of the plan: the verdict from what ran, the human reports, winner.json (when
signed off), the resolved recipe, reproduce.sh and the Triton repository. It hands the verdict and the
report's header on in memory; the deploy writes manifest.json from them, last of all (pipeline/release/manifest.py)."""

from __future__ import annotations

import os
import shlex
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import yaml

from pipeline.check.results import REPORTS, AccuracyReport, Selection, SpeedReport
from pipeline.core.artifacts import ArtifactRecord
from pipeline.core.files import write_json_atomic, write_text_atomic
from pipeline.core.variants import FORMATS
from pipeline.decide.verdict import (
    SignOff,
    Verdict,
    branch_warnings,
    decide,
    shape_warnings,
    stage_warnings,
    variant_failures,
)
from pipeline.inputs.specs import resolved_variant
from pipeline.recipe import Recipe
from pipeline.release.store import read_json, verify_folder
from pipeline.release.triton import ServingSpec, config_problems, write_model_repository
from pipeline.stages import benchmark
from pipeline.stages.base import RUN_STAGES, Output, Release, RunContext, Stage, StageConfig, StageResult
from pipeline.stages.record import StageRecord

VERSION = 1
VERDICT = "signoff"  # the name the verdict is handed on by


class SignoffConfig(StageConfig):
    requested: list[str]  # variants.build, as the contract's artifact names
    required: list[str]
    allow_failed: bool
    serving: ServingSpec  # export.triton and what its configuration is written from

    @classmethod
    def from_recipe(cls, recipe: Recipe) -> SignoffConfig:
        return cls(
            requested=[resolved_variant(recipe, v).name for v in recipe.variants.build],
            required=[resolved_variant(recipe, v).name for v in recipe.variants.required],
            allow_failed=recipe.variants.allow_failed,
            serving=ServingSpec.from_recipe(recipe),
        )


def artifacts(records: list[StageRecord]) -> list[dict[str, Any]]:
    """The deployable artifacts of the run, as manifest.json lists them."""
    return [
        {
            "name": out["artifact"],
            "path": out["path"],
            "kind": out["kind"],
            "precision": out.get("precision"),
            "stage": r.name,
            "fingerprint": r.fingerprint,
            "sha256": out["sha256"],
            "bytes": out["bytes"],
            "details": out.get("details", {}),
        }
        for r in records
        for out in r.outputs
        if out.get("kind") in FORMATS and out.get("artifact")
    ]


def judge(
    config: SignoffConfig,
    records: list[StageRecord],
    accuracy: AccuracyReport | None,
    speed: SpeedReport | None,
    selection: Selection | None,
) -> Verdict:
    """The verdict from what ran: requested and required variants, their failures, the selection, and the
    warnings the validation and the exports raised."""
    failures = variant_failures(config.requested, records, accuracy, speed)
    built = [out["artifact"] for r in records for out in r.outputs if out.get("kind") in FORMATS]
    warnings = [
        *((accuracy or {}).get("warnings") or []),
        *shape_warnings(records, built),
        *branch_warnings(records, failures),
        *stage_warnings(records),
        *_padding_warnings(speed, selection),
    ]
    chosen = selection or {"reasons": ["selection did not run"], "winner": None}
    return decide(config.requested, config.required, config.allow_failed, failures, chosen, warnings)


def _padding_warnings(speed: SpeedReport | None, selection: Selection | None) -> list[str]:
    """A padded row that beat its padding-aware twin at the winner's shape: the graphs whose padded rows were left
    out on the opposite evidence may be faster than the winner (a flag at another shape is the Flags section's)."""
    winner = (selection or {}).get("winner") or {}
    return [
        f"the winner may not be the fastest graph: {flag['message']}"
        for flag in (speed or {}).get("flags") or []
        if isinstance(flag, dict)
        and flag.get("kind") == "padding_aware_slower"
        and flag.get("shapes") == winner.get("shapes")
    ]


def reproduce_script(release: Release, final: Path) -> str:
    """A script that re-runs this deploy on any machine with the project checkout and the recipe: it runs
    from $REPO (default: the folder the deploy ran from, relative to the version folder `final`), with the
    recipe and overrides as given, into the store that holds this version (wherever that now lies). It
    records what the deploy ran with besides the recipe: the interpreter, the working directory and the
    PYTHONPATH (an entrypoint model's module may be importable only through them)."""
    cwd = release.started_in
    repo = os.path.relpath(cwd, final.resolve())
    recipe = (cwd / release.recipe_path).resolve()  # an absolute path stays absolute
    if recipe.is_relative_to(cwd):  # a recipe outside the checkout stays where it is
        recipe = recipe.relative_to(cwd)
    kept = [o for o in release.overrides if o.partition("=")[0].strip() != "output.root"]  # set below
    overrides = "".join(f" --set {shlex.quote(o)}" for o in kept)
    python_path = os.environ.get("PYTHONPATH", "")
    return (
        "#!/usr/bin/env sh\n"
        "# Re-runs this deploy: the same recipe and --set overrides, from the project checkout, into the store that\n"
        "# holds this version, so fresh stages are reused (pass --rebench to measure again). Same code: git checkout\n"
        "# the manifest's git_revision. REPO: the checkout (default: where the deploy ran, relative to this folder,\n"
        "# else the recorded working directory); PYTHON: the interpreter (default: the one the deploy ran with when\n"
        "# it exists here, else the checkout's .venv, else python3); PYTHONPATH: as the deploy had it unless set.\n"
        "set -eu\n"
        f"DEPLOYED_PYTHON={shlex.quote(sys.executable)}\n"
        f"DEPLOYED_CWD={shlex.quote(str(cwd))}\n"
        f"DEPLOYED_PYTHONPATH={shlex.quote(python_path)}\n"
        'here=$(cd "$(dirname "$0")" && pwd)\n'
        f'repo="${{REPO:-$here/{repo}}}"\n'
        'if [ -z "${REPO:-}" ] && [ ! -d "$repo" ]; then repo="$DEPLOYED_CWD"; fi\n'
        'cd "$repo"\n'
        'export PYTHONPATH="${PYTHONPATH-$DEPLOYED_PYTHONPATH}"\n'
        'if [ -z "${PYTHON:-}" ]; then\n'
        '  if [ -x "$DEPLOYED_PYTHON" ]; then PYTHON="$DEPLOYED_PYTHON"\n'
        "  elif [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi\n"
        "fi\n"
        f'exec "$PYTHON" -m pipeline deploy {shlex.quote(str(recipe))}{overrides} --set "output.root=$here/../.." "$@"\n'
    )


def _previous(folder: Path | None) -> dict[str, Any] | None:
    """The latest version's reports, for the report's "changes since"; none from a damaged version (its
    reports could say anything: the deploy builds as if there were no latest)."""
    if folder is None or verify_folder(folder):
        return None
    return {
        "version": folder.name,
        "accuracy": read_json(folder / REPORTS["report:accuracy"]),
        "speed": read_json(folder / REPORTS["report:speed"]),
        "winner": read_json(folder / "winner.json"),
    }


def _run(ctx: RunContext, config: SignoffConfig, inputs: dict[str, ArtifactRecord]) -> StageResult:
    from pipeline.bench.environment import capture_environment
    from pipeline.release.provenance import git_dirty, git_revision
    from pipeline.report import write_signoff as render

    release = ctx.release
    assert release is not None, "sign-off runs in a deploy, which says what it releases"
    workdir = ctx.workdir
    records: list[StageRecord] = inputs[RUN_STAGES].value
    found = {name: inputs[name].report() if name in inputs else None for name in REPORTS}
    accuracy, speed, selection = found["report:accuracy"], found["report:speed"], found["report:selection"]
    verdict = judge(config, records, accuracy, speed, selection)
    winner = (selection or {}).get("winner") if verdict.signed_off else None
    if winner:
        write_json_atomic(workdir / "winner.json", winner)
    header = {
        "name": config.serving.name,
        "version": release.version,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "signed_off": verdict.signed_off,
        "signoff_reasons": verdict.reasons,
        "headline": verdict.headline(),
        "provisional": verdict.provisional,
        "requested": verdict.requested,
        "failed": [f.to_json() for f in verdict.failures],
        "warnings": verdict.warnings,
        "git_revision": git_revision(),
        "git_dirty": git_dirty(),
        "environment": capture_environment(),
        "artifacts": artifacts(records),
        "benchmark_reused_from": next(
            (r.reused_from for r in records if r.name == benchmark.NAME and r.status == "reused"), None
        ),
    }
    write_text_atomic(workdir / "recipe.yaml", yaml.safe_dump(release.recipe, sort_keys=False))
    script = workdir / "reproduce.sh"
    write_text_atomic(script, reproduce_script(release, release.folder))
    script.chmod(0o755)
    empty_speed = {"schema_version": 1, "results": [], "not_run": []}
    write_model_repository(
        workdir, config.serving, winner, header["artifacts"], speed or empty_speed, release.version
    )
    unloadable = config_problems(workdir)
    if unloadable:  # the pipeline wrote a configuration Triton refuses: a bug, never a signed-off release
        raise RuntimeError(f"the Triton model repository written is not loadable: {'; '.join(unloadable)}")
    table = [asdict(r) for r in [*records, StageRecord("signoff", VERSION, None, "ran", {}, {}, {})]]
    written = render(
        workdir,
        header,
        accuracy or {"schema_version": 1, "artifacts": {}, "not_run": []},
        speed or empty_speed,
        winner,
        table,
        _previous(release.previous),
        found["report:load"],
    )
    return StageResult(
        outputs=[Output(path, "report") for path in written],
        details={"signed_off": verdict.signed_off, "reasons": verdict.reasons},
        values={VERDICT: SignOff(verdict, header, winner)},
    )


def stage(recipe: Recipe, recipe_dir: Path, artifacts: list[str]) -> Stage:
    """Sign-off over whatever was built, validated, measured and selected, and the run record so far."""
    return Stage(
        name="signoff",
        version=VERSION,
        config=SignoffConfig.from_recipe(recipe),
        run=_run,
        consumes_any=(*artifacts, *REPORTS, RUN_STAGES),
        critical=True,
        final=True,
    )
