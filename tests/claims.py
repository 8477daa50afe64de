"""Every sentence of a sign-off checked against the numbers it rests on, recomputed here from the version's
JSON reports (not with the renderer's own helpers): the accuracy table's "worst" figures, the winner's
speed claims, the tie group its reason names, the flags, and the intervals. `problems(version)` lists what
does not hold; a test asserts it is empty for every deploy it makes."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

LOWER_BOUNDS = ("cosine", "neighbours")
RATIO = re.compile(r"([0-9.]+)× (faster than|slower than|the throughput of) (\S+) \(([^)]+)\)")


def problems(version: Path) -> list[str]:
    reports = version / "reports"
    accuracy = json.loads((reports / "accuracy.json").read_text())
    speed = json.loads((reports / "speed.json").read_text())
    page = (reports / "signoff.md").read_text()
    winner_file = version / "winner.json"
    winner = json.loads(winner_file.read_text()) if winner_file.exists() else None
    found = interval_problems(speed)
    found += accuracy_table_problems(page, accuracy)
    if winner:
        found += winner_problems(page, winner, speed, accuracy)
    found += flag_problems(speed)
    found += spread_problems(page, accuracy)
    return found


# ---------------------------------------------------------------- one value per sample


def spread_problems(page: str, accuracy: dict[str, Any]) -> list[str]:
    """A one-value-per-sample output is bounded against one spread (the held-out samples'), at every input set
    and on every runtime, and the sign-off quotes that spread."""
    from pipeline.check.accuracy import SPREAD

    scales: dict[str, list[float]] = {}
    for entry in accuracy.get("artifacts", {}).values():
        for check in entry.get("checks", []):
            if check.get("reason") == SPREAD:  # a scale of 1 is left out of the JSON
                found_scales = scales.setdefault(check["output"], [])
                scale = float(check.get("scale", 1.0))
                if not any(math.isclose(scale, s, rel_tol=1e-6) for s in found_scales):
                    found_scales.append(scale)
    found = [
        f"{o}: bounded against {len(s)} different spreads {sorted(s)}"
        for o, s in scales.items()
        if len(s) > 1
    ]
    quoted = re.search(r"standard deviation over the held-out samples: ([^)]*)\)", page)
    for item in quoted.group(1).split(", ") if quoted else []:
        output, _, shown = item.rpartition(" ")
        if output in scales and not any(math.isclose(float(shown), v, rel_tol=5e-3) for v in scales[output]):
            found.append(
                f"the sign-off quotes {output}'s spread as {shown}; its checks used {sorted(scales[output])}"
            )
    if scales and not quoted:
        found.append(f"no sentence quotes the spread of {', '.join(sorted(scales))}")
    return found


# ---------------------------------------------------------------- intervals


def interval_problems(speed: dict[str, Any]) -> list[str]:
    """Every interval of a positive quantity lies at or above 0 and holds its own estimate."""
    found = []
    for row in speed.get("results", []):
        label = f"{row['artifact']} {row['runtime']} b{row['batch']}"
        spans = {"p50": row.get("p50_ci95_ms"), **(row.get("ci95_ms") or {})}
        for stat, span in spans.items():
            if span is None:
                continue
            if span[0] < 0:
                found.append(f"{label}: the {stat} interval {span} reaches below 0")
            estimate = row.get(f"{stat}_ms")
            if isinstance(estimate, int | float) and not span[0] <= estimate <= span[1]:
                found.append(f"{label}: the {stat} interval {span} does not hold its estimate {estimate}")
        throughput = row.get("throughput") or {}
        if throughput.get("ci95") and throughput["ci95"][0] < 0:
            found.append(f"{label}: the throughput interval {throughput['ci95']} reaches below 0")
    return found


# ---------------------------------------------------------------- the accuracy table


def _share(check: dict[str, Any]) -> float | None:
    value, threshold = check.get("value"), check.get("threshold")
    if not isinstance(value, int | float) or not isinstance(threshold, int | float):
        return None
    if check["metric"] in LOWER_BOUNDS:
        return (1 - value) / (1 - threshold) if threshold < 1 else None
    if threshold == 0 and check["metric"] == "max_abs":  # an integer output's exact bound: met or broken
        return 0.0 if value == 0 else math.inf
    return value / threshold if threshold > 0 else None


def _bad(check: dict[str, Any]) -> float:
    value = check.get("value")
    if not isinstance(value, int | float) or math.isnan(value):
        return math.inf
    return 1 - value if check["metric"] in LOWER_BOUNDS else value


def worst_checks(checks: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per metric, the worst check: among the required ones if there are any, by the share of the threshold
    it uses (then by its figure), else by its figure alone."""
    by_metric: dict[str, list[dict[str, Any]]] = {}
    for check in checks:
        if check["metric"] in ("finite", "comparable"):
            continue
        by_metric.setdefault(check["metric"], []).append(check)
    worst = {}
    for metric, group in by_metric.items():
        required = [c for c in group if not c.get("informational")]
        pool = required or group
        worst[metric] = max(pool, key=lambda c: (_share(c) if _share(c) is not None else -1.0, _bad(c)))
    return worst


def accuracy_table_problems(page: str, accuracy: dict[str, Any]) -> list[str]:
    """Each row of the accuracy table shows, per metric, the worst check of that artifact on that runtime."""
    section = page[page.index("## Accuracy") : page.index("## Speed")] if "## Speed" in page else ""
    lines = [line for line in section.splitlines() if line.startswith("| ") and "---" not in line]
    if not lines:
        return []
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    found = []
    for line in lines[1:]:
        cells = dict(zip(header, (c.strip() for c in line.strip("|").split("|")), strict=False))
        entry = accuracy["artifacts"].get(cells.get("artifact", ""))
        if entry is None:
            continue
        runtime = cells["runtime"]
        checks = [c for c in entry["checks"] if c.get("runtime", runtime) == runtime]
        for metric, check in worst_checks(checks).items():
            cell = cells.get(metric, "")
            shown = _shown_value(cell)
            if shown is None:
                continue
            expected = check.get("value")
            if not _same(shown, expected, metric):
                found.append(
                    f"accuracy table {cells['artifact']} on {runtime}: {metric} shows {cell!r}, "
                    f"the worst check is {expected}"
                )
    return found


def _shown_value(cell: str) -> float | None:
    text = cell.split(" ")[0:3]
    if not text or text[0] in ("", "—", "nan"):
        return None
    if len(text) >= 3 and text[1] == "−":  # '1 − 2.2e-16'
        return 1 - float(text[2])
    try:
        return float(text[0])
    except ValueError:
        return None


def _same(shown: float, value: Any, metric: str) -> bool:
    if not isinstance(value, int | float):
        return False
    if metric in LOWER_BOUNDS:
        return abs(shown - value) <= 1e-6 + 1e-9 * abs(value) or abs(
            (1 - shown) - (1 - value)
        ) <= 0.051 * abs(1 - value)
    return math.isclose(shown, value, rel_tol=6e-3, abs_tol=1e-12)


# ---------------------------------------------------------------- the winner


def _overlap(a: list[float] | None, b: list[float] | None) -> bool:
    return a is not None and b is not None and a[0] <= b[1] and b[0] <= a[1]


def winner_problems(
    page: str, winner: dict[str, Any], speed: dict[str, Any], accuracy: dict[str, Any]
) -> list[str]:
    """'N× faster than X' only where the two intervals separate, 'within noise of' where they overlap, 'do not
    overlap' only where the runner-up's interval does not; the reason's tie list is within the rows overlapping
    the fastest candidate (selection leaves out those whose timing did not settle)."""
    section = page[page.index("## Winner") : page.index("## Accuracy")]
    found = []
    peers = {p["artifact"]: p for p in (winner.get("baseline"), winner.get("runner_up")) if p}
    for match in RATIO.finditer(section):
        peer = peers.get(match.group(3))
        if peer is None:
            continue
        if _overlap(winner.get("interval"), peer.get("interval")):
            found.append(
                f"winner: '{match.group(0)}' although the intervals overlap "
                f"({winner.get('interval')} vs {peer.get('interval')})"
            )
    for peer in peers.values():
        separated = not _overlap(winner.get("interval"), peer.get("interval"))
        said_noise = f"within noise of {peer['artifact']}" in section
        if separated and said_noise:
            found.append(f"winner: 'within noise of {peer['artifact']}' although the intervals separate")
    objective = winner.get("objective") or {}
    metric = objective.get("metric", "p50_ms")
    candidates = _candidates(speed, winner, metric, accuracy)
    if candidates:
        fastest = candidates[0]
        group = {c["label"] for c in candidates if _overlap(c["interval"], fastest["interval"])}
        winner_label = _label(winner)
        named = set(winner.get("within_noise_of") or [])
        if winner_label not in group:
            found.append(f"winner {winner_label} is not within noise of the fastest {fastest['label']}")
        extra = named - group
        if extra:
            found.append(f"winner.json within_noise_of names {sorted(extra)}, outside the tie group")
        why = [line for line in section.splitlines() if line.startswith("Why: ")]
        found += tie_sentence_problems(" ".join(why) or winner.get("reason", ""), winner, candidates)
    runner_up = winner.get("runner_up") or {}
    if "the 95% intervals do not overlap" in winner.get("reason", "") and _overlap(
        winner.get("interval"), runner_up.get("interval")
    ):
        found.append(
            f"winner: 'the 95% intervals do not overlap' although the runner-up's does "
            f"({winner.get('interval')} vs {runner_up.get('interval')})"
        )
    return found


LABEL = re.compile(r"([\w.-]+ \([^()]*\)) ")


def tie_sentence_problems(why: str, winner: dict[str, Any], candidates: list[dict[str, Any]]) -> list[str]:
    """Every candidate the reason calls tied with someone overlaps that someone's interval: 'tied with the
    winner' lists only rows that overlap the winner, 'within noise of the fastest' only rows that overlap the
    fastest (`candidates`: best first, as `_candidates` gives them)."""
    spans = {c["label"]: c["interval"] for c in candidates}
    fastest = candidates[0]
    winner_label = _label(winner)
    subjects = [
        (r"tied with the winner: ([^;]*)", "the winner", winner_label, winner.get("interval")),
        (
            r"within noise of the (?:fastest|best): ([^;]*)",
            "the fastest",
            fastest["label"],
            fastest["interval"],
        ),
        (
            r", but within noise of (.*?) \(95% intervals overlap\)",
            "the winner",
            winner_label,
            winner.get("interval"),
        ),
    ]
    found = []
    best_of = {c["label"].split(" (")[0]: c["label"] for c in candidates}
    for pattern, said, label, span in subjects:
        for match in re.finditer(pattern, why):
            for named in LABEL.findall(match.group(1) + " "):
                artifact = named.split(" (")[0]
                if named not in spans and artifact in best_of:  # selection weighs each artifact's best row
                    found.append(f"the reason names {named}, not {artifact}'s best row {best_of[artifact]}")
                if named in spans and named != label and not _overlap(spans[named], span):
                    found.append(
                        f"the reason puts {named} {spans[named]} within noise of {said} {label} {span}: "
                        "the intervals do not overlap"
                    )
    return found


def _label(row: dict[str, Any]) -> str:
    io = "" if row.get("io") == "host" else f", {row.get('io')} I/O"
    graph = ", CUDA graph" if row.get("cuda_graph") else ""
    return f"{row['artifact']} ({row['runtime']}{io}{graph})"


def _passed(accuracy: dict[str, Any], artifact: str, runtime: str) -> bool:
    entry = accuracy["artifacts"].get(artifact) or {}
    return bool(((entry.get("runtimes") or {}).get(runtime) or {}).get("passed"))


def _candidates(
    speed: dict[str, Any], winner: dict[str, Any], metric: str, accuracy: dict[str, Any]
) -> list[dict[str, Any]]:
    """The rows selection could choose from at the winner's shapes (validated on their runtime), one per
    artifact (its best), best first, with their objective intervals (latency objectives)."""
    if metric == "sequences_per_s":
        return []
    key = metric.removesuffix("_ms")
    best: dict[str, dict[str, Any]] = {}
    for row in speed["results"]:
        if row.get("shapes") != winner.get("shapes") or not _passed(
            accuracy, row["artifact"], row["runtime"]
        ):
            continue
        if row["artifact"] not in best or row[metric] < best[row["artifact"]][metric]:
            best[row["artifact"]] = row
    out = []
    for row in best.values():
        span = (row.get("ci95_ms") or {}).get(key) or (row.get("p50_ci95_ms") if key == "p50" else None)
        if span is not None:
            out.append({"label": _label(row), "value": row[metric], "interval": span})
    return sorted(out, key=lambda c: c["value"])


# ---------------------------------------------------------------- flags


def flag_problems(speed: dict[str, Any]) -> list[str]:
    """An 'int8 not faster' flag says 'slower' only where the int8 row's p50 is not below its peer's."""
    found = []
    for flag in speed.get("flags", []):
        if not isinstance(flag, dict) or flag.get("kind") != "int8_not_faster":
            continue
        if flag["message"].endswith(": slower") and flag["int8_p50_ms"] < flag["other_p50_ms"]:
            found.append(f"flag says slower: {flag['message']}")
    return found
