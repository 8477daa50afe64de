"""The highest rate a candidate serves within the p99 target, found as MLPerf submitters find their Server
scenario's target QPS: run, look at the p99, raise or lower the rate. LoadGen's own FindPeakPerformance mode does
the same but checks the p99 alone (not whether the run was issued in full) and runs until it resolves 1 QPS; this
search is bounded by the recipe (`runs`) and stops once the passing and failing rates are within 15% of each
other.

One run decides nothing for good: the highest passing rate is run again (`repeats`) and stands only when most of
those runs hold the target; else the next lower rate that passed in the search is confirmed, then rates 15% lower
(CONFIRMATIONS rates at most). The figure is the mean completed rate of the confirming runs that held, with a 95%
interval, as the throughput run's is built from its segments. A search that never failed found a lower bound
only (`bounded`), and says so."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pipeline.bench.load.loadgen_run import ServerRun
from pipeline.bench.stats import t_two_sided

RESOLVED = 1.15  # passing and failing rates this close: the search has found the knee
CONFIRMATIONS = 3  # rates tried at most for a confirmed one


@dataclass(frozen=True)
class Confirmation:
    rate: float
    held: int
    of: int


@dataclass
class RateSearch:
    p99_ms: float
    runs: list[ServerRun] = field(default_factory=list)  # the search's runs, in order
    repeats: list[ServerRun] = field(default_factory=list)  # the runs that confirmed `rate`
    tried: list[Confirmation] = field(default_factory=list)  # every confirmation, the failed ones first
    rate: float | None = None  # the highest rate confirmed to hold the target

    @property
    def bounded(self) -> bool:
        """True when no run failed: the candidate may serve more than the search asked of it."""
        return bool(self.runs) and all(r.meets(self.p99_ms) for r in self.runs)

    def miss(self) -> str | None:
        """Why the candidate has no rate: by how much it missed the target, or which rates did not hold."""
        if self.rate is not None or not self.runs:
            return None
        if self.tried:
            held = ", ".join(f"{c.rate:.3g} requests/s held {c.held} of {c.of}" for c in self.tried)
            return f"no rate held the target in most of its runs again ({held})"
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
        """The rate served at the target: mean completed requests/s of the confirming runs that held, its 95%
        interval, each confirming run's p99, and how many held."""
        held = [r for r in self.repeats if r.meets(self.p99_ms) and r.completed_qps is not None]
        if self.rate is None or not held:
            return None
        rates = [float(r.completed_qps or 0.0) for r in held]
        mean = statistics.fmean(rates)
        spread = statistics.stdev(rates) / math.sqrt(len(rates)) if len(rates) > 1 else 0.0
        half = t_two_sided(0.95, len(rates) - 1) * spread if len(rates) > 1 else 0.0
        return {
            "qps": mean,
            "ci95": [max(0.0, mean - half), mean + half],
            "target_qps": self.rate,
            "p99_ms": [r.p99_ms for r in self.repeats],
            "held": len(held),
            "of": len(self.repeats),
            "bounded": self.bounded,
        }


def search(
    run_at: Callable[[float], ServerRun], start_qps: float, p99_ms: float, runs: int, repeats: int
) -> RateSearch:
    """Double the rate while it passes, halve it while it fails, then bisect (geometrically) between the
    highest pass and the lowest fail, within `runs` runs; then confirm (see the module's docstring)."""
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
    _confirm(found, run_at, repeats)
    return found


def _confirm(found: RateSearch, run_at: Callable[[float], ServerRun], repeats: int) -> None:
    passing = sorted({r.target_qps for r in found.runs if r.meets(found.p99_ms)}, reverse=True)
    if not passing:
        return
    rates = passing[:CONFIRMATIONS]
    while len(rates) < CONFIRMATIONS:
        rates.append(rates[-1] / RESOLVED)
    for rate in rates:
        again = [run_at(rate) for _ in range(repeats)]
        held = sum(r.meets(found.p99_ms) for r in again)
        if 2 * held > len(again):
            found.rate, found.repeats = rate, again
            return
        found.tried.append(Confirmation(rate, held, len(again)))
