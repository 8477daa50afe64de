"""A model with a custom autograd Function (BLOOM's GELU is one) exports to TorchScript: the trace records the
Function's forward, which TorchScript can save, and the saved module agrees with eager; gradients outside the
trace still take the Function's own backward."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch

from tests.models.tiny import _SquashFunction
from tests.unit.stages.onnx_fixtures import tiny_context


def test_a_custom_autograd_function_is_traced_as_its_forward(tmp_path: Path) -> None:
    original = torch.autograd.Function.__dict__["apply"]
    ctx = tiny_context(tmp_path, "model.entrypoint=tests.models.tiny:function_activation")
    out = ctx.run_named("export_torchscript", variants=["torchscript-fp32"]).outputs[0]
    assert torch.autograd.Function.__dict__["apply"] is original  # put back once the trace is taken
    loaded = torch.jit.load(io.BytesIO((tmp_path / out.path).read_bytes()))
    feeds = ctx.dataset().feeds_at({"batch": 3, "sequence": 12})
    args = (torch.from_numpy(feeds["input_ids"]), torch.from_numpy(feeds["attention_mask"]))
    with torch.no_grad():
        want, got = ctx.model().module(*args), loaded(*args)
    assert all(torch.allclose(g, w, atol=1e-5) for g, w in zip(got, want, strict=True))
    assert "_SquashFunction" not in str(loaded.inlined_graph)
    x = torch.ones(2, requires_grad=True)
    _SquashFunction.apply(x).sum().backward()
    assert torch.equal(x.grad, torch.ones(2))  # its own backward: the real GELU's gradient at 1 is 1.08


def test_a_trace_that_fails_at_another_shape_is_located_and_explained(tmp_path: Path) -> None:
    """A hold-out Funnel's trace raised "index 32 is out of bounds for dimension 0 with size 32" from the
    TorchScript interpreter: no shape, no corner, no cause."""
    from pipeline.core.errors import StageError
    from pipeline.decide.verdict import SHAPE_DEPENDENT

    ctx = tiny_context(tmp_path, "model.entrypoint=tests.models.tiny:last_position_by_number")
    with pytest.raises(StageError) as failed:
        ctx.run_named("export_torchscript", variants=["torchscript-fp32"])
    message = str(failed.value)
    assert message.startswith(
        "the trace taken at the opt shape (2×16, 2×16) fails at the min shape (1×4, 1×4): "
    )
    assert "index 15 out of range" in message and "TracerWarning" in message, message
    assert "fix the dims its code computes from in the recipe, or use the ONNX exports" in message
    assert failed.value.details[SHAPE_DEPENDENT] is True


class _Probe(torch.autograd.Function):
    """Records which context each call of its forward got: the real apply's graph node, or the trace's."""

    contexts: list[str] = []

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, x: torch.Tensor) -> torch.Tensor:
        _Probe.contexts.append(type(ctx).__name__)
        return 2 * x

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor) -> torch.Tensor:
        return 2 * grad


def test_the_forward_runs_alone_only_in_the_tracing_thread_and_without_gradients() -> None:
    """Another thread's Function calls, and calls with gradients on, keep the real apply while a trace is
    taken; nested uses keep the outer patch and put the real apply back once."""
    import threading

    from pipeline.toolchain.inlined_functions import forward_of_functions

    original = torch.autograd.Function.__dict__["apply"]
    x = torch.ones(2, requires_grad=True)
    _Probe.contexts.clear()

    def other_thread() -> None:
        with torch.no_grad():
            _Probe.apply(x)

    with forward_of_functions(), forward_of_functions():
        with torch.no_grad():
            _Probe.apply(x)
        _Probe.apply(x)
        worker = threading.Thread(target=other_thread)
        worker.start()
        worker.join()
    assert _Probe.contexts == ["_InferenceContext", "_ProbeBackward", "_ProbeBackward"]
    assert torch.autograd.Function.__dict__["apply"] is original


def test_the_trace_check_compares_empty_and_misshapen_outputs() -> None:
    """A hold-out detector returns the boxes whose score passes 0.5: none at some shapes, and the check's own
    max() raised "Expected reduction dim to be specified for input.numel() == 0"."""
    from pipeline.stages.export_torchscript import _max_diff

    empty = torch.zeros(0, 4)
    scores = torch.tensor([[0.2, 0.7]])
    assert _max_diff((scores, empty), (scores + 0.5, empty.clone())) == pytest.approx(0.5)
    assert _max_diff((scores, empty), (scores, torch.zeros(1, 4))) == float("inf")
