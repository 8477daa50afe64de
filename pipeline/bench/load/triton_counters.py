"""Triton's own accounting of a run: its per-model counters (the Prometheus metrics endpoint; PyTriton keeps the
statistics API closed), read before and after the run, and the runner's own time inside the server, so that a
served figure far from the in-process one says which step of the serving path took the difference."""

from __future__ import annotations

import contextlib
import threading


class RunnerClock:
    """The time the runner itself took inside the server, weighted per request (a batch of n requests counts n
    times its call, as Triton counts a batch's compute time once per request in it): what is left of Triton's
    compute time is the Python backend's hand-off to this process and back."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.rows = 0
        self.row_seconds = 0.0

    def add(self, rows: int, seconds: float) -> None:
        with self._lock:
            self.rows += rows
            self.row_seconds += rows * seconds


# Triton's per-model counters (its Prometheus metrics endpoint; PyTriton keeps the statistics API closed):
# requests answered, batches run, and the microseconds every request spent in each step, summed
COUNTERS = (
    "request_success",
    "exec_count",
    "request_duration_us",
    "queue_duration_us",
    "compute_input_duration_us",
    "compute_infer_duration_us",
    "compute_output_duration_us",
)


def reading(text: str, model: str, clock: RunnerClock) -> dict[str, float]:
    """One reading for time_split: the model's counters in the metrics endpoint's `text`, and the runner's own
    time so far ({} when the endpoint names none of the model's counters)."""
    found = metric_values(text, model)
    if not found:
        return {}
    return {**found, "runner_rows": clock.rows, "runner_row_s": clock.row_seconds}


def metric_values(text: str, model: str) -> dict[str, float]:
    """The COUNTERS of one model in Prometheus' text format (`nv_inference_queue_duration_us{model="m",…} 12`)."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("nv_inference_") or f'model="{model}"' not in line:
            continue
        name, _, value = line.partition("{")
        key = name[len("nv_inference_") :]
        if key in COUNTERS:
            with contextlib.suppress(ValueError):
                found[key] = found.get(key, 0.0) + float(value.rsplit(" ", 1)[-1])
    return found


def time_split(before: dict[str, float], after: dict[str, float]) -> dict[str, float] | None:
    """Where a request's time went between two readings of the counters, in mean ms per request: Triton's
    queue (the batcher's wait included), its input and output copies, the compute step (the Python backend's
    hand-off and the runner), the runner's own call, and the whole request inside the server; with the mean
    batch Triton ran. None when no request was answered in between, or the counters could not be read."""
    if not before or not after:
        return None
    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in (*COUNTERS, "runner_rows", "runner_row_s")}
    requests = delta["request_success"]
    if requests <= 0:
        return None

    def per_request(key: str) -> float:
        return round(delta[key] / requests / 1000, 3)

    runner_ms = delta["runner_row_s"] * 1000 / delta["runner_rows"] if delta["runner_rows"] > 0 else None
    return {
        "requests": int(requests),
        "mean_batch": round(requests / delta["exec_count"], 2) if delta["exec_count"] > 0 else None,
        "queue_ms": per_request("queue_duration_us"),
        "compute_input_ms": per_request("compute_input_duration_us"),
        "compute_infer_ms": per_request("compute_infer_duration_us"),
        "compute_output_ms": per_request("compute_output_duration_us"),
        "runner_ms": None if runner_ms is None else round(runner_ms, 3),
        "server_ms": per_request("request_duration_us"),
    }
