"""Model factories that go wrong the ways a user's entrypoint can: each must be a located user error."""

from __future__ import annotations

import torch
from torch import nn

from tests.models.tiny import TinyEncoder


def raises(**kwargs: int) -> nn.Module:
    raise ValueError("weights file not found")


def not_a_module(**kwargs: int) -> object:
    return {"hidden": 64}


def strict(hidden: int = 64, layers: int = 2) -> nn.Module:
    return TinyEncoder(hidden=hidden, layers=layers)


class _Single(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = TinyEncoder(hidden=32, layers=1)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.inner(input_ids, attention_mask)[1]


def one_output(**kwargs: int) -> nn.Module:
    return _Single()


class _Named(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = TinyEncoder(hidden=32, layers=1)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> dict[str, torch.Tensor]:
        hidden, pooled = self.inner(input_ids, attention_mask)
        return {"states": hidden, "embedding": pooled}


def named_outputs(**kwargs: int) -> nn.Module:
    return _Named()


class _Scalar(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = TinyEncoder(hidden=32, layers=1)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        hidden, pooled = self.inner(input_ids, attention_mask)
        return hidden.sum(), pooled


def scalar_output(**kwargs: int) -> nn.Module:
    return _Scalar()


class _Nested(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = TinyEncoder(hidden=32, layers=1)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple:
        hidden, pooled = self.inner(input_ids, attention_mask)
        return hidden, [pooled]


def nested_output(**kwargs: int) -> nn.Module:
    return _Nested()


class _OneInput(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = TinyEncoder(hidden=32, layers=1)

    def forward(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.inner(input_ids, torch.ones_like(input_ids))


def one_input(**kwargs: int) -> nn.Module:
    return _OneInput()


class _Empty(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = TinyEncoder(hidden=32, layers=1)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        hidden, pooled = self.inner(input_ids, attention_mask)
        return hidden, pooled[:, :0]


def empty_output(**kwargs: int) -> nn.Module:
    return _Empty()


def per_process(**kwargs: int) -> nn.Module:
    """Weights that depend on the process that builds the model (a factory seeding itself from its pid, or
    reading a file another process rewrites): the lane worker's export is of another model."""
    import os

    model = TinyEncoder(hidden=32, layers=1)
    with torch.no_grad():
        model.embed.weight.add_(os.getpid() % 97)
    return model
