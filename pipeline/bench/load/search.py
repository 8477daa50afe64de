"""The highest rate a candidate serves within the p99 target, found as MLPerf submitters find their Server
scenario's target QPS: run, look at the p99, raise or lower the rate. LoadGen's own FindPeakPerformance mode does
the same but checks the p99 alone (not whether the run was issued in full) and runs until it resolves 1 QPS; this
search is bounded by the recipe (`runs`) and stops once the passing and failing rates are within 15% of each
other. The highest passing rate is then run again (`repeats`): it stands when most of those runs hold the target,
else the rate is lowered by the search's resolution and confirmed again (twice at most). Its figure is the mean
completed rate of the confirming runs with a 95% interval, as the throughput run's is built from its segments."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pipeline.bench.load.loadgen_run import ServerRun
from pipeline.bench.stats import t_two_sided

RESOLVED = 1.15  # passing and failing rates this close: the search has found the knee
CONFIRMATIONS = 3  # rates tried at most for a confirmed one: the highest passing, then lower by RESOLVED


@dataclass
class RateSearch:
    p99_ms: float
    runs: list[ServerRun] = field(default_factory=list)  # every run, in order (failed confirmations too)
    repeats: list[ServerRun] = field(default_factory=list)  # the runs that confirmed `rate`
    rate: float | None = None  # the highest rate confirmed to hold the target

    def miss(self) -> str | None:
        """Why the candidate has no rate: by how much it missed the target, or that no passing rate held."""
        if self.rate is not None or not self.runs:
            return None
        passing = [r for r in self.runs if r.meets(self.p99_ms)]
        if passing:
            low = min(r.target_qps for r in passing)
            tried = [r for r in self.runs if r.target_qps == low]
            held = sum(r.meets(self.p99_ms) for r in tried)
            return f"no rate held the target in most of its runs (at {low:.3g} requests/s: {held} of {len(tried)})"
        lowest = min(self.runs, key=lambda r: r.target_qps)
        if lowest.error is not None:
            return f"the model failed under load: {lowest.error}"
        if lowest.p99_ms is None or not lowest.duration_met:
            return f"at {lowest.target_qps:.3g} requests/s, the lowest rate tried, the queue never drained"
        over = lowest.p99_ms / self.p99_ms
        return (
            f"p99 {lowest.p99_ms:.3g} ms at {lowest.target_qps:.3g} requests/s, the lowest rate tried: "
            f"{over:.2f}× the {self.p99_ms:g} ms target"
        )

    def served(self) -> dict[str, Any] | None:
        """The rate served at the target over the repeats: mean completed requests/s, its 95% interval, the
        p99s, and how many repeats held the target."""
        runs = [r for r in self.repeats if r.completed_qps is not None]
        if self.rate is None or not runs:
            return None
        rates = [float(r.completed_qps) for r in runs if r.completed_qps is not None]
        mean = statistics.fmean(rates)
        half = (
            t_two_sided(0.95, len(rates) - 1) * statistics.stdev(rates) / math.sqrt(len(rates))
            if len(rates) > 1
            else 0.0
        )
        return {
            "qps": mean,
            "ci95": [max(0.0, mean - half), mean + half],
            "target_qps": self.rate,
            "p99_ms": [r.p99_ms for r in runs],
            "held": sum(r.meets(self.p99_ms) for r in runs),
            "of": len(runs),
        }


def search(
    run_at: Callable[[float], ServerRun], start_qps: float, p99_ms: float, runs: int, repeats: int
) -> RateSearch:
    """Double the rate while it passes, halve it while it fails, then bisect (geometrically) between the
    highest pass and the lowest fail, within `runs` runs; then confirm the highest passing rate with `repeats`
    runs, lowering it by RESOLVED while most of them miss (CONFIRMATIONS rates at most)."""
    found = RateSearch(p99_ms)
    rate, low, high = start_qps, None, None
    for _ in range(runs):
        run = run_at(rate)
        found.runs.append(run)
        if run.meets(p99_ms):
            low = rate if low is None else max(low, rate)
        else:
            high = rate if high is None else min(high, rate)
        if low is not None and high is not None:
            if high / low < RESOLVED:
                break
            rate = math.sqrt(low * high)
        elif high is None:
            rate *= 2
        else:  # nothing passed yet: below half the rate, and below what the failing run managed to complete
            rate = min(rate / 2, 0.8 * run.completed_qps) if run.completed_qps else rate / 2
    passing = [r.target_qps for r in found.runs if r.meets(p99_ms)]
    rate = max(passing) if passing else None
    for _ in range(CONFIRMATIONS if rate is not None else 0):
        again = [run_at(rate) for _ in range(repeats)]
        if 2 * sum(r.meets(p99_ms) for r in again) > len(again):
            found.rate, found.repeats = rate, again
            break
        found.runs += again
        rate /= RESOLVED
    return found
