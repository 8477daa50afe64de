"""Server-scenario results (reports/load.json) side by side: a line per candidate, a column group per load.json.

    python scripts/load_table.py in_process=v0001/reports/load.json triton=v0002/reports/load.json

Cells: the highest rate that held the p99 target in every repeat (requests/s, with its interval), the mean
batch, the median p50 and worst p99 ms of the repeats at that rate and how many LoadGen called VALID; a candidate that held no rate says by how much it missed. Never imported
by pipeline/.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def _cell(row: dict[str, Any] | None) -> list[str]:
    if row is None:
        return ["not run", "", ""]
    served = row.get("served") or {}
    if row.get("max_qps") is None:
        missed = row.get("missed") or row.get("error") or "held no rate"
        return [f"none ({missed})" if isinstance(missed, str) else f"none ({json.dumps(missed)})", "", ""]
    low, high = row.get("ci95") or (None, None)
    held = [r for r in row.get("repeats") or [] if r.get("error") is None]
    batch = sum(r.get("mean_batch") or 0 for r in held) / len(held) if held else float("nan")
    p50 = sorted(r["p50_ms"] for r in held)[len(held) // 2] if held else float("nan")
    p99 = max(served.get("p99_ms") or [float("nan")])
    interval = f" [{low:,.0f}–{high:,.0f}]" if low is not None else ""
    valid = sum(r.get("loadgen_result") == "VALID" for r in held)
    return [
        f"{row['max_qps']:,.0f}{interval}",
        f"{batch:.1f}",
        f"{p50:.2f} / {p99:.2f} ({valid}/{len(held)} VALID)",
    ]


def table(loads: dict[str, dict[str, Any]]) -> str:
    keys: list[tuple[str, str]] = []
    for load in loads.values():
        for row in load.get("results", []):
            key = (row["artifact"], row["runtime"])
            if key not in keys:
                keys.append(key)
    head = ["artifact", "runtime"]
    for label, load in loads.items():
        target = (load.get("conditions") or {}).get("p99_ms")
        head += [f"{label}: req/s at p99 ≤ {target:g} ms", f"{label}: mean batch", f"{label}: p50 / p99 ms"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key in keys:
        cells = [f"`{key[0]}`", f"`{key[1]}`"]
        for load in loads.values():
            mine = next((r for r in load.get("results", []) if (r["artifact"], r["runtime"]) == key), None)
            cells += _cell(mine)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("loads", nargs="+", help="LABEL=path/to/load.json")
    args = parser.parse_args(argv)
    loads = {}
    for item in args.loads:
        label, _, path = item.partition("=")
        loads[label] = json.loads(Path(path).read_text(encoding="utf-8"))
    print(table(loads))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
