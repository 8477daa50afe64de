"""Selection: the fastest artifact that passed validation, by the recipe's objective, and only when it beats
the runner-up by more than the noise (BENCHMARKING.md rule 9); otherwise the simpler artifact wins."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pipeline.recipe import Recipe
from pipeline.stages.base import ArtifactRecord, Output, RunContext, Stage, StageResult
from pipeline.store import write_json_atomic

# Fewer transformations between the trained model and the artifact = simpler to trust and to operate.
SIMPLICITY = {
    "onnx-fp32": 1,
    "torchscript-fp32": 1,
    "onnx-optimized-fp32": 2,
    "onnx-fp16": 2,
    "onnx-int8-dynamic": 3,
    "onnx-optimized-fp16": 3,
    "onnx-int8": 3,
}


def simplicity(artifact: str) -> int:
    return SIMPLICITY.get(artifact, 4)


def objective_rows(recipe: Recipe, speed: dict[str, Any], accuracy: dict[str, Any]) -> list[dict[str, Any]]:
    """Benchmark rows at the objective's shape for artifacts that passed validation and meet constraints."""
    obj, sel = recipe.selection.objective, recipe.selection
    passed = {name for name, a in accuracy.get("artifacts", {}).items() if a.get("passed")}
    seq_dim = recipe.benchmark.sequence_dim
    rows = []
    for row in speed.get("results", []):
        if row["artifact"] not in passed or row["batch"] != obj.batch:
            continue
        if obj.sequence_length is not None and seq_dim and _seq(row, seq_dim) != obj.sequence_length:
            continue
        if sel.runtimes and row["runtime"] not in sel.runtimes:
            continue
        if sel.max_p99_ms is not None and row["p99_ms"] > sel.max_p99_ms:
            continue
        rows.append(row)
    if obj.sequence_length is None and seq_dim:
        lengths = sorted({_seq(row, seq_dim) for row in rows} - {None})
        if lengths:
            rows = [r for r in rows if _seq(r, seq_dim) in (None, lengths[0])]
    return rows


def _seq(row: dict[str, Any], seq_dim: str) -> int | None:
    if row.get("sequence_length") is not None:
        return row["sequence_length"]
    shapes = list((row.get("shapes") or {}).values())
    return shapes[0][1] if shapes and len(shapes[0]) > 1 else None


def choose(recipe: Recipe, speed: dict[str, Any], accuracy: dict[str, Any]) -> dict[str, Any] | None:
    metric = recipe.selection.objective.metric
    best: dict[str, dict[str, Any]] = {}
    for row in objective_rows(recipe, speed, accuracy):
        if row["artifact"] not in best or row[metric] < best[row["artifact"]][metric]:
            best[row["artifact"]] = row
    ranked = sorted(best.values(), key=lambda r: r[metric])
    if not ranked:
        return None
    fastest = ranked[0]
    tied = [r for r in ranked if _overlap(r, fastest)]
    winner = min(tied, key=lambda r: (simplicity(r["artifact"]), r[metric]))
    others = [r for r in ranked if r is not winner]
    runner_up = others[0] if others else None
    objective = recipe.selection.objective.model_dump()
    if winner is fastest and runner_up is None:
        reason = "the only artifact that passed validation and has a measurement at the objective's shape"
    elif winner is fastest:
        reason = (
            f"fastest by {metric} ({winner[metric]:.3g} ms vs {runner_up[metric]:.3g} ms for {runner_up['artifact']}), "
            "median confidence intervals do not overlap"
        )
    else:
        reason = (
            f"{fastest['artifact']} measured {fastest[metric]:.3g} ms but its median confidence interval overlaps "
            f"{winner['artifact']}'s ({winner[metric]:.3g} ms): within the noise, the simpler artifact is preferred"
        )
    if not winner.get("stable", True):
        reason += "; note: the winner's measurement did not stabilize"
    return {
        "artifact": winner["artifact"],
        "runtime": winner["runtime"],
        "io": winner["io"],
        "objective": objective,
        "value": winner[metric],
        "unit": "ms",
        "p50_ci95_ms": winner.get("p50_ci95_ms"),
        "shapes": winner.get("shapes"),
        "runner_up": {
            "artifact": runner_up["artifact"],
            "runtime": runner_up["runtime"],
            "value": runner_up[metric],
        }
        if runner_up
        else None,
        "reason": reason,
    }


def _overlap(a: dict[str, Any], b: dict[str, Any]) -> bool:
    ca, cb = a.get("p50_ci95_ms"), b.get("p50_ci95_ms")
    if not ca or not cb:
        return a is b
    return ca[0] <= cb[1] and cb[0] <= ca[1]


def signoff_verdict(
    recipe: Recipe, accuracy: dict[str, Any], winner: dict[str, Any] | None, artifact_of: dict[str, str]
) -> list[str]:
    """Reasons the release cannot be signed off (empty: signed off)."""
    reasons = []
    results = accuracy.get("artifacts", {})
    not_run = {n["artifact"]: n["reason"] for n in accuracy.get("not_run", [])}
    for variant in recipe.variants.required:
        name = artifact_of.get(variant, variant)
        if name in results and not results[name]["passed"]:
            reasons.append(f"required variant {name} failed validation: {results[name].get('reason')}")
        elif name not in results and name not in not_run:
            reasons.append(f"required variant {name} was not built")
    if not any(a.get("passed") for a in results.values()):
        reasons.append("no artifact passed validation")
    elif winner is None:
        reasons.append(
            "no artifact that passed validation has a benchmark at the objective's shape within constraints"
        )
    return reasons


def stage(recipe: Recipe, recipe_dir: Path, artifacts: list[str]) -> Stage:
    from pipeline.stages import artifact_name

    artifact_of = {v: artifact_name(v, recipe) for v in recipe.variants.build}

    def run(ctx: RunContext, inputs: dict[str, ArtifactRecord]) -> StageResult:
        accuracy = json.loads(inputs["report:accuracy"].path.read_text())
        speed = json.loads(inputs["report:speed"].path.read_text())
        winner = choose(recipe, speed, accuracy)
        reasons = signoff_verdict(recipe, accuracy, winner, artifact_of)
        write_json_atomic(
            ctx.path("reports/selection.json"),
            {"signed_off": not reasons, "reasons": reasons, "winner": winner},
        )
        outputs = [Output("reports/selection.json", "report", "report:selection")]
        if winner and not reasons:
            write_json_atomic(ctx.path("winner.json"), winner)
            outputs.append(Output("winner.json", "report", "report:winner"))
        return StageResult(outputs, {"signed_off": not reasons, "reasons": reasons})

    return Stage(
        name="select",
        version=1,
        run=run,
        config={
            "selection": recipe.selection.model_dump(),
            "required": [artifact_of.get(v, v) for v in recipe.variants.required],
        },
        consumes=("report:accuracy", "report:speed"),
        produces=("report:selection", "report:winner"),
        critical=True,
    )
