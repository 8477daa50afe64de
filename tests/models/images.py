"""A small real CNN fed an image's bytes: uint8 [batch, 3, height, width] in, normalized inside the model, as
camera and decoder pipelines hand images over (no float copy of every frame on the client)."""

from __future__ import annotations

import torch
from torch import nn


class ByteImageCNN(nn.Module):
    """Bytes scaled and centred by the ImageNet mean and spread, two convolution blocks (one residual), global
    average pooling and a linear head of `classes` logits. Batch norms carry non-trivial statistics, so that
    folding them (ONNX Runtime, INT8) changes numbers a check can see."""

    def __init__(self, width: int = 8, classes: int = 10):
        super().__init__()
        self.register_buffer("mean", torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1))
        self.register_buffer("std", torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1))
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 2, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        self.block = nn.Sequential(nn.Conv2d(width, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width))
        self.head = nn.Linear(width, classes)
        generator = torch.Generator().manual_seed(0)
        for module in self.modules():
            if isinstance(module, nn.BatchNorm2d):
                for stat, low, high in (("weight", 0.5, 1.5), ("bias", -0.2, 0.2)):
                    getattr(module, stat).data.uniform_(low, high, generator=generator)
                module.running_mean.uniform_(-0.2, 0.2, generator=generator)
                module.running_var.uniform_(0.5, 1.5, generator=generator)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        x = (image.float() / 255 - self.mean) / self.std
        x = self.stem(x)
        x = torch.relu(x + self.block(x))
        return self.head(x.mean((2, 3)))


def byte_image_cnn(**kwargs: int) -> nn.Module:
    return ByteImageCNN(**kwargs).eval()
