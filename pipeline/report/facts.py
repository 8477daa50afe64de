"""Small readings of the reports shared by every renderer, so the page, the plots and the console agree.

Everything here is pure: typed records (check/timings.py, check/verdicts.py) or contract dicts in, plain values out. The renderers
decide the look.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pipeline.check.accuracy import COMPARABLE, LOWER_BOUNDS, tolerance_share
from pipeline.check.speed import as_interval, fmt_ms, overlap
from pipeline.check.timings import Timing, timings
from pipeline.check.verdicts import CheckRecord, Verdict, records
from pipeline.core import errors
from pipeline.core.variants import precision_of as _named_precision

METRIC_ORDER = ("cosine", "neighbours", "max_abs", "mean_abs", "max_rel")
Row = Mapping[str, Any]


# ------------------------------------------------------------------ numbers


def fmt_metric(metric: str, value: float | None) -> str:
    """Lower bounds near 1 (cosine, neighbours) need their nines: at three significant figures 0.9995 would read
    0.999, twice its shortfall. Error magnitudes need three significant figures."""
    if value is None or not isinstance(value, int | float):
        return "—"
    if math.isnan(value):
        return "nan"
    if metric in LOWER_BOUNDS:
        text = f"{value:.6f}"
        if text != "1.000000" or value == 1:
            return text
        short = f"{value:.10g}"
        return short if short != "1" else f"1 − {1 - value:.1e}"
    return f"{value:.3g}"


def fmt_ci(ci: Any) -> str:
    if isinstance(ci, list | tuple) and len(ci) == 2:
        return f"{fmt_ms(ci[0])}–{fmt_ms(ci[1])}"
    return "—"


def fmt_seconds(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:.1f} s" if value < 100 else f"{value:.0f} s"


def fmt_change(old: float, new: float) -> str:
    """'-10%' style relative change; old == 0 gives no percentage rather than a division error."""
    if not old:
        return "n/a"
    return f"{(new - old) / old * 100:+.0f}%"


# ------------------------------------------------------------------ accuracy


def margin(check: CheckRecord) -> float:
    """How close a check is to its threshold (its tolerance share): 1.0 is on it, above 1 fails. NaN values
    are the worst; a check without a threshold has none to be close to."""
    value = check.measured
    if math.isnan(value):
        return math.inf
    if check.threshold is None:
        return 0.0
    share = tolerance_share(check.metric, value, check.threshold)
    if share is None:  # a zero-width tolerance (the finite check's 0): exact, or past it
        return 0.0 if check.passed else math.inf
    return share


def badness(check: CheckRecord) -> float:
    """How bad a check's figure is on its own, higher is worse: the value for error metrics, its shortfall from
    1 for lower bounds (cosine, neighbours); NaN is the worst. Ranks checks that have no threshold."""
    value = check.measured
    if math.isnan(value):
        return math.inf
    return 1.0 - value if check.metric in LOWER_BOUNDS else value


def key_checks(entry: Verdict) -> dict[str, CheckRecord]:
    """Per metric, the check that decides the artifact: the worst required one, else the worst informational.
    Worst by the share of its threshold it uses, and among checks with no threshold (or the same share) by
    the figure itself, so the table's "worst" is the worst for every metric.

    Ties keep the first check in file order, so the pick is deterministic.
    """
    picked: dict[str, CheckRecord] = {}
    for check in entry.checks:
        current = picked.get(check.metric)
        if current is None:
            picked[check.metric] = check
            continue
        rank_new = (check.required, margin(check), badness(check))
        rank_old = (current.required, margin(current), badness(current))
        if rank_new > rank_old:
            picked[check.metric] = check
    return {m: picked[m] for m in sorted(picked, key=metric_sort_key)}


def metric_sort_key(metric: str) -> tuple[int, str]:
    return (METRIC_ORDER.index(metric) if metric in METRIC_ORDER else len(METRIC_ORDER), metric)


def quoted_metric(gating: Sequence[str], available: Iterable[str]) -> str | None:
    """The metric a sentence about an artifact's accuracy quotes: one that gates it first (a metric that only
    informs, as cosine on one value per sample, says least about what passed), in the accuracy table's order."""
    present = sorted(available, key=metric_sort_key)
    return next((m for m in present if m in gating), present[0] if present else None)


def metrics_present(accuracy: Row | None) -> list[str]:
    found = {c.metric for e in records(accuracy).values() for c in e.checks}
    return sorted(found, key=metric_sort_key)


def relation(check: CheckRecord) -> str:
    """The relation that holds: '≥'/'≤' when the check passed, '<'/'>' when it did not."""
    lower = check.metric in LOWER_BOUNDS
    if check.passed:
        return "≥" if lower else "≤"
    return "<" if lower else ">"


def check_text(check: CheckRecord, with_metric: bool = False) -> str:
    """'0.971200 < 0.98 ✗' for a failing required check, '1.85 > 1 (info)' for an informational one that is
    over its threshold (it never gates, so it never gets a ✗), '0.999871 ≥ 0.9999 ✓' when it holds."""
    if check.metric == COMPARABLE and not check.passed:  # no number: what made the outputs incomparable
        return f"not comparable ({check.reason}) ✗" if with_metric and check.reason else "no ✗"
    text = fmt_metric(check.metric, check.value)
    if check.threshold is not None:
        text += f" {relation(check)} {check.threshold:g}"
    if check.informational:
        text += " (info)"
    else:
        text += " ✓" if check.passed else " ✗"
    return f"{check.metric} {text}" if with_metric else text


def check_tone(check: CheckRecord) -> str:
    """How a check's cell looks: failing required ones are bad, informational ones grey, the rest plain."""
    if check.informational:
        return "info"
    return "" if check.passed else "bad"


def failing_checks(entry: Verdict) -> list[CheckRecord]:
    """Required checks that failed, worst first."""
    failed = [c for c in entry.checks if not c.passed and c.required]
    return sorted(failed, key=margin, reverse=True)


def where(check: CheckRecord) -> str:
    return f"{check.output} @ {check.inputs}"


def input_sets_text(accuracy: Row | None) -> str:
    """What the validation batches were, in words: the corners, a shape between them where stored samples were
    run there too (off-corner), the benchmark's largest batch where it is larger than these (timed), and the
    held-out data."""
    found = {
        check.get("inputs")
        for entry in ((accuracy or {}).get("artifacts") or {}).values()
        for check in entry.get("checks") or []
    }
    between = ", a shape between them (off-corner)" if "off-corner" in found else ""
    timed = ", the largest batch the benchmark times (timed)" if "timed" in found else ""
    return f"shape corners min/opt/max{between}{timed} and the held-out data"


def precision_of(name: str, accuracy: Row | None = None) -> str:
    """The precision recorded by validation, else the one named in the contract's artifact name."""
    entry = records(accuracy).get(name)
    if entry is not None and entry.precision:
        return entry.precision
    return _named_precision(name) or "—"


# ------------------------------------------------------------------ speed


def shape_text(shapes: Mapping[str, Any] | None) -> str:
    """'1×128' when every input has that shape, else 'input_ids 1×128, pixels 1×3×224×224'."""
    if not shapes:
        return "—"
    dims = {name: "×".join(str(d) for d in shape) for name, shape in shapes.items()}
    if len(set(dims.values())) == 1:
        return next(iter(dims.values()))
    return ", ".join(f"{name} {text}" for name, text in dims.items())


def group_key(row: Timing) -> tuple[int, str]:
    """Rows that are comparable with each other: same batch, same shapes."""
    return (row.batch or 0, shape_text(row.shapes))


def sorted_results(speed: Row | None) -> list[Timing]:
    """By batch, shape, then fastest first: the order a reader compares in."""
    return sorted(timings(speed), key=lambda r: (group_key(r), _number(r.p50_ms), r.artifact))


def _number(value: Any) -> float:
    return float(value) if isinstance(value, int | float) else math.nan


def runner_label(row: Row) -> str:
    """'onnx-fp32 (onnxruntime-cpu)' with ', device I/O' only where it is not host I/O."""
    io = "" if row.get("io") in (None, "host") else f", {row.get('io')} I/O"
    return f"{row.get('artifact')} ({row.get('runtime')}{io})"


def flag_text(flag: Any) -> str:
    """A speed.json flag as one line; flags are strings or dicts {kind, artifact, runtime, io, batch, shapes, message}."""
    if not isinstance(flag, Mapping):
        return str(flag)
    kind = str(flag.get("kind") or "flag").replace("_", " ")
    where = runner_label(flag) if flag.get("artifact") else ""
    if flag.get("batch") is not None:
        where += f" batch {flag.get('batch')}"
    if flag.get("shapes"):
        where += f", shape {shape_text(flag.get('shapes'))}"
    message = flag.get("message") or ", ".join(
        f"{k} {scalar_text(v)}" for k, v in flag.items() if k != "kind"
    )
    return f"{kind}: {where.strip()}: {message}" if where.strip() else f"{kind}: {message}"


def intervals_overlap(a: Any, b: Any) -> bool:
    """Whether two recorded [low, high] intervals overlap (e.g. two winners' objective intervals)."""
    return overlap(as_interval(a), as_interval(b))


# ------------------------------------------------------------------ not run, environment


def not_run(accuracy: Row | None, speed: Row | None) -> list[tuple[str, str, str]]:
    """(artifact, reason, where) with a reason given by both validation and benchmark listed once."""
    merged: dict[tuple[str, str], list[str]] = {}
    for source, label in ((accuracy, "validation"), (speed, "benchmark")):
        for item in (source or {}).get("not_run") or []:
            key = (str(item.get("artifact")), str(item.get("reason")))
            merged.setdefault(key, [])
            if label not in merged[key]:
                merged[key].append(label)
    return [(artifact, reason, ", ".join(stages)) for (artifact, reason), stages in merged.items()]


def flatten(data: Any, prefix: str = "") -> list[tuple[str, str]]:
    """Nested dicts to ('onnxruntime.providers', 'CPUExecutionProvider, …') pairs, in the dict's own order."""
    if isinstance(data, Mapping):
        pairs: list[tuple[str, str]] = []
        for key, value in data.items():
            pairs.extend(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return pairs
    if isinstance(data, list | tuple):
        if all(not isinstance(v, Mapping | list | tuple) for v in data):
            return [(prefix, ", ".join(scalar_text(v) for v in data))]
        return [pair for i, v in enumerate(data) for pair in flatten(v, f"{prefix}[{i}]")]
    return [(prefix, scalar_text(data))]


def scalar_text(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def first_line(text: Any, limit: int = 160) -> str:
    return errors.first_line(text, limit)


def unique(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))
