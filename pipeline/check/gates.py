"""The effective accuracy gates: what every precision's tolerance resolves to for every output, after the
recipe's values are merged into the defaults and the output's kind is known (integer values are gated
exactly, one value per sample by max_abs: pipeline.check.accuracy.gates_for, which the deploy's checks read
too). `validate` prints it, so that what can fail an artifact is never a guess about defaults."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pipeline.recipe.root import Recipe

LOWER_BOUNDS = ("cosine", "neighbours")  # the metrics whose value must be at least the threshold
BASES = {
    "scale": " × scale",  # max(1, largest |reference|) (accuracy.py)
    "spread": " × spread",  # the output's standard deviation over the held-out samples (accuracy.py)
}


def gate_rows(recipe: Recipe, kinds: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """One row per precision and output: the gating thresholds and the informational ones, as text and data.
    `kinds`: output -> accuracy.output_kind, as pre-flight's run of the model found it; an output missing
    from it is shown as plain values, its row marked `kind: null` (its gates depend on its dtype and shape)."""
    from pipeline.check.accuracy import VALUES, gates_for

    kinds = kinds or {}
    rows = []
    for precision, tolerance in sorted(recipe.validation.tolerances.items()):
        for output in recipe.outputs:
            kind = kinds.get(output)
            resolved = gates_for(tolerance, output, kind or VALUES)
            gates = {m: g for m, g in resolved.items() if g.tolerance is not None and not g.informational}
            informational = {m: g for m, g in resolved.items() if g.tolerance is not None and g.informational}
            rows.append(
                {
                    "precision": precision,
                    "output": output,
                    "kind": kind,
                    "gates": {m: g.tolerance for m, g in gates.items()},
                    "bases": {m: g.basis for m, g in resolved.items() if g.basis},
                    "informational": {m: g.tolerance for m, g in informational.items()},
                    "text": ", ".join(_bound(m, g.tolerance, g.basis) for m, g in gates.items()) or "none",
                    "informational_text": ", ".join(
                        _bound(m, g.tolerance, g.basis) for m, g in informational.items()
                    )
                    or "—",
                }
            )
    return rows


def undetermined(rows: list[dict[str, Any]]) -> list[str]:
    """The outputs whose kind no run of the model told (their gates depend on their dtype and shape)."""
    return sorted({row["output"] for row in rows if row["kind"] is None})


def _bound(metric: str, threshold: float, basis: str | None) -> str:
    if metric in LOWER_BOUNDS:
        return f"{metric} ≥ {threshold:g}"
    if basis == "exact":
        return f"{metric} = 0 (exact)"
    number = f"{threshold:.3g}" if basis == "spread" else f"{threshold:g}"  # sqrt(1/cosine² - 1): 3 digits
    return f"{metric} ≤ {number}{BASES.get(basis or '', '')}"
