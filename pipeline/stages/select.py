"""Selection: the fastest candidate (artifact on a runtime) that passed validation on that very runtime, by the
recipe's objective, and only when it beats the others by more than the noise (BENCHMARKING.md rule 9).

The noise is the 95% interval of the objective's own metric (p50, p90, p99 or mean), which the benchmark
computes from whole windows, so it reflects window-to-window drift. Among the candidates whose interval overlaps
the fastest's, the simplest wins (SIMPLICITY below), and the reason names every candidate it is tied with.
A winner whose measurement never stabilized is chosen provisionally and says so."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pipeline.accuracy import runtime_passed
from pipeline.recipe import Recipe
from pipeline.stages.base import ArtifactRecord, Output, RunContext, Stage, StageResult
from pipeline.store import write_json_atomic

# Simplicity, most simple first: fewer transformations between the trained model and what runs are simpler to
# trust and to operate. Artifacts: plain exports, then one transformation (optimizer or FP16), then two or a
# quantization, then compiled engines. Runtimes: the CPU, then the CUDA provider or device, then compilers and
# CUDA graphs. Ties are broken by the artifact first, then the runtime, then CUDA graphs, then host I/O.
ARTIFACT_SIMPLICITY = {
    "onnx-fp32": 1,
    "torchscript-fp32": 1,
    "onnx-optimized-fp32": 2,
    "onnx-fp16": 2,
    "onnx-optimized-fp16": 3,
    "onnx-int8-dynamic": 3,
    "onnx-int8": 3,
}
RUNTIME_SIMPLICITY = {
    "onnxruntime-cpu": 0,
    "torchscript-cpu": 0,
    "torch-cpu": 0,
    "onnxruntime-cuda": 1,
    "torchscript-cuda": 1,
    "torch-cuda": 1,
}
METRIC_INTERVAL = {"p50_ms": "p50", "p90_ms": "p90", "p99_ms": "p99", "mean_ms": "mean"}
BASELINES = ("onnx-fp32", "torchscript-fp32")  # what a release manager compares the winner's cost with


def simplicity(row: dict[str, Any]) -> tuple[int, int, int, int]:
    return (
        ARTIFACT_SIMPLICITY.get(row["artifact"], 4),
        RUNTIME_SIMPLICITY.get(row["runtime"], 2),
        int(bool(row.get("cuda_graph"))),
        int(row.get("io") != "host"),
    )


def interval(row: dict[str, Any], metric: str) -> tuple[float, float]:
    """The row's 95% interval of the objective's metric (a point when the benchmark gave none)."""
    key = METRIC_INTERVAL[metric]
    found = (row.get("ci95_ms") or {}).get(key)
    if found is None and key == "p50":
        found = row.get("p50_ci95_ms")
    if not found:
        return (row[metric], row[metric])
    return (float(found[0]), float(found[1]))


def overlap(a: dict[str, Any], b: dict[str, Any], metric: str) -> bool:
    (a0, a1), (b0, b1) = interval(a, metric), interval(b, metric)
    return a0 <= b1 and b0 <= a1


def objective_rows(recipe: Recipe, speed: dict[str, Any], accuracy: dict[str, Any]) -> list[dict[str, Any]]:
    """Benchmark rows at the objective's shape whose artifact passed validation on that row's runtime, within
    the recipe's constraints. A row without its own accuracy record is never a candidate."""
    obj, sel = recipe.selection.objective, recipe.selection
    entries = accuracy.get("artifacts", {})
    seq_dim = recipe.benchmark.sequence_dim
    rows = []
    for row in speed.get("results", []):
        if row["batch"] != obj.batch or not runtime_passed(entries.get(row["artifact"]), row["runtime"]):
            continue
        if obj.sequence_length is not None and seq_dim and _seq(row) != obj.sequence_length:
            continue
        if obj.io is not None and row["io"] != obj.io:
            continue
        if sel.runtimes and row["runtime"] not in sel.runtimes:
            continue
        if sel.max_p99_ms is not None and row["p99_ms"] > sel.max_p99_ms:
            continue
        rows.append(row)
    if obj.sequence_length is None and seq_dim:
        lengths = sorted({_seq(row) for row in rows} - {None})
        if lengths:
            rows = [r for r in rows if _seq(r) in (None, lengths[0])]
    return rows


def _seq(row: dict[str, Any]) -> int | None:
    if row.get("sequence_length") is not None:
        return row["sequence_length"]
    shapes = list((row.get("shapes") or {}).values())
    return shapes[0][1] if shapes and len(shapes[0]) > 1 else None


def _label(row: dict[str, Any]) -> str:
    io = "" if row["io"] == "host" else f", {row['io']} I/O"
    graph = ", CUDA graph" if row.get("cuda_graph") else ""
    return f"{row['artifact']} ({row['runtime']}{io}{graph})"


def _figure(row: dict[str, Any], metric: str) -> str:
    low, high = interval(row, metric)
    return f"{row[metric]:.3g} ms [{low:.3g}–{high:.3g}]"


def candidates(recipe: Recipe, speed: dict[str, Any], accuracy: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per artifact (its fastest passing runtime and I/O mode), fastest first."""
    metric = recipe.selection.objective.metric
    best: dict[str, dict[str, Any]] = {}
    for row in objective_rows(recipe, speed, accuracy):
        if row["artifact"] not in best or row[metric] < best[row["artifact"]][metric]:
            best[row["artifact"]] = row
    return sorted(best.values(), key=lambda r: (r[metric], simplicity(r)))


def choose(
    recipe: Recipe, speed: dict[str, Any], accuracy: dict[str, Any], files: dict[str, str] | None = None
) -> dict[str, Any] | None:
    """The winner as winner.json holds it, or None when no candidate exists."""
    metric = recipe.selection.objective.metric
    ranked = candidates(recipe, speed, accuracy)
    if not ranked:
        return None
    fastest = ranked[0]
    tied = [r for r in ranked if overlap(r, fastest, metric)]
    winner = min(tied, key=lambda r: (simplicity(r), r[metric]))
    within = [r for r in ranked if r is not winner and overlap(r, winner, metric)]
    others = [r for r in ranked if r is not winner]
    runner_up = others[0] if others else None
    reason = _reason(winner, fastest, within, runner_up, metric)
    provisional = not winner.get("stable", True)
    if provisional:
        why = winner.get("unstable_reason") or winner.get("stop_reason") or "no stable windows"
        reason += f"; provisional: winner did not stabilize ({why})"
    entries = accuracy.get("artifacts", {})
    baseline = next((r for r in ranked if r["artifact"] in BASELINES and r is not winner), None)
    return {
        "artifact": winner["artifact"],
        "file": (files or {}).get(winner["artifact"]),
        "runtime": winner["runtime"],
        "io": winner["io"],
        "cuda_graph": bool(winner.get("cuda_graph")),
        "objective": recipe.selection.objective.model_dump(),
        "value": winner[metric],
        "unit": "ms",
        "interval": list(interval(winner, metric)),
        "p50_ci95_ms": winner.get("p50_ci95_ms"),
        "shapes": winner.get("shapes"),
        "stable": bool(winner.get("stable", True)),
        "provisional": provisional,
        "accuracy": accuracy_record(entries.get(winner["artifact"]), winner),
        "runner_up": _peer(runner_up, metric, entries),
        "baseline": _peer(baseline, metric, entries),
        "within_noise_of": [_label(r) for r in within],
        "reason": reason,
    }


def _peer(row: dict[str, Any] | None, metric: str, entries: dict[str, Any]) -> dict[str, Any] | None:
    if row is None:
        return None
    return {
        "artifact": row["artifact"],
        "runtime": row["runtime"],
        "io": row["io"],
        "value": row[metric],
        "interval": list(interval(row, metric)),
        "accuracy": accuracy_record(entries.get(row["artifact"]), row)["figures"],
    }


def accuracy_record(entry: dict[str, Any] | None, row: dict[str, Any]) -> dict[str, Any]:
    """Where the candidate's own accuracy record is, and per metric its worst figure on that runtime: among
    the checks that gate when there are any (as the accuracy table shows it), else the informational ones."""
    runtime = row["runtime"]
    checks = [c for c in (entry or {}).get("checks", []) if c.get("runtime", runtime) == runtime]
    figures: dict[str, float] = {}
    gating: set[str] = set()
    for check in checks:
        value, metric = check.get("value"), check.get("metric")
        if not isinstance(value, int | float) or metric in ("finite", "comparable"):
            continue
        required = not check.get("informational")
        if metric in gating and not required:
            continue
        if required and metric not in gating:
            gating.add(metric)
            figures.pop(metric, None)
        worse = min if metric in ("cosine", "neighbours") else max
        figures[metric] = worse(figures.get(metric, value), value)
    return {
        "runtime": runtime,
        "passed": runtime_passed(entry, runtime),
        "record": f"reports/accuracy.json: artifacts.{row['artifact']}.runtimes.{runtime}",
        "figures": figures,
    }


def _reason(
    winner: dict[str, Any],
    fastest: dict[str, Any],
    within: list[dict[str, Any]],
    runner_up: dict[str, Any] | None,
    metric: str,
) -> str:
    name = METRIC_INTERVAL[metric]
    if runner_up is None:
        return "the only candidate that passed validation on its runtime with a measurement at the objective's shape"
    if not within:
        return (
            f"fastest by {name}: {_figure(winner, metric)} vs {_figure(runner_up, metric)} for "
            f"{_label(runner_up)}; the 95% intervals do not overlap"
        )
    tied = ", ".join(f"{_label(r)} {_figure(r, metric)}" for r in within)
    if winner is fastest:
        return (
            f"fastest by {name} at {_figure(winner, metric)}, but within noise of {tied} (95% intervals "
            "overlap); it is also the simplest of these, so it is chosen"
        )
    return (
        f"{_label(fastest)} measured {_figure(fastest, metric)}, within noise of {_label(winner)} at "
        f"{_figure(winner, metric)} (95% intervals overlap); the simplest of the tied candidates is chosen "
        f"(within noise of the winner: {tied})"
    )


def selection_problems(accuracy: dict[str, Any], winner: dict[str, Any] | None) -> list[str]:
    """Why nothing can be signed off from selection's side (empty when a winner exists)."""
    if winner is not None:
        return []
    entries = accuracy.get("artifacts", {})
    if not any(
        e.get("passed") or any(r.get("passed") for r in e.get("runtimes", {}).values())
        for e in entries.values()
    ):
        return ["no artifact passed validation"]
    return [
        "no artifact that passed validation on its runtime has a benchmark at the objective's shape within constraints"
    ]


def stage(recipe: Recipe, recipe_dir: Path, artifacts: list[str]) -> Stage:
    def run(ctx: RunContext, inputs: dict[str, ArtifactRecord]) -> StageResult:
        accuracy = json.loads(inputs["report:accuracy"].path.read_text())
        speed = json.loads(inputs["report:speed"].path.read_text())
        files = {
            name: record.path.relative_to(ctx.workdir).as_posix()
            for name, record in inputs.items()
            if not name.startswith("report:") and record.path.is_relative_to(ctx.workdir)
        }
        winner = choose(recipe, speed, accuracy, files)
        reasons = selection_problems(accuracy, winner)
        write_json_atomic(ctx.path("reports/selection.json"), {"reasons": reasons, "winner": winner})
        outputs = [Output("reports/selection.json", "report", "report:selection")]
        return StageResult(outputs, {"winner": winner["artifact"] if winner else None, "reasons": reasons})

    return Stage(
        name="select",
        version=2,  # 2: per-runtime accuracy, the objective metric's own interval, the simplest of the tied
        run=run,
        config={
            "selection": recipe.selection.model_dump(exclude={"regression"}),  # compare's budget, not ours
            # read by the verdict that follows: a change must make a new version, not "up to date"
            "verdict": {
                "required": list(recipe.variants.required),
                "allow_failed": recipe.variants.allow_failed,
            },
        },
        consumes=("report:accuracy", "report:speed"),
        consumes_any=tuple(artifacts),
        produces=("report:selection",),
        critical=True,
    )
