"""The CUDA-graph cache's lookups, structurally on the CPU (capture itself needs a GPU: tests/gpu runs it)."""

from __future__ import annotations

import torch

from pipeline.runners.cuda_graphs import Captured, GraphCache, signature


class _Graph:
    """Stands in for torch.cuda.CUDAGraph, which cannot be made without a GPU: counts replays."""

    def __init__(self) -> None:
        self.replays = 0

    def replay(self) -> None:
        self.replays += 1


def _cache_with_one_graph() -> tuple[GraphCache, _Graph, list[torch.Tensor]]:
    cache = GraphCache(lambda *t: t)
    graph, buffers = _Graph(), [torch.zeros(1, 8, dtype=torch.long), torch.ones(1, 8, dtype=torch.long)]
    cache.graphs[(signature(buffers), None)] = Captured(graph, buffers, [])
    return cache, graph, buffers


def test_replay_of_the_graphs_own_buffers_is_the_bare_replay() -> None:
    cache, graph, buffers = _cache_with_one_graph()
    assert cache.inputs_of([b.clone() for b in buffers]) is buffers
    replay = cache.replay_of(buffers)
    assert replay is not None
    replay()
    assert graph.replays == 1


def test_no_bare_replay_for_other_tensors_or_shapes() -> None:
    cache, _, buffers = _cache_with_one_graph()
    assert cache.replay_of([buffers[0].clone(), buffers[1]]) is None  # same shape, not the buffers: copies
    assert cache.replay_of([torch.zeros(2, 8, dtype=torch.long)] * 2) is None  # never captured


def test_a_call_with_other_tensors_copies_them_in_before_the_replay() -> None:
    cache, graph, buffers = _cache_with_one_graph()
    new = [torch.full((1, 8), 7, dtype=torch.long), torch.full((1, 8), 9, dtype=torch.long)]
    cache(new)
    assert graph.replays == 1 and [int(b[0, 0]) for b in buffers] == [7, 9]


def test_a_plan_keys_a_graph_of_its_own() -> None:
    """A padding-aware call is captured per plan: same input shapes, another plan, another graph; the bare
    replay of the unplanned graph never stands in for it."""
    cache, graph, buffers = _cache_with_one_graph()
    planned = _Graph()
    cache.graphs[(signature(buffers), ((1, 8),))] = Captured(planned, [b.clone() for b in buffers], [])
    cache(buffers, ((1, 8),))
    assert (planned.replays, graph.replays) == (1, 0)
    cache(buffers)
    assert (planned.replays, graph.replays) == (1, 1)
