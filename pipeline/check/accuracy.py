"""Accuracy of one artifact against the FP32 reference: small named metrics, Check records, and an
ArtifactAccuracy object that is truthy when every required check passed.

Absolute tolerances (max_abs, mean_abs) are written for outputs of unit magnitude: each is multiplied by the
output's scale, max(1, largest |reference value|) on that input set, because float error grows with the
values (a float32 logit of 200 carries about 1e-5 of absolute rounding per operation). The check records the
scaled threshold it was judged against and the scale. Relative metrics (max_rel, cosine, neighbours) are
scale-free and used as written. Outputs whose cosine cannot judge them (integer values, one value per sample)
are gated by max_abs instead: see gates_for.

Pure numpy, no runtimes: the validate stage runs the models and hands the outputs here, so every rule of
what "passed" means lives in one small, unit-testable place.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from pipeline.recipe import Tolerance

METRIC_NAMES = ("max_abs", "mean_abs", "max_rel", "cosine")  # measured per batch
NEIGHBOURS = "neighbours"  # measured over the held-out data as a whole (embedding outputs only)
LOWER_BOUNDS = frozenset(
    {"cosine", NEIGHBOURS}
)  # value must be >= threshold; every other metric must be <= threshold
FINITE = "finite"  # the check counting NaN/inf in the artifact's output; always required, threshold 0
COMPARABLE = "comparable"  # the check standing in for all others when outputs cannot be compared at all
REL_EPSILON = 1e-6
SCALED = frozenset({"max_abs", "mean_abs"})  # absolute metrics: their thresholds grow with the output's scale


def output_scale(reference: np.ndarray) -> float:
    """max(1, largest |value|) of a reference output: what an absolute tolerance is multiplied by."""
    values = np.abs(np.asarray(reference, np.float64))
    finite = values[np.isfinite(values)]
    return max(1.0, float(finite.max())) if finite.size else 1.0


# ---------------------------------------------------------------- metrics (one pair of arrays each)


def _diff(reference: np.ndarray, actual: np.ndarray) -> np.ndarray:
    return np.abs(np.asarray(actual, np.float64) - np.asarray(reference, np.float64))


def max_abs(reference: np.ndarray, actual: np.ndarray) -> float:
    """Largest absolute difference of any element."""
    return float(_diff(reference, actual).max(initial=0.0))


def mean_abs(reference: np.ndarray, actual: np.ndarray) -> float:
    """Mean absolute difference over all elements."""
    d = _diff(reference, actual)
    return float(d.mean()) if d.size else 0.0


def max_rel(reference: np.ndarray, actual: np.ndarray, epsilon: float = REL_EPSILON) -> float:
    """Largest |actual - reference| / max(|reference|, epsilon): epsilon keeps near-zero references finite."""
    scale = np.maximum(np.abs(np.asarray(reference, np.float64)), epsilon)
    return float((_diff(reference, actual) / scale).max(initial=0.0))


def _rows(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a, np.float64)
    return a.reshape(1, -1) if a.ndim == 0 else a.reshape(a.shape[0], -1)


def cosine(reference: np.ndarray, actual: np.ndarray) -> float:
    """Lowest cosine similarity between matching samples (rows along the batch axis, flattened).

    The lowest row, not the mean: one bad sample in a batch must not hide behind good ones. Two all-zero
    rows count as identical (1.0); one zero row against a non-zero one as unrelated (0.0).
    """
    r, a = _rows(reference), _rows(actual)
    if r.shape[0] == 0:
        return 1.0
    dot = (r * a).sum(axis=1)
    nr, na = np.linalg.norm(r, axis=1), np.linalg.norm(a, axis=1)
    norms, both_zero = nr * na, (nr == 0) & (na == 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        sims = np.where(norms > 0, dot / np.where(norms > 0, norms, 1.0), np.where(both_zero, 1.0, 0.0))
    return float(np.clip(sims, -1.0, 1.0).min())


METRICS: dict[str, Callable[[np.ndarray, np.ndarray], float]] = {
    "max_abs": max_abs,
    "mean_abs": mean_abs,
    "max_rel": max_rel,
    "cosine": cosine,
}

# ---------------------------------------------------------------- measurements over batches


@dataclass(frozen=True)
class Measure:
    """Every metric of one output over one batch (or aggregated over several), plus what went wrong."""

    values: dict[str, float]
    elements: int
    nonfinite: int = 0
    problem: str | None = None  # not comparable: missing output, shape mismatch, non-finite reference
    scale: float = 1.0  # output_scale of the reference: absolute thresholds are multiplied by it
    directionless: bool = False  # one value per sample, or integer/boolean values: cosine sees only signs
    exact: bool = False  # integer or boolean values (labels, ids, flags): any change is wrong
    spread: float = 1.0  # output_spread of the reference: the basis of a one-value-per-sample output's bound


def measure(reference: np.ndarray, actual: np.ndarray | None, mask: np.ndarray | None = None) -> Measure:
    """All metrics of one output for one batch; a missing output, a shape mismatch or a non-finite reference
    make the pair not comparable (a problem, not a crash).

    `mask` (batch, sequence), non-zero on real tokens: when the output is per token (at least 3-D, its leading
    dims those of the mask), padded positions are left out of every metric, since no consumer reads them and
    variants may compute them differently (or not at all)."""
    reference = np.asarray(reference)
    if actual is None:
        return Measure({}, 0, problem="output missing from the artifact's results")
    actual = np.asarray(actual)
    if actual.shape != reference.shape:
        return Measure(
            {}, 0, problem=f"shape {list(actual.shape)} differs from the reference {list(reference.shape)}"
        )
    keep = per_token_mask(reference, mask)
    reference, actual = on_real_tokens(reference, keep), on_real_tokens(actual, keep)
    ref_nonfinite = nonfinite_count(reference)
    if ref_nonfinite:
        return Measure({}, 0, problem=f"the reference itself has {ref_nonfinite} NaN/inf values")
    if keep is None:
        values = {name: fn(reference, actual) for name, fn in METRICS.items()}
        ref_kept, act_kept = reference, actual
    else:
        keep = np.broadcast_to(keep, reference.shape)
        ref_kept, act_kept = reference[keep], actual[keep]
        values = {
            "max_abs": max_abs(ref_kept, act_kept),
            "mean_abs": mean_abs(ref_kept, act_kept),
            "max_rel": max_rel(ref_kept, act_kept),
            "cosine": cosine(reference, actual),  # padded positions are zero in both: they add nothing
        }
    return Measure(
        values,
        int(act_kept.size),
        nonfinite_count(act_kept),
        scale=_scale(ref_kept),
        directionless=directionless(reference),
        exact=integer_values(reference),
        spread=output_spread([ref_kept]),
    )


DIRECTIONLESS = "one value per sample: cosine sees only signs, so max_abs gates as the tolerance sets it"
SPREAD = (
    "one value per sample: cosine sees only signs, so max_abs gates at sqrt(1/cosine^2 - 1) x the output's "
    "spread (standard deviation over the held-out samples)"
)
EXACT = (
    "integer values (labels, ids, flags): any change is wrong, so max_abs gates at 0 and cosine only informs"
)
# why a check gates as it does: a note on a measured value, not a problem
GATED_NOTES = (DIRECTIONLESS, SPREAD, EXACT)


def integer_values(reference: np.ndarray) -> bool:
    """Labels, ids and flags (integer or boolean values): no magnitude, and any change is wrong."""
    return reference.dtype.kind in "biu"


def _scale(reference: np.ndarray) -> float:
    """The output's scale for absolute thresholds; 1 for integer and boolean outputs, whose values are labels
    and ids, not magnitudes (class 20 against 21 is as wrong as 2 against 3)."""
    return 1.0 if integer_values(reference) else output_scale(reference)


def directionless(reference: np.ndarray) -> bool:
    """Whether cosine cannot judge this output: one value per sample (a score, a class index: the cosine of
    two single numbers is only whether their signs agree, so a score off by 20% or a class changed from 3 to 4
    has cosine 1), or integer or boolean values (labels, ids, flags: equal or not)."""
    return integer_values(reference) or one_value_per_sample(reference)


def one_value_per_sample(reference: np.ndarray) -> bool:
    """A score or a count: at most one value per sample in this batch."""
    return reference.ndim <= 1 or reference.size <= reference.shape[0]


def per_sample_everywhere(reference: Mapping[str, list[Outputs]], output: str) -> bool:
    """Whether an output holds one value per sample at every input set: its kind, as pre-flight decides it.
    An output of [batch, items] has one value per sample only where items is 1 (a corner): it is judged as
    values, and only its batches of one value per row as scores (_judged_by_direction)."""
    values = [np.asarray(b[output]) for batches in reference.values() for b in batches if output in b]
    return bool(values) and all(one_value_per_sample(v) for v in values)


def output_spread(references: Iterable[np.ndarray]) -> float:
    """The spread of an output over samples: the standard deviation of its finite reference values, what
    tells one sample's score from another's. A constant output (a count that follows the shape) has none:
    then its magnitude, max |value|, and 1 for an output that is all zeros."""
    values = np.concatenate([np.asarray(r, np.float64).ravel() for r in references] or [np.zeros(0)])
    values = values[np.isfinite(values)]
    if not values.size:
        return 1.0
    spread = float(values.std())
    if spread > 0:
        return spread
    return float(np.abs(values).max()) or 1.0


def output_kind(reference: np.ndarray) -> str:
    """INTEGER, PER_SAMPLE (one float value per sample) or VALUES: what decides how an output is gated."""
    if integer_values(reference):
        return INTEGER
    return PER_SAMPLE if directionless(reference) else VALUES


def on_real_tokens(value: np.ndarray, keep: np.ndarray | None) -> np.ndarray:
    """A per-token output with its padded positions zeroed (`keep` from per_token_mask; None: as it is)."""
    return value if keep is None else np.where(keep, value, 0)


def real_tokens(
    feeds: Mapping[str, np.ndarray], mask_input: str | None, padding_value: int = 0
) -> np.ndarray | None:
    """The batch's padding mask (validation.padding_mask) as 1 on real tokens and 0 on padding, whichever value
    the recipe's mask uses for padding (validation.padding_value): every check below reads `mask != 0` as real.
    None where masking is off or the batch has no such input."""
    mask = feeds.get(mask_input) if mask_input else None
    if mask is None:
        return None
    return (np.asarray(mask) != padding_value).astype(np.int8)


def per_token_mask(output: np.ndarray, mask: np.ndarray | None) -> np.ndarray | None:
    """The mask broadcastable to a per-token output (True on real tokens), or None when the output is not per
    token: it must have at least 3 dims whose first two are the mask's (a 2-D output such as a pooled
    embedding of width equal to the sequence length must not be mistaken for one)."""
    if mask is None or output.ndim < 3 or output.shape[:2] != mask.shape:
        return None
    keep = np.asarray(mask) != 0
    return keep.reshape(keep.shape + (1,) * (output.ndim - 2))


def off_the_mask_axis(
    reference: Mapping[str, Sequence[Outputs]],
    sizes: Mapping[str, Sequence[Mapping[str, int]]],
    mask_dim: str | None,
    batch_dim: str,
) -> frozenset[str]:
    """The outputs whose second axis is not shown to follow the padding mask's dim (`mask_dim`, the mask
    input's second axis): never compared on real tokens only. per_token_mask goes by shape, and a decoder's
    logits [batch, tgt, vocab] have the shape of an encoder's mask [batch, src] wherever tgt and src have one
    size: masked by shape alone, their real positions past the mask's would be in no gate. An output follows
    the mask's dim where, over every batch (`sizes`: each batch's dim sizes, grouped as `reference`), its axis
    1 had that dim's size and no other dim's in all of them. A mask whose axis is fixed (no dim name): shape
    alone."""
    if mask_dim is None:
        return frozenset()
    found = second_axis_dims(reference, sizes, batch_dim)
    return frozenset(output for output, dims in found.items() if dims != {mask_dim})


def second_axis_dims(
    reference: Mapping[str, Sequence[Outputs]],
    sizes: Mapping[str, Sequence[Mapping[str, int]]],
    batch_dim: str,
) -> dict[str, set[str]]:
    """Per output of 3 or more dims, the dims (but the batch's) whose size its second axis had in every batch."""
    candidates: dict[str, set[str]] = {}
    for inputs, batches in reference.items():
        for batch, dims in zip(batches, sizes.get(inputs, []), strict=False):
            for output, value in batch.items():
                if np.ndim(value) < 3:
                    continue  # never per token
                here = {d for d, n in dims.items() if n == np.shape(value)[1] and d != batch_dim}
                candidates[output] = candidates[output] & here if output in candidates else here
    return candidates


def token_mask(output: str, mask: np.ndarray | None, unmasked: frozenset[str]) -> np.ndarray | None:
    """The batch's padding mask for this output: none for an output off_the_mask_axis left out."""
    return None if output in unmasked else mask


def reference_nonfinite(
    reference: Mapping[str, list[Outputs]],
    outputs: Iterable[str],
    masks: Masks,
    unmasked: frozenset[str] = frozenset(),
) -> list[str]:
    """'y at min: 6 NaN/inf values', per output and input set where the reference's own output is not finite
    on real positions (padding aside, as measure() sees it): no artifact can be judged against those."""
    found = []
    for inputs, batches in reference.items():
        batch_masks = masks.get(inputs) or [None] * len(batches)
        for output in outputs:
            count = 0
            for batch, mask in zip(batches, batch_masks, strict=False):
                if output in batch:
                    value = np.asarray(batch[output])
                    keep = per_token_mask(value, token_mask(output, mask, unmasked))
                    count += nonfinite_count(on_real_tokens(value, keep))
            if count:
                found.append(f"{output} at {inputs}: {count} NaN/inf values")
    return found


def nonfinite_count(a: np.ndarray) -> int:
    """NaN and inf values in an array of any dtype (an integer array has none)."""
    return int(a.size - np.count_nonzero(np.isfinite(a.astype(np.float64, copy=False))))


def combine(measures: list[Measure]) -> Measure:
    """Aggregate batches: max of max_abs and max_rel, min of cosine, element-weighted mean of mean_abs."""
    if len(measures) == 1:
        return measures[0]
    problems = [m.problem for m in measures if m.problem]
    if problems:
        return Measure({}, 0, sum(m.nonfinite for m in measures), problems[0])
    elements = sum(m.elements for m in measures)
    values = {
        "max_abs": max(m.values["max_abs"] for m in measures),
        "max_rel": max(m.values["max_rel"] for m in measures),
        "cosine": min(m.values["cosine"] for m in measures),
        "mean_abs": sum(m.values["mean_abs"] * m.elements for m in measures) / elements if elements else 0.0,
    }
    scale = max(m.scale for m in measures)
    flat, exact = any(m.directionless for m in measures), any(m.exact for m in measures)
    return Measure(
        values,
        elements,
        sum(m.nonfinite for m in measures),
        scale=scale,
        directionless=flat,
        exact=exact,
        spread=max(m.spread for m in measures),
    )


# ---------------------------------------------------------------- tolerances and checks


def thresholds_for(tolerance: Tolerance, output: str) -> dict[str, tuple[float | None, bool]]:
    """metric -> (threshold, informational) for one output as the recipe resolves it (the rules live with the
    Tolerance); gates_for says what an output of a given kind is judged by."""
    return tolerance.resolved(output)


VALUES, PER_SAMPLE, INTEGER = "values", "one value per sample", "integer"
OUTPUT_KINDS = (VALUES, PER_SAMPLE, INTEGER)


@dataclass(frozen=True)
class Gate:
    """What one metric of one output is judged by: `tolerance` times the basis. basis 'scale': max(1, largest
    |reference|) (absolute metrics), 'spread': output_spread over the held-out samples, 'exact': the
    tolerance is 0 (an integer output), None: as written."""

    tolerance: float | None
    informational: bool
    basis: str | None = None
    note: str | None = None  # why it gates as it does (DIRECTIONLESS, SPREAD, EXACT)


def spread_factor(cosine_threshold: float) -> float:
    """The error a cosine threshold allows relative to the length of what it compares: a candidate r + e with
    e orthogonal to r has cosine 1/sqrt(1 + |e|^2/|r|^2), so cosine >= c allows |e| <= sqrt(1/c^2 - 1) |r|
    (0.98: 0.203, 0.999: 0.0447, 0.9999: 0.0141)."""
    return math.sqrt(max(1.0 / cosine_threshold**2 - 1.0, 0.0))


def gates_for(tolerance: Tolerance, output: str, kind: str) -> dict[str, Gate]:
    """metric -> Gate for one output of one kind (VALUES, PER_SAMPLE, INTEGER); the deploy's checks and
    `validate`'s gate table both read it, so that what is printed is what is applied.

    VALUES (embeddings, per-token outputs, logits): the tolerance as resolved, absolute metrics on the
    output's scale. INTEGER: max_abs gates at 0 (a per-output max_abs allows more) and cosine only informs
    (class 0 against 4 has cosine 0, 3 against 4 has cosine 1), unless a per-output tolerance writes it.
    PER_SAMPLE (a score, a count): cosine of single numbers only informs; max_abs gates as resolved where it
    gates (fp32's 1e-3 x scale, a per-output max_abs), and otherwise at the error the precision's cosine
    allows a vector: sqrt(1/cosine^2 - 1) x the output's spread over the held-out samples (the samples'
    values taken as one vector about the reference's mean, so a shared offset such as a sigmoid's 0.5 does
    not dilute it; per sample, not as a root mean square, so one bad sample cannot hide)."""
    resolved = tolerance.resolved(output)
    gates = {
        m: Gate(t, info, "scale" if m in SCALED and t is not None else None)
        for m, (t, info) in resolved.items()
    }
    if kind == VALUES:
        return gates
    override = tolerance.outputs.get(output)
    own = override.model_fields_set if override is not None else set()
    if "cosine" not in own and gates["cosine"].tolerance is not None:
        gates["cosine"] = Gate(gates["cosine"].tolerance, True)
    max_abs_gate = gates["max_abs"]
    if kind == INTEGER:
        if "max_abs" in own and max_abs_gate.tolerance is not None:
            gates["max_abs"] = Gate(max_abs_gate.tolerance, max_abs_gate.informational, None, EXACT)
        else:
            gates["max_abs"] = Gate(0.0, False, "exact", EXACT)
        return gates
    if max_abs_gate.tolerance is not None and not max_abs_gate.informational:
        gates["max_abs"] = Gate(max_abs_gate.tolerance, False, "scale", DIRECTIONLESS)
    elif resolved["cosine"][0] is not None:
        gates["max_abs"] = Gate(spread_factor(resolved["cosine"][0]), False, "spread", SPREAD)
    elif max_abs_gate.tolerance is not None:  # no cosine to carry over: the written bound gates
        gates["max_abs"] = Gate(max_abs_gate.tolerance, False, "scale", DIRECTIONLESS)
    return gates


@dataclass(frozen=True)
class Check:
    """One metric of one output on one input set (min | opt | max | data) against its threshold."""

    output: str
    inputs: str
    metric: str
    value: float | None
    threshold: float | None
    passed: bool
    informational: bool
    reason: str | None = None
    scale: float = 1.0  # the threshold is the recipe's tolerance times this (absolute metrics, see above)

    @property
    def blocking(self) -> bool:
        """A required check that failed: this alone fails the artifact."""
        return not self.passed and not self.informational

    def severity(self) -> float:
        """How far past its threshold (1.0 = at it); problems and non-finite values rank worst."""
        if (self.reason is not None and self.reason not in GATED_NOTES) or self.metric in (
            FINITE,
            COMPARABLE,
        ):
            return math.inf
        share = tolerance_share(self.metric, self.value, self.threshold)
        return math.inf if share is None else share

    def describe(self) -> str:
        """One line naming output, metric and input set, e.g. 'pooled cosine 0.91 < 0.98 at opt'."""
        if self.metric == FINITE and self.value:
            return f"{self.output} has {self.value} NaN/inf values at {self.inputs}"
        if self.metric == COMPARABLE and not self.passed:
            return f"{self.output} not comparable at {self.inputs}: {self.reason}"
        if self.reason is not None and self.reason not in GATED_NOTES:
            return f"{self.output} {self.metric} at {self.inputs}: {self.reason}"
        if self.value is None or self.threshold is None:
            return f"{self.output} {self.metric} at {self.inputs}: no value"
        op = "<" if self.metric in LOWER_BOUNDS else ">"
        if self.passed:
            op = ">=" if self.metric in LOWER_BOUNDS else "<="
        value, threshold = _distinct(self.value, self.threshold)
        return f"{self.output} {self.metric} {value} {op} {threshold} at {self.inputs}"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "output": self.output,
            "inputs": self.inputs,
            "metric": self.metric,
            "value": self.value,
            "threshold": self.threshold,
            "passed": self.passed,
            "informational": self.informational,
        }
        if self.reason is not None:
            out["reason"] = self.reason
        if self.scale != 1.0:
            out["scale"] = self.scale
        return out


def tolerance_share(metric: str, value: Any, threshold: Any) -> float | None:
    """How much of its tolerance a figure uses: 0 = exact, 1 = at the threshold, above 1 = past it; for lower
    bounds (cosine, neighbours) measured from 1. An exact bound (max_abs 0 for integer values) is used not at
    all or past all. None when it cannot be told: no finite value or threshold, or a lower bound of zero width."""
    if not isinstance(value, int | float) or not isinstance(threshold, int | float) or math.isnan(value):
        return None
    if metric in LOWER_BOUNDS:
        slack = 1.0 - threshold
        return (1.0 - value) / slack if slack > 0 else None
    if threshold == 0 and metric == "max_abs":  # integer outputs' exact bound
        return 0.0 if value == 0 else math.inf
    return value / threshold if threshold > 0 else None


def _distinct(a: float, b: float) -> tuple[str, str]:
    """Format two numbers with just enough digits that they do not print the same (0.99995 vs 0.9999)."""
    for digits in range(3, 10):  # a threshold as written (0.9999, not 1), the value as short as it can be
        sa, sb = f"{a:.{digits}g}", f"{b:.{max(digits, 6)}g}"
        if float(sa) != float(sb) and (float(sa) < float(sb)) == (a < b):  # rounding keeps the comparison
            return sa, sb
    return repr(a), repr(b)


def _passes(metric: str, value: float, threshold: float) -> bool:
    return value >= threshold if metric in LOWER_BOUNDS else value <= threshold


def checks_for(
    output: str, inputs: str, m: Measure, tolerance: Tolerance, spread: float | None = None
) -> list[Check]:
    """The finite check plus one check per metric for one output on one input set. `spread`: the output's
    spread over the held-out samples (evaluate passes it; without it, the batch's own)."""
    if m.problem is not None:
        return [Check(output, inputs, COMPARABLE, None, None, False, False, m.problem)]
    finite_reason = f"{m.nonfinite} NaN/inf values in the output" if m.nonfinite else None
    checks = [Check(output, inputs, FINITE, m.nonfinite, 0, m.nonfinite == 0, False, finite_reason)]
    kind = INTEGER if m.exact else PER_SAMPLE if m.directionless else VALUES
    for metric, gate in gates_for(tolerance, output, kind).items():
        if metric not in METRIC_NAMES:
            continue  # measured over a whole input set, not per batch (neighbours)
        informational = gate.informational
        scale = {"scale": m.scale, "spread": m.spread if spread is None else spread}.get(
            gate.basis or "", 1.0
        )
        threshold = None if gate.tolerance is None else gate.tolerance * scale
        value = m.values.get(metric)
        if value is None or not math.isfinite(value) or m.nonfinite:
            reason = finite_reason or "not a finite number"
            checks.append(
                Check(output, inputs, metric, None, threshold, False, informational, reason, scale=scale)
            )
            continue
        passed = True if threshold is None else _passes(metric, value, threshold)
        checks.append(
            Check(output, inputs, metric, value, threshold, passed, informational, gate.note, scale)
        )
    return checks


# ---------------------------------------------------------------- one artifact


@dataclass
class ArtifactAccuracy:
    """All checks of one artifact; truthy when it ran and no required check failed."""

    artifact: str
    precision: str | None
    runtime: str | None
    checks: list[Check] = field(default_factory=list)
    error: str | None = None  # the runtime raised: the artifact failed without (complete) checks
    details: dict[str, Any] = field(default_factory=dict)  # extra report fields (e.g. Polygraphy's verdict)

    def __bool__(self) -> bool:
        return self.error is None and bool(self.checks) and not any(c.blocking for c in self.checks)

    @property
    def passed(self) -> bool:
        return bool(self)

    def failures(self) -> list[Check]:
        """Required failing checks, worst first."""
        return sorted((c for c in self.checks if c.blocking), key=lambda c: -c.severity())

    @property
    def reason(self) -> str | None:
        """None when passed; else the runtime error or the worst failing check in one line."""
        if self.error is not None:
            return self.error
        if not self.checks:
            return "no checks ran"
        failures = self.failures()
        if not failures:
            return None
        more = f" (and {len(failures) - 1} more failing checks)" if len(failures) > 1 else ""
        return failures[0].describe() + more

    def to_json(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "reason": self.reason,
            "precision": self.precision,
            "runtime": self.runtime,
            "checks": [c.to_json() for c in self.checks],
            **self.details,
        }


Outputs = Mapping[str, np.ndarray]
Masks = Mapping[str, list[np.ndarray | None]]


def neighbour_agreement(reference: np.ndarray, actual: np.ndarray, k: int) -> float | None:
    """Mean share of each sample's k nearest neighbours (by cosine, among the other samples) that the
    candidate's embeddings keep: what a retrieval user sees, with no labels needed. None with too few samples."""
    r, a = _rows(reference), _rows(actual)
    if r.shape[0] <= k:
        return None

    def nearest(x: np.ndarray) -> np.ndarray:
        unit = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
        sims = unit @ unit.T
        np.fill_diagonal(sims, -np.inf)
        return np.argsort(-sims, axis=1, kind="stable")[:, :k]

    ref_nn, act_nn = nearest(r), nearest(a)
    shared = [len(set(ref_nn[i].tolist()) & set(act_nn[i].tolist())) for i in range(r.shape[0])]
    return float(np.mean(shared) / k)


def neighbour_check(
    output: str, ref_batches: list[Outputs], got: list[Outputs], tolerance: Tolerance, k: int
) -> Check | None:
    """The neighbour-agreement check of an embedding output (2-D: one vector of a fixed width per sample) over
    one input set's batches taken together; None when the output is not an embedding (a width that follows the
    input's length is per-token scores, a width of 1 a score) or the batches cannot be compared."""
    refs = [np.asarray(b[output]) for b in ref_batches]
    if not refs or any(r.ndim != 2 for r in refs) or len(got) != len(refs):
        return None
    if len({r.shape[1] for r in refs}) != 1 or refs[0].shape[1] < 2:
        return None
    acts = [b.get(output) for b in got]
    if any(a is None or np.asarray(a).shape != r.shape for a, r in zip(acts, refs, strict=True)):
        return None
    reference = np.concatenate(refs)
    actual = np.concatenate([np.asarray(a, np.float64) for a in acts])
    if nonfinite_count(reference) or nonfinite_count(actual):
        return None  # the finite checks already fail or flag this
    value = neighbour_agreement(reference, actual, k)
    if value is None:
        return None
    threshold, informational = thresholds_for(tolerance, output)[NEIGHBOURS]
    passed = True if threshold is None else _passes(NEIGHBOURS, value, threshold)
    return Check(output, "data", NEIGHBOURS, value, threshold, passed, informational)


def evaluate(
    accuracy: ArtifactAccuracy,
    reference: Mapping[str, list[Outputs]],
    actual: Mapping[str, list[Outputs]],
    outputs: Iterable[str],
    tolerance: Tolerance,
    masks: Masks | None = None,
    neighbours_k: int = 5,
    unmasked: frozenset[str] = frozenset(),
) -> ArtifactAccuracy:
    """Fill `accuracy` with checks: per input set (min/opt/max/data, each a list of batches) and output,
    the batches are measured (per-token outputs on real tokens only, by `masks`, but for the `unmasked`
    outputs), combined, and checked against the tolerance; embedding outputs also get the neighbour agreement
    over the held-out data."""
    masks = masks or {}
    flat = {output: per_sample_everywhere(reference, output) for output in outputs}
    spreads = {output: held_out_spread(reference, output) for output in outputs}
    for inputs, ref_batches in reference.items():
        got = actual.get(inputs, [])
        batch_masks = masks.get(inputs) or [None] * len(ref_batches)
        for output in outputs:
            per_batch = [
                measure(
                    ref[output],
                    got[i].get(output) if i < len(got) else None,
                    token_mask(output, batch_masks[i], unmasked),
                )
                for i, ref in enumerate(ref_batches)
            ]
            combined = combine(per_batch)
            if combined.problem is None and not combined.exact:
                combined = _judged_by_direction(combined, per_batch, flat[output])
            accuracy.checks += checks_for(output, inputs, combined, tolerance, spreads[output])
            if combined.problem is None and not combined.exact and not combined.directionless:
                accuracy.checks += _single_value_bound(output, inputs, per_batch, tolerance, spreads[output])
            if inputs == "data":
                check = neighbour_check(output, ref_batches, got, tolerance, neighbours_k)
                if check is not None:
                    accuracy.checks.append(check)
    return accuracy


def _judged_by_direction(combined: Measure, per_batch: list[Measure], per_sample: bool) -> Measure:
    """An input set's measure with its cosine taken only from batches whose rows hold more than one value.

    An output that is one value per sample everywhere is gated as such. An output with more values per row
    elsewhere (CLIP's [images, texts] logits, a ranker's [batch, items] scores) can still hold one value per
    row in a batch of one: there cosine sees only whether a sign flipped, which a logit near zero does under
    any rounding, so those batches are bounded as scores are (max_abs at the held-out spread: here where the
    whole input set is such batches, _single_value_bound where it mixes them with others) and the input
    set's cosine comes from its other batches."""
    directional = [m for m in per_batch if not m.directionless]
    if per_sample or not directional:
        return replace(combined, directionless=True)
    cosine_ = min(m.values["cosine"] for m in directional)
    return replace(combined, directionless=False, values={**combined.values, "cosine": cosine_})


def _single_value_bound(
    output: str, inputs: str, per_batch: list[Measure], tolerance: Tolerance, spread: float | None
) -> list[Check]:
    """The score's bound on an input set's batches of one value per row, where others in the set hold more
    (the held-out data grouped by shape leaves batches of one): its gating max_abs check, none where that
    bound only informs (the values' own check says as much)."""
    singles = [m for m in per_batch if m.directionless]
    if not singles:
        return []
    checks = checks_for(output, inputs, replace(combine(singles), directionless=True), tolerance, spread)
    return [c for c in checks if c.metric == "max_abs" and not c.informational]


def held_out_spread(reference: Mapping[str, list[Outputs]], output: str) -> float | None:
    """output_spread of an output over the held-out data's samples (every input set's when there is no
    held-out data), where some batch holds one value per sample: the basis of its bound in every such batch,
    the corners' batches of one or two samples included. None for other outputs, or when no batch has the
    output."""
    if not any(
        one_value_per_sample(np.asarray(b[output])) for s in reference.values() for b in s if output in b
    ):
        return None  # only a one-value-per-sample batch is bounded by the spread
    sets = [reference["data"]] if reference.get("data") else list(reference.values())
    values = [np.asarray(b[output]) for batches in sets for b in batches if output in b]
    if not values or any(integer_values(v) for v in values):
        return None  # labels and ids: any change is wrong, whatever their spread
    return output_spread(values)
