"""A short profile of one timed row, taken after its windows (never inside them): how many kernels one call
launches, which kernels take the time, how the call's wall time splits across GEMMs, attention, elementwise
work, copies and idle time (on a GPU the gaps between kernels, on a CPU the time no operator works), and so whether the row is launch-, compute- or memory-bound. A latency table says
which row wins; this says why, which is what decides the next optimization.

On a GPU, the PyTorch profiler: it records every CUDA kernel of the process through CUPTI, whichever
library launched it (PyTorch, ONNX Runtime's CUDA provider, a CUDA-graph replay). On a CPU, PyTorch's
operators through the same profiler, and ONNX Runtime's nodes through its own (Runner.own_profile); another
CPU runtime's row says it was not profiled instead of inventing a profile."""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import tempfile
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.runners.base import Runner

CALL = "pipeline::profiled_call"
ONNXRUNTIME_TOOL = (
    "ONNX Runtime's profiler: operators (nodes) on the CPU, in a twin session of the same graph"
)
TARGET_S = 0.2  # profiled calls fill about this long (at least MIN_CALLS, at most MAX_CALLS)
MIN_CALLS, MAX_CALLS = 3, 20
TOP = 5
IDLE_BOUND = 0.5  # the device idle for half the call or more: launches, not work, set the pace
SEEN_SHARE = 0.1  # a CPU row whose PyTorch operators cover less of its call is not profiled by them
CATEGORIES = ("gemm", "attention", "elementwise", "copies")
# A CPU operator that only describes tensors (views, empties) or the interpreter's own frame does no work: its
# time is overhead and counts as idle.
OVERHEAD = re.compile(
    r"^(?!aten::|onnx::)|onnx::(Reshape|Shape|Unsqueeze|Squeeze|Flatten|Identity|Constant\w*)$|::(view|_?reshape\w*|expand|t|transpose|as_strided|slice|select|unsqueeze|squeeze|permute|"
    r"resolve_conj|resolve_neg|detach|alias|empty\w*|lift_fresh|unbind|split|chunk|narrow|size|dim)$"
)
# Checked in this order: an attention kernel's name often holds "gemm" or "cutlass" too.
PATTERNS = (
    ("attention", re.compile(r"flash|fmha|attention|attn|\bmha|sdpa|softmax", re.I)),
    (
        "gemm",
        re.compile(
            r"gemm|cutlass|xmma|nvjet|cublas|matmul|::mm\b|::bmm\b|addmm|aten::linear|conv|cudnn|winograd|fprop",
            re.I,
        ),
    ),
    (
        "copies",
        re.compile(
            r"memcpy|memset|::copy_|::to\b|::_to_copy|contiguous|::clone|"
            r"onnx::(Transpose|Cast|Concat|Split|Slice|Gather\w*|Expand|Tile|Pad)$",
            re.I,
        ),
    ),
)


@dataclass
class Interval:
    name: str
    start: float  # µs, the trace's clock
    end: float
    tid: Any = None
    children: list[Interval] = field(default_factory=list)

    @property
    def length(self) -> float:
        return self.end - self.start


def category(name: str, on_gpu: bool = True) -> str:
    """GEMM (convolutions too), attention, copies, else elementwise: a kernel or operator by its name; on the
    CPU, an operator that does no work is overhead."""
    if not on_gpu and OVERHEAD.search(name):
        return "overhead"
    for label, pattern in PATTERNS:
        if pattern.search(name):
            return label
    return "elementwise"


def short_name(name: str, limit: int = 72) -> str:
    """A kernel's name without its return type, template arguments and parameters."""
    text = name.removeprefix("void ").strip()
    cut = min((i for i in (text.find("<"), text.find("(")) if i > 0), default=len(text))
    text = text[:cut]
    return text if len(text) <= limit else text[: limit - 1] + "…"


def profile_row(runner: Runner, p50_ms: float | None, on_gpu: bool) -> dict[str, Any]:
    """The row's profile (see the module docstring), or {"unavailable": why}. The runner is active with its
    inputs prepared; one unprofiled call first, so that the profiler's start-up is not in the profile."""
    calls = _calls(p50_ms)
    if not on_gpu:
        own = runner.own_profile(calls)
        if own is not None:
            per_call = [(_by_name([(f"onnx::{op}", spent) for op, spent in ops]), len(ops)) for _, ops in own]
            walls = [wall for wall, _ in own]
            return _summary(per_call, walls, ONNXRUNTIME_TOOL, "operators", on_gpu, p50_ms)
    try:
        from torch.profiler import ProfilerActivity, profile, record_function
    except ImportError:
        return {"unavailable": "the PyTorch profiler is not installed"}
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    runner.infer_prepared()
    runner.synchronize()
    with tempfile.TemporaryDirectory(prefix="pipeline-profile-") as folder:
        trace = Path(folder) / "trace.json"
        with _quiet_stderr(), profile(activities=activities) as prof:
            for _ in range(calls):
                with record_function(CALL):
                    runner.infer_prepared()
                    runner.synchronize()
        with _quiet_stderr():
            prof.export_chrome_trace(str(trace))
        events = json.loads(trace.read_text())
    events = events.get("traceEvents", []) if isinstance(events, dict) else events
    return summarize(events, on_gpu, p50_ms)


def summarize(events: list[dict[str, Any]], on_gpu: bool, p50_ms: float | None = None) -> dict[str, Any]:
    """A profile from a Chrome trace of profiled calls (each a CALL annotation on the CPU; Kineto mirrors it
    on the GPU's timeline as a gpu_user_annotation, which is not a call of its own)."""
    windows = sorted(
        (
            _interval(e)
            for e in events
            if e.get("name") == CALL and e.get("ph") == "X" and e.get("cat") == "user_annotation"
        ),
        key=lambda w: w.start,
    )
    if not windows:
        return {"unavailable": "the profiler recorded no call"}
    if on_gpu:
        work = [_interval(e) for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
        per_call = [_busy_by_kernel([k for k in work if _inside(k, w)], w) for w in windows]
        tool, unit = "torch.profiler: CUDA kernels (CUPTI), every library in the process", "kernels"
    else:
        ops = [_interval(e) for e in events if e.get("cat") == "cpu_op"]
        per_call = [_self_time_by_op([o for o in ops if _inside(o, w) and o.tid == w.tid]) for w in windows]
        tool, unit = "torch.profiler: PyTorch operators on the CPU (self time)", "operators"
    return _summary(per_call, [w.length for w in windows], tool, unit, on_gpu, p50_ms)


Spent = dict[str, tuple[float, int]]  # name -> (µs, calls)


def _summary(
    per_call: list[tuple[Spent, int]],
    walls: list[float],
    tool: str,
    unit: str,
    on_gpu: bool,
    p50_ms: float | None = None,
) -> dict[str, Any]:
    """Per call: the time and count of each kernel or operator, the count of those doing work, and the call's
    wall time (µs). The split is over the profiled calls themselves, so that work and gaps are measured under
    the same conditions; the profiler's own cost per operator lands in the gaps, so idle is overstated most
    for many small operators (the sign-off says so). `p50_ms`, the row's timed median, is kept beside it."""
    launched = sum(n for _, n in per_call)
    wall = sum(walls)
    if launched == 0 or wall <= 0:
        seen = (
            "no CUDA kernel"
            if on_gpu
            else ("no operator" if tool == ONNXRUNTIME_TOOL else "no PyTorch operator")
        )
        return {"unavailable": f"the profiler saw {seen} in this runtime's calls"}
    by_name: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for times, _ in per_call:
        for name, (spent, count) in times.items():
            by_name[name][0] += spent
            by_name[name][1] += count
    working = {n: v for n, v in by_name.items() if category(n, on_gpu) != "overhead"}
    busy = sum(spent for spent, _ in working.values())
    if not on_gpu and tool != ONNXRUNTIME_TOOL and busy < SEEN_SHARE * wall:
        return {
            "unavailable": "the PyTorch profiler saw operators for under "
            f"{SEEN_SHARE:.0%} of this runtime's calls (compiled kernels run outside its operators)"
        }
    split = {label: 0.0 for label in CATEGORIES}
    for name, (spent, _) in working.items():
        split[category(name, on_gpu)] += spent / wall
    split["idle"] = max(0.0, 1.0 - busy / wall)
    top = sorted(working.items(), key=lambda item: item[1][0], reverse=True)[:TOP]
    return {
        "tool": tool,
        "calls": len(walls),
        "call_ms": round(wall / len(walls) / 1000, 4),
        "timed_p50_ms": round(p50_ms, 4) if p50_ms and math.isfinite(p50_ms) else None,
        f"{unit}_per_call": round(launched / len(walls), 1),
        "split": {k: round(v, 4) for k, v in split.items()},
        "top": [
            {
                "name": short_name(name),
                "category": category(name, on_gpu),
                "share_of_busy": round(spent / busy, 4) if busy else 0.0,
                "per_call": round(count / len(walls), 2),
            }
            for name, (spent, count) in top
        ],
        "bound": bound(split, on_gpu),
    }


def _by_name(spans: list[tuple[str, float]]) -> Spent:
    out: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for name, spent in spans:
        out[name][0] += spent
        out[name][1] += 1
    return {name: (spent, int(count)) for name, (spent, count) in out.items()}


def bound(split: dict[str, float], on_gpu: bool) -> str:
    """Launch-bound (on a CPU: overhead-bound) when the device idles half the call or more; else compute-bound
    when GEMMs and attention take half the busy time or more; else memory-bound (elementwise work and copies
    move bytes more than they compute). A heuristic from the time split, not a roofline."""
    if split["idle"] >= IDLE_BOUND:
        return "launch-bound" if on_gpu else "overhead-bound"
    busy = 1.0 - split["idle"]
    return "compute-bound" if split["gemm"] + split["attention"] >= 0.5 * busy else "memory-bound"


def _calls(p50_ms: float | None) -> int:
    if not p50_ms or not math.isfinite(p50_ms) or p50_ms <= 0:
        return MIN_CALLS
    return max(MIN_CALLS, min(MAX_CALLS, int(TARGET_S * 1000 / p50_ms)))


def _interval(event: dict[str, Any]) -> Interval:
    start = float(event.get("ts", 0.0))
    return Interval(
        str(event.get("name", "?")), start, start + float(event.get("dur", 0.0)), event.get("tid")
    )


def _inside(item: Interval, window: Interval) -> bool:
    return item.start >= window.start and item.end <= window.end


def _busy_by_kernel(kernels: list[Interval], window: Interval) -> tuple[Spent, int]:
    """Each kernel name's share of the union of busy time (kernels on several streams overlap: the overlap
    is shared out in proportion), and the count."""
    if not kernels:
        return {}, 0
    union, edge = 0.0, window.start
    for k in sorted(kernels, key=lambda k: k.start):
        if k.end > edge:
            union += k.end - max(k.start, edge)
            edge = k.end
    total = sum(k.length for k in kernels) or 1.0
    return _by_name([(k.name, k.length * union / total) for k in kernels]), len(kernels)


def _self_time_by_op(ops: list[Interval]) -> tuple[Spent, int]:
    """Each operator's self time (its time less its children's), so nested operators count once, and its
    calls; the total counts the leaf operators that do work."""
    roots: list[Interval] = []
    stack: list[Interval] = []
    for op in sorted(ops, key=lambda o: (o.start, -o.end)):
        while stack and op.start >= stack[-1].end:
            stack.pop()
        (stack[-1].children if stack else roots).append(op)
        stack.append(op)
    spans: list[tuple[str, float]] = []
    leaves = 0

    def visit(op: Interval) -> None:
        nonlocal leaves
        spans.append((op.name, max(0.0, op.length - sum(c.length for c in op.children))))
        leaves += not op.children and category(op.name, on_gpu=False) != "overhead"
        for child in op.children:
            visit(child)

    for root in roots:
        visit(root)
    return _by_name(spans), leaves


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Kineto writes a line to the process's stderr at each start and stop; a deploy's progress stays
    readable without them. Python's own errors are exceptions, unaffected."""
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
