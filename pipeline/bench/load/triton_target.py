"""Requests sent to a running Triton server over gRPC, as a client sends them: each LoadGen query is one request,
answered when the server's reply arrives. Triton's own dynamic batcher batches them (only requests of the same
shape: it does not pad), so the latency LoadGen measures holds the client, the network stack, Triton's queue and
batcher, the Python backend's hand-off and the runner. Triton's own counters, read before and after the run, say
which of those the time went to."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from typing import Any

from pipeline.bench.load.requests import RequestPool
from pipeline.bench.load.triton_counters import time_split


class TritonTarget:
    def __init__(
        self,
        url: str,
        model: str,
        counters: Callable[[], dict[str, float]],
        pool: RequestPool,
        answer: Callable[[Sequence[int]], None],
    ):
        """`counters`: Triton's counters for the model now (the server's Running.counters)."""
        import tritonclient.grpc as grpc
        from tritonclient.utils import np_to_triton_dtype

        self._counters = counters
        self._client = grpc.InferenceServerClient(url)
        self._model, self._answer = model, answer
        self._inputs = []  # one request per sample, made once: the run times serving, not request building
        for sample in pool.samples:
            request = []
            for name, array in sample.items():
                tensor = grpc.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
                tensor.set_data_from_numpy(array)
                request.append(tensor)
            self._inputs.append(request)
        self._outstanding = 0
        self._idle = threading.Condition()
        self.requests = 0
        self.error: str | None = None
        # set on close: where the run's requests spent their time
        self.time_split: dict[str, float] | None = None
        self._before = counters()

    @property
    def mean_batch(self) -> float | None:
        """The batch Triton's batcher ran on average (its metrics endpoint counts batches)."""
        return (self.time_split or {}).get("mean_batch")

    def submit(self, requests: Sequence[tuple[int, int]]) -> None:
        for query, sample in requests:
            with self._idle:
                self._outstanding += 1
            try:
                done = functools.partial(self._done, query)
                self._client.async_infer(self._model, self._inputs[sample], done)
            except Exception as exc:  # never sent: answered now, and the run reports why
                self._done(query, None, exc)

    def close(self, timeout_s: float = 30.0) -> None:
        """Wait for every reply (at most `timeout_s`), then close the connection."""
        with self._idle:
            self._idle.wait_for(lambda: self._outstanding == 0, timeout=timeout_s)
        self._client.close()
        self.time_split = time_split(self._before, self._counters())

    def _done(self, query: int, result: Any, error: Any) -> None:
        if error is not None and self.error is None:
            self.error = f"Triton answered with an error: {str(error).strip().splitlines()[0]}"
        self._answer([query])
        with self._idle:
            self._outstanding -= 1
            self.requests += 1
            self._idle.notify_all()
