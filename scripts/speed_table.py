"""A speed.json as one markdown table: a line per (artifact, runtime, io), a column group per batch.

    python scripts/speed_table.py artifacts/bert/latest/reports/speed.json [--accuracy .../accuracy.json]

Cells: p50 / p99 ms, throughput (sequences/s) and peak device memory (MiB) where measured; the fastest p50
of each batch is marked with *. With --accuracy (the version's reports/accuracy.json) a column says whether the
pair passed validation on that very runtime. Never imported by pipeline/.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def table(speed: dict, accuracy: dict | None = None) -> str:
    rows = speed["results"]
    batches = sorted({r["batch"] for r in rows})
    best = {b: min((r["p50_ms"] for r in rows if r["batch"] == b), default=None) for b in batches}
    passed = {
        (name, runtime): record.get("passed")
        for name, entry in (accuracy or {}).get("artifacts", {}).items()
        for runtime, record in (entry.get("runtimes") or {}).items()
    }
    keys = sorted({(r["artifact"], r["runtime"], r["io"]) for r in rows})
    head = ["artifact", "runtime", "io", "graph"] + (["accuracy"] if accuracy else [])
    head += [f"b{b} p50/p99 ms" for b in batches] + [f"b{b} seq/s" for b in batches] + ["peak MiB"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key in keys:
        mine = {r["batch"]: r for r in rows if (r["artifact"], r["runtime"], r["io"]) == key}
        cells = [*key, "yes" if any(r.get("cuda_graph") for r in mine.values()) else ""]
        if accuracy:
            verdict = passed.get(key[:2])
            cells.append("" if verdict is None else ("pass" if verdict else "FAIL"))
        for b in batches:
            r = mine.get(b)
            star = "*" if r and r["p50_ms"] == best[b] else ""
            cells.append(f"{star}{r['p50_ms']:.3f} / {r['p99_ms']:.3f}" if r else "")
        for b in batches:
            t = (mine.get(b) or {}).get("throughput") or {}
            cells.append(f"{t['sequences_per_s']:.0f}" if "sequences_per_s" in t else "")
        peaks = [r["peak_memory"]["bytes"] for r in mine.values() if r.get("peak_memory")]
        cells.append(f"{max(peaks) / 2**20:.0f}" if peaks else "")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("speed", type=Path)
    parser.add_argument("--accuracy", type=Path)
    args = parser.parse_args()
    speed = json.loads(args.speed.read_text())
    accuracy = json.loads(args.accuracy.read_text()) if args.accuracy and args.accuracy.is_file() else None
    print(table(speed, accuracy))
    failures = speed.get("failed", [])
    for f in failures:
        print(f"- failed: {f['artifact']} {f['runtime']} {f['io']} batch {f.get('batch')}: {f['reason']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
