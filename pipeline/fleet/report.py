"""The fleet report: per recipe, the winner on each target with its accuracy and speed, and why a target has
none; the `compare` command that sets two targets' versions side by side."""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.core.files import write_json_atomic, write_text_atomic
from pipeline.fleet.spec import Target
from pipeline.report.facts import fmt_metric, quoted_metric


@dataclass
class FleetReport:
    name: str
    root: str
    recipes: list[str]
    targets: list[Target]
    unplaced: dict[str, str] = field(default_factory=dict)  # target -> why no node runs it
    results: list[dict[str, Any]] = field(default_factory=list)

    def cell(self, recipe: str, target: str) -> dict[str, Any]:
        """One (recipe, target): its status, version, winner, accuracy and speed, or why there is none."""
        if target in self.unplaced:
            return {"status": "not_run", "why": self.unplaced[target]}
        found = next((r for r in self.results if r["recipe"] == recipe and r["target"] == target), None)
        if found is None:
            return {"status": "not_run", "why": "not submitted"}
        doc = found.get("document") or {}
        base = {"attempts": found.get("attempt"), "seconds": found.get("seconds"), "node": found.get("node")}
        if not doc.get("signed_off"):
            return base | {
                "status": doc.get("status", "failed"),
                "why": why_not(found),
                "version": doc.get("version"),
            }
        winner = doc.get("winner") or {}
        return base | {
            "status": doc["status"],
            "version": doc["version"],
            "path": doc["path"],
            "winner": winner.get("artifact"),
            "runtime": winner.get("runtime"),
            "accuracy": _accuracy(winner),
            "speed": _speed(winner),
            "provisional": doc.get("provisional", False),
        }

    def all_signed_off(self) -> bool:
        cells = [self.cell(r, t.name) for r in self.recipes for t in self.targets]
        return all(c["status"] in ("signed_off", "up_to_date") for c in cells)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": 1,
            "fleet": self.name,
            "root": self.root,
            "targets": [
                {"name": t.name, "needs": t.label(), "cpu": t.cpu, "set": t.set} for t in self.targets
            ],
            "recipes": {
                recipe: {t.name: self.cell(recipe, t.name) for t in self.targets} for recipe in self.recipes
            },
            "signed_off": self.all_signed_off(),
        }


def why_not(result: dict[str, Any]) -> str:
    """Why a deploy signed nothing off: the task's own error (a timeout, a lost worker), the deploy's reasons,
    else its last line on stderr or its exit code."""
    doc = result.get("document") or {}
    lines = result.get("stderr_tail") or []
    return (
        result.get("error")
        or "; ".join(doc.get("reasons") or [])
        or (lines[-1] if lines else "")
        or f"the deploy exited with {result.get('exit_code')}"
    )


def _accuracy(winner: dict[str, Any]) -> str:
    accuracy = winner.get("accuracy") or {}
    figures, passed = accuracy.get("figures") or {}, accuracy.get("passed")
    metric = quoted_metric(
        accuracy.get("gating") or [], [m for m, v in figures.items() if isinstance(v, float)]
    )
    shown = f"{metric} {fmt_metric(metric, figures[metric])}" if metric else "checked"
    return f"{'pass' if passed else 'fail'} ({shown}, on {winner.get('runtime')})"


def _speed(winner: dict[str, Any]) -> str:
    value, unit, interval = winner.get("value"), winner.get("unit", ""), winner.get("interval")
    objective = winner.get("objective") or {}
    if value is None:
        return "not timed"
    spread = f" [{interval[0]:.3g}–{interval[1]:.3g}]" if interval else ""
    return f"{objective.get('metric', 'p50_ms')} {value:.3g} {unit}{spread} at batch {objective.get('batch')}"


def markdown(report: FleetReport) -> str:
    lines = [f"# Fleet {report.name}", "", f"Versions under `{report.root}/TARGET/RECIPE/`.", ""]
    verdict = "every deploy signed off" if report.all_signed_off() else "NOT every deploy signed off"
    lines += [f"**{verdict}**", ""]
    for recipe in report.recipes:
        lines += [
            f"## {Path(recipe).name}",
            "",
            "| target | needs | status | version | winner | accuracy | speed |",
        ]
        lines.append("|---|---|---|---|---|---|---|")
        signed = []
        for target in report.targets:
            cell = report.cell(recipe, target.name)
            if cell["status"] in ("signed_off", "up_to_date"):
                signed.append(cell["path"])
                attempts = f" (attempt {cell['attempts']})" if (cell.get("attempts") or 1) > 1 else ""
                status = cell["status"].replace("_", " ") + attempts
                row = [status, cell["version"], f"{cell['winner']} ({cell['runtime']})"]
                row += [cell["accuracy"], cell["speed"]]
            else:
                status = cell["status"].replace("_", " ")
                row = [f"{status}: {cell['why']}", cell.get("version") or "—", "nothing signed off", "—", "—"]
            lines.append(f"| {target.name} | {target.label()} | " + " | ".join(_cell(x) for x in row) + " |")
        if len(signed) >= 2:
            command = [Path(sys.executable).name, "-m", "pipeline", "compare", signed[0], signed[1]]
            lines += ["", f"Across targets: `{shlex.join(command)}`"]
        lines.append("")
    return "\n".join(lines)


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def write_report(report: FleetReport) -> dict[str, str]:
    root = Path(report.root)
    root.mkdir(parents=True, exist_ok=True)
    paths = {"json": root / f"fleet-{report.name}.json", "markdown": root / f"fleet-{report.name}.md"}
    write_json_atomic(paths["json"], report.to_json())
    write_text_atomic(paths["markdown"], markdown(report))
    return {k: str(v) for k, v in paths.items()}
