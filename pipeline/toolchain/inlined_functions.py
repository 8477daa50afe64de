"""Custom autograd Functions traced as the operations of their forward.

A trace records `torch.autograd.Function.apply` as a Python call, which TorchScript cannot save ("Could not
export Python function call 'GeLUFunction'": BLOOM's GELU, straight-through estimators, fused-kernel
wrappers). An inference trace needs no backward, so while it is taken every Function runs its forward directly
and the tracer sees what it computes. A Function whose forward leaves torch (numpy, a custom kernel) is
recorded as the trace sees it, and the trace check against eager judges the result.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import torch


class _InferenceContext:
    """The `ctx` a Function's forward is given: whatever it saves for a backward is dropped."""

    saved_tensors: tuple[torch.Tensor, ...] = ()

    def __init__(self, inputs: int):
        self.needs_input_grad = (False,) * inputs

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


_LOCK = threading.RLock()  # one patch at a time; a nested use in the tracing thread keeps the outer one
_TRACING: dict[str, Any] = {"thread": None, "depth": 0, "original": None}


@contextlib.contextmanager
def forward_of_functions() -> Iterator[None]:
    """Within, in this thread, with gradients off: `Function.apply` calls the Function's forward (with a
    context that keeps nothing, or none for a forward written with `setup_context`). Other threads, and calls
    with gradients on, go through the real `apply`."""
    with _LOCK:
        if _TRACING["depth"] == 0:
            _TRACING["original"] = torch.autograd.Function.__dict__[
                "apply"
            ]  # the classmethod, put back as is
            _TRACING["thread"] = threading.get_ident()
            torch.autograd.Function.apply = classmethod(_apply)  # type: ignore[method-assign,assignment]
        _TRACING["depth"] += 1
        try:
            yield
        finally:
            _TRACING["depth"] -= 1
            if _TRACING["depth"] == 0:
                torch.autograd.Function.apply = _TRACING["original"]  # type: ignore[method-assign]


def _apply(cls: type, *args: Any, **kwargs: Any) -> Any:
    if torch.is_grad_enabled() or threading.get_ident() != _TRACING["thread"]:
        return _TRACING["original"].__func__(cls, *args, **kwargs)
    if cls.setup_context is not torch.autograd.Function.setup_context:  # forward(*args), no ctx
        return cls.forward(*args, **kwargs)
    return cls.forward(_InferenceContext(len(args)), *args, **kwargs)
