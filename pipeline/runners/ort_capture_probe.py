"""The CUDA-graph capture probe's own process (`python -m pipeline.runners.ort_capture_probe JOB.json`).

A capture that fails may leave the CUDA context unusable, and ONNX Runtime can abort the process when it
releases a session (1.31.1 did, on an H100, for sessions that had run an LSTM). The probe therefore tries the
capture in a child (pipeline/core/children.run_job), and a child that dies is one more reason not to offer the
graph runtime, never the end of the deploy that asked."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from pipeline.core.children import serve_job

MODULE = "pipeline.runners.ort_capture_probe"
# the probe's runner, never released: releasing a session after a failed capture is what aborted the process
_KEPT: list[Any] = []


def probe(job: dict[str, Any]) -> dict[str, Any]:
    """The job's graph captured at the recipe's smallest shapes: {"ok": True, "refused": reason or None}."""
    from pipeline.inputs.specs import RunnerSettings
    from pipeline.runners.ort_cuda_graph import OrtCudaGraphRunner, try_capture

    settings = RunnerSettings.model_validate(job["settings"])
    runner = OrtCudaGraphRunner(job["name"], Path(job["path"]), settings, job["precision"])
    _KEPT.append(runner)
    return {"ok": True, "refused": try_capture(runner, settings)}


def main(argv: list[str] | None = None) -> None:
    """serve_job writes the reason; the process then ends at once, its sessions unreleased."""
    code = serve_job(argv, MODULE, "capture probe", probe)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
