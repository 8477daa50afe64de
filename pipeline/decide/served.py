"""Selection by served rate (objective max_qps_at_p99): the candidate of MLPerf's Server scenario that serves the
most requests/s within the p99 target, chosen by the rule every objective follows (docs/benchmarking.md rule 9):
only beyond the noise (the 95% intervals over repeated LoadGen runs do not overlap), else the simplest of the
candidates within noise of the best that no simpler candidate serving more beats. The load stage ran only
candidates that passed validation on their runtime, and this checks again. A target no candidate meets signs off
nothing: the reasons say by how much each missed.

A rate whose search never saw a run fail is a lower bound (≥): it competes with the figure it has, and the reason
says so, since the candidate may serve more."""

from __future__ import annotations

from typing import Any

from pipeline.check.results import Row, Winner
from pipeline.check.served import ServedRate, served_rates
from pipeline.check.speed import SERVED, fmt_qps, overlap, unit_of
from pipeline.check.timings import Timing, timings
from pipeline.check.verdicts import AccuracyRecord, records
from pipeline.decide.selection import (
    BASELINES,
    Named,
    SelectionPolicy,
    TieRule,
    accuracy_record,
    candidates,
    set_aside_sentence,
    simplest_unbeaten,
    simplicity_of,
    tie_reason,
)


def served_candidates(policy: SelectionPolicy, load: Row | None, accuracy: Row) -> list[ServedRate]:
    """load.json's rows with a rate within the target, on a runtime their artifact passed validation on and
    selection allows, most served first."""
    entries = records(accuracy)
    found = [
        row
        for row in served_rates(load)
        if row.max_qps is not None
        and (entry := entries.get(row.artifact)) is not None
        and entry.passed_on(row.runtime)
        and (not policy.runtimes or row.runtime in policy.runtimes)
    ]
    return sorted(found, key=lambda r: (-(r.max_qps or 0.0), _simplicity(r)))


def choose_served(
    policy: SelectionPolicy, load: Row | None, speed: Row, accuracy: Row, files: dict[str, str] | None = None
) -> Winner | None:
    """The winner as winner.json holds it, or None when no candidate held the target."""
    ranked = served_candidates(policy, load, accuracy)
    if not ranked:
        return None
    best = ranked[0]
    overlapping = [r for r in ranked if overlap(_interval(r), _interval(best))]
    winner, noise, beaten = simplest_unbeaten(overlapping, ranked, _RULE)
    within = [r for r in noise if r is not winner]
    others = [r for r in ranked if r is not winner]
    entries = records(accuracy)
    stable = _held_every_run(winner)
    reason = _reason(winner, best, within, others[0] if others else None, beaten)
    if not stable:
        reason += f"; provisional: {winner.held} of {winner.repeats} runs at that rate held the target"
    row = _speed_row(policy, speed, winner)
    p50_ci = row.interval("p50_ms") if row else None
    return {
        "artifact": winner.artifact,
        "file": (files or {}).get(winner.artifact),
        "runtime": winner.runtime,
        "io": winner.io,
        "cuda_graph": False,
        "objective": policy.objective.model_dump(),
        "value": winner.max_qps or 0.0,
        "unit": unit_of(SERVED),
        "interval": list(_interval(winner)),
        "p50_ci95_ms": list(p50_ci) if p50_ci else None,
        "shapes": None,
        "stable": stable,
        "provisional": not stable,
        "accuracy": accuracy_record(entries.get(winner.artifact), winner.artifact, winner.runtime),
        "runner_up": _peer(others[0] if others else None, entries),
        "baseline": _peer(next((r for r in others if r.artifact in BASELINES), None), entries),
        "within_noise_of": [r.label for r in within],
        "reason": reason,
        "single_stream": _single_stream(policy, speed, accuracy, winner),
    }


def served_problems(load: Row | None, accuracy: Row, winner: Row | None) -> list[str]:
    """Why nothing can be signed off by served rate: every candidate's miss (empty when a winner exists)."""
    if winner is not None:
        return []
    if not any(entry.passed_anywhere for entry in records(accuracy).values()):
        return ["no artifact passed validation"]
    rows = served_rates(load)
    if not rows:
        return [
            "the server scenario ran no candidate: no artifact that passed validation has a host-I/O runner here"
        ]
    misses = "; ".join(f"{r.label}: {r.error or r.missed or 'no rate held the target'}" for r in rows)
    return [f"no candidate served the p99 target of {_target(rows[0])} at any rate: {misses}"]


def _target(row: ServedRate) -> str:
    return f"{row.p99_target_ms:g} ms" if row.p99_target_ms is not None else "? ms"  # load.json always says


def _simplicity(row: ServedRate) -> tuple[int, int, int, int]:
    return simplicity_of(row.artifact, row.runtime)


def _interval(row: ServedRate) -> tuple[float, float]:
    value = row.max_qps or 0.0
    return row.ci95 or (value, value)


def _figure(row: ServedRate) -> str:
    low, high = _interval(row)
    bound = "≥ " if row.bounded else ""
    return f"{bound}{fmt_qps(row.max_qps)} requests/s [{fmt_qps(low)}–{fmt_qps(high)}]"


def _held_every_run(row: ServedRate) -> bool:
    return row.held is not None and row.held == row.repeats


# rule 9 on served rates: the most served ranks first, and a rate that held in every confirming run is settled
_RULE: TieRule[ServedRate] = TieRule(_simplicity, lambda r: -(r.max_qps or 0.0), _held_every_run)


def _reason(
    winner: ServedRate,
    best: ServedRate,
    within: list[ServedRate],
    runner_up: ServedRate | None,
    beaten: list[tuple[ServedRate, ServedRate]],
) -> str:
    target = f"p99 ≤ {_target(winner)}"
    bound = " (≥: its search never saw a rate fail, so it may serve more)" if winner.bounded else ""
    if runner_up is None:
        return f"the only candidate that served the target ({target}): {_figure(winner)}{bound}"
    lead = f"serves the most within {target}"
    found = (
        tie_reason(
            lead,
            _named(winner),
            _named(best),
            [_named(r) for r in within],
            _named(runner_up),
            "served",
            "best",
        )
        if within or not beaten
        else None
    )
    if beaten:
        aside = [
            f"{r.label} {_figure(r)} (beaten by the simpler {s.label} at {_figure(s)})" for r, s in beaten
        ]
        found = set_aside_sentence(lead, _named(winner), found, aside, "best")
    return f"{found}{bound}"


def _named(row: ServedRate) -> Named:
    return Named(row.label, _figure(row))


def _speed_row(policy: SelectionPolicy, speed: Row, winner: ServedRate) -> Timing | None:
    """The winner's single-stream row at the objective's batch on its host-I/O runtime (its p50 interval)."""
    return next(
        (
            r
            for r in timings(speed)
            if (r.artifact, r.runtime, r.io, r.cuda_graph) == (winner.artifact, winner.runtime, "host", False)
            and r.batch == policy.objective.batch
        ),
        None,
    )


def _single_stream(
    policy: SelectionPolicy, speed: Row, accuracy: Row, winner: ServedRate
) -> dict[str, Any] | None:
    """The fastest candidate by single-stream p50 at the objective's batch, for the sign-off's sentence on whether
    the fastest single request also serves the most."""
    ranked = candidates(policy.by_p50(), speed, accuracy)
    if not ranked:
        return None
    first = ranked[0]
    return {
        "artifact": first.artifact,
        "runtime": first.runtime,
        "io": first.io,
        "cuda_graph": first.cuda_graph,
        "p50_ms": first.p50_ms,
        "same": (first.artifact, first.runtime) == (winner.artifact, winner.runtime),
        "label": first.label,
    }


def _peer(row: ServedRate | None, entries: dict[str, AccuracyRecord]) -> dict[str, Any] | None:
    if row is None:
        return None
    return {
        "artifact": row.artifact,
        "runtime": row.runtime,
        "io": row.io,
        "value": row.max_qps,
        "interval": list(_interval(row)),
        "accuracy": accuracy_record(entries.get(row.artifact), row.artifact, row.runtime)["figures"],
    }
