"""Selection: the best candidate (artifact on a runtime) that passed validation on that very runtime, by the
recipe's objective, and only when it beats the others by more than the noise (docs/benchmarking.md rule 9).

The objective is a latency statistic (p50, p90, p99 or mean: the lowest wins) or throughput (sequences/s from
the benchmark's throughput run: the highest wins). The noise is the 95% interval of that metric: for latency
the benchmark computes it from whole windows, so it reflects window-to-window drift; for throughput from the
throughput run's segments. Among the candidates whose interval overlaps the best's, the simplest wins
(`simplicity`: fewer transformations of the artifact, then simpler runtimes), and the reason names every
candidate within noise of the best; a candidate whose measurement never settled ties with a settled best only
by being it (`_tie_group`), and one a simpler, better candidate beats does not win for its simplicity
(`beaten_by_simpler`). A winner whose measurement never stabilized is chosen provisionally and says so.
The select stage chooses, once; the benchmark only asks which rows contend with an unstable would-be winner
(`unsettled_contenders`), to measure them again before selection sees them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, NamedTuple, TypeVar

from pydantic import BaseModel, ConfigDict

from pipeline.check.accuracy import LOWER_BOUNDS
from pipeline.check.results import Row, Winner
from pipeline.check.speed import fmt_ms, fmt_rate, maximized, metric_name, overlap, unit_of
from pipeline.check.timings import Timing, timings
from pipeline.check.verdicts import AccuracyRecord, records
from pipeline.core.variants import PLAIN_EXPORTS, parse
from pipeline.recipe import Objective, Recipe
from pipeline.runners import registry

T = TypeVar("T")


class SelectionPolicy(BaseModel):
    """What selection reads of the recipe: the objective, the constraints, and the sequence axis."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    objective: Objective
    max_p99_ms: float | None
    runtimes: list[str]
    sequence_dim: str | None  # benchmark.sequence_dim: which shape axis the objective's length is on

    def by_p50(self) -> SelectionPolicy:
        """The same policy ranking single-stream latency (p50 at the objective's batch): what the server scenario
        picks its candidates by, and what the fastest single request means."""
        return self.model_copy(update={"objective": Objective(batch=self.objective.batch)})

    @classmethod
    def from_recipe(cls, recipe: Recipe) -> SelectionPolicy:
        sel = recipe.selection
        return cls(
            objective=sel.objective,
            max_p99_ms=sel.max_p99_ms,
            runtimes=list(sel.runtimes),
            sequence_dim=recipe.benchmark.sequence_dim,
        )


# Simplicity, most simple first: fewer transformations between the trained model and what runs are simpler to
# trust and to operate. Artifacts: by Variant.transformations (plain exports, then one conversion, then two
# or a quantization, then compilers). Runtimes: by the tier their runner module declares (the CPU, then the
# CUDA provider or device, then compilers and CUDA graphs). Ties are broken by the artifact first, then the runtime, then CUDA graphs, then host I/O.
BASELINES = PLAIN_EXPORTS  # what a release manager compares the winner's cost with


def simplicity(row: Timing) -> tuple[int, int, int, int]:
    return simplicity_of(row.artifact, row.runtime, row.cuda_graph, row.io)


def simplicity_of(
    artifact: str, runtime: str, cuda_graph: bool = False, io: str = "host"
) -> tuple[int, int, int, int]:
    return (_transformations(artifact), registry.tier(runtime), int(cuda_graph), int(io != "host"))


def tied(a: Timing, b: Timing, metric: str) -> bool:
    """Whether two rows' intervals of the objective's metric overlap: the difference is within the noise."""
    return overlap(a.interval_or_point(metric), b.interval_or_point(metric))


def _transformations(artifact: str) -> int:
    try:
        return parse(artifact).transformations
    except ValueError:  # the reference (torch-fp32) and names outside the grammar: the least simple
        return 4


def objective_rows(policy: SelectionPolicy, speed: Row, accuracy: Row) -> list[Timing]:
    """Benchmark rows at the objective's shape whose artifact passed validation on that row's runtime, within
    the recipe's constraints, with a figure for the objective's metric. A row without its own accuracy record is
    never a candidate; nor, under a throughput objective, is a row without a throughput run."""
    obj, sel = policy.objective, policy
    entries = records(accuracy)
    seq_dim = policy.sequence_dim
    rows = []
    for row in timings(speed):
        entry = entries.get(row.artifact)
        if row.batch != obj.batch or entry is None or not entry.passed_on(row.runtime):
            continue
        if obj.sequence_length is not None and seq_dim and row.sequence_length != obj.sequence_length:
            continue
        if obj.io is not None and row.io != obj.io:
            continue
        if sel.runtimes and row.runtime not in sel.runtimes:
            continue
        if sel.max_p99_ms is not None and (row.p99_ms is None or row.p99_ms > sel.max_p99_ms):
            continue
        if row.value(obj.metric) is None:
            continue
        rows.append(row)
    if obj.sequence_length is None and seq_dim:
        lengths = sorted({row.sequence_length for row in rows} - {None})
        if lengths:
            rows = [r for r in rows if r.sequence_length in (None, lengths[0])]
    return rows


def _label(row: Timing) -> str:
    io = "" if row.io == "host" else f", {row.io} I/O"
    graph = ", CUDA graph" if row.cuda_graph else ""
    return f"{row.artifact} ({row.runtime}{io}{graph})"


def _figure(row: Timing, metric: str) -> str:
    low, high = row.interval_or_point(metric)
    if maximized(metric):
        return f"{fmt_rate(row.value(metric))} seq/s [{fmt_rate(low)}–{fmt_rate(high)}]"
    return f"{fmt_ms(row.value(metric))} ms [{fmt_ms(low)}–{fmt_ms(high)}]"


def candidates(policy: SelectionPolicy, speed: Row, accuracy: Row) -> list[Timing]:
    """One row per artifact (its best passing runtime and I/O mode by the objective's metric), best first."""
    metric = policy.objective.metric
    best: dict[str, Timing] = {}
    for row in objective_rows(policy, speed, accuracy):
        held = best.get(row.artifact)
        if held is None or row.rank_key(metric) < held.rank_key(metric):
            best[row.artifact] = row
    return sorted(best.values(), key=lambda r: (r.rank_key(metric), simplicity(r)))


def choose(
    policy: SelectionPolicy, speed: Row, accuracy: Row, files: dict[str, str] | None = None
) -> Winner | None:
    """The winner as winner.json holds it, or None when no candidate exists."""
    metric = policy.objective.metric
    ranked = candidates(policy, speed, accuracy)
    if not ranked:
        return None
    fastest = ranked[0]
    group = _tie_group(ranked, metric)
    winner, noise, beaten = simplest_unbeaten(group, ranked, _timing_rule(metric))
    within = [r for r in noise if r is not winner]  # the reason names exactly the group it chose from
    others = [r for r in ranked if r is not winner]
    runner_up = others[0] if others else None
    unsettled = [r for r in _overlapping(ranked, metric) if r not in group]
    reason = _reason(winner, fastest, within, runner_up, metric, unsettled, beaten)
    provisional = not winner.settled(metric)
    if provisional:
        reason += f"; provisional: winner did not stabilize ({winner.unsettled_reason(metric)})"
    entries = records(accuracy)
    baseline = next((r for r in ranked if r.artifact in BASELINES and r is not winner), None)
    p50_ci = winner.interval("p50_ms")
    return {
        "artifact": winner.artifact,
        "file": (files or {}).get(winner.artifact),
        "runtime": winner.runtime,
        "io": winner.io,
        "cuda_graph": winner.cuda_graph,
        "objective": policy.objective.model_dump(),
        "value": winner.value(metric),
        "unit": unit_of(metric),
        "interval": list(winner.interval_or_point(metric)),
        "p50_ci95_ms": list(p50_ci) if p50_ci else None,
        "shapes": dict(winner.shapes) or None,
        "stable": winner.settled(metric),
        "provisional": provisional,
        "accuracy": accuracy_record(entries.get(winner.artifact), winner.artifact, winner.runtime),
        "runner_up": _peer(runner_up, metric, entries),
        "baseline": _peer(baseline, metric, entries),
        "within_noise_of": [_label(r) for r in within],  # the tie group (within noise of the fastest)
        "reason": reason,
    }


def _overlapping(ranked: list[Timing], metric: str) -> list[Timing]:
    """Every candidate whose interval overlaps the fastest's (ranked best first), settled or not."""
    return [r for r in ranked if tied(r, ranked[0], metric)]


def _tie_group(ranked: list[Timing], metric: str) -> list[Timing]:
    """The candidates within noise of the fastest (ranked best first). Where the fastest settled, a row that
    did not is not in it: its wide interval says how unsure it is, not that it may be as fast, and by the
    simplicity rule it would win every tie it overlaps. Where the fastest did not settle either, every row
    overlapping it is."""
    fastest = ranked[0]
    settled = fastest.settled(metric)
    return [
        r for r in ranked if r is fastest or (tied(r, fastest, metric) and (r.settled(metric) or not settled))
    ]


def beaten_by_simpler(row: T, ranked: list[T], rule: TieRule[T]) -> T | None:
    """A settled candidate simpler than `row` and better by the objective (ranked best first), if any. Such a
    row does not win a tie for its simplicity: "the simplest within noise of the best" is not transitive, and a
    hold-out BEiT shipped `onnx-fp16` (0.781 ms) for being simpler than the fastest, though `onnx-fp32`,
    simpler still and faster (0.748 ms), was within its noise and not the fastest's."""
    return next(
        (
            s
            for s in ranked
            if s is not row
            and rule.settled(s)
            and rule.simplicity(s) < rule.simplicity(row)
            and rule.rank(s) < rule.rank(row)
        ),
        None,
    )


def simplest_unbeaten(
    group: list[T], ranked: list[T], rule: TieRule[T]
) -> tuple[T, list[T], list[tuple[T, T]]]:
    """The simplest of `group` that no simpler, better candidate beats (the best, ranked[0], at the latest),
    the group without the rows set aside, and those rows, each with what beats it. Every objective decides its
    ties by this, on its own rows."""
    noise, beaten = list(group), []
    while (chosen := min(noise, key=lambda r: (rule.simplicity(r), rule.rank(r)))) is not ranked[0]:
        beater = beaten_by_simpler(chosen, ranked, rule)
        if beater is None:
            break
        beaten.append((chosen, beater))  # it cannot win for its simplicity: the next simplest may
        noise.remove(chosen)
    return chosen, noise, beaten


class TieRule(NamedTuple, Generic[T]):
    """How rule 9 reads one objective's rows: their simplicity, their rank by the objective (lowest best) and
    whether their measurement settled (only a settled row's figure may set another aside)."""

    simplicity: Callable[[T], tuple[int, ...]]
    rank: Callable[[T], Any]
    settled: Callable[[T], bool]


def _timing_rule(metric: str) -> TieRule[Timing]:
    return TieRule(simplicity, lambda r: r.rank_key(metric), lambda r: r.settled(metric))


def unsettled_contenders(policy: SelectionPolicy, speed: Row, accuracy: Row) -> list[Timing]:
    """The rows to measure again before selection decides, when the candidate that would win a latency
    objective now never stabilized: it first, then every candidate it or the fastest is tied with. Empty when the
    would-be winner is stable, there is none, or the objective is throughput (more latency windows do not
    settle a throughput run). The benchmark asks this; only the select stage chooses."""
    metric = policy.objective.metric
    ranked = candidates(policy, speed, accuracy)
    if maximized(metric) or not ranked:
        return []
    # unsettled rows too: measuring may settle them
    chosen, _, _ = simplest_unbeaten(_overlapping(ranked, metric), ranked, _timing_rule(metric))
    if chosen.settled(metric):
        return []
    tied_rows = [
        r for r in ranked if r is not chosen and (tied(r, chosen, metric) or tied(r, ranked[0], metric))
    ]
    return [chosen, *tied_rows]


def _peer(row: Timing | None, metric: str, entries: dict[str, AccuracyRecord]) -> dict[str, Any] | None:
    if row is None:
        return None
    return {
        "artifact": row.artifact,
        "runtime": row.runtime,
        "io": row.io,
        "value": row.value(metric),
        "interval": list(row.interval_or_point(metric)),
        "stable": row.settled(metric),
        "accuracy": accuracy_record(entries.get(row.artifact), row.artifact, row.runtime)["figures"],
    }


def accuracy_record(entry: AccuracyRecord | None, artifact: str, runtime: str) -> dict[str, Any]:
    """Where the candidate's own accuracy record is, and per metric its worst figure on that runtime: among
    the checks that gate when there are any (as the accuracy table shows it), else the informational ones;
    `gating` names the metrics that gate, the ones a sentence about its accuracy quotes first."""
    verdict = entry.on(runtime) if entry else None
    figures: dict[str, float] = {}
    gating: set[str] = set()
    for check in verdict.checks if verdict else ():
        value, metric = check.value, check.metric
        if value is None or metric in ("finite", "comparable"):
            continue
        if metric in gating and not check.required:
            continue
        if check.required and metric not in gating:
            gating.add(metric)
            figures.pop(metric, None)
        worse = min if metric in LOWER_BOUNDS else max
        figures[metric] = worse(figures.get(metric, value), value)
    return {
        "runtime": runtime,
        "passed": bool(entry and entry.passed_on(runtime)),
        "record": f"reports/accuracy.json: artifacts.{artifact}.runtimes.{runtime}",
        "figures": figures,
        "gating": sorted(gating),
    }


def _reason(
    winner: Timing,
    fastest: Timing,
    within: list[Timing],
    runner_up: Timing | None,
    metric: str,
    unsettled: list[Timing] | None = None,
    beaten: list[tuple[Timing, Timing]] | None = None,
) -> str:
    """`unsettled`: rows whose interval overlaps the settled fastest's but whose timing did not settle, which
    are therefore not within its noise; `beaten`: rows within its noise that a simpler, better candidate beats
    (each with that candidate). Both said, since the intervals do overlap."""
    lead = f"highest {metric_name(metric)}" if maximized(metric) else f"fastest by {metric_name(metric)}"
    if runner_up is None:
        return "the only candidate that passed validation on its runtime with a measurement at the objective's shape"
    if beaten:
        return _set_aside_reason(lead, winner, fastest, within, runner_up, metric, unsettled or [], beaten)
    if not unsettled:
        return _tie_reason(lead, winner, fastest, within, runner_up, metric)
    rows = "; ".join(f"{_label(r)} {_figure(r, metric)} ({r.unsettled_reason(metric)})" for r in unsettled)
    note = (
        f"its 95% interval overlaps only those of rows whose timing did not settle, which are not within noise "
        f"of a settled fastest: {rows}"
    )
    if not within:
        return f"{lead} at {_named(winner, metric).figure}; {note}"
    within_reason = _tie_reason(lead, winner, fastest, within, runner_up, metric)
    return f"{within_reason}; the fastest's interval also overlaps rows whose timing did not settle: {rows}"


def _set_aside_reason(
    lead: str,
    winner: Timing,
    fastest: Timing,
    within: list[Timing],
    runner_up: Timing,
    metric: str,
    unsettled: list[Timing],
    beaten: list[tuple[Timing, Timing]],
) -> str:
    """The reason where rows overlapping the fastest were set aside: each named with why it cannot win a tie."""
    aside = [
        f"{_label(r)} {_figure(r, metric)} (its timing did not settle: {r.unsettled_reason(metric)})"
        for r in unsettled
    ]
    aside += [
        f"{_label(r)} {_figure(r, metric)} (beaten by the simpler {_label(s)} at {_figure(s, metric)})"
        for r, s in beaten
    ]
    chosen = _tie_reason(lead, winner, fastest, within, runner_up, metric) if within else None
    return set_aside_sentence(lead, _named(winner, metric), chosen, aside)


def set_aside_sentence(
    lead: str, winner: Named, tie_sentence: str | None, aside: list[str], best_word: str = "fastest"
) -> str:
    """The reason where rows overlapping the best were set aside (`aside`: each with why it cannot win a tie),
    after the tie sentence of the group that remains, or alone where none remains."""
    note = "; ".join(aside)
    if tie_sentence is None:
        return f"{lead} at {winner.figure}; the rows whose intervals overlap it cannot win a tie: {note}"
    return f"{tie_sentence}, setting aside rows within noise of the {best_word} that cannot win a tie: {note}"


def _named(row: Timing, metric: str) -> Named:
    return Named(_label(row), _figure(row, metric))


def _tie_reason(
    lead: str, winner: Timing, fastest: Timing, within: list[Timing], runner_up: Timing, metric: str
) -> str:
    return tie_reason(
        lead,
        _named(winner, metric),
        _named(fastest, metric),
        [_named(r, metric) for r in within],
        _named(runner_up, metric),
    )


class Named(NamedTuple):
    """A candidate as a reason names it: its label and its figure with the interval."""

    label: str
    figure: str


def tie_reason(
    lead: str,
    winner: Named,
    best: Named,
    within: list[Named],
    runner_up: Named,
    measured: str = "measured",
    best_word: str = "fastest",
) -> str:
    """Why the winner, by rule 9, for every objective: beyond the noise of the runner-up, or the simplest of those
    within noise of the best (`within`: the rest of that group). The group is built around the best, not the
    winner: a member may overlap the best and not the winner, so the sentence names the group by the best."""
    if not within:
        return f"{lead}: {winner.figure} vs {runner_up.figure} for {runner_up.label}; the 95% intervals do not overlap"
    if winner == best:
        tied = ", ".join(f"{r.label} {r.figure}" for r in within)
        return (
            f"{lead} at {winner.figure}, but within noise of {tied} (95% intervals overlap); it is also the "
            "simplest of these, so it is chosen"
        )
    found = (
        f"{best.label} {measured} {best.figure}, within noise of {winner.label} at {winner.figure} (95% intervals "
        f"overlap); the simplest of the candidates within noise of the {best_word} is chosen"
    )
    others = [r for r in within if r != best]
    if not others:
        return found
    listed = ", ".join(f"{r.label} {r.figure}" for r in others)
    return f"{found} (the others within noise of the {best_word}: {listed})"


def selection_problems(accuracy: Row, winner: Row | None) -> list[str]:
    """Why nothing can be signed off from selection's side (empty when a winner exists)."""
    if winner is not None:
        return []
    if not any(entry.passed_anywhere for entry in records(accuracy).values()):
        return ["no artifact passed validation"]
    return [
        "no artifact that passed validation on its runtime has a benchmark at the objective's shape within constraints"
    ]
