"""The few request shapes a CUDA-graph runtime serves under load, as a server with captured graphs serves them
(Triton's TensorRT backend and vLLM pad to captured batch sizes the same way).

A graph replays one shape. Requests arrive at every batch size and length, so a batch of requests is padded up
to the nearest bucket: its batch to a power of two (or the batcher's largest batch), its length (text) to a
power-of-two multiple of the padding step (or the longest length the model takes). Every bucket is captured
before the first LoadGen run, so no request waits for a capture; the padding's cost is part of the latency
LoadGen measures, as it is in a real server."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ShapeBuckets:
    batches: tuple[int, ...]  # ascending; the last is the batcher's largest batch
    lengths: tuple[int, ...] | None  # ascending; None: the requests have no sequence axis to pad

    @classmethod
    def powers(
        cls, max_batch: int, longest: int | None, step: int, shortest: int = 1, limit: int | None = None
    ) -> ShapeBuckets:
        """Powers of two up to `max_batch`; for text, `step` times powers of two from the model's `shortest`
        length up to `longest` (the longest request, within what the model takes)."""
        batches = _doubling(1, max_batch)
        if longest is None:
            return cls(batches, None)
        first = max(step, shortest)
        lengths = _doubling(first, max(first, longest) if limit is None else min(max(first, longest), limit))
        return cls(batches, lengths)

    def __len__(self) -> int:
        return len(self.batches) * (len(self.lengths) if self.lengths else 1)

    def batch_for(self, size: int) -> int:
        """The smallest bucket holding `size` requests."""
        return _ceil_in(self.batches, size, "batch")

    def length_for(self, length: int) -> int:
        """The smallest bucket length holding a request of `length` tokens."""
        assert self.lengths is not None
        return _ceil_in(self.lengths, length, "length")

    def shapes(self) -> list[tuple[int, int | None]]:
        """Every (batch, length) a run can send, for capture before it."""
        return [(b, length) for b in self.batches for length in (self.lengths or (None,))]

    def describe(self) -> dict[str, list[int] | None]:
        return {"batches": list(self.batches), "lengths": list(self.lengths) if self.lengths else None}


def _doubling(first: int, last: int) -> tuple[int, ...]:
    values = []
    value = first
    while value < last:
        values.append(value)
        value *= 2
    values.append(last)
    return tuple(values)


def _ceil_in(values: tuple[int, ...], wanted: int, what: str) -> int:
    for value in values:
        if value >= wanted:
            return value
    raise ValueError(f"a {what} of {wanted} is beyond the largest bucket ({values[-1]})")
