"""Custom autograd Functions traced as the operations of their forward.

A trace records `torch.autograd.Function.apply` as a Python call, which TorchScript cannot save ("Could not
export Python function call 'GeLUFunction'": BLOOM's GELU, straight-through estimators, fused-kernel
wrappers). An inference trace needs no backward, so while it is taken every Function runs its forward directly
and the tracer sees what it computes. A Function whose forward leaves torch (numpy, a custom kernel) is
recorded as the trace sees it, and the trace check against eager judges the result.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch.autograd.function import _SingleLevelFunction


class _InferenceContext:
    """The `ctx` a Function's forward is given: whatever it saves for a backward is dropped."""

    needs_input_grad: tuple[bool, ...] = ()
    saved_tensors: tuple[torch.Tensor, ...] = ()

    def save_for_backward(self, *tensors: Any) -> None:
        pass

    def save_for_forward(self, *tensors: Any) -> None:
        pass

    def mark_dirty(self, *tensors: Any) -> None:
        pass

    def mark_non_differentiable(self, *tensors: Any) -> None:
        pass

    def set_materialize_grads(self, value: bool) -> None:
        pass


@contextlib.contextmanager
def forward_of_functions() -> Iterator[None]:
    """Within: with gradients off, `Function.apply` calls the Function's forward (with a context that keeps
    nothing, or none for a forward written with `setup_context`)."""
    original = torch.autograd.Function.__dict__["apply"]  # the classmethod itself, put back as it was

    def apply(cls: type, *args: Any, **kwargs: Any) -> Any:
        if torch.is_grad_enabled():
            return original.__func__(cls, *args, **kwargs)
        if cls.setup_context is not _SingleLevelFunction.setup_context:  # forward(*args), no ctx
            return cls.forward(*args, **kwargs)
        return cls.forward(_InferenceContext(), *args, **kwargs)

    torch.autograd.Function.apply = classmethod(apply)  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        torch.autograd.Function.apply = original  # type: ignore[method-assign,assignment]
