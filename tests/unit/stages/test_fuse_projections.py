"""The projection-fusion pass on small exported modules: what it fuses, and that outputs do not change."""

from __future__ import annotations

import torch
from torch import nn

from pipeline.toolchain.fuse_projections import LINEAR, fuse_linear_groups


class Heads(nn.Module):
    def __init__(self, second_bias: bool = True):
        super().__init__()
        self.a, self.b = nn.Linear(4, 3), nn.Linear(4, 5, bias=second_bias)
        self.c = nn.Linear(3, 2)  # reads another tensor: stays alone

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.c(torch.relu(self.a(x))), self.b(x)


def _fused(module: nn.Module) -> tuple[int, int, torch.fx.GraphModule]:
    torch.manual_seed(0)
    graph_module = torch.export.export(module.eval(), (torch.randn(2, 4),)).module()
    count = fuse_linear_groups(graph_module)
    linears = sum(n.target == LINEAR for n in graph_module.graph.nodes)
    return count, linears, graph_module


def test_linears_on_one_input_become_one() -> None:
    module = Heads()
    count, linears, fused = _fused(module)
    assert (count, linears) == (1, 2)
    x = torch.randn(2, 4)
    for got, want in zip(fused(x), module(x), strict=True):
        assert torch.allclose(got, want, atol=1e-6)
    assert not any("a.weight" in name for name, _ in fused.named_parameters())  # no weights carried twice


def test_mixed_bias_is_left_alone() -> None:
    count, linears, _ = _fused(Heads(second_bias=False))
    assert (count, linears) == (0, 3)
