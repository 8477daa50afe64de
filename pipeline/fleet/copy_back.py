"""`store: copy`, the node's side: a deploy into a scratch store on the node's own disk (seeded with the shared
store's latest and newest versions), then its new version sent back to the driver in chunks, for nodes that do
not see the fleet's root. The driver checks every file against the version's manifest and publishes it
(pipeline/fleet/copy_publish.py); the scratch store is removed whatever happens."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from pipeline.core.test_hooks import corrupt_copy, keep_scratch
from pipeline.fleet.seed import plant_seed, seeded
from pipeline.fleet.task import Job, run_job
from pipeline.fleet.transfer import list_files, read_chunks
from pipeline.release.store import Store


def run_job_copying_back(job: Job) -> Iterator[Any]:
    """A Ray streaming generator task: first the deploy's result (run_job's, with a `copy` entry saying which
    version follows, its files and sizes, and where the deploy left `latest` and the promotions log), then
    the version's bytes, chunk after chunk (none when the deploy made no new version: up to date, or failed
    before publishing)."""
    import ray

    assert job.seed is not None, "a copy-mode job carries the shared store's seed"
    scratch = Path(tempfile.mkdtemp(prefix="pipeline-fleet-"))
    try:
        store = Store(scratch, job.seed.name)
        plant_seed(ray, job.seed, store)
        logged = len(store.promotions())
        root = f"output.root={json.dumps(str(scratch))}"  # quoted: a YAML value
        result = run_job(replace(job, sets=(*job.sets, root), seed=None))
        folder = _new_version(result, store, seeded(job.seed))
        files = list_files(folder) if folder else []
        latest = store.latest()
        result["copy"] = {
            "version": folder.name if folder else None,
            "files": files,
            "latest": latest.name if latest else None,
            "promotions": store.promotions()[logged:],
            "node": os.uname().nodename,
        }
        # before the first yield: once the driver has the last chunk it may end this task's process
        keep_scratch(scratch, result["attempt"])
        yield result
        if folder:
            attempt = result["attempt"]
            yield from read_chunks(folder, files, lambda rel, data: corrupt_copy(rel, data, attempt))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _new_version(result: dict[str, Any], store: Store, seeded_versions: set[str]) -> Path | None:
    """The version this deploy published in the scratch store, if any (an up-to-date deploy names a seeded
    one, which the shared store already holds)."""
    version = (result.get("document") or {}).get("version")
    if not version or version in seeded_versions or result["document"].get("status") == "up_to_date":
        return None
    folder = store.version_folder(version)
    return folder if folder.is_dir() else None
