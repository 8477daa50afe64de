"""The requests a load run sends: the recipe's validation samples, one per request, at their own lengths, so the
load carries the data's real length distribution rather than one benchmark shape.

A batch of requests is what a serving batcher would hand the model: text padded to the longest request in it
(with the tokenizer's own pad values, on its padding side), other inputs only batched with requests of the same
shape (as Triton's dynamic batcher does without ragged batching)."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from pipeline.bench.load.buckets import ShapeBuckets
from pipeline.inputs.data import Dataset
from pipeline.runners.base import Feeds


@dataclass(frozen=True)
class RequestPool:
    samples: list[Feeds]  # one request each: batch axis of size 1
    pad: dict[str, int] | None  # text: each input's pad value (None: samples batch only with equal shapes)
    pad_left: bool = False

    @classmethod
    def from_dataset(cls, dataset: Dataset) -> RequestPool:
        samples = dataset.validation_feeds(batch=1)
        if not samples:
            raise ValueError("the recipe's validation split holds no samples to send as requests")
        pad = dataset.pad_values()
        side = getattr(dataset.tokenizer, "padding_side", "right") if pad is not None else "right"
        return cls(samples, pad, side == "left")

    def __len__(self) -> int:
        return len(self.samples)

    @property
    def batchable(self) -> bool:
        """Whether any requests can share a batch (text: padded to the longest); else `key` decides."""
        return self.pad is not None

    def key(self, index: int) -> Hashable:
        """Requests with the same key can share a batch: those of the same shapes."""
        return tuple((name, a.shape[1:]) for name, a in sorted(self.samples[index].items()))

    def collate(self, indices: Sequence[int], buckets: ShapeBuckets | None = None) -> Feeds:
        """One batch of these requests, in order (text padded to its longest request); with `buckets`, padded
        up to the nearest bucket shape (extra rows repeat the first request, and are not answered)."""
        if buckets is None:
            return self._batch([self.samples[i] for i in indices], len(indices), None)
        length = None
        if self.pad is not None and buckets.lengths is not None:
            length = buckets.length_for(max(self._length(self.samples[i]) for i in indices))
        return self._batch([self.samples[i] for i in indices], buckets.batch_for(len(indices)), length)

    def bucket_feeds(self, buckets: ShapeBuckets) -> list[Feeds]:
        """One batch at every shape a bucketed run can send: what a capture before the run needs. Text is
        padded to the bucket lengths (from the shortest request); requests that cannot be padded keep their own
        shapes, so every distinct request shape is sent at every bucket batch."""
        if self.pad is not None:
            shortest = min(self.samples, key=self._length)
            return [self._batch([shortest], batch, length) for batch, length in buckets.shapes()]
        firsts = {self.key(i): self.samples[i] for i in range(len(self.samples))}
        return [self._batch([sample], batch, None) for sample in firsts.values() for batch in buckets.batches]

    def longest(self) -> int | None:
        """The longest request's length (text), else None."""
        return max(self._length(s) for s in self.samples) if self.pad is not None else None

    @staticmethod
    def _length(sample: Feeds) -> int:
        return max((a.shape[1] for a in sample.values() if a.ndim > 1), default=1)

    def _batch(self, chosen: list[Feeds], batch: int, length: int | None) -> Feeds:
        """`chosen` as one batch of `batch` rows (the first repeated to fill it), text padded to `length`
        (default: its longest)."""
        chosen = chosen + [chosen[0]] * (batch - len(chosen))
        if self.pad is None:
            return {name: np.concatenate([s[name] for s in chosen]) for name in chosen[0]}
        longest = length or max(self._length(s) for s in chosen)
        out = {}
        for name in chosen[0]:
            value = self.pad.get(name, 0)
            rows = []
            for s in chosen:
                missing = longest - s[name].shape[1] if s[name].ndim > 1 else 0
                width = [(0, 0)] * s[name].ndim
                width[1] = (missing, 0) if self.pad_left else (0, missing)
                rows.append(np.pad(s[name], width, constant_values=value) if missing else s[name])
            out[name] = np.concatenate(rows)
        return out
