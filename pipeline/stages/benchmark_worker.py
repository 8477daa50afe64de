"""One GPU's share of the benchmark, in a child process that sees that GPU alone (`benchmark.parallel_gpus`).

Run as `python -m pipeline.stages.benchmark_worker JOB.json` (pipeline.core.children.run_job), with
CUDA_VISIBLE_DEVICES set to one GPU. The job carries the benchmark stage's own config, the artifacts' records,
the matrix of work and the cells this GPU times; the worker measures them with the stage's own functions
(pipeline/stages/benchmark.py: the same candidates, shapes, windows and profiles; its torch.compile modules are
compiled afresh, not kept from validation) and returns the rows and failures as JSON, each row saying which
GPU it ran on. Workers run at once on one host: each is pinned to CPU cores of its own, so that one's loading
and compiling stays off the cores another launches its timed calls from. Its progress lines are the stage's,
tagged with the GPU.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import sys
import tempfile
import threading
import traceback
from pathlib import Path
from typing import Any

from pipeline.core.artifacts import ArtifactRecord
from pipeline.core.children import Cancelled, run_job, serve_job


def job_for(
    workdir: Path,
    config: Any,
    inputs: dict[str, ArtifactRecord],
    matrix: dict[str, Any],
    keys: list[tuple[str, str, str]],
    device: str,
    result: Path,
    cores: list[int] | None = None,
) -> dict[str, Any]:
    """The job of one worker: everything it measures from, as JSON beside the stage's config (pickled next to
    the result file, in the parent's temporary folder)."""
    records = [
        {**dataclasses.asdict(r), "path": str(r.path), "value": None}
        for name, r in inputs.items()
        if not name.startswith("report:")
    ]
    config_file = result.with_name("config.pickle")  # a stage config holds fields its JSON leaves out
    config_file.write_bytes(pickle.dumps(config))
    return {
        "workdir": str(workdir),
        "config": str(config_file),
        "artifacts": records,
        "matrix": matrix,
        "keys": [list(k) for k in keys],
        "device": device,
        "cores": cores,
        "result": str(result),
    }


Cell = tuple[str, str, str]  # (artifact, runtime, io)


def run_workers(
    ctx: Any,
    config: Any,
    inputs: dict[str, ArtifactRecord],
    matrix: dict[str, Any],
    shares: list[tuple[str, list[Cell]]],
) -> list[tuple[str, list[Cell], dict[str, Any]]]:
    """Each share (a GPU id and its cells) timed by a worker of its own, all at once; every worker's outcome
    (its result, or ok False with why it left none), in the order given. No timeout: a worker measures under the
    benchmark's own caps, as the stage does in process; a Ctrl-C or a stopping run kills every worker."""
    outcomes: dict[int, dict[str, Any]] = {}

    def one(i: int, device: str, cells: list[Cell]) -> None:
        with tempfile.TemporaryDirectory(prefix="bench-gpu-") as tmp:
            job = job_for(ctx.workdir, config, inputs, matrix, cells, device, Path(tmp) / "result.json")
            try:
                outcome = run_job(
                    "pipeline.stages.benchmark_worker",
                    job,
                    Path(tmp),
                    None,
                    ctx.report,
                    cancel=getattr(ctx, "cancel", None),
                    env={"CUDA_VISIBLE_DEVICES": device},
                )
            except Cancelled:
                outcomes[i] = {"ok": False, "error": "the run stopped"}
                return
            outcomes[i] = outcome.result or {
                "ok": False,
                "error": outcome.death(None, "benchmark worker", ""),
            }

    threads = [threading.Thread(target=one, args=(i, d, c), daemon=True) for i, (d, c) in enumerate(shares)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [
        (device, cells, outcomes.get(i, {"ok": False, "error": "no outcome"}))
        for i, (device, cells) in enumerate(shares)
    ]


def measure(job: dict[str, Any]) -> dict[str, Any]:
    from pipeline.bench.windows import WindowPolicy
    from pipeline.core.heap import frozen_heap
    from pipeline.core.host import gpu_name
    from pipeline.stages import benchmark
    from pipeline.stages.base import RunContext

    device = job["device"]
    tag = f"[gpu {device}]"
    if job.get("cores") and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, job["cores"])
    try:
        config = pickle.loads(Path(job["config"]).read_bytes())  # noqa: S301 - written by this deploy's parent
        inputs = {a["name"]: ArtifactRecord(**{**a, "path": Path(a["path"])}) for a in job["artifacts"]}
        keys = {tuple(k) for k in job["keys"]}
        ctx = RunContext(Path(job["workdir"]), report=lambda line: print(f"{tag} {line}", flush=True))
        policy = WindowPolicy.from_config(config.benchmark)
        work = job["matrix"]
        candidates = [c for c in benchmark.candidates(ctx, config, inputs, work) if c.key in keys]
        shapes = benchmark.shapes_of(ctx, config)
        with frozen_heap():  # as in the stage: the collections after each shape walk only what it made
            results, failed, _ = benchmark.measure_shapes(ctx, config, candidates, shapes, policy, work)
            if config.benchmark.profile:
                benchmark.profile_rows(ctx, config, candidates, shapes, results)
    except Exception as exc:  # noqa: BLE001 - the worker's failure is its GPU's cells', with the reason
        traceback.print_exc()
        return {"ok": False, "error": f"{type(exc).__name__}: {' '.join(str(exc).split())[:800]}"}
    where = {"visible_device": device, "name": gpu_name(), "process": os.getpid(), "cores": job.get("cores")}
    for row in results:
        row.setdefault("runtime_details", {})["gpu_worker"] = where
    return {"ok": True, "results": results, "failed": failed, "gpu": where}


def main(argv: list[str] | None = None) -> int:
    return serve_job(argv, "pipeline.stages.benchmark_worker", "benchmark worker", measure)


if __name__ == "__main__":
    sys.exit(main())
