"""The sign-off verdict: what was asked for, what failed where, what to be careful about, and whether the
release may be signed off.

A requested variant has failed when the stage that builds it failed (or was skipped because something it is
built from failed), when it failed validation on a runtime, or when a runtime raised while benchmarking it. An
artifact that merely cannot run on this host (a TensorRT engine without a GPU) has not failed: it is "not run",
with its reason, in the reports."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from pipeline.check.results import Winner
from pipeline.check.verdicts import records as accuracy_records
from pipeline.core.errors import first_line, reason_line

SHAPE_DEPENDENT = "shape_dependent"  # set in a stage's details when a trace disagreed with eager at a corner
WEIGHTS = "weights"  # an export's details: weights_digest of the model it was exported from


class RunRecord(Protocol):
    """What the verdict reads of a stage's run record (pipeline.stages.record.StageRecord)."""

    name: str
    status: str
    error: str | None
    produces: list[str]
    details: dict[str, Any]


@dataclass(frozen=True)
class VariantFailure:
    artifact: str
    stage: str
    error: str

    def to_json(self) -> dict[str, str]:
        return asdict(self)

    def describe(self) -> str:
        return f"{self.artifact} failed at {self.stage}: {reason_line(self.error)}"


@dataclass(frozen=True)
class Verdict:
    signed_off: bool
    reasons: list[str]  # why the release is not signed off (empty when it is)
    requested: list[str]  # artifact names the recipe asked for (variants.build)
    failures: list[VariantFailure] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    provisional: bool = False  # signed off on a winner whose measurement did not stabilize

    def failed_artifacts(self) -> list[str]:
        return list(dict.fromkeys(f.artifact for f in self.failures))

    def headline(self) -> str:
        """'signed off, 2 of 10 variants failed' / 'NOT signed off': the one line `list` and the console show."""
        if not self.signed_off:
            return "NOT signed off"
        text = "signed off"
        failed = self.failed_artifacts()
        if failed:
            text += f", {len(failed)} of {len(self.requested)} variants failed"
        if self.provisional:
            text += " (provisional: winner did not stabilize)"
        return text


def variant_failures(
    requested: Iterable[str],
    records: Iterable[RunRecord],
    accuracy: Mapping[str, Any] | None,
    speed: Mapping[str, Any] | None,
) -> list[VariantFailure]:
    """Every failure of a requested artifact, in pipeline order: build, then validation, then benchmark."""
    wanted = list(requested)
    failures: list[VariantFailure] = []
    for record in records:
        if record.status not in ("failed", "skipped"):
            continue
        for artifact in record.produces:
            if artifact in wanted:
                failures.append(VariantFailure(artifact, record.name, record.error or record.status))
    for artifact, entry in accuracy_records(accuracy).items():
        if artifact in wanted and not entry.passed:
            failures.append(VariantFailure(artifact, "validate", entry.reason or "failed"))
    # one failure per runner and reason: the batches it failed at are named together, not listed again each
    batches: dict[tuple[str, str, str, str], list[str]] = {}
    for item in (speed or {}).get("failed") or []:
        artifact = str(item.get("artifact"))
        if artifact in wanted:
            key = (artifact, str(item.get("runtime")), str(item.get("io")), str(item.get("reason")))
            batches.setdefault(key, []).append(str(item.get("batch")))
    for (artifact, runtime, io, reason), at in batches.items():
        where = f"{runtime} ({io} I/O), batch{'es' if len(at) > 1 else ''} {', '.join(dict.fromkeys(at))}"
        failures.append(VariantFailure(artifact, "benchmark", f"{where}: {reason}"))
    return failures


def shape_warnings(records: Iterable[RunRecord], artifacts: Iterable[str]) -> list[str]:
    """A trace that disagreed with eager at some shape shows the module's behaviour depends on shape: every
    artifact exported from that module is only as good as the shapes it was validated at."""
    warnings = []
    for record in records:
        if record.details.get(SHAPE_DEPENDENT):
            others = ", ".join(a for a in artifacts if a not in record.produces) or "none"
            warnings.append(
                f"{record.name} found that the model's behaviour depends on the input shape "
                f"({first_line(record.error, 200)}); exports are valid only where validated: {others}"
            )
    return warnings


PYTHON_VALUE = "TracerWarning: Converting a tensor to a Python"  # a boolean (an if), an integer, a float


def branch_warnings(records: Iterable[RunRecord], failures: Iterable[VariantFailure]) -> list[str]:
    """Exports failing validation where the tracer warned that forward turns a tensor into a Python value (an
    `if` on tensor values, or a number such as a padding amount computed from a size): each export recorded
    the one path or value the example had, and data that takes another disagrees. Said once beside the
    verdict, since the failures themselves only show cosines."""
    failed = sorted({f.artifact for f in failures if f.stage == "validate" and f.artifact.endswith("-fp32")})
    if not failed:  # lower precisions fail for reasons of their own
        return []
    warned: list[tuple[str, str]] = []  # (stage, warning) for every Python-value warning of every record
    for record in records:
        if record.details.get(SHAPE_DEPENDENT):
            return []  # shape_warnings says it already
        warned += [
            (record.name, str(w))
            for w in record.details.get("tracer_warnings") or []
            if str(w).startswith(PYTHON_VALUE)
        ]
    branch = next(((n, w) for n, w in warned if w.startswith(f"{PYTHON_VALUE} boolean")), None)
    if branch:
        return [
            f"{branch[0]}: the tracer warned that the model's forward turns a tensor into a Python value "
            f"({first_line(branch[1], 120)}): an `if` on tensor values is exported as the one path the "
            f"example took, so {', '.join(failed)} may fail where the data takes the other path; express "
            "the branch with tensor operations (torch.where) to export both"
        ]
    if warned:  # an integer or float: a size or amount computed in Python (TF-style "same" padding)
        name, warning = warned[0]
        return [
            f"{name}: the tracer warned that the model's forward turns a tensor into a Python value "
            f"({first_line(warning, 120)}): a number computed in Python from a tensor or its shape (a "
            f"padding amount, a size) is exported as the value the example had, so {', '.join(failed)} may "
            "fail where the data's shapes or values give another; compute it with tensor operations, or "
            "narrow the recipe's dims to the shapes it holds for"
        ]
    return []


STAGE_WARNINGS = "warnings"  # a stage's details key: what it did short of what it meant to, in sentences


def stage_warnings(records: Iterable[RunRecord]) -> list[str]:
    """What stages that ran (or were reused) said they did short of the plan without failing, e.g. a
    quantizer's pre-pass that could not finish: a reader of the sign-off sees it next to the verdict."""
    return [
        f"{record.name}: {text}"
        for record in records
        if record.status in ("ran", "reused")
        for text in record.details.get(STAGE_WARNINGS) or []
    ]


def decide(
    requested: list[str],
    required: list[str],
    allow_failed: bool,
    failures: list[VariantFailure],
    selection: Mapping[str, Any],
    warnings: list[str],
) -> Verdict:
    """Signed off unless a required variant failed, any variant failed while allow_failed is false, or selection
    found no winner (its own reasons)."""
    reasons = []
    for name in required:
        mine = [f for f in failures if f.artifact == name]
        if mine:
            reasons.append(f"required variant {mine[0].describe()}")
    failed = list(dict.fromkeys(f.artifact for f in failures))
    if failed and not allow_failed:
        reasons.append(
            f"{len(failed)} of {len(requested)} requested variants failed ({', '.join(failed)}) "
            "and variants.allow_failed is false"
        )
    reasons += [str(r) for r in selection.get("reasons") or []]
    winner = selection.get("winner") or {}
    return Verdict(
        signed_off=not reasons,
        reasons=reasons,
        requested=list(requested),
        failures=failures,
        warnings=list(warnings),
        provisional=bool(winner.get("provisional")) and not reasons,
    )


@dataclass(frozen=True)
class SignOff:
    """What sign-off hands the deploy: the verdict, and the facts the report and the manifest share."""

    verdict: Verdict
    header: dict[str, Any]  # name, version, created, the outcome, git, environment, artifacts
    winner: Winner | None  # winner.json (None when not signed off)

    def outcome(self) -> dict[str, Any]:
        return {key: self.header[key] for key in OUTCOME}


OUTCOME = ("signed_off", "signoff_reasons", "headline", "provisional", "requested", "failed", "warnings")
