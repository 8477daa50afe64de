"""The effective accuracy gates: what every precision's tolerance resolves to for every output, after the
recipe's values are merged into the defaults. `validate` prints it, so that what can fail an artifact is never
a guess about defaults."""

from __future__ import annotations

from typing import Any

from pipeline.recipe.root import Recipe

LOWER_BOUNDS = ("cosine", "neighbours")  # the metrics whose value must be at least the threshold
SCALED = ("max_abs", "mean_abs")  # absolute metrics: multiplied by max(1, largest |reference|) (accuracy.py)


def gate_rows(recipe: Recipe) -> list[dict[str, Any]]:
    """One row per precision and output: the gating thresholds and the informational ones, as text and data."""
    rows = []
    for precision, tolerance in sorted(recipe.validation.tolerances.items()):
        for output in recipe.outputs:
            resolved = tolerance.resolved(output)
            gates = {m: t for m, (t, info) in resolved.items() if t is not None and not info}
            informational = {m: t for m, (t, info) in resolved.items() if t is not None and info}
            rows.append(
                {
                    "precision": precision,
                    "output": output,
                    "gates": gates,
                    "informational": informational,
                    "text": ", ".join(_bound(m, t) for m, t in gates.items()) or "none",
                    "informational_text": ", ".join(_bound(m, t) for m, t in informational.items()) or "—",
                }
            )
    return rows


def _bound(metric: str, threshold: float) -> str:
    if metric in LOWER_BOUNDS:
        return f"{metric} ≥ {threshold:g}"
    scaled = " × scale" if metric in SCALED else ""
    return f"{metric} ≤ {threshold:g}{scaled}"
