"""What speed.json says about each candidate: its row (statistics, stability, windows, GPU memory and
throughput), its failures, and the flags a reader must see (docs/benchmarking.md rules 6 and 8)."""

from __future__ import annotations

import json
from typing import Any

from pipeline.bench.stats import latency_stats
from pipeline.bench.timer import CudaEventTimer, Timer, on_gpu
from pipeline.bench.windows import Measurement, WindowPolicy
from pipeline.check.speed import overlap
from pipeline.check.timings import Timing
from pipeline.core.errors import plain
from pipeline.runners.base import Runner

HOST_BOUND_RATIO = 0.5  # GPU time below half the wall time: the host, not the GPU, sets the pace


def one_line(message: str, limit: int = 400) -> str:
    """A reason fit for a report: the first line and, for tracebacks (TorchScript), the last one."""
    lines = [line.strip() for line in plain(message).strip().splitlines() if line.strip()]
    text = lines[0] if len(lines) < 2 else f"{lines[0]} ... {lines[-1]}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def failure(runner: Runner, where: dict[str, Any], reason: str) -> dict[str, Any]:
    return {
        "artifact": runner.artifact,
        "runtime": runner.runtime,
        "io": runner.io,
        **where,
        "reason": reason,
    }


def speed_row(
    runner: Runner,
    precision: str | None,
    timer: Timer | None,
    m: Measurement,
    where: dict[str, Any],
    policy: WindowPolicy,
    memory: dict[str, Any] | None = None,
    throughput: dict[str, Any] | None = None,
    load_s: float | None = None,
) -> dict[str, Any]:
    """One speed.json row: who ran where, the latency statistics, and how the measurement went (`load_s`:
    activation, staging and the first call at this shape, all outside the timing)."""
    out = {
        "artifact": runner.artifact,
        "runtime": runner.runtime,
        "io": runner.io,
        "precision": precision,
        **where,
        **latency_stats(m.ms(), window_sizes=m.window_sizes),
        "stable": m.stable,
        "stop_reason": m.stop_reason,
        "windows": len(m.window_medians),
        "window_medians_ms": m.window_medians,
        "window_spread": m.window_spread(policy.stable_windows),
        "measured_s": m.elapsed_s,
        "warmup_iters": m.warmup_iters,
        "timer": timer.name if timer else None,
        **m.row_fields(),
        "cuda_graph": bool(runner.cuda_graph),
        "load_s": load_s,
    }
    details = getattr(runner, "details", None)
    if details:
        out["runtime_details"] = dict(details)
    if memory is not None:
        out["peak_memory"] = memory
    if throughput is not None:
        out["throughput"] = throughput
    if isinstance(timer, CudaEventTimer) or on_gpu(runner):
        out["wall_p50_ms"] = m.wall_p50_ms()
    return out


def flags(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rule 8: INT8 rows not faster than the fastest float row at the same runtime, I/O and shape; padded rows
    faster than their padding-aware twin; host-bound GPU rows; rows that never stabilized."""
    out = []
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for row in results:
        groups.setdefault((row["runtime"], row["io"], json.dumps(row["shapes"], sort_keys=True)), []).append(
            row
        )
    for rows in groups.values():
        for int8 in (r for r in rows if r.get("precision") == "int8"):
            flag = _int8_flag(int8, rows)
            if flag:
                out.append(flag)
    out += _padding_flags(results)
    for row in results:
        where = {k: row[k] for k in ("artifact", "runtime", "io", "batch", "sequence_length", "shapes")}
        wall = row.get("wall_p50_ms")
        if wall and row["p50_ms"] < HOST_BOUND_RATIO * wall:
            out.append(
                {
                    "kind": "host_bound",
                    **where,
                    "message": f"GPU p50 {row['p50_ms']:.3f} ms, wall p50 {wall:.3f} ms",
                }
            )
        if not row["stable"]:
            out.append(
                {
                    "kind": "unstable",
                    **where,
                    "message": row.get("unstable_reason")
                    or f"stopped by {row['stop_reason']}, cv {row['cv']:.3f}",
                }
            )
    return out


def _padding_flags(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A padded row faster than its padding-aware twin beyond the noise, same artifact and shape. The CPU host
    times the padded rows of the plain exports only (bench/hosts.py, left_for_padding) on the evidence that
    padding-aware runs are faster; where this one says otherwise (a tiny model, whose call costs less than the
    planning), the other graphs' padded rows, left out, may be faster than anything timed."""
    from pipeline.runners.registry import runtimes

    declared = runtimes()
    by_key = {
        (r["artifact"], r["runtime"], r["io"], json.dumps(r["shapes"], sort_keys=True)): r for r in results
    }
    out = []
    for (artifact, runtime, io, shapes), padded in by_key.items():
        twin = declared[runtime].padded_twin if runtime in declared else ""
        aware = by_key.get((artifact, twin, io, shapes)) if twin else None
        if aware is None:
            continue
        spans = [Timing.read(r).interval_or_point("p50_ms") for r in (padded, aware)]
        if padded["p50_ms"] < aware["p50_ms"] and not overlap(*spans):
            out.append(
                {
                    "kind": "padding_aware_slower",
                    **{
                        k: padded[k]
                        for k in ("artifact", "runtime", "io", "batch", "sequence_length", "shapes")
                    },
                    "twin": twin,
                    "message": f"{artifact} on {runtime} (padded) p50 {padded['p50_ms']:.3f} ms vs "
                    f"{aware['p50_ms']:.3f} ms on {twin}: the padded run is faster beyond the noise, and the "
                    "other graphs' padded rows were left to their padding-aware twins; list both runtimes "
                    "under benchmark.runtimes to time them",
                }
            )
    return out


def _int8_flag(int8: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Against the fastest float row, FP16 or FP32: on a CPU FP16 is often the slowest of all, and an INT8 row
    slower than FP32 there must not pass for faster because FP16 was slower still."""
    peers = [r for r in rows if r.get("precision") in ("fp16", "fp32")]
    if not peers:
        return None
    best = min(peers, key=lambda r: r["p50_ms"])
    precision = best["precision"]
    spans = [Timing.read(r).interval_or_point("p50_ms") for r in (int8, best)]
    apart = not overlap(*spans)
    if int8["p50_ms"] >= best["p50_ms"]:
        verdict = "slower" if apart else "slower by p50, within the noise (confidence intervals overlap)"
    elif not apart:
        verdict = "not faster beyond the noise (confidence intervals overlap)"
    else:
        return None
    return {
        "kind": "int8_not_faster",
        "artifact": int8["artifact"],
        "than": best["artifact"],
        "than_precision": precision,
        "runtime": int8["runtime"],
        "io": int8["io"],
        "batch": int8["batch"],
        "sequence_length": int8["sequence_length"],
        "shapes": int8["shapes"],
        "int8_p50_ms": int8["p50_ms"],
        "other_p50_ms": best["p50_ms"],
        "message": f"{int8['artifact']} p50 {int8['p50_ms']:.3f} ms vs {best['artifact']} {best['p50_ms']:.3f} ms: {verdict}",
    }
