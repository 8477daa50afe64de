"""Packed tokens: a padded text batch as one row of its real tokens, for a graph exported to run that way.

Real text traffic is short sentences padded to a fixed length, so most of a padded batch is padding. A packed
graph (pipeline/inputs/packed_model.py) runs its projections and feed-forward layers on the real tokens
only, `[1, tokens]`, and its attention per sentence, so it computes what the padded model computes on every
real token and on the mask-pooled outputs. This module turns the recipe's padded feeds into the packed
graph's feeds; it is the one place that layout is defined, for the runners and for the export that checks it.

Attention needs each sentence's tokens side by side, so the packed graph lays them out in grids of
`[sentences, length]`, one grid per group of similar lengths (the groups of padding-aware runs,
pipeline/core/length_groups.py): one grid at the longest sentence would cost attention at that
length for every sentence. A graph has a fixed number of grid inputs; unused ones hold one empty slot.

The packed feeds are the recipe's inputs (those with a sequence axis cut to `[1, tokens]`, the mask and the
rest as they are) plus:
- `pack_positions` `[1, tokens]`: each token's position id in its padded row (its column; for models that
  count positions from a padding index, `offset` + its rank among the row's real tokens);
- `pack_layout` `[batch, sequence]`: each padded slot's packed token, or `tokens` (a zero row) for padding;
- `pack_grid_<g>` `[sentences, length]`: group g's sentences, each its packed tokens, then `tokens`;
- `pack_tokens` `[tokens]`: each packed token's place in the grids laid end to end, flattened.

A row without a real token keeps its first position, so that every row has a token and no softmax is empty;
the mask the graph pools with is the caller's, so the pooled value of that row is what the padded model gives.

A graph whose attention is a variable-length kernel (`attention: varlen`, FlashAttention's varlen form on a GPU)
needs no grids: it reads each sentence's span from `pack_cu` `[batch + 2]` (int32), the running count of tokens
at each sentence's start, then the row's end. The row is padded with filler tokens up to a multiple of `bucket`,
which form one last sentence of their own (no real token attends to them, nor they to one): a CUDA graph
captured for one batch shape and row length then serves every batch of that shape whose real tokens round to
it. `pack_layout` points padded slots past the filler, to the zero row.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.core.length_groups import plan_groups

FLASH_VARLEN = "FlashAttention varlen (CUDA)"  # a packed program's attention, when traced for a CUDA device


def grid_names(groups: int) -> list[str]:
    return [f"pack_grid_{g}" for g in range(groups)]


@dataclass(frozen=True)
class Packing:
    """How one packed graph takes a batch: `mask` names the mask input, `per_token` the inputs with a sequence
    axis (packed), `positions` the position rule (`column`, or `offset` for a padding-index count from
    `offset`); `position_input` is a recipe input that already holds position ids (packed like the others);
    `groups` grids for attention, planned with `overhead` tokens as the cost of one more grid."""

    mask: str
    per_token: tuple[str, ...]
    positions: str = "column"
    offset: int = 0
    position_input: str | None = None
    groups: int = 4
    overhead: int = 512
    attention: str = "grids"  # grids | varlen (see the module docstring)
    bucket: int = 64  # varlen: the packed row's length rounds up to a multiple of this
    longest: int = 0  # varlen: the longest sentence the graph takes (the kernel's bound on a span)

    def extra_inputs(self) -> list[str]:
        """The graph's inputs after the recipe's, in order."""
        positions = [] if self.position_input else ["pack_positions"]
        if self.attention == "varlen":
            return [*positions, "pack_layout", "pack_cu"]
        return [*positions, "pack_layout", "pack_tokens", *grid_names(self.groups)]

    def to_json(self) -> dict[str, object]:
        return {
            "mask": self.mask,
            "per_token": list(self.per_token),
            "positions": self.positions,
            "offset": self.offset,
            "position_input": self.position_input,
            "groups": self.groups,
            "overhead": self.overhead,
            "attention": self.attention,
            "bucket": self.bucket,
            "longest": self.longest,
        }

    @classmethod
    def from_json(cls, data: dict[str, object]) -> Packing:
        return cls(
            mask=str(data["mask"]),
            per_token=tuple(str(n) for n in data["per_token"]),  # type: ignore[attr-defined]
            positions=str(data.get("positions", "column")),
            offset=int(data.get("offset", 0)),  # type: ignore[arg-type]
            position_input=data.get("position_input"),  # type: ignore[arg-type]
            groups=int(data.get("groups", 1)),  # type: ignore[arg-type]
            overhead=int(data.get("overhead", 512)),  # type: ignore[arg-type]
            attention=str(data.get("attention", "grids")),
            bucket=int(data.get("bucket", 64)),  # type: ignore[arg-type]
            longest=int(data.get("longest", 0)),  # type: ignore[arg-type]
        )

    def pack(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The packed graph's feeds for one padded batch (see the module docstring)."""
        real = np.asarray(feeds[self.mask]) != 0
        real[:, 0] |= ~real.any(axis=1)  # an empty row keeps one token
        rows, cols = np.nonzero(real)  # row-major: each row's real tokens in order
        tokens = len(rows)
        counts = real.sum(axis=1)
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        rank = np.arange(tokens) - starts[rows]
        packed = {
            name: (
                np.asarray(value)[rows, cols][None] if name in self.per_token and name != self.mask else value
            )
            for name, value in feeds.items()
        }
        if self.position_input is None:
            positions = cols if self.positions == "column" else self.offset + rank
            packed["pack_positions"] = positions.astype(np.int64)[None]
        if self.attention == "varlen":
            return self._varlen(packed, rows, cols, counts)
        layout = np.full(real.shape, tokens, dtype=np.int64)
        layout[rows, cols] = np.arange(tokens)
        packed["pack_layout"] = layout
        planned = plan_groups(counts, int(counts.max()), 1, self.groups, self.overhead)
        group_of = np.zeros(
            len(counts), dtype=np.int64
        )  # each row's group, and its row within the group's grid
        row_in_group = np.zeros(len(counts), dtype=np.int64)
        bases, lengths = np.zeros(len(planned), dtype=np.int64), np.zeros(len(planned), dtype=np.int64)
        base = 0
        for g, group in enumerate(planned):
            group_of[group.index] = g
            row_in_group[group.index] = np.arange(len(group.index))
            bases[g], lengths[g] = base, group.length
            base += len(group.index) * group.length
        token_group = group_of[rows]
        place = bases[token_group] + row_in_group[rows] * lengths[token_group] + rank
        for g, name in enumerate(grid_names(self.groups)):
            if g >= len(planned):
                packed[name] = np.full((1, 1), tokens, dtype=np.int64)  # an unused grid: one empty slot
                continue
            grid = np.full((len(planned[g].index), int(lengths[g])), tokens, dtype=np.int64)
            mine = np.flatnonzero(token_group == g)
            grid[row_in_group[rows[mine]], rank[mine]] = mine
            packed[name] = grid
        packed["pack_tokens"] = place
        return packed

    def _varlen(
        self, packed: dict[str, np.ndarray], rows: np.ndarray, cols: np.ndarray, counts: np.ndarray
    ) -> dict[str, np.ndarray]:
        """The varlen feeds: the row padded with filler to a multiple of `bucket` (at least one filler token,
        so that the filler is a span of its own), the spans' starts, and the layout past the filler."""
        tokens = len(rows)
        length = -(-(tokens + 1) // self.bucket) * self.bucket
        for name in [*self.per_token, "pack_positions"]:
            if name in packed and name != self.mask:
                row = packed[name]
                filler = np.zeros((1, length - tokens, *row.shape[2:]), dtype=row.dtype)
                packed[name] = np.concatenate([row, filler], axis=1)
        layout = np.full(packed[self.mask].shape, length, dtype=np.int64)
        layout[rows, cols] = np.arange(tokens)
        packed["pack_layout"] = layout
        packed["pack_cu"] = np.concatenate([[0], np.cumsum(counts), [length]]).astype(np.int32)
        return packed

    def example_count(self, feeds: dict[str, np.ndarray]) -> tuple[int, int]:
        """(real tokens, padded tokens) of a batch: what packing saves, for the reports."""
        mask = np.asarray(feeds[self.mask])
        return int((mask != 0).sum()), int(mask.size)


def run_details(packing: Packing, feeds: dict[str, np.ndarray], io: str) -> dict[str, object]:
    """What a packed runner's row says about its batch: how many tokens were real, and when it was packed
    (host I/O: on every call, as a server packs each batch it forms; device I/O: once, when staged)."""
    real, padded = packing.example_count(feeds)
    when = "on every call" if io == "host" else "once, when the inputs are staged on the GPU"
    return {"real_tokens": real, "padded_tokens": padded, "packed": when}
