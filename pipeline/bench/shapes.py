"""The benchmark's shapes: batch sizes x sequence lengths on the dims the recipe names (docs/benchmarking.md
rule 11)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.recipe import BenchmarkConfig, DimRange


@dataclass(frozen=True)
class BenchShape:
    """One benchmark shape: a batch size and, for sequence models, a sequence length."""

    batch: int
    sequence: int | None

    def dims(self, bench: BenchmarkConfig, dims: dict[str, DimRange]) -> dict[str, int]:
        """The shape as pinned dims (a recipe without a batch dim runs batch 1)."""
        pinned = {}
        if bench.batch_dim in dims:
            pinned[bench.batch_dim] = self.batch
        if self.sequence is not None and bench.sequence_dim:
            pinned[bench.sequence_dim] = self.sequence
        return pinned

    def label(self) -> str:
        return f"batch {self.batch}" + (f" seq {self.sequence}" if self.sequence is not None else "")


def data_sequence_lengths(lengths: list[int], low: int, high: int) -> list[int]:
    """Median and p90 of the data's token lengths, clipped to the sequence dim's range (rule 11)."""
    if not lengths:
        return []
    picks = np.percentile(np.asarray(lengths, dtype=np.float64), [50, 90])
    return sorted({int(min(max(round(float(p)), low), high)) for p in picks})


def benchmark_shapes(
    bench: BenchmarkConfig, dims: dict[str, DimRange], token_lengths: list[int] | None = None
) -> list[BenchShape]:
    """Batch sizes x sequence lengths; a recipe without a sequence dim varies the batch only."""
    seq = dims.get(bench.sequence_dim) if bench.sequence_dim else None
    batches = bench.batch_sizes if bench.batch_dim in dims else [1]
    if seq is None:
        return [BenchShape(b, None) for b in batches]
    if bench.sequence_lengths == "data":
        lengths = data_sequence_lengths(token_lengths or [], seq.min, seq.max) or [seq.opt]
    else:
        lengths = list(bench.sequence_lengths)
    return [BenchShape(b, s) for b in batches for s in lengths]
