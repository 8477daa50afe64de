"""The AOTInductor compile of one ExportedProgram, in a child process of the deploy.

Run as `python -m pipeline.toolchain.aoti_child JOB.json` (pipeline.core.children.run_job). The job names the ExportedProgram,
the package to write, the target device, whether to autotune, and the JSON result file. The compile runs here,
not in the deploy, because it takes half a minute or more on a GPU host and holds process-wide state (Inductor's
config and compile-time counters, torch's loggers, stdout): in a child it can run while the deploy validates
other artifacts, and whatever it prints lands in the stage log without touching the live display."""

from __future__ import annotations

import sys
import traceback
from pathlib import Path
from typing import Any

from pipeline.core.children import serve_job


def build(job: dict[str, Any]) -> dict[str, Any]:
    """The package, or a failed result with the compiler's own message (its traceback goes to the log)."""
    from pipeline.toolchain.aoti import compile_aoti

    print(f"[aoti] compiling {job['source']} for {job['device']}", flush=True)
    try:
        path, seconds, info = compile_aoti(
            Path(job["source"]), Path(job["target"]), job["device"], bool(job["max_autotune"])
        )
    except Exception as exc:  # noqa: BLE001 - the compiler's own message is the variant's failure
        traceback.print_exc()
        message = " ".join(str(exc).split())[:1000]
        return {"ok": False, "error": f"AOTInductor compile failed: {type(exc).__name__}: {message}"}
    print(f"[aoti] compiled in {round(seconds, 2)} s", flush=True)
    return {"ok": True, "path": path, "compile_s": round(seconds, 2), "device": info}


def main(argv: list[str] | None = None) -> int:
    return serve_job(argv, "pipeline.toolchain.aoti_child", "aoti", build)


if __name__ == "__main__":
    sys.exit(main())
