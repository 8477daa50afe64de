"""What validation, the benchmark and selection hand on: the JSON shapes of reports/accuracy.json,
reports/speed.json and reports/selection.json (winner.json) as the stages write them.

The reports are plain JSON-ready dicts with declared keys (the contract's keys are required, the rest optional,
more may be added), so a stage hands them on in memory by declared name (pipeline/run/executor.py) and each is
written as JSON once, by the stage that makes it. A report is parsed from its file only when its stage was reused
from an earlier version (`read_report`). Readers never index those dicts: they read speed rows as `Timing`s
(check/timings.py), accuracy entries as `AccuracyRecord`s (check/verdicts.py) and load.json's rows as
`ServedRate`s (check/served.py), so a key is spelled, defaulted and typed in one place."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict

if TYPE_CHECKING:
    from pipeline.check.accuracy import ArtifactAccuracy

Row = Mapping[str, Any]


class SpeedRow(TypedDict):
    """One (artifact, runtime, io, shapes) measurement (docs/benchmarking.md rule 6)."""

    artifact: str
    runtime: str
    io: str
    batch: int
    shapes: dict[str, list[int]]
    n: int
    mean_ms: float
    p50_ms: float
    p90_ms: float
    p95_ms: float
    p99_ms: float
    min_ms: float
    max_ms: float
    cv: float
    p50_ci95_ms: list[float]
    stable: bool
    precision: NotRequired[str | None]
    sequence_length: NotRequired[int | None]
    ci95_ms: NotRequired[dict[str, list[float]]]
    cuda_graph: NotRequired[bool]
    stop_reason: NotRequired[str]
    unstable_reason: NotRequired[str | None]


class SpeedReport(TypedDict):
    schema_version: int
    conditions: dict[str, Any]
    results: list[SpeedRow]
    not_run: list[dict[str, str]]
    failed: NotRequired[list[dict[str, Any]]]
    flags: NotRequired[list[dict[str, Any]]]


class AccuracyEntry(TypedDict):
    """One artifact in accuracy.json: passed on every runtime, and each runtime's own record."""

    passed: bool
    reason: str | None
    precision: str | None
    runtime: str | None
    checks: list[dict[str, Any]]
    runtimes: NotRequired[dict[str, dict[str, Any]]]


class AccuracyReport(TypedDict):
    schema_version: int
    reference: str
    artifacts: dict[str, AccuracyEntry]
    not_run: list[dict[str, str]]
    reference_runtime: NotRequired[str | None]
    warnings: NotRequired[list[str]]
    inputs: NotRequired[dict[str, Any]]  # per input: the values validation covered (min, max, distinct)


class Winner(TypedDict):
    """winner.json: what to ship, how it was chosen, and the accuracy record it passed."""

    artifact: str
    runtime: str
    io: str
    objective: dict[str, Any]
    value: float
    unit: str
    runner_up: dict[str, Any] | None
    reason: str
    file: NotRequired[str | None]
    cuda_graph: NotRequired[bool]
    interval: NotRequired[list[float]]
    shapes: NotRequired[dict[str, list[int]] | None]
    stable: NotRequired[bool]
    provisional: NotRequired[bool]
    accuracy: NotRequired[dict[str, Any]]
    baseline: NotRequired[dict[str, Any] | None]
    within_noise_of: NotRequired[list[str]]
    single_stream: NotRequired[dict[str, Any] | None]  # under max_qps_at_p99: the fastest single request


class Selection(TypedDict):
    """reports/selection.json: the winner, or the reasons there is none."""

    reasons: list[str]
    winner: Winner | None


class EngineDetails(TypedDict, total=False):
    """What an engine stage records about its build, read by the runner that decides where it can run."""

    flavour: str
    trt_version: str | None
    compute_capabilities: list[str]
    profiles: list[dict[str, list[list[int]]]]
    optimization_level: int
    build_s: float
    layer_count: int
    layers_source: str


def artifact_entry(results: list[ArtifactAccuracy]) -> AccuracyEntry:
    """One artifact's accuracy.json entry from its record on each runtime it was validated on.

    `passed` holds when every required check on every runtime passed (the contract's meaning); `runtimes`
    keeps each runtime's own verdict, which is what selection reads: a benchmark row can only win on a
    runtime whose record passed. Every check names its runtime."""
    first = results[0]
    failing = [r for r in results if not r]
    reason = None
    if failing:
        reason = failing[0].reason
        if len(results) > 1:
            reason = f"on {failing[0].runtime}: {reason}"
    return {
        "passed": not failing,
        "reason": reason,
        "precision": first.precision,
        "runtime": first.runtime,
        "runtimes": {
            r.runtime: {"passed": r.passed, "reason": r.reason, **r.details} for r in results if r.runtime
        },
        "checks": [{**c.to_json(), "runtime": r.runtime} for r in results for c in r.checks],
    }


def as_number(found: Any) -> float | None:
    """A JSON figure as a float (NaN kept: a check can measure NaN); None when absent or not a number."""
    return float(found) if isinstance(found, int | float) and not isinstance(found, bool) else None


def as_text(found: Any) -> str | None:
    return None if found is None else str(found)


REPORTS = {  # declared name -> the file its stage writes
    "report:accuracy": "reports/accuracy.json",
    "report:speed": "reports/speed.json",
    "report:selection": "reports/selection.json",
    "report:matrix": "reports/matrix.json",  # pipeline/bench/matrix.py: what is validated and timed
    "report:load": "reports/load.json",  # pipeline/stages/load.py: the server scenario's rates at the p99 target
}
