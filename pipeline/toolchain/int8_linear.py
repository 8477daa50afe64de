"""INT8 linear layers with static scales, for the compiled PyTorch path (`exported-int8`, `aoti-int8`): the
GPU's INT8 tensor cores without TensorRT, on any GPU that has them (Turing on; Ampere has no FP8).

The GEMM is `torch._int_mm` (cuBLASLt's INT8 GEMM on a GPU: int8 × int8 into int32), then one multiply by the
input's and the weight's scales and the bias, which Inductor fuses into a single kernel after the GEMM.
Weights are quantized per output channel (the common practice: a channel of large weights does not crush the
rest to zero), inputs per tensor with the scale calibrated on the calibration split (static_linear.py); values
beyond it saturate. Symmetric, ±127.
"""

from __future__ import annotations

import torch
from torch import nn

from pipeline.toolchain.static_linear import StaticLinear, swap

INT8_MAX = 127.0
# cuBLASLt's INT8 GEMM, as torch calls it, wants more than 16 rows: fewer are padded with zero rows up to this
MIN_ROWS = 17


class Int8Linear(StaticLinear):
    """A linear layer computing in INT8 with a calibrated input scale; its inputs and outputs keep their dtype."""

    def __init__(self, layer: nn.Module, input_amax: float, dtype: torch.dtype):
        super().__init__(layer, dtype)
        weight = self.float_weight(layer)
        scale = weight.abs().amax(dim=1).clamp(min=1e-12) / INT8_MAX  # one per output channel
        self.register_buffer("weight_int8", (weight / scale[:, None]).round().clamp(-127, 127).to(torch.int8))
        self.register_buffer("weight_scale", scale)
        self.register_buffer("input_scale", torch.tensor(max(input_amax, 1e-12) / INT8_MAX))

    def dequantized(self) -> torch.Tensor:
        return (self.weight_int8.float() * self.weight_scale[:, None]).to(self.compute_dtype)

    def quantized_input(self, rows: torch.Tensor) -> torch.Tensor:
        return (rows.float() / self.input_scale).round().clamp(-INT8_MAX, INT8_MAX).to(torch.int8)

    def gemm(self, rows: torch.Tensor) -> torch.Tensor:
        count = rows.shape[0]
        padding = torch.sym_max(MIN_ROWS - count, 0)  # no guard on the row count: zero rows from 17 on
        quantized = nn.functional.pad(self.quantized_input(rows), (0, 0, 0, padding))
        out = torch._int_mm(quantized, self.weight_int8.t())[:count]
        out = out.float() * (self.input_scale * self.weight_scale)
        if self.bias is not None:
            out = out + self.bias.float()
        return out.to(self.compute_dtype)


def to_int8(module: nn.Module, amax: dict[str, float], dtype: torch.dtype) -> list[str]:
    """Swap the calibrated layers of `module` (already in `dtype`) for Int8Linear; the names swapped."""
    return swap(module, amax, dtype, Int8Linear)
