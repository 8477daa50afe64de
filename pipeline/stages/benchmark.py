"""Benchmark stage: every runnable artifact (and the PyTorch reference) on the same input batches, with the
same timer, warm-up and window policy, interleaved per shape (BENCHMARKING.md). Writes reports/speed.json.

Per shape every candidate is activated and given the same prepared inputs; windows then run A B C A B C
until each candidate is stable or capped; afterwards every candidate is released (sessions dropped,
gc, CUDA cache emptied) before the next shape, so that no candidate runs in another's leftovers.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.bench import hosts
from pipeline.bench.device import MemoryProbe, throughput
from pipeline.bench.environment import capture_environment
from pipeline.bench.stats import latency_stats
from pipeline.bench.timer import CudaEventTimer, Timer, on_gpu, timer_for
from pipeline.bench.windows import Measurement, WindowPolicy, measure_interleaved, measure_more
from pipeline.recipe import Recipe
from pipeline.runners.base import NotRunnable, Runner
from pipeline.runners.registry import reference_runners, runners_for, runtime_environment
from pipeline.runners.torch_runner import REFERENCE, intra_op_threads
from pipeline.stages.base import (
    ArtifactRecord,
    Output,
    RunContext,
    Stage,
    StageResult,
    model_data_slice,
    package_version,
)

SCHEMA_VERSION = 1
REPORT = "reports/speed.json"
ACCURACY = "report:accuracy"  # read to know which candidate would win (an unstable one is measured again)
HOST_BOUND_RATIO = 0.5  # GPU time below half the wall time: the host, not the GPU, sets the pace


@dataclass(frozen=True)
class BenchShape:
    """One benchmark shape: a batch size and, for sequence models, a sequence length."""

    batch: int
    sequence: int | None

    def dims(self, recipe: Recipe) -> dict[str, int]:
        bench, dims = recipe.benchmark, {}
        if bench.batch_dim in recipe.dims:
            dims[bench.batch_dim] = self.batch
        if self.sequence is not None and bench.sequence_dim:
            dims[bench.sequence_dim] = self.sequence
        return dims

    def label(self) -> str:
        return f"batch {self.batch}" + (f" seq {self.sequence}" if self.sequence is not None else "")


Key = tuple[str, str, str]  # (artifact, runtime, io)


@dataclass
class Candidate:
    runner: Runner
    precision: str | None
    timer: Timer | None = None
    memory: dict[str, Any] | None = None  # GPU candidates: peak device memory (pipeline/bench/device.py)
    throughput: dict[str, Any] | None = None

    @property
    def key(self) -> Key:
        return (self.runner.artifact, self.runner.runtime, self.runner.io)


# ---------------------------------------------------------------- shapes


def data_sequence_lengths(lengths: list[int], low: int, high: int) -> list[int]:
    """Median and p90 of the data's token lengths, clipped to the sequence dim's range (rule 11)."""
    if not lengths:
        return []
    picks = np.percentile(np.asarray(lengths, dtype=np.float64), [50, 90])
    return sorted({int(min(max(round(float(p)), low), high)) for p in picks})


def benchmark_shapes(recipe: Recipe, token_lengths: list[int] | None = None) -> list[BenchShape]:
    """Batch sizes x sequence lengths; a recipe without a sequence dim varies the batch only."""
    bench = recipe.benchmark
    seq = recipe.dims.get(bench.sequence_dim) if bench.sequence_dim else None
    batches = bench.batch_sizes if bench.batch_dim in recipe.dims else [1]
    if seq is None:
        return [BenchShape(b, None) for b in batches]
    if bench.sequence_lengths == "data":
        lengths = data_sequence_lengths(token_lengths or [], seq.min, seq.max) or [seq.opt]
    else:
        lengths = list(bench.sequence_lengths)
    return [BenchShape(b, s) for b in batches for s in lengths]


# ---------------------------------------------------------------- stage


def stage(recipe: Recipe, recipe_dir: Path, artifacts: list[str]) -> Stage:
    config = {
        "benchmark": recipe.benchmark.model_dump(mode="json"),
        "objective": recipe.selection.model_dump(mode="json"),  # the would-be winner is measured again
        **model_data_slice(recipe, recipe_dir),
    }
    return Stage(
        name="benchmark",
        version=4,  # 4: whole-window intervals, slow calls sized to stabilize, unstable winner re-measured,
        # runtimes chosen per host, GPU rows with peak memory and throughput
        run=functools.partial(run, order=list(artifacts)),
        config=config,
        environment=_environment,
        consumes_any=(*artifacts, ACCURACY),
        critical=True,
        volatile=True,
    )


def _environment() -> dict[str, Any]:
    return {
        "torch": package_version("torch"),
        "onnxruntime": package_version("onnxruntime") or package_version("onnxruntime-gpu"),
        **runtime_environment(),
    }


def run(ctx: RunContext, inputs: dict[str, ArtifactRecord], order: list[str] | None = None) -> StageResult:
    recipe = ctx.recipe
    policy = WindowPolicy.from_config(recipe.benchmark)
    artifacts = {name: record for name, record in inputs.items() if not name.startswith("report:")}
    candidates, not_run = _candidates(ctx, artifacts, order or list(artifacts))
    gpu_host = hosts.has_cuda()
    not_run += hosts.skipped_gpu_variants(recipe, gpu_host)
    shapes = benchmark_shapes(recipe, _token_lengths(ctx))
    results: list[dict[str, Any]] = []
    failed: list[dict[str, Any]] = []
    measured: dict[BenchShape, dict[Key, Measurement]] = {}
    for shape in shapes:
        timed = [
            c
            for c in candidates
            if hosts.timed(recipe, c.runner.artifact, c.runner.runtime, shape.batch, gpu_host)
        ]
        rows, failures, measured[shape] = _measure_shape(ctx, shape, timed, policy)
        results += rows
        failed += failures
    if ACCURACY in inputs:
        accuracy = json.loads(inputs[ACCURACY].path.read_text())
        results = confirm_winner(ctx, results, accuracy, candidates, measured, policy)
    report = {
        "schema_version": SCHEMA_VERSION,
        "conditions": {
            **_conditions(recipe, policy, shapes),
            "cuda_graphs": "per row (cuda_graph); captured outside the timed windows",
            "runtimes_timed": hosts.policy(recipe, gpu_host),
        },
        "results": results,
        "not_run": not_run,  # artifacts this host cannot run at all
        "failed": failed,  # candidates that raised at a shape: (artifact, runtime, io, shape, reason)
        "flags": flags(results),
    }
    target = ctx.path(REPORT)
    target.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    details = {
        "rows": len(results),
        "not_run": len(not_run),
        "failed": len(failed),
        "flags": len(report["flags"]),
        "remeasured": [r["artifact"] for r in results if r.get("remeasured")],
    }
    return StageResult(outputs=[Output(path=REPORT, kind="report")], details=details)


def confirm_winner(
    ctx: RunContext,
    results: list[dict[str, Any]],
    accuracy: dict[str, Any],
    candidates: list[Candidate],
    measured: dict[BenchShape, dict[Key, Measurement]],
    policy: WindowPolicy,
) -> list[dict[str, Any]]:
    """An unstable would-be winner is measured again before it is chosen: it and every candidate it or the
    fastest is tied with get more windows (interleaved, earlier windows kept, a second full budget), and
    their rows are rebuilt. Selection then decides on the new rows (provisionally, if still unstable)."""
    from pipeline.stages.select import candidates as ranked
    from pipeline.stages.select import choose, overlap

    recipe = ctx.recipe
    winner = choose(recipe, {"results": results}, accuracy)
    if winner is None or winner["stable"]:
        return results
    metric = recipe.selection.objective.metric
    rows = ranked(recipe, {"results": results}, accuracy)
    chosen = next(r for r in rows if r["artifact"] == winner["artifact"])
    contenders = [r for r in rows if r is chosen or overlap(r, chosen, metric) or overlap(r, rows[0], metric)]
    shape = next(
        s for s in measured if (s.batch, s.sequence) == (chosen["batch"], chosen.get("sequence_length"))
    )
    keys = {(r["artifact"], r["runtime"], r["io"]) for r in contenders}
    again = [c for c in candidates if c.key in keys]
    ctx.report(
        f"benchmark: the would-be winner {winner['artifact']} is unstable; measuring {len(again)} again"
    )
    rebuilt, _, _ = _measure_shape(ctx, shape, again, policy, earlier=measured[shape])
    fresh = {(r["artifact"], r["runtime"], r["io"], r["batch"], r.get("sequence_length")): r for r in rebuilt}
    return [
        fresh.get((r["artifact"], r["runtime"], r["io"], r["batch"], r.get("sequence_length")), r)
        for r in results
    ]


def _token_lengths(ctx: RunContext) -> list[int]:
    return ctx.dataset().token_lengths() if ctx.recipe.benchmark.sequence_lengths == "data" else []


def _candidates(
    ctx: RunContext, inputs: dict[str, ArtifactRecord], order: list[str]
) -> tuple[list[Candidate], list[dict[str, Any]]]:
    candidates: list[Candidate] = []
    not_run: list[dict[str, Any]] = []
    if ctx.recipe.benchmark.include_reference:
        candidates += [Candidate(r, "fp32") for r in reference_runners(ctx)]
    names = [n for n in order if n in inputs] + [n for n in inputs if n not in order]
    for name in names:
        artifact = inputs[name]
        runners = runners_for(artifact, ctx)
        if isinstance(runners, NotRunnable):
            not_run.append({"artifact": runners.artifact, "reason": runners.reason})
        else:
            candidates += [Candidate(r, artifact.precision) for r in runners]
    return candidates, not_run


def _measure_shape(
    ctx: RunContext,
    shape: BenchShape,
    candidates: list[Candidate],
    policy: WindowPolicy,
    earlier: dict[Key, Measurement] | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[Key, Measurement]]:
    """Activate all, interleave windows, release all; a candidate that fails here is reported, not fatal.
    With `earlier` measurements, their windows are kept and more are added (measure_more)."""
    feeds = ctx.dataset().feeds_at(shape.dims(ctx.recipe))
    shapes = {name: list(array.shape) for name, array in feeds.items()}
    where = {"batch": shape.batch, "sequence_length": shape.sequence, "shapes": shapes}
    active, failures = [], []
    for c in candidates:
        ctx.report(
            f"benchmark {c.runner.artifact} ({c.runner.runtime}, {c.runner.io}) {shape.label()}: loading"
        )
        try:
            probe = MemoryProbe() if on_gpu(c.runner) and hosts.has_cuda() else None
            c.runner.activate()
            c.runner.prepare(feeds)
            if probe is not None:
                c.runner.infer_prepared()
                c.memory = probe.stop()
            c.timer = timer_for(c.runner)
            active.append(c)
        except Exception as exc:  # this candidate cannot run at this shape: report it, measure the others
            failures.append(_failure(c, where, one_line(f"{type(exc).__name__}: {exc}")))
            _release(c)
    by_key = {c.key: c for c in active}

    def progress(key: Key, m: Measurement) -> None:
        last = m.window_medians[-1] if m.window_medians else float("nan")
        again = " (again)" if m.windows_before_remeasure is not None else ""
        ctx.report(
            f"benchmark {key[0]} ({key[1]}, {key[2]}) {shape.label()}{again}: window {len(m.window_medians)}, p50 {last:.3f} ms"
        )

    workloads = {c.key: functools.partial(c.timer.measure, c.runner) for c in active}
    if earlier is None:
        measured = measure_interleaved(workloads, policy, on_window=progress)
    else:
        measured = measure_more(workloads, earlier, policy, on_window=progress)
    for c in active:
        if c.memory is not None and measured[c.key].error is None:
            try:
                c.throughput = throughput(c.runner, shape.batch, ctx.recipe.benchmark.throughput_s)
            except Exception as exc:  # the latency row stands; the throughput run says why it has none
                c.throughput = {"error": one_line(f"{type(exc).__name__}: {exc}")}
    rows = []
    for key, m in measured.items():
        c = by_key[key]
        if m.error is not None:
            failures.append(_failure(c, where, one_line(m.error)))
        else:
            rows.append(_row(c, m, where, policy))
    for c in candidates:
        _release(c)
    _free_memory()
    return rows, failures, measured


def _release(c: Candidate) -> None:
    with contextlib.suppress(Exception):  # a runner that never activated holds nothing to release
        c.runner.deactivate()
    c.timer = None
    c.memory = c.throughput = None


def _free_memory() -> None:
    gc.collect()
    try:
        import torch
    except ImportError:
        return
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def one_line(message: str, limit: int = 400) -> str:
    """A reason fit for a report: the first line and, for tracebacks (TorchScript), the last one."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    text = lines[0] if len(lines) < 2 else f"{lines[0]} ... {lines[-1]}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _failure(c: Candidate, where: dict[str, Any], reason: str) -> dict[str, Any]:
    return {
        "artifact": c.runner.artifact,
        "runtime": c.runner.runtime,
        "io": c.runner.io,
        **where,
        "reason": reason,
    }


def _row(c: Candidate, m: Measurement, where: dict[str, Any], policy: WindowPolicy) -> dict[str, Any]:
    row = {
        "artifact": c.runner.artifact,
        "runtime": c.runner.runtime,
        "io": c.runner.io,
        "precision": c.precision,
        **where,
        **latency_stats(m.ms(), window_sizes=m.window_sizes),
        "stable": m.stable,
        "stop_reason": m.stop_reason,
        "windows": len(m.window_medians),
        "window_medians_ms": m.window_medians,
        "window_spread": m.window_spread(policy.stable_windows),
        "measured_s": m.elapsed_s,
        "warmup_iters": m.warmup_iters,
        "timer": c.timer.name if c.timer else None,
        **m.row_fields(),
        "cuda_graph": bool(getattr(c.runner, "cuda_graph", False)),
    }
    details = getattr(c.runner, "details", None)
    if details:
        row["runtime_details"] = dict(details)
    if c.memory is not None:
        row["peak_memory"] = c.memory
    if c.throughput is not None:
        row["throughput"] = c.throughput
    if isinstance(c.timer, CudaEventTimer) or on_gpu(c.runner):
        row["wall_p50_ms"] = float(np.median(m.wall_ms()))
    return row


# ---------------------------------------------------------------- conditions and flags


def _conditions(recipe: Recipe, policy: WindowPolicy, shapes: list[BenchShape]) -> dict[str, Any]:
    env = capture_environment()
    torch_info = env.get("torch") or {}
    return {
        "intra_op_threads": intra_op_threads(recipe),
        "inter_op_threads": 1,
        "device": {"cpu": env["cpu"], "gpu": env["gpu"]},
        "versions": {
            key: env[key]
            for key in ("python", "torch", "onnx", "onnxruntime", "polygraphy", "tensorrt", "numpy")
        },
        "policy": policy.describe(),
        "timer": {
            "cpu": "time.perf_counter around a call that has returned its outputs",
            "gpu": "CUDA events on the runtime's stream, after a synchronize",
        },
        "inputs": "the same batches for every candidate (validation split, fixed order), prepared once per shape",
        "shapes": [{"batch": s.batch, "sequence_length": s.sequence} for s in shapes],
        "sequence_lengths": recipe.benchmark.sequence_lengths,
        "reference": REFERENCE if recipe.benchmark.include_reference else None,
        "cuda_graphs": False,
        "onnxruntime_thread_spinning": False,
        "onnxruntime_cuda_tf32": False,
        "tf32": {k: torch_info[k] for k in ("tf32_matmul", "tf32_cudnn") if k in torch_info} or None,
        "measured_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "host": env["hostname"],
    }


def flags(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rule 8: INT8 rows not faster than FP16 (FP32 where no FP16 ran) at the same runtime, I/O and shape;
    host-bound GPU rows; rows that never stabilized."""
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


def _int8_flag(int8: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    for precision in ("fp16", "fp32"):
        peers = [r for r in rows if r.get("precision") == precision]
        if peers:
            break
    else:
        return None
    best = min(peers, key=lambda r: r["p50_ms"])
    if int8["p50_ms"] >= best["p50_ms"]:
        verdict = "slower"
    elif int8["p50_ci95_ms"][1] >= best["p50_ci95_ms"][0]:
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
