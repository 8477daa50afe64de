"""A dynamic batcher in front of one runner, as a server puts one in front of a model: requests queue as they
arrive; one worker takes the oldest, waits at most `max_delay_s` from its arrival for more that can share its batch
(up to `max_batch`), runs the batch and answers every request in it. A request's latency is then what a client
sees: queueing, the wait for a fuller batch, padding, the host-to-device and device-to-host copies of the runner's
host I/O, and the inference.

Every request is answered, whatever happens: a batch whose inference raises is answered too and the first error
is kept, so the load generator waiting on it never hangs on the model's failure."""

from __future__ import annotations

import collections
import itertools
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

from pipeline.bench.load.serving_thread import ServingThread
from pipeline.runners.base import Feeds

Answer = Callable[[Sequence[int]], None]  # the query ids of one finished batch


@dataclass(frozen=True)
class Request:
    query: int  # the load generator's id, answered when the batch holding it is done
    sample: int  # which request of the pool
    arrived: float  # time.monotonic() at arrival


class DynamicBatcher:
    def __init__(
        self,
        infer: Callable[[Feeds], object],
        collate: Callable[[Sequence[int]], Feeds],
        key: Callable[[int], Hashable] | None,
        answer: Answer,
        max_batch: int,
        max_delay_s: float,
        thread: ServingThread | None = None,
    ):
        """`thread`: the candidate's serving thread, which runs this batcher's loop (else a thread of its own)."""
        self._infer, self._collate, self._key, self._answer = infer, collate, key, answer
        self.max_batch, self.max_delay_s = max_batch, max_delay_s
        self._queue: collections.deque[Request] = collections.deque()
        self._ready = threading.Condition()
        self._stopping = False
        self.batches = 0
        self.requests = 0
        self.error: str | None = None
        self._waited_s = 0.0  # summed per request: arrival to the start of its batch's call
        self._runner_s = 0.0  # summed per request: its batch's collate and call (a batch of n counts n times)
        self._done = threading.Event()
        if thread is None:
            threading.Thread(target=self._serve, name="batcher", daemon=True).start()
        else:
            thread.start(self._serve)

    def submit(self, requests: Sequence[tuple[int, int]]) -> None:
        """(query id, sample) pairs arriving now."""
        now = time.monotonic()
        with self._ready:
            self._queue.extend(Request(query, sample, now) for query, sample in requests)
            self._ready.notify()

    def close(self, timeout_s: float = 30.0) -> None:
        """Stop after answering what is queued; the worker is a daemon, so a runner stuck in a call never
        holds up the process past `timeout_s`."""
        with self._ready:
            self._stopping = True
            self._ready.notify()
        self._done.wait(timeout_s)

    @property
    def mean_batch(self) -> float | None:
        return self.requests / self.batches if self.batches else None

    @property
    def time_split(self) -> dict[str, float] | None:
        """Where a request's time went, in mean ms per request: waiting in the queue (the batch wait included)
        and in its batch's collate and call; the same steps a Triton run's counters name, so that the two read
        side by side."""
        if not self.requests:
            return None
        return {
            "requests": self.requests,
            "mean_batch": round(self.requests / self.batches, 2),
            "queue_ms": round(self._waited_s / self.requests * 1000, 3),
            "runner_ms": round(self._runner_s / self.requests * 1000, 3),
        }

    def _serve(self) -> None:
        try:
            self._serve_batches()
        finally:
            self._done.set()

    def _serve_batches(self) -> None:
        while True:
            batch = self._next_batch()
            if batch is None:
                return
            started = time.monotonic()
            try:
                if self.error is None:
                    self._infer(self._collate([r.sample for r in batch]))
            except Exception as exc:  # answered below all the same; the run reports the first error
                self.error = (
                    f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
                )
            finally:
                self.batches += 1
                self.requests += len(batch)
                self._waited_s += sum(started - r.arrived for r in batch)
                self._runner_s += (time.monotonic() - started) * len(batch)
                self._answer([r.query for r in batch])

    def _next_batch(self) -> list[Request] | None:
        """The oldest request and those queued behind it that share its key, once the batch is full or the
        oldest has waited `max_delay_s`; None when closed and drained."""
        with self._ready:
            while not self._queue:
                if self._stopping:
                    return None
                self._ready.wait()
            first = self._queue[0]
            deadline = first.arrived + self.max_delay_s
            while len(self._fitting(first)) < self.max_batch and not self._stopping:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._ready.wait(left)
            batch = self._fitting(first)[: self.max_batch]
            if self._key is None:  # the batch is the head of the queue
                for _ in batch:
                    self._queue.popleft()
            else:
                for request in batch:
                    self._queue.remove(request)
            return batch

    def _fitting(self, first: Request) -> list[Request]:
        """Queued requests that can share the first one's batch (key None: every request can)."""
        if self._key is None:
            return list(itertools.islice(self._queue, self.max_batch))
        key = self._key(first.sample)
        return [r for r in self._queue if r is first or self._key(r.sample) == key]
