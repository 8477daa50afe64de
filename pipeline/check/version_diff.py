"""What changed between two versions' reports: speed row by row, accuracy artifact by artifact, and the server
scenario's served rates candidate by candidate.

One diff for both readers: `compare A B` (pipeline/release/compare.py) gates a release on it, and the sign-off's
"changes since" (pipeline/report/diff.py) writes it as lines. Rows are matched by their one identity
(`Timing.id`, check/timings.py); a difference is faster or slower only when the two rows' 95% intervals of the
metric do not overlap, else within noise; accuracy moves are read as the share of its tolerance a check uses, so that
they read the same for every metric.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.check.accuracy import tolerance_share
from pipeline.check.results import Row
from pipeline.check.served import ServedRate, served_rates
from pipeline.check.speed import THROUGHPUT, Interval, maximized
from pipeline.check.timings import RowId, Timing, timings
from pipeline.check.verdicts import AccuracyRecord, records


def speed_verdict(a_ci: Interval | None, b_ci: Interval | None, metric: str = "p50_ms") -> str:
    """faster / slower (B against A) when the intervals are disjoint, within noise when they overlap. Faster is
    a lower latency, or a higher throughput."""
    if a_ci is None or b_ci is None:
        return "no interval"
    lower, higher = ("slower", "faster") if maximized(metric) else ("faster", "slower")
    if b_ci[1] < a_ci[0]:
        return lower
    if b_ci[0] > a_ci[1]:
        return higher
    return "within noise"


def change(a: float | None, b: float | None) -> float | None:
    """B's value relative to A's (+0.1: 10 % higher), whichever way is better."""
    if a is None or b is None or not a:
        return None
    return (b - a) / a


def slowdown(a: float | None, b: float | None, metric: str) -> float | None:
    """How much slower B is than A, relative to A: a longer latency, or a lower throughput (negative: faster)."""
    relative = change(a, b)
    if relative is None:
        return None
    return -relative if maximized(metric) else relative


@dataclass(frozen=True)
class RowChange:
    """One speed row in A, in B, or in both, and how its metric moved."""

    id: RowId
    before: Timing | None
    after: Timing | None
    metric: str

    @property
    def a(self) -> float | None:
        return self.before.value(self.metric) if self.before is not None else None

    @property
    def b(self) -> float | None:
        return self.after.value(self.metric) if self.after is not None else None

    @property
    def a_ci(self) -> Interval | None:
        return self.before.interval(self.metric) if self.before is not None else None

    @property
    def b_ci(self) -> Interval | None:
        return self.after.interval(self.metric) if self.after is not None else None

    @property
    def change(self) -> float | None:
        return change(self.a, self.b)

    @property
    def verdict(self) -> str:
        """new, gone, faster, slower, within noise, or no interval."""
        if self.before is None:
            return "new"
        if self.after is None:
            return "gone"
        return speed_verdict(self.a_ci, self.b_ci, self.metric)

    @property
    def row(self) -> Timing:
        """The newest of the two rows (B's when it has one)."""
        found = self.after if self.after is not None else self.before
        assert found is not None
        return found


def speed_changes(before: Row | None, after: Row | None, metric: str = "p50_ms") -> list[RowChange]:
    """Every row of either version's speed.json, matched by identity: B's in its order, then those only A has."""
    old = {r.id: r for r in timings(before)}
    new = {r.id: r for r in timings(after)}
    return [RowChange(key, old.get(key), new.get(key), metric) for key in dict.fromkeys([*new, *old])]


def worst_shares(entry: AccuracyRecord | None) -> dict[tuple[str, str, str], float]:
    """Per required check (output, inputs, metric), the largest share of its tolerance it uses."""
    out: dict[tuple[str, str, str], float] = {}
    for check in entry.checks if entry else ():
        if check.informational:
            continue
        share = tolerance_share(check.metric, check.value, check.threshold)
        if share is not None:
            key = (str(check.output), str(check.inputs), check.metric)
            out[key] = max(out.get(key, share), share)
    return out


@dataclass(frozen=True)
class ArtifactChange:
    """One artifact's accuracy entry in A, in B, or in both."""

    artifact: str
    before: AccuracyRecord | None
    after: AccuracyRecord | None

    @property
    def a_passed(self) -> bool:
        return bool(self.before and self.before.passed)

    @property
    def b_passed(self) -> bool:
        return bool(self.after and self.after.passed)

    @property
    def verdict_changed(self) -> bool:
        return self.before is not None and self.after is not None and self.a_passed != self.b_passed

    @property
    def share_growth(self) -> float | None:
        """The largest growth, over the checks both have, of the share of its tolerance a check uses."""
        a, b = worst_shares(self.before), worst_shares(self.after)
        return max((b[k] - a[k] for k in b if k in a), default=None)


def accuracy_changes(before: Row | None, after: Row | None) -> list[ArtifactChange]:
    """Every artifact of either version's accuracy.json: B's in its order, then those only A has."""
    old, new = records(before), records(after)
    return [ArtifactChange(name, old.get(name), new.get(name)) for name in dict.fromkeys([*new, *old])]


@dataclass(frozen=True)
class ServedChange:
    """One candidate of the server scenario in A, in B, or in both: the rate it serves within the p99 target.
    Comparable only at the same target, through the same path (in-process or Triton)."""

    key: tuple[str, str, str]  # (artifact, runtime, through)
    before: ServedRate | None
    after: ServedRate | None

    @property
    def verdict(self) -> str:
        """faster (serves more), slower, within noise, or why it cannot be told."""
        if self.before is None:
            return "new"
        if self.after is None:
            return "gone"
        if self.before.p99_target_ms != self.after.p99_target_ms:
            return "other target"
        if self.before.max_qps is None or self.after.max_qps is None:
            return "no rate"
        return speed_verdict(self.before.ci95, self.after.ci95, THROUGHPUT)

    @property
    def slowdown(self) -> float | None:
        """How much less B serves than A, relative to A (negative: more); None where the verdict says the two
        cannot be compared."""
        if self.verdict in ("new", "gone", "other target", "no rate"):
            return None
        assert self.before is not None and self.after is not None
        return slowdown(self.before.max_qps, self.after.max_qps, THROUGHPUT)


def served_changes(before: Row | None, after: Row | None) -> list[ServedChange]:
    """Every candidate of either version's load.json: B's in its order, then those only A has."""
    old = {(r.artifact, r.runtime, r.through): r for r in served_rates(before)}
    new = {(r.artifact, r.runtime, r.through): r for r in served_rates(after)}
    return [ServedChange(key, old.get(key), new.get(key)) for key in dict.fromkeys([*new, *old])]
