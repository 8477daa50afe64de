"""Whether a stage can be reused: its fingerprint (docs/architecture.md) against the records of the latest
version and of killed runs, and its recorded outputs still on disk with their hashes."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.core.files import sha256_file
from pipeline.release.store import Store
from pipeline.stages.base import Stage
from pipeline.stages.record import StageRecord


def fingerprint(stage: Stage, inputs: dict[str, str], environment: dict[str, Any]) -> str:
    """sha256 of canonical JSON of the stage name and version, its config (what its run reads), its inputs'
    sha256 and the environment keys it declares (docs/architecture.md)."""
    payload = {
        "stage": stage.name,
        "version": stage.version,
        "config": stage.config.fingerprinted(),
        "inputs": inputs,
        "environment": environment,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


@dataclass
class Freshness:
    """Whether one stage can be reused, and why not."""

    fresh: bool
    why: str
    record: StageRecord | None = None
    source: Path | None = None  # the folder its outputs can be fetched from besides the cache


MAX_PATHS = 4
# what a digest stands for: the setting the user changed is in what it hashes
DIGESTS = {
    "model.digest": "model.digest (the model's source module, its files or its settings)",
    "data.digest": "data.digest (the samples' file or their settings)",
    "data.model.digest": "data.model.digest (the model's source module, its files or its settings)",
}


def changed_paths(before: Any, after: Any, prefix: str = "") -> list[str]:
    """The dotted paths of the leaves that differ ('validation.tolerances.fp32.max_abs', 'model.digest'): a
    re-run says what changed, not only which part of the recipe."""
    if isinstance(before, dict) and isinstance(after, dict):
        found = []
        for key in sorted(set(before) | set(after), key=str):
            if before.get(key) != after.get(key):
                found += changed_paths(
                    before.get(key), after.get(key), f"{prefix}.{key}" if prefix else str(key)
                )
        return found
    return [prefix] if before != after else []


def _diff_reason(stage: Stage, prev: StageRecord, inputs: dict[str, str], env: dict[str, Any]) -> str:
    if prev.version != stage.version:
        return f"stage version {prev.version} -> {stage.version}"
    changed = changed_paths(prev.config, stage.config.fingerprinted())
    if changed:
        shown = [DIGESTS.get(path, path) for path in changed[:MAX_PATHS]]
        return "config changed: " + ", ".join(shown) + (", …" if len(changed) > MAX_PATHS else "")
    moved = [k for k in sorted(set(prev.inputs) | set(inputs)) if prev.inputs.get(k) != inputs.get(k)]
    if moved:
        return "input changed: " + ", ".join(moved)
    env_changed = [
        k for k in sorted(set(prev.environment) | set(env)) if prev.environment.get(k) != env.get(k)
    ]
    if env_changed:
        return "environment changed: " + ", ".join(
            f"{k} {prev.environment.get(k)} -> {env.get(k)}" for k in env_changed
        )
    return "fingerprint changed"


class Judge:
    def __init__(self, store: Store, previous: list[tuple[Path, dict[str, StageRecord]]], retry_failed: bool):
        """previous: (folder, records) candidates for reuse, the latest version first, then killed runs.
        A failed stage with an unchanged fingerprint is reused as failed (as far as the fingerprint can tell
        its failure is deterministic) unless retry_failed asks to run it again (timeouts, crashes)."""
        self.store = store
        self.previous = previous
        self.retry_failed = retry_failed
        self._environments: dict[str, dict[str, Any]] = {}

    def environment(self, stage: Stage) -> dict[str, Any]:
        if stage.name not in self._environments:
            self._environments[stage.name] = stage.environment()
        return self._environments[stage.name]

    def judge(self, stage: Stage, inputs: dict[str, str], force_stale: bool = False) -> Freshness:
        env = self.environment(stage)
        fp = fingerprint(stage, inputs, env)
        if force_stale:
            return Freshness(False, "re-measure requested (--rebench)")
        first_reason = "no previous run"
        for folder, records in self.previous:
            prev = records.get(stage.name)
            if prev is None or prev.status not in ("ran", "reused", "failed"):
                continue
            if prev.status == "failed" and self.retry_failed:
                first_reason = "failed before; retry requested (--retry-failed)"
                continue
            if prev.fingerprint != fp:
                if first_reason == "no previous run":
                    first_reason = _diff_reason(stage, prev, inputs, env)
                continue
            missing = self._unverifiable(prev, folder)
            if missing:
                first_reason = missing
                continue
            return Freshness(True, f"same fingerprint as {folder.name}", prev, folder)
        return Freshness(False, first_reason)

    def _unverifiable(self, prev: StageRecord, folder: Path) -> str | None:
        for out in prev.outputs:
            cached = self.store.cache_path(out["sha256"])
            candidates = [p for p in (cached, folder / out["path"]) if p.is_file()]
            if not any(sha256_file(p) == out["sha256"] for p in candidates):
                return f"output {out['path']} missing or modified"
        return None
