"""Explicit CUDA-graph capture of a torch callable, one graph per input-shape signature (and plan).

At batch 1 a transformer is bound by kernel launches: replaying one captured graph removes the per-kernel
host cost. A graph is captured the first time a signature is seen (the runners do that in prepare(), outside
the timed windows): two warm-up calls on a side stream, then capture into the graph's own memory pool. The
graph owns its input buffers (contiguous copies made at capture); a replay copies new inputs into them (any
strides; skipped when the caller passes those very buffers, see `inputs_of`) and leaves the results in the
captured output buffers, which the next replay overwrites: callers copy out what they keep. AOTInductor
packages must be loaded with `run_single_threaded=True` to be capturable.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

Signature = tuple[tuple[tuple[int, ...], Any], ...]


def signature(tensors: Sequence[Any]) -> Signature:
    """What a captured graph is keyed by: the inputs' shapes and dtypes."""
    return tuple((tuple(t.shape), t.dtype) for t in tensors)


@dataclass
class Captured:
    graph: Any  # torch.cuda.CUDAGraph
    inputs: list[Any]
    outputs: list[Any]


class GraphCache:
    """Captured graphs by input signature (shapes and dtypes); the least recently used beyond `limit` go."""

    def __init__(self, fn: Callable[..., Sequence[Any]], limit: int = 32):
        self.fn, self.limit = fn, limit
        self.graphs: OrderedDict[tuple[Signature, Hashable], Captured] = OrderedDict()
        self.captures = 0

    def __call__(
        self, tensors: Sequence[Any], extra: Hashable = None, fn: Callable[..., Any] | None = None
    ) -> list[Any]:
        """Replay (capturing first if new) the graph of these inputs; `extra` adds to the key what else the
        captured work depends on, and `fn` is the work to capture when it is not the cache's own `fn` (a whole
        padding-aware call for one plan of groups)."""
        key = (signature(tensors), extra)
        entry = self.graphs.get(key)
        if entry is None:
            entry = self._capture(list(tensors), fn or self.fn)
            self.graphs[key] = entry
            while len(self.graphs) > self.limit:
                self.graphs.popitem(last=False)
        else:
            self.graphs.move_to_end(key)
            for dst, src in zip(entry.inputs, tensors, strict=True):
                if dst.data_ptr() != src.data_ptr():
                    dst.copy_(src)
        entry.graph.replay()
        return entry.outputs

    def inputs_of(self, tensors: Sequence[Any]) -> list[Any] | None:
        """The captured input buffers for this signature: a caller that keeps its inputs there replays with
        no copies."""
        entry = self.graphs.get((signature(tensors), None))
        return entry.inputs if entry is not None else None

    def replay_of(self, tensors: Sequence[Any]) -> Callable[[], None] | None:
        """The bare replay of the graph whose input buffers these very tensors are (see `inputs_of`), else
        None. At batch 1 the host time between the caller's start and the graph launch is part of the
        latency: a caller that keeps its inputs in the buffers needs no key, no lookup, no copy checks."""
        entry = self.graphs.get((signature(tensors), None))
        if entry is None or any(a is not b for a, b in zip(entry.inputs, tensors, strict=True)):
            return None
        return entry.graph.replay

    def _capture(self, tensors: list[Any], fn: Callable[..., Any]) -> Captured:
        import torch

        tensors = [t.clone(memory_format=torch.contiguous_format) for t in tensors]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                fn(*tensors)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outputs = _flatten(fn(*tensors))
        self.captures += 1
        return Captured(graph, tensors, outputs)

    def clear(self) -> None:
        self.graphs.clear()


def _flatten(result: Any) -> list[Any]:
    import torch

    if isinstance(result, torch.Tensor):
        return [result]
    return list(result)
