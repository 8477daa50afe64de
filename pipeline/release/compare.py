"""`compare A B`: two versions side by side, judged the way a release gate needs.

Speed per (artifact, runtime, io, shape) with interval-aware verdicts: faster or slower only when the
confidence intervals of the objective metric do not overlap, else within noise. Accuracy per artifact and
check, measured as the share of its tolerance a check uses (error / threshold, or (1 - cosine) /
(1 - threshold)), so that changes read the same for every metric. Environment and recipe changes listed.

The gate (exit 1) is about what B ships, against the budget in B's recipe (`selection.regression`): B did
not sign off while A did; B's winner is slower than A's winner by more than `max_slowdown`, beyond noise; or
a required check of B's winner uses more than `max_accuracy_loss` more of its tolerance than the same check
of the same artifact in A (or of A's winner, when A did not validate that artifact). Everything else is
reported, not gated."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from pipeline.check.speed import SERVED, as_interval, unit_of
from pipeline.check.timings import Timing, is_winner_row, timings
from pipeline.check.verdicts import AccuracyRecord, records
from pipeline.check.version_diff import (
    accuracy_changes,
    change,
    served_changes,
    slowdown,
    speed_changes,
    speed_verdict,
    worst_shares,
)
from pipeline.core.errors import PipelineError
from pipeline.core.stored import Damaged, read_stored
from pipeline.recipe import RegressionBudget
from pipeline.release.tracking import flatten

IGNORED_RECIPE_KEYS = ("output.root",)


# ---------------------------------------------------------------- finding versions


def resolve_version(ref: str, recipe: str | None) -> Path:
    """A version folder from: a path to one; NAME/vNNNN or NAME/latest under ./artifacts (or the recipe's
    output root); vNNNN or latest in the recipe's store, else in the only store under ./artifacts that has it."""
    path = Path(ref)
    if (path / "manifest.json").is_file():
        return path
    if path.is_absolute() or ref.startswith(".") or path.is_dir():
        raise PipelineError(f"compare: {ref} is not a version folder (no manifest.json)")
    if recipe is not None:
        from pipeline.recipe.loader import load, resolve_recipe_path

        loaded = load(resolve_recipe_path(recipe))
        stores = [Path(loaded.recipe.output.root) / loaded.recipe.name]
    else:
        root = Path("artifacts")
        stores = sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    if "/" in ref:
        name, _, version = ref.partition("/")
        stores = [s.parent / name for s in stores[:1]] if recipe else [Path("artifacts") / name]
        ref = version
    found = [s / ref for s in stores if (s / ref / "manifest.json").is_file()]
    if len(found) == 1:
        return found[0].resolve() if ref == "latest" else found[0]
    where = ", ".join(str(s) for s in stores) or "./artifacts (empty)"
    if not found:
        raise PipelineError(f"compare: no version '{ref}' (looked in {where}; pass a folder or --recipe)")
    raise PipelineError(f"compare: '{ref}' is ambiguous ({where}); pass --recipe or NAME/{ref}")


def _version(folder: Path) -> dict[str, Any]:
    """A version's reports, once its files verify against its manifest: compare judges releases, so a damaged
    one (a report edited after publication, say) is refused, never judged."""
    from pipeline.release.store import verify_folder

    if not (folder / "manifest.json").is_file():
        raise PipelineError(f"compare: {folder} has no manifest.json (not a version folder)")
    damage = verify_folder(folder)
    if damage:
        more = f" (and {len(damage) - 1} more)" if len(damage) > 1 else ""
        raise PipelineError(
            f"compare: {folder} is damaged: {damage[0]}{more}; a damaged version is not judged "
            f"(python -m pipeline verify shows every damaged file)"
        )
    try:
        return {
            "folder": folder,
            "manifest": read_stored(folder / "manifest.json") or {},
            "speed": read_stored(folder / "reports/speed.json") or {},
            "accuracy": read_stored(folder / "reports/accuracy.json") or {},
            "winner": read_stored(folder / "winner.json"),
            "load": read_stored(folder / "reports/load.json")
            if (folder / "reports/load.json").is_file()
            else None,
        }
    except Damaged as exc:  # sealed, yet not of the contract's shape: made by something else
        raise PipelineError(f"compare: {exc}; a damaged version is not judged") from None


# ---------------------------------------------------------------- speed


def compare_rows(a: dict[str, Any], b: dict[str, Any], metric: str) -> list[dict[str, Any]]:
    """The rows both versions measured, with B's change against A (check/version_diff.py)."""
    out = []
    for moved in speed_changes(a, b, metric):
        if moved.a is None or moved.b is None:
            continue
        row_a, row_b = moved.before, moved.row
        out.append(
            {
                "artifact": row_b.artifact,
                "runtime": row_b.runtime,
                "io": row_b.io,
                "batch": row_b.batch,
                "sequence_length": row_b.recorded_sequence,
                "shapes": dict(row_b.shapes),
                "metric": metric,
                "a": moved.a,
                "b": moved.b,
                "a_ci95": moved.a_ci,
                "b_ci95": moved.b_ci,
                "change": moved.change,
                "verdict": moved.verdict,
                "stable": bool((row_a is None or row_a.stable) and row_b.stable),
            }
        )
    return out


def _winner_row(version: dict[str, Any]) -> Timing | None:
    """The speed row the winner was chosen on (its intervals), else winner.json itself read as a row."""
    winner = version["winner"]
    if not winner:
        return None
    found = next((row for row in timings(version["speed"]) if is_winner_row(row, winner)), None)
    return found or Timing.read(winner)


def compare_served(a: dict[str, Any] | None, b: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The server scenario's candidates both versions ran: the rate each serves within its p99 target."""
    return [
        {
            "artifact": moved.key[0],
            "runtime": moved.key[1],
            "through": moved.key[2],
            "p99_target_ms": (moved.after or moved.before).p99_target_ms,  # type: ignore[union-attr]
            "a": moved.before.max_qps if moved.before else None,
            "b": moved.after.max_qps if moved.after else None,
            "a_ci95": moved.before.ci95 if moved.before else None,
            "b_ci95": moved.after.ci95 if moved.after else None,
            "slowdown": moved.slowdown,
            "verdict": moved.verdict,
        }
        for moved in served_changes(a, b)
        if moved.before is not None and moved.after is not None
    ]


# ---------------------------------------------------------------- accuracy


def compare_accuracy(a: dict[str, Any], b: dict[str, Any]) -> list[dict[str, Any]]:
    """The artifacts both versions validated, with the share of its tolerance each uses."""
    return [
        {
            "artifact": moved.artifact,
            "a_passed": moved.a_passed,
            "b_passed": moved.b_passed,
            "a_worst_share": max(worst_shares(moved.before).values(), default=None),
            "b_worst_share": max(worst_shares(moved.after).values(), default=None),
            "largest_share_growth": moved.share_growth,
            "now_fails": moved.a_passed and not moved.b_passed,
        }
        for moved in accuracy_changes(a, b)
        if moved.before is not None and moved.after is not None
    ]


# ---------------------------------------------------------------- environment and recipe


def changes(a: dict[str, Any], b: dict[str, Any], ignored: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    flat_a, flat_b = flatten(a), flatten(b)
    return [
        {"key": key, "a": flat_a.get(key), "b": flat_b.get(key)}
        for key in sorted(set(flat_a) | set(flat_b))
        if flat_a.get(key) != flat_b.get(key) and key not in ignored
    ]


# ---------------------------------------------------------------- the gate


def budget_of(version: dict[str, Any]) -> RegressionBudget:
    raw = ((version["manifest"].get("recipe") or {}).get("selection") or {}).get("regression") or {}
    return RegressionBudget.model_validate(raw)


def objective_metric(version: dict[str, Any]) -> str:
    selection = (version["manifest"].get("recipe") or {}).get("selection") or {}
    return (selection.get("objective") or {}).get("metric", "p50_ms")


def _shipped_value(version: dict[str, Any], row: Timing, metric: str) -> float:
    """The winner's figure from its speed row, else winner.json's own value (no row found)."""
    found = row.value(metric)
    return found if found is not None else version["winner"]["value"]


def shipped(a: dict[str, Any], b: dict[str, Any], metric: str) -> dict[str, Any] | None:
    row_a, row_b = _winner_row(a), _winner_row(b)
    if row_a is None or row_b is None:
        return None
    if metric == SERVED:  # a served rate is winner.json's own (load.json's), never a speed row's
        if a["winner"].get("unit") != unit_of(SERVED):  # A chose by another objective: nothing to set against
            return None
        value_a, value_b = a["winner"]["value"], b["winner"]["value"]
        a_ci, b_ci = as_interval(a["winner"].get("interval")), as_interval(b["winner"].get("interval"))
    else:
        value_a, value_b = _shipped_value(a, row_a, metric), _shipped_value(b, row_b, metric)
        a_ci, b_ci = row_a.interval(metric), row_b.interval(metric)
    return {
        "a": {"artifact": a["winner"]["artifact"], "runtime": a["winner"]["runtime"], "value": value_a},
        "b": {"artifact": b["winner"]["artifact"], "runtime": b["winner"]["runtime"], "value": value_b},
        "metric": metric,
        "unit": unit_of(metric),
        "a_ci95": a_ci,
        "b_ci95": b_ci,
        "change": change(value_a, value_b),
        "slowdown": slowdown(value_a, value_b, metric),
        "verdict": speed_verdict(a_ci, b_ci, metric),
    }


def _winner_accuracy(version: dict[str, Any]) -> AccuracyRecord | None:
    """The accuracy record the winner passed: winner.json's own when it carries one, else the artifact's."""
    winner = version["winner"]
    if not winner:
        return None
    if isinstance(winner.get("accuracy"), dict) and "checks" in winner["accuracy"]:
        return AccuracyRecord.read(winner["artifact"], winner["accuracy"])
    return records(version["accuracy"]).get(winner["artifact"])


def regressions(a: dict[str, Any], b: dict[str, Any], ship: dict[str, Any] | None) -> list[str]:
    budget, found = budget_of(b), []
    if a["winner"] and not b["winner"]:
        return [f"B ({b['folder'].name}) did not sign off; A ({a['folder'].name}) did"]
    slower = ship is not None and ship["slowdown"] is not None and ship["slowdown"] > budget.max_slowdown
    if slower and ship["verdict"] in ("slower", "no interval"):
        found.append(
            f"shipped {ship['metric']} {ship['a']['value']:.4g} -> {ship['b']['value']:.4g} {ship['unit']} "
            f"({ship['change']:+.1%}: {ship['slowdown']:.1%} slower, budget {budget.max_slowdown:.0%}, "
            f"{ship['verdict']})"
        )
    found += _served_regressions(a, b, budget.max_slowdown)
    if b["winner"]:
        name = b["winner"]["artifact"]
        baseline = records(a["accuracy"]).get(name) or _winner_accuracy(a)
        shares_a, shares_b = worst_shares(baseline), worst_shares(_winner_accuracy(b))
        for key, share in sorted(shares_b.items()):
            if key in shares_a and share - shares_a[key] > budget.max_accuracy_loss:
                found.append(
                    f"{name} {'/'.join(key)} uses {share:.0%} of its tolerance (was {shares_a[key]:.0%}; "
                    f"budget +{budget.max_accuracy_loss:.0%})"
                )
    return found


def _served_regressions(a: dict[str, Any], b: dict[str, Any], budget: float) -> list[str]:
    """B's winner serves less within the same p99 target than in A, beyond noise and beyond the budget."""
    if not b["winner"]:
        return []
    found = []
    for row in compare_served(a.get("load"), b.get("load")):
        if row["artifact"] != b["winner"]["artifact"] or row["verdict"] != "slower":
            continue
        if row["slowdown"] is not None and row["slowdown"] > budget:
            found.append(
                f"served {row['artifact']} ({row['runtime']}, {row['through']}) at p99 ≤ {row['p99_target_ms']:g} ms: "
                f"{row['a']:.4g} -> {row['b']:.4g} requests/s ({row['slowdown']:.1%} less, budget {budget:.0%}, slower)"
            )
    return found


def compare(a_dir: Path, b_dir: Path) -> dict[str, Any]:
    """The comparison as one JSON-ready document; exit_code 1 when B regressed beyond its budget."""
    a, b = _version(a_dir), _version(b_dir)
    metric = objective_metric(b)
    ship = shipped(a, b, metric)
    found = regressions(a, b, ship)
    return {
        "a": _label(a),
        "b": _label(b),
        "same_model": a["manifest"].get("name") == b["manifest"].get("name"),
        "metric": metric,
        "budget": budget_of(b).model_dump(),
        "shipped": ship,
        "speed": compare_rows(a["speed"], b["speed"], "p50_ms" if metric == SERVED else metric),
        "accuracy": compare_accuracy(a["accuracy"], b["accuracy"]),
        "served": compare_served(a.get("load"), b.get("load")),
        "environment": changes(
            {**a["manifest"].get("environment", {}), "git_revision": a["manifest"].get("git_revision")},
            {**b["manifest"].get("environment", {}), "git_revision": b["manifest"].get("git_revision")},
        ),
        "recipe": changes(
            a["manifest"].get("recipe", {}), b["manifest"].get("recipe", {}), IGNORED_RECIPE_KEYS
        ),
        "regressions": found,
        "exit_code": 1 if found else 0,
    }


def _label(version: dict[str, Any]) -> dict[str, Any]:
    manifest = version["manifest"]
    return {
        "name": manifest.get("name"),
        "version": manifest.get("version"),
        "path": str(version["folder"]),
        "created": manifest.get("created"),
        "signed_off": bool(manifest.get("signed_off")),
        "winner": (version["winner"] or {}).get("artifact"),
    }


# ---------------------------------------------------------------- command


def compare_command(a: str, b: str, recipe: str | None, console: Console) -> tuple[int, dict[str, Any]]:
    report = compare(resolve_version(a, recipe), resolve_version(b, recipe))
    show(report, console)
    return report["exit_code"], report


def _figure(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1%}"


def _passed(passed: bool, share: float | None) -> str:
    return ("pass" if passed else "FAIL") + ("" if share is None else f" {share:.0%}")


def show(report: dict[str, Any], console: Console) -> None:
    a, b = report["a"], report["b"]
    if not report.get("same_model", True):  # first: every figure below compares two models, not two releases
        console.print(
            f"different models: A is {a['name']}, B is {b['name']} (versions of two recipes): the changes below "
            "are between two models, not two releases of one",
            highlight=False,
        )
    for tag, v in (("A", a), ("B", b)):
        state = "signed off" if v["signed_off"] else "NOT signed off"
        console.print(
            f"{tag}: {v['name']}/{v['version']}  {v['created']}  {state}  winner {v['winner']}",
            highlight=False,
        )
    ship = report["shipped"]
    if ship:
        unit = unit_of(report["metric"])
        console.print(
            f"shipped: {ship['a']['artifact']} {ship['a']['value']:.4g} {unit} -> {ship['b']['artifact']} "
            f"{ship['b']['value']:.4g} {unit} ({_pct(ship['change'])}, {ship['verdict']})",
            highlight=False,
        )
    table = Table(
        title=f"Speed ({report['metric']}, {unit_of(report['metric'])}; verdicts from the 95 % intervals, listed "
        "by --json)"
    )
    for column in ("artifact", "runtime", "io", "shape", "A", "B", "change", "verdict"):
        table.add_column(column, justify="right" if column in ("A", "B", "change") else "left")
    for row in report["speed"]:
        shape = f"batch {row['batch']}" + (
            f" seq {row['sequence_length']}" if row.get("sequence_length") else ""
        )
        verdict = row["verdict"] + ("" if row["stable"] else " (unstable)")
        table.add_row(
            row["artifact"], row["runtime"], row["io"], shape,
            _figure(row["a"]), _figure(row["b"]), _pct(row["change"]), verdict,
        )  # fmt: skip
    console.print(table)
    table = Table(title="Accuracy (share of tolerance used by the worst required check)")
    for column in ("artifact", "A", "B", "largest growth", "verdict"):
        table.add_column(column)
    for row in report["accuracy"]:
        verdict = "now fails" if row["now_fails"] else "ok"
        growth = "-" if row["largest_share_growth"] is None else f"{row['largest_share_growth']:+.0%}"
        table.add_row(
            row["artifact"], _passed(row["a_passed"], row["a_worst_share"]),
            _passed(row["b_passed"], row["b_worst_share"]), growth, verdict,
        )  # fmt: skip
    console.print(table)
    if report["served"]:
        table = Table(title="Served (server scenario: requests/s within the p99 target)")
        for column in ("artifact", "runtime", "through", "p99 target ms", "A", "B", "change", "verdict"):
            table.add_column(column)
        for row in report["served"]:
            change = None if row["slowdown"] is None else -row["slowdown"]
            table.add_row(
                row["artifact"], row["runtime"], row["through"], f"{row['p99_target_ms']:g}",
                _figure(row["a"]), _figure(row["b"]), _pct(change), row["verdict"],
            )  # fmt: skip
        console.print(table)
    for title, items in (("environment", report["environment"]), ("recipe", report["recipe"])):
        for item in items:
            console.print(f"{title} changed: {item['key']}: {item['a']} -> {item['b']}", highlight=False)
    budget = report["budget"]
    if report["regressions"]:
        for reason in report["regressions"]:
            console.print(f"[red]REGRESSION[/red] {escape(reason)}", highlight=False, markup=True)
    else:
        console.print(
            f"no regression beyond the budget (max_slowdown {budget['max_slowdown']:.0%}, "
            f"max_accuracy_loss {budget['max_accuracy_loss']:.0%})",
            highlight=False,
        )
