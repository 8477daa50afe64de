"""Linear layers with static (calibrated) scales for the compiled PyTorch path: what FP8 (fp8_linear.py) and
INT8 (int8_linear.py) share. Which layers qualify, each one's input range on the calibration split, the layer's
shape and attributes as model code reads them, and the swap.

A scale fixed by calibration makes an activation's quantization a multiply, a rounding and a cast that Inductor
fuses into the kernel producing the activation; a dynamic scale would add an amax reduction over each
activation before every GEMM (on the H200, torchao's dynamic float8 feed-forward block took 0.619 ms against
0.564 ms in BF16). Layers other than nn.Linear and transformers' Conv1D stay in the compute dtype, as do those
whose widths are not multiples of 16 (cuBLASLt's FP8 rule; its INT8 GEMM wants multiples of 8).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

ALIGN = 16


class StaticLinear(nn.Module):
    """The shape and attributes of the linear layer a quantized one replaces, made from an nn.Linear or a
    transformers Conv1D (GPT-2's linear layer, its weight stored transposed). Subclasses hold the quantized
    weight and compute; `weight` reads it back dequantized."""

    simulate = False  # set on a copy whose accuracy is measured (simulated)

    def __init__(self, layer: nn.Module, dtype: torch.dtype):
        super().__init__()
        self.transposed = not isinstance(layer, nn.Linear)  # Conv1D keeps [in, out]
        rows, columns = layer.weight.shape
        self.out_features, self.in_features = (columns, rows) if self.transposed else (rows, columns)
        self.nf = self.out_features  # Conv1D's name for it
        self.compute_dtype = dtype
        bias = layer.bias
        self.register_buffer("bias", None if bias is None else bias.detach().to(dtype))

    @staticmethod
    def float_weight(layer: nn.Module) -> torch.Tensor:
        """The layer's weight in FP32 as [out, in], contiguous: its transpose is the column-major operand the
        GEMMs take."""
        weight = layer.weight.detach().float()
        return (weight if isinstance(layer, nn.Linear) else weight.t()).contiguous()

    def dequantized(self) -> torch.Tensor:
        """The weight as [out, in] in the compute dtype."""
        raise NotImplementedError

    def quantized_input(self, rows: torch.Tensor) -> torch.Tensor:
        """The input rows in 8 bits, scaled by the calibrated input scale."""
        raise NotImplementedError

    def gemm(self, rows: torch.Tensor) -> torch.Tensor:
        """The 8-bit GEMM of the input rows, with the scales and the bias, in the compute dtype."""
        raise NotImplementedError

    def simulated(self, rows: torch.Tensor) -> torch.Tensor:
        """What `gemm` computes, from the 8-bit operands' values in FP32: equal up to FP32's rounding of the
        sums, and at FP32 GEMM speed on any host (torch's INT8 and FP8 GEMMs on a CPU are reference loops, a
        thousand times slower), for measuring many mixes' accuracy on the calibration split."""
        inputs = self.quantized_input(rows).float() * self.input_scale
        bias = None if self.bias is None else self.bias.float()
        return nn.functional.linear(inputs, self.dequantized().float(), bias).to(self.compute_dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        out = self.simulated(rows) if self.simulate else self.gemm(rows)
        # the model's dtype, then the caller's: as the float layer it replaces would have rounded
        return out.to(x.dtype).reshape(*x.shape[:-1], self.out_features)

    @property
    def weight(self) -> torch.Tensor:
        """The weight as the model's own code may read it (T5 casts its activations to its output layer's weight
        dtype), in the layer's own layout: dequantized, in the dtype the model computes in. Unused by the GEMM:
        Inductor drops it, an eager run pays one dequantize per read."""
        weight = self.dequantized()
        return weight.t() if self.transposed else weight


def quantizable(module: nn.Module) -> dict[str, nn.Module]:
    """The linear layers the static GEMMs take (nn.Linear, transformers' Conv1D), by qualified name."""
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


Make = Callable[[nn.Module, float, torch.dtype], nn.Module]


def simulated(module: nn.Module) -> nn.Module:
    """`module` with its 8-bit layers computing through StaticLinear.simulated; the module."""
    for sub in module.modules():
        if isinstance(sub, StaticLinear):
            sub.simulate = True
    return module


def swap(module: nn.Module, amax: dict[str, float], dtype: torch.dtype, make: Make) -> list[str]:
    """Swap the calibrated layers of `module` (already in `dtype`) for `make(layer, input amax, dtype)`; the
    names swapped."""
    swapped = []
    for name, linear in quantizable(module).items():
        if name not in amax:  # never reached on the calibration split: no scale to give it
            continue
        parent_name, _, child = name.rpartition(".")
        parent = module.get_submodule(parent_name) if parent_name else module
        setattr(parent, child, make(linear, amax[name], dtype))
        swapped.append(name)
    return swapped
