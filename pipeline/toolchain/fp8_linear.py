"""FP8 linear layers with static scales, for the compiled PyTorch path (`exported-fp8`, `aoti-fp8`).

Hopper's FP8 tensor cores run twice FP16's rate, but dynamic scaling (an amax reduction over each activation
before every GEMM) spends that gain on a batch's worth of extra memory traffic: on the H200, torchao's dynamic
float8 feed-forward block took 0.619 ms against 0.564 ms in BF16. With a scale fixed by calibration, the
quantization is a multiply and a cast that Inductor fuses into the kernel producing the activation, and the
GEMM is one `torch._scaled_mm` call (cuBLASLt's FP8 GEMM on a GPU, with the bias in its epilogue).

Each weight has one scale (its absolute maximum over 448, e4m3's largest value); each layer's input has one,
from the absolute maximum it saw on the calibration split, and values beyond it saturate. Layers whose
widths are not multiples of 16 (cuBLASLt's FP8 rule) stay in FP16, as do layers other than nn.Linear and
transformers' Conv1D.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from pipeline.core import host

FP8 = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8).max)  # 448
ALIGN = 16


class Fp8Linear(nn.Module):
    """A linear layer computing in FP8 with a calibrated input scale; its inputs and outputs keep their dtype.
    Made from an nn.Linear or a transformers Conv1D (GPT-2's linear layer, its weight stored transposed)."""

    def __init__(self, layer: nn.Module, input_amax: float, dtype: torch.dtype):
        super().__init__()
        weight = layer.weight.detach().float()
        self.transposed = not isinstance(layer, nn.Linear)  # Conv1D keeps [in, out]
        if self.transposed:
            weight = weight.t()
        weight = weight.contiguous()  # [out, in]: its transpose is the column-major operand cuBLASLt takes
        weight_scale = weight.abs().max().clamp(min=1e-12) / FP8_MAX
        self.register_buffer("weight_fp8", (weight / weight_scale).to(FP8))
        self.register_buffer("weight_scale", weight_scale.reshape(()))
        self.register_buffer("input_scale", torch.tensor(max(input_amax, 1e-12) / FP8_MAX))
        bias = layer.bias
        self.register_buffer("bias", None if bias is None else bias.detach().to(dtype))
        self.out_features, self.in_features = weight.shape
        self.nf = self.out_features  # Conv1D's name for it
        self.compute_dtype = dtype

    @property
    def weight(self) -> torch.Tensor:
        """The weight as the model's own code may read it (T5 casts its activations to its output layer's weight
        dtype), in the layer's own layout: dequantized, in the dtype the model computes in. Unused by the GEMM:
        Inductor drops it, an eager run pays one dequantize per read."""
        weight = self.weight_fp8.to(self.compute_dtype) * self.weight_scale.to(self.compute_dtype)
        return weight.t() if self.transposed else weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        quantized = (rows.float() / self.input_scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)
        out = torch._scaled_mm(  # on CUDA the bias must be in the output's dtype: the compute dtype
            quantized,
            self.weight_fp8.t(),
            scale_a=self.input_scale,
            scale_b=self.weight_scale,
            bias=self.bias,
            out_dtype=self.compute_dtype,
        )
        return out.to(x.dtype).reshape(*x.shape[:-1], self.out_features)


def fp8_gemm_runs() -> bool:
    """Whether this host's GPU has FP8 tensor cores (compute capability 8.9 on: Ada, Hopper and later)."""
    return host.has_cuda() and torch.cuda.get_device_capability() >= (8, 9)


def quantizable(module: nn.Module) -> dict[str, nn.Module]:
    """The linear layers FP8's GEMM takes (nn.Linear, transformers' Conv1D), by qualified name."""
    found = {}
    for name, sub in module.named_modules():
        linear = type(sub) is nn.Linear or type(sub).__name__ == "Conv1D"
        weight = getattr(sub, "weight", None)
        if linear and weight is not None and weight.dim() == 2 and all(w % ALIGN == 0 for w in weight.shape):
            found[name] = sub
    return found


def input_amax(module: nn.Module, batches: Iterable[tuple[torch.Tensor, ...]]) -> dict[str, float]:
    """Each quantizable layer's largest absolute input over the batches (the calibration split), in FP32."""
    seen: dict[str, float] = {}

    def hook(name: str):
        def record(_: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            given = args[0] if args else next(iter(kwargs.values()), None)  # `layer(input=x)` too
            if isinstance(given, torch.Tensor):
                value = float(given.detach().abs().max())
                seen[name] = max(seen.get(name, 0.0), value)

        return record

    layers = quantizable(module).items()
    handles = [sub.register_forward_pre_hook(hook(name), with_kwargs=True) for name, sub in layers]
    try:
        with torch.no_grad():
            for batch in batches:
                module(*batch)
    finally:
        for handle in handles:
            handle.remove()
    return seen


def to_fp8(module: nn.Module, amax: dict[str, float], dtype: torch.dtype) -> list[str]:
    """Swap the calibrated layers of `module` (already in `dtype`) for Fp8Linear; the names swapped."""
    swapped = []
    for name, linear in quantizable(module).items():
        if name not in amax:  # never reached on the calibration split: no scale to give it
            continue
        parent_name, _, child = name.rpartition(".")
        parent = module.get_submodule(parent_name) if parent_name else module
        setattr(parent, child, Fp8Linear(linear, amax[name], dtype))
        swapped.append(name)
    return swapped
