"""Which linear layers an 8-bit compiled program (`exported-fp8`, `exported-int8`) quantizes, by measured
accuracy on the calibration split.

Every calibrated layer is quantized when that passes the recipe's gate for the precision. Otherwise each layer
is quantized alone and run against the FP32 model; its sensitivity is the share of the tolerance it uses,
judged by the checks validation applies (as `onnx-int8-mixed` measures it, pipeline/stages/int8_mixed.py).
Layers are then quantized least sensitive first, and the largest count that passes is found by bisection. A
trained MiniLM fails INT8's gate with every layer in INT8 (pooled cosine 0.973 against 0.98 on this CPU): a
few layers carry the activation outliers a per-tensor INT8 scale cannot hold, and those stay in FP16. Which
ones is the model's answer, not a family default naming feed-forward layers.

Speed is not measured mix by mix here, unlike `onnx-int8-mixed`: on the GPUs these variants are for, each
8-bit GEMM replaces an FP16 one of twice the bytes, and the program is timed as a whole like every artifact.
The choice uses the calibration split only; validation then judges the artifact on held-out data."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

from pipeline.check.accuracy import ArtifactAccuracy, evaluate, real_tokens
from pipeline.core.errors import StageError
from pipeline.inputs.data import Feeds
from pipeline.recipe import Tolerance
from pipeline.stages.int8_mixed import choose, finite, judgement
from pipeline.toolchain.static_linear import simulated

SENSITIVITY_BATCHES = 4  # of the calibration split, for each layer alone

Swap = Callable[[nn.Module, dict[str, float], torch.dtype], list[str]]
Wrap = Callable[[nn.Module], nn.Module]  # the model as the export calls it (float inputs and outputs)


class StaticMix:
    """Runs copies of the FP32 model with a given set of layers in 8 bits against the FP32 model's outputs on
    the calibration split, on the CPU and in FP32 around the 8-bit operands (StaticLinear.simulated): the error
    being measured is the 8-bit rounding (the FP16 around them is FP16's own, gated as such), and the CPU runs
    it on any host, a GPU without FP8 included."""

    def __init__(
        self,
        model: nn.Module,
        wrap: Wrap,
        batches: list[tuple[Any, ...]],
        feeds: list[Feeds],
        outputs: list[str],
        tolerance: Tolerance,
        mask: tuple[str | None, int],
    ):
        self.model, self.wrap, self.outputs, self.tolerance = model, wrap, outputs, tolerance
        self.batches, self.feeds = batches, feeds
        self.masks = [real_tokens(f, mask[0], mask[1]) for f in feeds]
        self.reference = self._run(model)

    def verdict(
        self,
        layers: list[str],
        amax: dict[str, float],
        swap: Swap,
        batches: int | None = None,
    ) -> tuple[bool, float]:
        """Whether the model with `layers` in 8 bits passes the gate on the calibration split (its first
        `batches`), and the largest share of its tolerance a required check uses."""
        quantized = copy.deepcopy(self.model)
        swap(quantized, {name: amax[name] for name in layers}, torch.float32)
        simulated(quantized)
        accuracy = ArtifactAccuracy("mix", None, None)
        evaluate(
            accuracy,
            {"calibration": self.reference[:batches]},
            {"calibration": self._run(quantized, batches)},
            self.outputs,
            self.tolerance,
            {"calibration": self.masks[:batches]},
        )
        return judgement(accuracy)

    def _run(self, module: nn.Module, batches: int | None = None) -> list[dict[str, np.ndarray]]:
        wrapped = self.wrap(module).eval()
        with torch.no_grad():
            results = [wrapped(*batch) for batch in self.batches[:batches]]
        return [
            {
                name: out.detach().float().cpu().numpy()
                for name, out in zip(self.outputs, result, strict=False)
            }
            for result in results
        ]


def chosen_layers(
    mix: StaticMix,
    amax: dict[str, float],
    swap: Swap,
    label: str,
    report: Callable[[str], None],
) -> tuple[list[str], dict[str, Any]]:
    """The layers to quantize (every calibrated one when that passes) and what the details say of the choice."""
    layers = sorted(amax)
    if mix.verdict(layers, amax, swap)[0]:
        return layers, {"mix": f"every calibrated layer in {label}: passes the gate on the calibration split"}
    sensitivity = {}
    for i, layer in enumerate(layers, 1):
        report(f"{label} layer sensitivity {i}/{len(layers)} ({layer})")
        sensitivity[layer] = mix.verdict([layer], amax, swap, SENSITIVITY_BATCHES)[1]
    order = sorted(layers, key=lambda name: sensitivity[name])
    verdicts = {len(order): False}  # every layer: judged above

    def passes(count: int) -> bool:
        if count not in verdicts:
            verdicts[count] = mix.verdict(order[:count], amax, swap)[0]
        return verdicts[count]

    best, _ = choose(len(order), passes, step=1)
    if best == 0:
        least = order[0]
        raise StageError(
            f"no layer can be quantized to {label} within the gate on the calibration split: the least "
            f"sensitive, {least}, "
            + (
                f"uses {sensitivity[least]:.2f}x its tolerance alone"
                if math.isfinite(sensitivity[least])
                else "fails a required check outright alone"
            )
        )
    kept = order[best:]
    details = {
        "mix": f"{best} of {len(order)} layers in {label}, least sensitive first: with every layer the model "
        f"failed the gate on the calibration split; {len(kept)} kept in FP16",
        "kept_float": kept,
        "sensitivity": {name: finite(value) for name, value in sorted(sensitivity.items())},
    }
    return order[:best], details
