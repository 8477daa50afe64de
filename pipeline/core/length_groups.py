"""Length groups: a padded batch's rows cut into a few groups of similar real length, each run (or laid out) at
its longest member's length. Padding-aware runs (pipeline/runners/bucketing.py) call the model once per group;
packed graphs (pipeline/core/packing.py) give attention one grid per group."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Group:
    index: np.ndarray  # rows of the batch, in batch order
    length: int  # the sequence length this group runs at


def plan_groups(
    lengths: np.ndarray, full: int, multiple: int, max_groups: int, overhead: int, min_length: int = 1
) -> list[Group]:
    """Groups covering every row once, each run at its longest rounded real length (never above `full`,
    never below `min_length`), minimizing sum(rows x length) + overhead per group."""
    lengths = np.asarray(lengths, dtype=np.int64)
    rounded = np.clip(-(-np.maximum(lengths, 1) // multiple) * multiple, max(min_length, 1), full)
    if rounded.min() == rounded.max():  # one length (always so at batch 1): nothing to plan
        return [Group(np.arange(len(rounded)), int(rounded.max()))]
    values, counts = np.unique(rounded, return_counts=True)
    m = len(values)
    k_max = min(max_groups, m)
    prefix = np.concatenate([[0], np.cumsum(counts)]).astype(np.float64)
    value = values.astype(np.float64)
    # best[k][j]: cheapest cover of values[0..j] with k+1 groups, the last ending at j; cut[k][j]: its start.
    # One matrix per k, [start i, end j], vectorized: a Python loop over m^2 pairs cost milliseconds a batch.
    starts, ends = np.arange(m)[:, None], np.arange(m)[None, :]
    span = (prefix[1:][None, :] - prefix[:-1][:, None]) * value[None, :] + overhead  # the group values[i..j]
    best = np.full((k_max, m), np.inf)
    cut = np.zeros((k_max, m), dtype=np.int64)
    best[0] = overhead + prefix[1:] * value
    for k in range(1, k_max):
        before = np.concatenate([[np.inf], best[k - 1][:-1]])[:, None]  # best[k-1][i-1], none before i = 0
        total = np.where((starts >= k) & (starts <= ends), before + span, np.inf)
        cut[k] = np.argmin(total, axis=0)
        best[k] = total[cut[k], np.arange(m)]
    k = int(np.argmin(best[:, m - 1]))
    bounds, j = [], m - 1
    while k >= 0:
        i = int(cut[k][j]) if k else 0
        bounds.append((i, j))
        j, k = i - 1, k - 1
    groups = []
    for i, j in reversed(bounds):
        rows = np.flatnonzero((rounded >= values[i]) & (rounded <= values[j]))
        groups.append(Group(rows, int(values[j])))
    return groups
