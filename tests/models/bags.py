"""A small recommender: bags of categorical ids through nn.EmbeddingBag, dense features, pairwise dot
interactions, a click probability per sample. The ONNX exporter writes each EmbeddingBag as a Loop over the
bags with an If per bag (an empty bag returns a constant): the control flow that graph converters mishandle."""

from __future__ import annotations

import torch
from torch import nn


class BagRecommender(nn.Module):
    def __init__(self, tables: int = 2, rows: int = 50, dim: int = 8, dense: int = 5):
        super().__init__()
        self.tables = nn.ModuleList(nn.EmbeddingBag(rows, dim, mode="sum") for _ in range(tables))
        self.bottom = nn.Sequential(nn.Linear(dense, 16), nn.ReLU(), nn.Linear(16, dim), nn.ReLU())
        features = tables + 1
        self.top = nn.Sequential(
            nn.Linear(dim + features * (features - 1) // 2, 16), nn.ReLU(), nn.Linear(16, 1)
        )

    def forward(self, dense: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        x = self.bottom(dense)
        bags = [table(ids[:, i, :].long()) for i, table in enumerate(self.tables)]
        features = torch.stack([x, *bags], 1)
        interactions = features @ features.transpose(1, 2)
        i, j = torch.triu_indices(features.shape[1], features.shape[1], 1)
        return torch.sigmoid(self.top(torch.cat([x, interactions[:, i, j]], 1))).squeeze(1)


def bag_recommender(**kwargs: int) -> nn.Module:
    return BagRecommender(**kwargs)
