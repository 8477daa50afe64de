"""The process-wide torch setting every torch runner on a CUDA device runs under."""

from __future__ import annotations

CUDNN_BENCHMARK = True


def autotune_convolutions() -> None:
    """Let cuDNN time its convolution algorithms per shape and keep the fastest.

    Without it cuDNN picks by heuristics, which on a convolutional network leaves speed on the table at every
    batch. The timing happens at the first call of each shape: the runners' warm-up and CUDA-graph capture
    calls, outside the timed windows, so a row is timed with the algorithm it keeps. Every torch row on the GPU
    (the reference too) gets the same setting, so rows compare on equal terms; a model without convolutions
    is untouched. benchmark.json records it (environment)."""
    import torch

    torch.backends.cudnn.benchmark = CUDNN_BENCHMARK
