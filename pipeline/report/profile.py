"""The report's Profile section: why the winner wins, from each row's short profile (pipeline/bench/profile.py)
at the winner's shape: kernels per call, the time split, what bounds it and its heaviest kernel."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pipeline.report.blocks import Block, Para, Section, Table

Dict = Mapping[str, Any]
PARTS = ("gemm", "attention", "elementwise", "copies", "idle")


def profile_section(speed: Dict | None, winner: Dict | None) -> Section:
    rows = [r for r in (speed or {}).get("results") or [] if isinstance(r.get("profile"), Mapping)]
    if winner and winner.get("shapes"):
        rows = [r for r in rows if r.get("shapes") == winner["shapes"]] or rows
    else:  # no winner: the smallest batch
        smallest = min((r.get("batch") or 0 for r in rows), default=0)
        rows = [r for r in rows if (r.get("batch") or 0) == smallest]
    profiled = [r for r in rows if "split" in r["profile"]]
    if not profiled:
        return Section("Profile", [])
    first = profiled[0]
    shape = f"batch {first.get('batch')}" + (
        f", sequence {first['sequence_length']}" if first.get("sequence_length") else ""
    )
    tools = "; ".join(dict.fromkeys(str(r["profile"].get("tool")) for r in profiled))
    blocks: list[Block] = [
        Para(
            f"Where each row's call time goes at {shape}, from a short profile taken after its timing windows "
            f"({tools}). Idle is time no kernel or operator works: gaps between kernels on a GPU; on a CPU the "
            "runtime's own overhead around its operators (views, the interpreter, session and padding-aware "
            "bookkeeping). A row is launch-bound (on a CPU, overhead-bound) when idle is half the call or more, "
            "else compute-bound when GEMMs and attention take half its busy time, else memory-bound. Shares, not "
            "latencies: profiled calls carry the profiler's own cost, which lands in idle (most for many small "
            "operators)."
        ),
        Table(
            ["row", "per call", *PARTS, "bound", "heaviest"],
            [_cells(r) for r in profiled],
            ["winner" if _is(r, winner) else "" for r in profiled],
        ),
    ]
    sentence = _winner_sentence(next((r for r in profiled if _is(r, winner)), None))
    if sentence:
        blocks.insert(0, Para(sentence, strong=True))
    unseen = [r for r in rows if "split" not in r["profile"]]
    if unseen:
        reasons = sorted({str(r["profile"].get("unavailable")) for r in unseen})
        blocks.append(Para(f"Not profiled ({len(unseen)} rows): {'; '.join(reasons)}.", tone="note"))
    return Section("Profile", blocks)


def _is(row: Dict, winner: Dict | None) -> bool:
    keys = ("artifact", "runtime", "io", "cuda_graph")
    return bool(winner) and all(
        bool(row.get(k)) == bool(winner.get(k)) if k == "cuda_graph" else row.get(k) == winner.get(k)
        for k in keys
    )


def _label(row: Dict) -> str:
    graph = ", graph" if row.get("cuda_graph") else ""
    return f"{row.get('artifact')} · {row.get('runtime')} ({row.get('io')}{graph})"


def _count(profile: Dict) -> str:
    if "kernels_per_call" in profile:
        return f"{profile['kernels_per_call']:g} kernels"
    return f"{profile.get('operators_per_call', 0):g} operators"


def _cells(row: Dict) -> list[str]:
    profile = row["profile"]
    split = profile.get("split") or {}
    top = (profile.get("top") or [{}])[0]
    heaviest = f"{top.get('name', '—')} ({_pct(top.get('share_of_busy'))} of busy)" if top else "—"
    return [
        _label(row),
        _count(profile),
        *[_pct(split.get(part)) for part in PARTS],
        str(profile.get("bound", "—")),
        heaviest,
    ]


def _pct(value: Any) -> str:
    return f"{100 * value:.0f}%" if isinstance(value, int | float) else "—"


def _winner_sentence(row: Dict | None) -> str | None:
    """What bounds the winner, in its own figures."""
    if row is None:
        return None
    profile = row["profile"]
    split = profile["split"]
    top = (profile.get("top") or [{}])[0]
    bound = profile.get("bound")
    if bound == "launch-bound":
        why = f"the GPU is idle {_pct(split['idle'])} of its call ({_count(profile)} per call)"
    elif bound == "overhead-bound":
        why = f"no operator works {_pct(split['idle'])} of its call, the runtime's own overhead ({_count(profile)} per call)"
    elif bound == "compute-bound":
        why = f"GEMMs and attention take {_pct(split['gemm'] + split['attention'])} of its call"
    else:
        why = f"elementwise work and copies take {_pct(split['elementwise'] + split['copies'])} of its call"
    heaviest = (
        f"; its heaviest {'kernel' if 'kernels_per_call' in profile else 'operator'}, {top['name']}, takes "
        f"{_pct(top.get('share_of_busy'))} of the busy time"
        if top.get("name")
        else ""
    )
    return f"The winner is {bound}: {why}{heaviest}."
