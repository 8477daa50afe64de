"""The AOTInductor compile of one ExportedProgram, in a child process of the deploy.

Run as `python -m pipeline.aoti_build JOB.json` (pipeline.children.run_job). The job names the ExportedProgram,
the package to write, the target device, whether to autotune, and the JSON result file. The compile runs here,
not in the deploy, because it takes a minute or more on a GPU host and holds process-wide state (Inductor's
config and compile-time counters, torch's loggers, stdout): in a child it can run while the deploy validates
other artifacts, and whatever it prints lands in the stage log without touching the live display."""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path
from typing import Any

from pipeline.store import write_bytes_atomic


def build(job: dict[str, Any]) -> dict[str, Any]:
    from pipeline.stages.export_pt2 import compile_aoti

    path, seconds, info = compile_aoti(
        Path(job["source"]), Path(job["target"]), job["device"], bool(job["max_autotune"])
    )
    return {"ok": True, "path": path, "compile_s": round(seconds, 2), "device": info}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m pipeline.aoti_build JOB.json", file=sys.stderr)
        return 2
    job = json.loads(Path(args[0]).read_text())
    print(f"[aoti] compiling {job['source']} for {job['device']}", flush=True)
    try:
        result = build(job)
    except Exception as exc:  # noqa: BLE001 - the compiler's own message is the variant's failure
        traceback.print_exc()
        message = " ".join(str(exc).split())[:1000]
        result = {"ok": False, "error": f"AOTInductor compile failed: {type(exc).__name__}: {message}"}
    write_bytes_atomic(Path(job["result"]), json.dumps(result, indent=1).encode())
    if not result["ok"]:
        print(f"[aoti] {result['error']}", flush=True)
        return 1
    print(f"[aoti] compiled in {result['compile_s']} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
