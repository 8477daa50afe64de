"""The sign-off report as a neutral document (pipeline/report/blocks.py), which Markdown and HTML render.

It reads as a release manager needs: the verdict with what failed and what to watch first, then the winner with its accuracy
cost beside its speed gain, the evidence, and last, folded, the record (artifacts, stages, conditions).
Every text here is plain; the renderers escape it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import PurePosixPath
from typing import Any

from pipeline.check.accuracy import DIRECTIONLESS, EXACT, SPREAD
from pipeline.check.speed import SERVED, THROUGHPUT, figure_text, fmt_qps, fmt_rate, metric_name
from pipeline.check.timings import Throughput, is_winner_row
from pipeline.check.verdicts import AccuracyRecord, Verdict, records
from pipeline.core.errors import reason_line
from pipeline.report.blocks import Block, Bullets, Cell, Document, Image, Para, Section, Table, Text
from pipeline.report.card import decision_card
from pipeline.report.diff import diff_versions
from pipeline.report.facts import (
    check_text,
    check_tone,
    failing_checks,
    first_line,
    flag_text,
    fmt_ci,
    fmt_metric,
    fmt_ms,
    input_sets_text,
    intervals_overlap,
    key_checks,
    metrics_present,
    not_run,
    quoted_metric,
    scalar_text,
    shape_text,
    sorted_results,
    where,
)
from pipeline.report.inputs import inputs_section
from pipeline.report.load import load_section
from pipeline.report.mixed import mixed_precision_section, static_mix_section
from pipeline.report.profile import profile_section
from pipeline.report.record import artifacts_section, conditions_section, stages_section

Dict = Mapping[str, Any]


def build_document(
    header: Dict,
    accuracy: Dict | None,
    speed: Dict | None,
    winner: Dict | None,
    stages: Sequence[Dict],
    previous: Dict | None = None,
    plots: Sequence[str] = (),
    load: Dict | None = None,
) -> Document:
    """Verdict, failures and warnings first; the winner and why; the evidence; what did not run; changes; and
    folded at the end the artifacts, the stages and the conditions of the measurement."""
    images = {PurePosixPath(p).stem: PurePosixPath(p).name for p in plots}
    sections = [
        _verdict(header, accuracy, speed, winner),
        _not_run(accuracy, speed),
        _winner(winner),
        _accuracy(accuracy, images.get("accuracy")),
        inputs_section(accuracy),
        _speed(header, speed, winner, images.get("latency")),
        load_section(load, winner, images.get("load")),
        mixed_precision_section(header),
        static_mix_section(header),
        profile_section(speed, winner),
        _flags(speed),
        _not_timed(speed),
        _changes(header, accuracy, speed, winner, previous),
        artifacts_section(header),
        stages_section(stages),
        conditions_section(speed, header.get("environment")),
    ]
    revision = header.get("git_revision") or "unknown"
    if header.get("git_dirty"):
        revision += " with uncommitted changes to the pipeline's code"
    subtitle = f"created {header.get('created') or '—'} · git revision {revision}"
    title = f"Sign-off: {header.get('name', '?')} {header.get('version', '?')}"
    return Document(title, subtitle, bool(header.get("signed_off")), [s for s in sections if s.blocks])


# ------------------------------------------------------------------ verdict


def _verdict(header: Dict, accuracy: Dict | None, speed: Dict | None, winner: Dict | None) -> Section:
    """The card that decides (pipeline/report/card.py), then what it rests on: failures, reasons, warnings."""
    blocks: list[Block] = [decision_card(header, accuracy, speed, winner)]
    failed = list(header.get("failed") or [])
    requested = list(header.get("requested") or [])
    names = list(dict.fromkeys(str(f.get("artifact")) for f in failed))
    if names:
        blocks.append(
            Para(f"{len(names)} of {len(requested) or len(names)} requested variants failed.", tone="bad")
        )
    if header.get("provisional"):
        blocks.append(
            Para(
                f"Provisional: winner did not stabilize. Its {_objective_figure(winner)} is a spread, not a clean "
                "number; measure again (--rebench) on a quieter machine before relying on the ranking.",
                tone="bad",
            )
        )
    reasons = [str(r) for r in header.get("signoff_reasons") or []]
    if reasons:
        blocks.append(Bullets(reasons, tone="bad"))
    if failed:
        rows = [
            [str(f.get("artifact")), str(f.get("stage")), reason_line(f.get("error"), 300)] for f in failed
        ]
        blocks += [Para("Failed variants:"), Table(["artifact", "stage", "error"], rows, ["bad"] * len(rows))]
    warnings = [str(w) for w in header.get("warnings") or []]
    if warnings:
        blocks += [Para("Warnings:"), Bullets(warnings, tone="warn")]
    return Section("Verdict", blocks)


def _objective_figure(winner: Dict | None) -> str:
    """What selection ranked, in words: a throughput objective's winner is unsettled in its throughput."""
    return {THROUGHPUT: "throughput", SERVED: "served rate"}.get(str(_objective_metric(winner)), "latency")


def _objective_metric(winner: Dict | None) -> Any:
    return ((winner or {}).get("objective") or {}).get("metric")


# ------------------------------------------------------------------ winner


def _winner(winner: Dict | None) -> Section:
    if not winner:
        return Section(
            "Winner",
            [Para("No artifact was selected: nothing may be deployed from this version.", tone="bad")],
        )
    objective = winner.get("objective") or {}
    goal = ", ".join(f"{k} {scalar_text(v)}" for k, v in objective.items() if v is not None)
    graph = ", CUDA graph" if winner.get("cuda_graph") else ""
    value = figure_text(winner.get("value"), winner.get("unit"))
    span = winner.get("interval")
    within = f" (95% interval {_span(span, winner.get('unit'))})" if span else ""
    blocks: list[Block] = [
        Para(
            f"{winner.get('artifact')} on {winner.get('runtime')} ({winner.get('io')} I/O{graph}): {value}{within}",
            strong=True,
        ),
        Para(f"File: {winner.get('file') or '—'}. Objective: {goal or '—'}."),
    ]
    cost = _cost_line(winner, winner.get("baseline"))
    if cost:
        blocks.append(Para(cost))
    runner_up = winner.get("runner_up")
    if runner_up:
        blocks.append(
            Para(
                f"Runner-up: {runner_up.get('artifact')} on {runner_up.get('runtime')} at "
                f"{figure_text(runner_up.get('value'), winner.get('unit'))}{_ratio(winner, runner_up)}."
            )
        )
    else:
        blocks.append(Para("No runner-up: it was the only candidate that passed validation."))
    if winner.get("reason"):
        blocks.append(Para(f"Why: {winner['reason']}"))
    record = winner.get("accuracy") or {}
    if record.get("record"):
        blocks.append(Para(f"Accuracy record it passed: {record['record']}.", tone="note"))
    return Section("Winner", blocks)


def _cost_line(winner: Dict, baseline: Dict | None) -> str | None:
    """'1.27× faster than onnx-fp32 (onnxruntime-cpu) at cosine 0.9891 vs 1.0000': the speed gain and what it
    costs in accuracy, against the plain export a release manager would otherwise ship. A gain is claimed only
    where the two 95% intervals separate; otherwise the winner is 'within noise of' it."""
    if not baseline:
        return None
    speed = _compared(winner, baseline)
    if speed is None:
        return None
    mine = (winner.get("accuracy") or {}).get("figures") or {}
    theirs = baseline.get("accuracy") or {}
    metric = quoted_metric(
        (winner.get("accuracy") or {}).get("gating") or [], [m for m in mine if m in theirs]
    )
    text = f"{speed[0].upper()}{speed[1:]} {baseline.get('artifact')} ({baseline.get('runtime')})"
    if metric:
        text += f" at {metric} {fmt_metric(metric, mine[metric])} vs {fmt_metric(metric, theirs[metric])}"
    if baseline.get("stable") is False and not speed.startswith("within"):
        text += f"; {baseline.get('artifact')}'s timing did not settle, so the ratio is rough"
    return text + "."


def _speedup(value: Any, other: Any, unit: Any) -> float | None:
    if not (isinstance(value, int | float) and isinstance(other, int | float) and value > 0 and other > 0):
        return None
    return other / value if (unit or "ms") == "ms" else value / other


def _compared(winner: Dict, other: Dict) -> str | None:
    """'1.27× faster than' / '1.27× the throughput of' / '1.27× slower than' where the 95% intervals of the
    two figures separate; 'within noise of' where they overlap (no ratio: the difference is not measured)."""
    ratio = _speedup(winner.get("value"), other.get("value"), winner.get("unit"))
    if ratio is None:
        return None
    if intervals_overlap(winner.get("interval"), other.get("interval")):
        return "within noise of"
    if (winner.get("unit") or "ms") != "ms":
        return f"{ratio:.2f}× the {_rate_word(winner)} of"
    return f"{ratio:.2f}× faster than" if ratio >= 1 else f"{1 / ratio:.2f}× slower than"


def _rate_word(winner: Dict) -> str:
    return "served rate" if winner.get("unit") == "requests/s" else "throughput"


def _ratio(winner: Dict, runner_up: Dict) -> str:
    compared = _compared(winner, runner_up)
    if compared is None:
        return ""
    if compared == "within noise of":  # a tie: the Why line says how the winner was picked among them
        return " (within noise of the winner: 95% intervals overlap; see Why)"
    if (winner.get("unit") or "ms") != "ms":
        return f" (the winner has {compared.split('×')[0]}× its {_rate_word(winner)})"
    rough = "; that row's timing did not settle" if runner_up.get("stable") is False else ""
    if compared.endswith("slower than"):  # only a simpler winner chosen from a tie is slower (see Why)
        return f" (the winner is {compared.removesuffix(' than')} by p50{rough}; see Why)"
    return f" (the winner is {compared.removesuffix(' than')}{rough})"


# ------------------------------------------------------------------ accuracy


def _accuracy_lines(entries: Mapping[str, AccuracyRecord]) -> list[tuple[str, str | None, Verdict]]:
    """(artifact, runtime, verdict on that runtime): one line per runtime an artifact was validated on."""
    lines: list[tuple[str, str | None, Verdict]] = []
    for name, entry in entries.items():
        if len(entry.runtimes) <= 1:
            lines.append((name, next(iter(entry.runtimes), entry.runtime), entry.overall))
            continue
        lines += [(name, runtime, verdict) for runtime, verdict in entry.runtimes.items()]
    return lines


def _accuracy(accuracy: Dict | None, image: str | None) -> Section:
    entries = records(accuracy)
    if not entries:
        return Section(
            "Accuracy", [Para("No artifact was validated.", tone="bad")] if accuracy is not None else []
        )
    metrics = metrics_present(accuracy)
    headers = ["artifact", "runtime", "precision", "verdict", "required checks passed", *metrics, "reason"]
    rows: list[list[Text]] = []
    tones = []
    for name, runtime, entry in _accuracy_lines(entries):
        picked = key_checks(entry)
        required = [c for c in entry.checks if c.required]
        cells: list[Text] = [
            name,
            str(runtime or "—"),
            entry.precision or "—",
            "pass" if entry.passed else "FAIL",
            f"{sum(c.passed for c in required)}/{len(required)}",
        ]
        cells += [Cell(check_text(picked[m]), check_tone(picked[m])) if m in picked else "—" for m in metrics]
        cells.append(entry.reason or "")
        rows.append(cells)
        tones.append("" if entry.passed else "bad")
    reference = (accuracy or {}).get("reference", "the reference")
    blocks: list[Block] = [
        Para(
            f"Every artifact against {reference}, on every runtime it is benchmarked on. Each figure is the worst "
            f"check of that metric over outputs and inputs ({input_sets_text(accuracy)}): the one closest to its "
            "threshold, or the largest error where there is none; per-token outputs are "
            "compared on real tokens only. Thresholds of max_abs and mean_abs are the recipe's tolerance times the "
            "output's scale, max(1, largest |reference value|). (info) marks a check that is reported but does "
            "not gate; neighbours is the share of each held-out sample's nearest neighbours an embedding keeps."
        ),
        Table(headers, rows, tones),
    ]
    noted = {(c.output, c.reason) for e in entries.values() for c in e.checks if c.metric == "max_abs"}
    flat = sorted({o for o, reason in noted if reason == DIRECTIONLESS})  # max_abs gating as written (fp32)
    spread = sorted({o for o, reason in noted if reason == SPREAD})  # where max_abs only informs
    exact = sorted({o for o, reason in noted if reason == EXACT})
    if flat:
        blocks.append(
            Para(
                f"{', '.join(flat)}: one value per sample (wherever a batch holds one), which cosine "
                "cannot judge there (the cosine of two single "
                f"numbers only says whether their signs agree, so it only informs): max_abs gates "
                f"{'it' if len(flat) == 1 else 'them'} as the tolerance sets it where it gates max_abs (FP32: "
                "its max_abs × scale)."
            )
        )
    if spread:
        blocks.append(
            Para(
                f"{', '.join(spread)}: one value per sample (wherever a batch holds one), which cosine "
                "cannot judge there (the cosine of two single "
                "numbers only says whether their signs agree, so it only informs): max_abs gates "
                f"{'it' if len(spread) == 1 else 'them'} where the precision's max_abs only informs (FP16, BF16, "
                "INT8) at the error the precision's cosine allows a vector, "
                "sqrt(1/cosine² - 1) × the output's spread (its standard deviation over the held-out samples: "
                f"{_spreads(entries, spread)}); a per-output max_abs under validation.tolerances replaces it."
            )
        )
    if exact:
        blocks.append(
            Para(
                f"{', '.join(exact)}: integer values (labels, ids, flags), where any change is wrong: max_abs gates "
                f"{'it' if len(exact) == 1 else 'them'} at 0, and cosine (meaningless for class ids) only informs "
                "(a per-output tolerance under validation.tolerances can allow more)."
            )
        )
    failures = [
        f"{name}{f' on {runtime}' if runtime else ''}: {where(c)}: {check_text(c, with_metric=True)}"
        for name, runtime, entry in _accuracy_lines(entries)
        for c in failing_checks(entry)[:5]
    ]
    if failures:
        blocks += [
            Para("Failing checks (worst first, at most five per artifact and runtime):"),
            Bullets(failures),
        ]
    located = _divergences(entries)
    if located:
        blocks += [Para("Where failing artifacts first diverge from the FP32 ONNX graph:"), Bullets(located)]
    if image:
        blocks.append(Image(image, "Accuracy: key error figures against thresholds"))
    return Section("Accuracy", blocks)


def _spreads(entries: Mapping[str, AccuracyRecord], outputs: list[str]) -> str:
    """'score 0.21' per output: the spread its spread-relative max_abs bounds were judged against."""
    found: dict[str, float] = {}
    for entry in entries.values():
        for c in entry.checks:
            if c.output in outputs and c.reason == SPREAD:
                found.setdefault(c.output, c.scale)
    return ", ".join(f"{o} {found[o]:.3g}" for o in outputs if o in found) or "see accuracy.json"


def _divergences(entries: Mapping[str, AccuracyRecord]) -> list[str]:
    """The node each failing graph first departs at; where none was found or the search failed, that: a
    failure with no line here would read as never searched."""
    lines = []
    for name, entry in entries.items():
        for runtime, verdict in entry.runtimes.items():
            found = verdict.divergence or {}
            if found.get("text"):
                lines.append(f"{name} on {runtime}: {found['text']}")
            elif found.get("note"):
                lines.append(f"{name} on {runtime}: {found['note']}")
            elif found.get("error"):
                lines.append(f"{name} on {runtime}: not located, the search failed: {found['error']}")
    return lines


# ------------------------------------------------------------------ speed


def _speed(header: Dict, speed: Dict | None, winner: Dict | None, image: str | None) -> Section:
    rows_in = sorted_results(speed)
    if not rows_in:
        return Section(
            "Speed", [Para("No artifact was benchmarked.", tone="bad")] if speed is not None else []
        )
    headers = [
        "artifact",
        "runtime",
        "io",
        "batch",
        "shapes",
        "p50 ms",
        "p99 ms",
        "p50 95% CI ms",
        "cv",
        "n",
        "stable",
    ]
    with_throughput = any(r.throughput for r in rows_in)
    with_memory = any(r.peak_memory_bytes is not None for r in rows_in)
    ranked = _ranked_latency(winner)
    headers += [f"{metric_name(ranked)} ms", f"{metric_name(ranked)} 95% CI ms"] if ranked else []
    headers += ["seq/s", "seq/s 95% CI"] if with_throughput else []
    headers += ["peak MiB"] if with_memory else []
    rows: list[list[Text]] = []
    tones = []
    for r in rows_in:
        won = is_winner_row(r, winner)
        graph = " (CUDA graph)" if r.cuda_graph else ""
        rows.append(
            [
                f"{r.artifact} ★" if won else r.artifact,
                f"{r.runtime}{graph}",
                r.io,
                scalar_text(r.batch),
                shape_text(r.shapes),
                fmt_ms(r.p50_ms),
                fmt_ms(r.p99_ms),
                fmt_ci(r.interval("p50_ms")),
                "—" if r.cv is None else f"{r.cv:.3f}",
                scalar_text(r.n),
                "yes" if r.stable else Cell(f"NO: {r.unsettled_reason('p50_ms')}", "bad"),
                *([fmt_ms(r.value(ranked)), fmt_ci(r.interval(ranked))] if ranked else []),
                *(_throughput_cells(r.throughput) if with_throughput else []),
                *([_memory_cell(r.peak_memory_bytes)] if with_memory else []),
            ]
        )
        tones.append("winner" if won else ("warn" if not r.stable else ""))
    blocks: list[Block] = [
        Para(_measured(header, speed), tone="note" if header.get("benchmark_reused_from") else "")
    ]
    blocks.append(Table(headers, rows, tones))
    notes = "Same inputs, timer, warm-up and window policy for every row; confidence intervals resample whole windows."
    if any(tone == "winner" for tone in tones):
        notes += " ★ marks the winner at the objective's shape."
    if with_throughput:
        notes += (
            " seq/s: sequences per second from a separate run of back-to-back requests (not derived from the "
            "latencies), its interval from the run's synchronized segments."
        )
    if with_memory:
        notes += (
            " peak MiB: the candidate's own peak device memory over loading, staging and its first call "
            "(the larger of the torch allocator's peak and the device's used-memory growth)."
        )
    if any(not r.stable for r in rows_in):
        notes += (
            " Rows with stable NO never had their window medians agree within the policy: read their spread "
            "(p50 to p99), not a clean number."
        )
    blocks.append(Para(notes, tone="note"))
    if image:
        blocks.append(
            Image(image, "Latency: p50 per artifact with p50..p99 range and the p50 confidence interval")
        )
    return Section("Speed", blocks)


def _ranked_latency(winner: Dict | None) -> str | None:
    """The latency statistic selection ranked by where the table has no column of it (p90, mean): the winner's
    reason quotes those figures, and a reader checks them here."""
    metric = _objective_metric(winner)
    return metric if metric in ("p90_ms", "mean_ms") else None


def _span(span: Any, unit: Any) -> str:
    if (unit or "ms") == "ms":
        return fmt_ci(span)
    rate = fmt_qps if unit == "requests/s" else fmt_rate
    return f"{rate(span[0])}–{rate(span[1])}" if isinstance(span, list | tuple) and len(span) == 2 else "—"


def _throughput_cells(run: Throughput | None) -> list[Text]:
    if not run:
        return ["—", "—"]
    if run.error:
        return [Cell(f"error: {first_line(run.error, 120)}", "bad"), "—"]
    figure = fmt_rate(run.sequences_per_s)
    span = _span(run.ci95, "seq/s")
    return [figure if run.stable else Cell(f"{figure} (unstable)", "warn"), span]


def _memory_cell(found: float | None) -> Text:
    return "—" if found is None else f"{found / 2**20:.0f}"


def _measured(header: Dict, speed: Dict | None) -> str:
    """A benchmark is never served from cache silently: say when and where it was measured."""
    conditions = (speed or {}).get("conditions") or {}
    text = f"Measured at {conditions.get('measured_at', '?')} on {conditions.get('host', '?')}."
    reused = header.get("benchmark_reused_from")
    if reused:
        text += f" These numbers were reused from {reused}, not measured again; deploy with --rebench to re-measure."
    return text


def _flags(speed: Dict | None) -> Section:
    """Grouped by kind with a count each (ten rows that never stabilized are one finding, not ten bullets)."""
    flags = list((speed or {}).get("flags") or [])
    groups: dict[str, list[str]] = {}
    for flag in flags:
        kind = str(flag.get("kind") or "flag").replace("_", " ") if isinstance(flag, Mapping) else "flag"
        groups.setdefault(kind, []).append(flag_text(flag))
    blocks: list[Block] = []
    for kind, lines in groups.items():
        blocks += [Para(f"{kind} ({len(lines)})", strong=True), Bullets(lines)]
    return Section("Flags", blocks)


def _not_run(accuracy: Dict | None, speed: Dict | None) -> Section:
    items = not_run(accuracy, speed)
    if not items:
        return Section("Not run", [])
    rows: list[list[Text]] = [[artifact, reason, stages] for artifact, reason, stages in items]
    return Section(
        "Not run",
        [
            Para("Built or requested, but not runnable on this host (no number is reported for these):"),
            Table(["artifact", "reason", "skipped by"], rows),
        ],
    )


def _not_timed(speed: Dict | None) -> Section:
    """What the host's timing rule left out on purpose (benchmark.runtimes null), so no reader takes a missing
    row for a failure."""
    timing = ((speed or {}).get("conditions") or {}).get("runtimes_timed") or {}
    left = timing.get("not_timed") or []
    if not left:
        return Section("Not timed", [])
    rows: list[list[Text]] = [
        [x.get("artifact", "?"), x.get("runtime", "?"), x.get("io", "any"), x.get("reason", "")] for x in left
    ]
    return Section(
        "Not timed",
        [
            Para(
                "Left out on purpose, so that no reader takes a missing row for a failure: a runtime not offered "
                "for the artifact, with why, or one not timed in this I/O mode under this host's rule: "
                f"{timing.get('rule', '?')}. An artifact with no row timed at all is still validated, on a runtime "
                "it was left out of for a faster twin, else on the first runtime this host offers it that the "
                "recipe has not opted out of (Accuracy), unless benchmark.runtimes leaves all of them out. "
                "A runtime an artifact could not run on in validation is not timed: it would only fail again. "
                "One whose outputs failed the accuracy gates is timed, for comparison, and never chosen."
            ),
            Table(["artifact", "runtime", "I/O", "reason"], rows),
        ],
    )


def _changes(
    header: Dict, accuracy: Dict | None, speed: Dict | None, winner: Dict | None, previous: Dict | None
) -> Section:
    if not previous:
        return Section("Changes", [])
    current = {
        "version": header.get("version"),
        "accuracy": accuracy,
        "speed": speed,
        "winner": winner,
        "signed_off": header.get("signed_off"),
    }
    lines = diff_versions(previous, current)
    title = f"Changes since {previous.get('version', 'the previous version')}"
    return Section(title, [Bullets(lines)] if lines else [Para("No changes.")])
