"""The matrix of work: which (artifact, runtime, I/O) pairs this host validates and which it times, at which
batches, and why the others are neither.

It is computed once, by the validate stage, artifact by artifact as the builds arrive, and written to
reports/matrix.json; the benchmark times exactly its cells and reports its left-outs. So validation never asks
the benchmark's policy and the benchmark never re-derives it: a pair is timed only where it was validated,
because both read one plan. The rules themselves (which pairs a host times by default) are in
pipeline/bench/hosts.py; this module applies them to what was built.

The reference (the eager PyTorch model) is planned like an artifact but never validated; its cells are timed
when the recipe's benchmark.include_reference says so, a choice the benchmark applies, so that toggling it does
not make validation stale.

An artifact's plan depends only on which of its faster twins exist (hosts.twin_artifacts): whoever plans it
must have offered those first (the validate stage waits for them when they build in the background).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypedDict

from pipeline.bench import hosts
from pipeline.core.variants import REFERENCE

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

SCHEMA_VERSION = 1


class Cell(TypedDict):
    """One (artifact, runtime, I/O) the benchmark times, at these batches."""

    artifact: str
    runtime: str
    io: str
    batches: list[int]


class MatrixReport(TypedDict):
    """reports/matrix.json."""

    schema_version: int
    gpu_host: bool
    policy: dict[str, Any]  # the rule, as speed.json's conditions.runtimes_timed records it
    cells: list[Cell]
    validated: dict[str, list[str]]  # artifact -> the runtimes it is validated on, in order
    not_validated: list[dict[str, str]]  # built and runnable here, but on no runtime this host times
    not_run: list[
        dict[str, str]
    ]  # no runtime on this host loads it (one benchmark.runtimes leaves out: not_timed)
    not_timed: list[dict[str, str]]  # pairs left out by default (opt-in, faster twin), declined, or failed


Offer = tuple[str, str]  # (runtime, io): one way this host can run an artifact
FAILED_VALIDATION = "it failed validation: it did not run on this runtime"


@dataclass(frozen=True)
class ArtifactPlan:
    """What is done with one artifact: the runtimes it is validated on and the cells it is timed in, or why
    it is validated nowhere."""

    validated: tuple[str, ...]
    cells: tuple[Cell, ...]
    reason: str | None = None
    runnable: bool = (
        False  # validated nowhere by the recipe's choice (benchmark.runtimes), not for want of one
    )


@dataclass
class Matrix:
    """The plan being made: offers come in as artifacts are built, each artifact is planned once its twins are
    offered, and the report is the plans made."""

    timing: hosts.HostTiming
    gpu_host: bool
    offers: dict[str, list[Offer]] = field(default_factory=dict)
    declined: dict[str, dict[str, str]] = field(default_factory=dict)
    not_run: dict[str, str] = field(default_factory=dict)
    plans: dict[str, ArtifactPlan] = field(default_factory=dict)
    failed: dict[tuple[str, str], str] = field(default_factory=dict)  # (artifact, runtime) that raised

    def offer(
        self, artifact: str, offers: Iterable[Offer], declined: Mapping[str, str] | None = None
    ) -> None:
        """The ways this host runs an artifact (and the runtimes it declines for it, with why)."""
        self.offers[artifact] = list(dict.fromkeys(offers))
        self.declined[artifact] = dict(declined or {})

    def cannot_run(self, artifact: str, reason: str, declined: Mapping[str, str] | None = None) -> None:
        """An artifact no runtime on this host loads (and the runtimes that decline it, with why)."""
        self.not_run[artifact] = reason
        self.declined[artifact] = dict(declined or {})

    def pairs(self) -> set[hosts.Pair]:
        return {(artifact, rt) for artifact, offers in self.offers.items() for rt, _ in offers}

    def plan(self, artifact: str) -> ArtifactPlan:
        """Plan one offered artifact (its twins offered first): which cells are timed, which runtimes
        validated. The reference is what the others are validated against: timed, never validated."""
        pairs = self.pairs()
        cells = tuple(self._cells(artifact, pairs))
        validated = () if artifact == REFERENCE else self._validated(artifact, cells, pairs)
        reason = None if validated or artifact == REFERENCE else self._why_not(artifact)
        unlisted = reason is not None and self._unlisted(artifact)
        if unlisted:
            reason = self._unlisted_reason(artifact)
        self.plans[artifact] = found = ArtifactPlan(validated, cells, reason, runnable=unlisted)
        return found

    def _unlisted(self, artifact: str) -> bool:
        """Runnable here, but benchmark.runtimes lists none of the runtimes that run it: the recipe's choice."""
        return self.timing.runtimes is not None and bool(self.offers[artifact])

    def _unlisted_reason(self, artifact: str) -> str:
        offered = ", ".join(dict.fromkeys(rt for rt, _ in self.offers[artifact]))
        return f"benchmark.runtimes lists none of its runtimes ({offered})"

    def failed_validation(self, artifact: str, runtime: str) -> None:
        """The planned artifact could not run on `runtime` in validation (the runtime raised, at loading or at a
        batch): its cells on that runtime are dropped, since timing it would only fail again, and the report
        says once why it is not timed (its failure is the validation's to list)."""
        plan = self.plans[artifact]
        cells = tuple(c for c in plan.cells if c["runtime"] != runtime)
        self.plans[artifact] = ArtifactPlan(plan.validated, cells, plan.reason)
        self.failed[(artifact, runtime)] = FAILED_VALIDATION

    def _cells(self, artifact: str, pairs: set[hosts.Pair]) -> list[Cell]:
        cells: list[Cell] = []
        for rt, io in self.offers[artifact]:
            batches = [b for b in self.timing.batch_sizes if self._timed(artifact, rt, io, b, pairs)]
            if batches:
                cells.append({"artifact": artifact, "runtime": rt, "io": io, "batches": batches})
        return cells

    def _validated(self, artifact: str, cells: tuple[Cell, ...], pairs: set[hosts.Pair]) -> tuple[str, ...]:
        """Every runtime the artifact is timed on. One timed nowhere is still validated, so that every built
        artifact carries an accuracy verdict: on the first runtime it was left out of for its faster twins, else
        on the first runtime this host offers it that the recipe has not opted out of (a GPU host's CPU runtime
        for a graph the CUDA provider declines: the CPU winner of a CPU deploy, or a recurrent model's graphs).
        Not where benchmark.runtimes leaves it out: that is the recipe's choice (_unlisted)."""
        timed = tuple(dict.fromkeys(c["runtime"] for c in cells))
        if timed:
            return timed
        offered = dict.fromkeys(rt for rt, _ in self.offers[artifact])
        left = [rt for rt in offered if hosts.left_for_twin(self.timing, artifact, rt, self.gpu_host, pairs)]
        if left or self.timing.runtimes is not None:
            return tuple(left[:1])
        return tuple([rt for rt in offered if not hosts.opted_out(self.timing, rt)][:1])

    def _why_not(self, artifact: str) -> str:
        declined = "".join(f"{why}; " for why in self._declined(artifact).values())
        rule = hosts.policy(self.timing, self.gpu_host)["rule"]
        return f"{declined}none of its runtimes is timed on this host ({rule})"

    def _timed(self, artifact: str, rt: str, io: str, batch: int, pairs: set[hosts.Pair]) -> bool:
        return hosts.timed(self.timing, artifact, rt, batch, self.gpu_host, io, pairs)

    def _declined(self, artifact: str) -> dict[str, str]:
        """The declined runtimes the reports name: not an opt-in runtime the recipe does not ask for."""
        found = self.declined.get(artifact, {})
        return {rt: why for rt, why in found.items() if not hosts.opted_out(self.timing, rt)}

    def report(self, order: Iterable[str] = ()) -> MatrixReport:
        """The plans made: the reference first, then the artifacts in `order` (the recipe's), then any other."""
        rank = {name: i for i, name in enumerate([REFERENCE, *order])}

        def in_order(names: Iterable[str]) -> list[str]:
            return sorted(names, key=lambda a: rank.get(a, len(rank)))

        planned = in_order(self.plans)
        declined = [
            {"artifact": artifact, "runtime": rt, "io": "any", "reason": why}
            for artifact in in_order(self.declined)
            for rt, why in self._declined(artifact).items()
        ]
        failed = [
            {"artifact": artifact, "runtime": rt, "io": "any", "reason": why}
            for (artifact, rt), why in self.failed.items()
        ]
        unlisted = [
            {"artifact": artifact, "runtime": rt, "io": "any", "reason": self.plans[artifact].reason or ""}
            for artifact in planned
            if self.plans[artifact].runnable
            for rt in dict.fromkeys(rt for rt, _ in self.offers[artifact])
        ]
        return {
            "schema_version": SCHEMA_VERSION,
            "gpu_host": self.gpu_host,
            "policy": hosts.policy(self.timing, self.gpu_host),
            "cells": [cell for artifact in planned for cell in self.plans[artifact].cells],
            "validated": {a: list(self.plans[a].validated) for a in planned if self.plans[a].validated},
            "not_validated": [
                {"artifact": a, "reason": self.plans[a].reason or ""} for a in planned if self.plans[a].reason
            ],
            "not_run": [{"artifact": a, "reason": self.not_run[a]} for a in in_order(self.not_run)],
            "not_timed": hosts.not_timed(self.timing, self._planned_pairs(planned), self.gpu_host)
            + unlisted
            + declined
            + failed,
        }

    def _planned_pairs(self, planned: list[str]) -> list[hosts.Pair]:
        return [(artifact, rt) for artifact in planned for rt, _ in self.offers[artifact]]


def timed_batches(matrix: MatrixReport) -> dict[tuple[str, str, str], list[int]]:
    """(artifact, runtime, io) -> the batches the benchmark times it at."""
    return {(c["artifact"], c["runtime"], c["io"]): c["batches"] for c in matrix["cells"]}
