"""The CUDA-graph capture probe's own process (`python -m pipeline.runners.ort_capture_probe JOB.json`).

A capture that fails can leave the CUDA context unusable: on an H100, ONNX Runtime 1.31 aborted the whole
process when the next session was released after its LSTM refused to be captured. The probe therefore tries
the capture in a child (pipeline/core/children.run_job), and a child that dies is one more reason not to offer
the graph runtime, never the end of the deploy that asked."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

MODULE = "pipeline.runners.ort_capture_probe"


def probe(job: dict[str, Any]) -> None:
    """Capture the job's graph at the recipe's smallest shapes, write {"ok": True, "refused": reason or None}
    where the job says, and end the process at once: the runner's sessions are never released, since releasing
    a session after a failed capture is what aborted the process (the reason must be written before that)."""
    from pipeline.core.files import write_bytes_atomic
    from pipeline.inputs.specs import RunnerSettings
    from pipeline.runners.ort_cuda_graph import OrtCudaGraphRunner, try_capture

    settings = RunnerSettings.model_validate(job["settings"])
    runner = OrtCudaGraphRunner(job["name"], Path(job["path"]), settings, job["precision"])
    refused = try_capture(runner, settings)
    write_bytes_atomic(Path(job["result"]), json.dumps({"ok": True, "refused": refused}).encode())
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(f"usage: python -m {MODULE} JOB.json", file=sys.stderr)
        return 2
    probe(json.loads(Path(args[0]).read_text()))
    return 0  # not reached: probe ends the process


if __name__ == "__main__":
    sys.exit(main())
