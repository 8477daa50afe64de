"""The two sign-off plots: latency per artifact and accuracy against thresholds (PNG, deterministic bytes).

Figures are built on matplotlib's object API with the Agg canvas, never pyplot, so nothing global (the
backend, the current figure) changes in the process that calls this. PNG metadata carries no software
version or date, so the same inputs give the same file.
"""

from __future__ import annotations

import contextlib
import io
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pipeline.check.served import served_rates
from pipeline.check.speed import fmt_qps
from pipeline.check.timings import Timing, is_winner_row
from pipeline.check.verdicts import CheckRecord, records
from pipeline.core.files import write_bytes_atomic
from pipeline.core.variants import REFERENCE
from pipeline.report.facts import (
    LOWER_BOUNDS,
    fmt_metric,
    group_key,
    key_checks,
    metrics_present,
    sorted_results,
)

Dict = Mapping[str, Any]
DPI = 100
BLUE, GREEN, RED, GREY, AMBER = "#5b8def", "#2e7d32", "#c62828", "#9e9e9e", "#f9a825"


def write_plots(
    out_dir: Path,
    accuracy: Dict | None,
    speed: Dict | None,
    winner: Dict | None = None,
    load: Dict | None = None,
) -> list[str]:
    """Write reports/latency.png, reports/accuracy.png and reports/load.png (the server scenario, where it ran)
    under out_dir; skip a plot that has no data.

    Returns the written paths relative to out_dir (e.g. "reports/latency.png").
    """
    written = []
    reports = Path(out_dir) / "reports"
    latency = latency_figure(speed, winner, accuracy)
    if latency is not None:
        _save(latency, reports / "latency.png")
        written.append("reports/latency.png")
    acc = accuracy_figure(accuracy)
    if acc is not None:
        _save(acc, reports / "accuracy.png")
        written.append("reports/accuracy.png")
    served = load_figure(load)
    if served is not None:
        _save(served, reports / "load.png")
        written.append("reports/load.png")
    return written


def settle_matplotlib_dirs() -> None:
    """Let matplotlib choose its config and cache folder now. It chooses on first import, and where HOME
    cannot be written makes a temporary folder that an atexit handler removes; a deploy draws the plots
    inside its own temp folder (Store.temp_dir), which is gone by then, and that removal printed a traceback
    at exit. Called before the deploy enters its temp folder, the temporary one lands in the system's."""
    with contextlib.suppress(ImportError):  # _figure says how to get it back, if a plot is drawn
        import matplotlib  # noqa: F401


def _figure(width: float, height: float, **kwargs: Any):
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:  # a core dependency, but say how to get it back
        raise RuntimeError("plots need matplotlib: pip install matplotlib") from exc
    fig = Figure(figsize=(width, height), dpi=DPI, **kwargs)
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Any, target: Path) -> None:
    """Write through a temporary name so a reader never sees half a PNG."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI, metadata={"Software": None})
    write_bytes_atomic(target, buffer.getvalue())


# ------------------------------------------------------------------ latency


def latency_figure(speed: Dict | None, winner: Dict | None = None, accuracy: Dict | None = None):
    """One panel per (batch, shape): p50 bars, p50..p99 whiskers, the p50 CI in black, unstable rows hatched.

    Artifacts that failed validation are drawn faded and say so: fast but not deployable.
    """
    rows = sorted_results(speed)
    rows = [r for r in rows if r.p50_ms is not None]
    if not rows:
        return None
    groups: dict[tuple, list[Timing]] = {}
    for row in rows:
        groups.setdefault(group_key(row), []).append(row)
    heights = [len(g) for g in groups.values()]
    fig = _figure(9.0, 1.3 + sum(0.38 * h + 0.65 for h in heights), layout="constrained")
    axes = fig.subplots(
        len(groups), 1, squeeze=False, gridspec_kw={"height_ratios": [h + 1.2 for h in heights]}
    )
    for ax, ((batch, shape), group) in zip(axes[:, 0], groups.items(), strict=True):
        _latency_panel(ax, group, winner, _failed(accuracy))
        ax.set_title(f"batch {batch}, shape {shape}", loc="left", fontsize=10)
    axes[-1, 0].set_xlabel("latency (ms)")
    fig.legend(handles=_latency_legend(), loc="outside upper center", ncols=6, fontsize=8, frameon=False)
    return fig


def _failed(accuracy: Dict | None) -> set[str]:
    return {name for name, entry in records(accuracy).items() if not entry.passed}


def _latency_panel(ax: Any, rows: list[Timing], winner: Dict | None, failed: set[str]) -> None:
    y = list(range(len(rows)))[::-1]  # fastest on top
    p50 = [r.p50_ms or 0.0 for r in rows]
    p99 = [max(r.p99_ms or a, a) for r, a in zip(rows, p50, strict=True)]
    colours = [_bar_colour(r, winner) for r in rows]
    bars = ax.barh(y, p50, color=colours, edgecolor="#333", linewidth=0.6, height=0.62)
    for bar, row in zip(bars, rows, strict=True):
        if not row.stable:
            bar.set_hatch("///")
        if row.artifact in failed:
            bar.set_alpha(0.4)
    ax.errorbar(
        p50,
        y,
        xerr=[[0.0] * len(rows), [b - a for a, b in zip(p50, p99, strict=True)]],
        fmt="none",
        ecolor="#444",
        elinewidth=1,
        capsize=3,
    )
    for yi, row in zip(y, rows, strict=True):
        ci = row.interval("p50_ms")
        if ci is not None:
            ax.hlines(yi, ci[0], ci[1], color="black", linewidth=4)
    log = max(p99) / max(min(p50), 1e-9) > 20
    if log:
        _log_decades(ax)
    for yi, a, b, row in zip(y, p50, p99, rows, strict=True):
        note = f"p50 {a:.3g} · p99 {b:.3g} ms" + ("" if row.stable else "  unstable")
        note += "  failed validation" if row.artifact in failed else ""
        # a column right of the axes: never over a bar, and the layout makes room for it
        ax.text(1.01, yi, note, va="center", fontsize=8, transform=ax.get_yaxis_transform())
    ax.set_xlim(left=min(p50) / 2 if log else 0, right=max(p99) * (1.5 if log else 1.08))
    ax.set_yticks(y, [r.label for r in rows], fontsize=8)
    ax.grid(axis="x", color="#eee")
    ax.set_axisbelow(True)


SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def _log_decades(ax: Any) -> None:
    """A log x scale labelled at its decades in plain text (10⁻³): matplotlib's own labels are mathtext, whose
    parser cost a deploy's two plots 0.3 CPU-s. Minor ticks are off: a decade grid reads as well, and
    unlabelled minor ticks cost seconds of layout."""
    from matplotlib.ticker import FuncFormatter, NullLocator

    ax.set_xscale("log")
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(_decade_label))


def _decade_label(value: float, _position: int | None) -> str:
    exponent = math.log10(value) if 0 < value < math.inf else math.nan
    if math.isnan(exponent) or abs(exponent - round(exponent)) > 1e-9:
        return ""
    return "10" + str(round(exponent)).translate(SUPERSCRIPT)


def _bar_colour(row: Timing, winner: Dict | None) -> str:
    if is_winner_row(row, winner):
        return GREEN
    return GREY if row.artifact == REFERENCE else BLUE


def _latency_legend() -> list:
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    return [
        Patch(facecolor=BLUE, edgecolor="#333", label="p50"),
        Patch(facecolor=GREEN, edgecolor="#333", label="winner"),
        Patch(facecolor=GREY, edgecolor="#333", label="torch reference"),
        Patch(facecolor="white", edgecolor="#333", hatch="///", label="unstable"),
        Line2D([], [], color="#444", linewidth=1, label="p50..p99"),
        Line2D([], [], color="black", linewidth=4, label="p50 95% CI"),
    ]


# ------------------------------------------------------------------ accuracy


def accuracy_figure(accuracy: Dict | None):
    """Per metric, each artifact's deciding check (dot) against its threshold (bar), on a log scale of error."""
    entries = records(accuracy)
    metrics = metrics_present(accuracy)[:4]
    if not entries or not metrics:
        return None
    names = list(entries)
    fig = _figure(min(4.2 * len(metrics), 13.0), 1.6 + 0.36 * len(names), layout="constrained")
    axes = fig.subplots(1, len(metrics), squeeze=False, sharey=True)
    y = list(range(len(names)))[::-1]
    for ax, metric in zip(axes[0], metrics, strict=True):
        _accuracy_panel(ax, metric, [key_checks(entries[n].overall).get(metric) for n in names], y)
    first = axes[0, 0]
    first.set_yticks(y, names, fontsize=8)
    for label, name in zip(first.get_yticklabels(), names, strict=True):
        if not entries[name].passed:
            label.set_color(RED)
    fig.legend(handles=_accuracy_legend(), loc="outside upper center", ncols=4, fontsize=8, frameon=False)
    return fig


def _error(metric: str, value: Any) -> float:
    """The plotted error: 1 - cosine for cosine (so lower is better everywhere), the value otherwise."""
    if not isinstance(value, int | float) or math.isnan(value):
        return math.nan
    return 1.0 - value if metric in LOWER_BOUNDS else float(value)


def _accuracy_panel(ax: Any, metric: str, checks: Sequence[CheckRecord | None], y: list[int]) -> None:
    points = [
        (yi, c, _error(metric, c.value), _error(metric, c.threshold))
        for yi, c in zip(y, checks, strict=True)
        if c is not None
    ]
    positive = [v for _, _, e, t in points for v in (e, t) if not math.isnan(v) and v > 0]
    floor = min(positive) / 10 if positive else 1e-12
    top = max(positive) * 4 if positive else 1.0
    for yi, check, err, thr in points:
        colour = _check_colour(check)
        if math.isnan(err):
            ax.plot([thr if not math.isnan(thr) else top / 2], [yi], marker="X", markersize=9, color=RED)
            continue
        shown = max(err, floor)
        if not math.isnan(thr):
            ax.hlines(yi, min(shown, thr), max(shown, thr), color=colour, linewidth=1.5, alpha=0.6)
            ax.plot([thr], [yi], marker="|", markersize=14, markeredgewidth=2, color="black")
        ax.plot([shown], [yi], marker="o", markersize=7, color=colour, markeredgecolor="#222")
    for yi, check, _, _ in points:  # the values in a column right of the panel, clear of the markers
        text = fmt_metric(metric, check.value)
        ax.text(1.02, yi, text, va="center", fontsize=7, color="#333", transform=ax.get_yaxis_transform())
    _log_decades(ax)
    ax.set_xlim(floor / 2, top)
    ax.set_ylim(-0.7, len(y) - 0.3)
    title = f"1 − {metric} (worst)" if metric in LOWER_BOUNDS else f"{metric} (worst)"
    ax.set_title(title + ", lower is better", fontsize=9)
    ax.grid(axis="x", color="#eee")
    ax.set_axisbelow(True)


def _check_colour(check: CheckRecord) -> str:
    if check.passed:
        return GREEN
    return AMBER if check.informational else RED


def _accuracy_legend() -> list:
    from matplotlib.lines import Line2D

    dot = {"marker": "o", "linestyle": "none", "markeredgecolor": "#222"}
    return [
        Line2D([], [], color=GREEN, label="within threshold", **dot),
        Line2D([], [], color=RED, label="fails threshold", **dot),
        Line2D([], [], color=AMBER, label="over threshold, informational", **dot),
        Line2D(
            [],
            [],
            color="black",
            marker="|",
            linestyle="none",
            markersize=12,
            markeredgewidth=2,
            label="threshold",
        ),
    ]


# ------------------------------------------------------------------ load


def load_figure(load: Dict | None):
    """The server scenario: per candidate, the p99 of request latency against the rate it completed, one point
    per LoadGen run (filled where the run met the target), with the target as a line."""
    rows = [r for r in served_rates(load) if any(p.completed_qps and p.p99_ms for p in r.points)]
    if not rows:
        return None
    fig = _figure(9.0, 4.2, layout="constrained")
    ax = fig.subplots()
    colours = [BLUE, GREEN, AMBER, GREY, RED, "#6a1b9a", "#00838f", "#5d4037"]
    for i, row in enumerate(rows):
        points = sorted(
            (p for p in row.points if p.completed_qps and p.p99_ms), key=lambda p: p.completed_qps or 0
        )
        colour = colours[i % len(colours)]
        xs = [p.completed_qps for p in points]
        ys = [p.p99_ms for p in points]
        best = f", {fmt_qps(row.max_qps)} req/s at target" if row.max_qps else ", target never met"
        ax.plot(xs, ys, color=colour, linewidth=1, alpha=0.7, label=row.label + best)
        for p in points:
            ax.plot(
                [p.completed_qps],
                [p.p99_ms],
                marker="o",
                markersize=6,
                color=colour,
                markerfacecolor=colour if p.met else "white",
                markeredgecolor=colour,
            )
    target = rows[0].p99_target_ms
    if target:
        ax.axhline(target, color=RED, linestyle="--", linewidth=1.2, label=f"p99 target {target:g} ms")
    from matplotlib.ticker import LogLocator, ScalarFormatter

    ax.set_xscale("log")
    ax.set_yscale("log")
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        axis.set_major_formatter(ScalarFormatter())
        axis.set_minor_locator(LogLocator(subs=()))
    ax.set_xlabel("requests per second completed (log)")
    ax.set_ylabel("p99 latency, ms (log)")
    ax.set_title("Server scenario (MLPerf LoadGen): filled points met the target", loc="left", fontsize=10)
    ax.grid(color="#eee")
    ax.set_axisbelow(True)
    ax.legend(fontsize=8, frameon=False, loc="upper left")
    return fig
