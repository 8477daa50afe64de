"""The recipe's dims as torch.export's symbolic dims: the dynamic shapes every torch.export of the model declares
(the ONNX export, the compiled programs and the packed one).

A dim whose min equals its max is a fixed size, not a symbol: torch refuses a Dim whose range is one value
("Cannot create Dim with inconsistent min=4, max=4"), and a recipe fixes a dim that way where the model depends
on it. Such axes are left out of the dynamic shapes, which torch.export then takes as static.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pipeline.inputs.specs import ModelSpec
from pipeline.recipe.sources import DimRange


def symbolic_dims(dims: Mapping[str, DimRange]) -> dict[str, Any]:
    """One torch.export.Dim per dim with a range; fixed dims have none."""
    import torch

    return {name: torch.export.Dim(name, min=r.min, max=r.max) for name, r in dims.items() if r.min < r.max}


def input_axes(shape: Sequence[int | str], dims: Mapping[str, Any]) -> dict[int, Any]:
    """An input's symbolic axes: those named by a dim with a range."""
    return {axis: dims[d] for axis, d in enumerate(shape) if isinstance(d, str) and d in dims}


def dynamic_shapes(spec: ModelSpec) -> tuple[dict[int, Any], ...]:
    """torch.export's dynamic_shapes for the recipe's inputs, in their order."""
    dims = symbolic_dims(spec.dims)
    return tuple(input_axes(s.shape, dims) for s in spec.inputs)


def example_batch(spec: ModelSpec, batch_dim: str) -> int | None:
    """The batch of the example an export traces: at least 2 where the batch has a range (torch.export takes a
    size of 1 for a constant, and fixes the axis), the size itself where the recipe fixes it."""
    rng = spec.dims.get(batch_dim)
    if rng is None:
        return None
    return rng.opt if rng.min == rng.max else max(2, rng.opt)
