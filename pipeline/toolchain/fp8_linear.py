"""FP8 linear layers with static scales, for the compiled PyTorch path (`exported-fp8`, `aoti-fp8`).

Hopper's FP8 tensor cores run twice FP16's rate; with calibrated scales (static_linear.py) the GEMM is one
`torch._scaled_mm` call (cuBLASLt's FP8 GEMM on a GPU, with the bias and both scales in its epilogue).
Each weight has one scale (its absolute maximum over 448, e4m3's largest value); each layer's input has one,
from the absolute maximum it saw on the calibration split, and values beyond it saturate.
"""

from __future__ import annotations

import torch
from torch import nn

from pipeline.core import host
from pipeline.toolchain.static_linear import StaticLinear, swap

FP8 = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8).max)  # 448


class Fp8Linear(StaticLinear):
    """A linear layer computing in FP8 with a calibrated input scale; its inputs and outputs keep their dtype."""

    def __init__(self, layer: nn.Module, input_amax: float, dtype: torch.dtype):
        super().__init__(layer, dtype)
        weight = self.float_weight(layer)
        weight_scale = weight.abs().max().clamp(min=1e-12) / FP8_MAX
        self.register_buffer("weight_fp8", (weight / weight_scale).to(FP8))
        self.register_buffer("weight_scale", weight_scale.reshape(()))
        self.register_buffer("input_scale", torch.tensor(max(input_amax, 1e-12) / FP8_MAX))

    def dequantized(self) -> torch.Tensor:
        return self.weight_fp8.to(self.compute_dtype) * self.weight_scale.to(self.compute_dtype)

    def quantized_input(self, rows: torch.Tensor) -> torch.Tensor:
        return (rows.float() / self.input_scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)

    def gemm(self, rows: torch.Tensor) -> torch.Tensor:
        return torch._scaled_mm(  # on CUDA the bias must be in the output's dtype: the compute dtype
            self.quantized_input(rows),
            self.weight_fp8.t(),
            scale_a=self.input_scale,
            scale_b=self.weight_scale,
            bias=self.bias,
            out_dtype=self.compute_dtype,
        )


def fp8_gemm_runs() -> bool:
    """Whether this host's GPU has FP8 tensor cores (compute capability 8.9 on: Ada, Hopper and later)."""
    return host.has_cuda() and torch.cuda.get_device_capability() >= (8, 9)


def to_fp8(module: nn.Module, amax: dict[str, float], dtype: torch.dtype) -> list[str]:
    """Swap the calibrated layers of `module` (already in `dtype`) for Fp8Linear; the names swapped."""
    return swap(module, amax, dtype, Fp8Linear)
