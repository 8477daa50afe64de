"""One more ResNet-50 lever, measured before it is built: cuDNN's fused convolution epilogues.

The compiled peer (scripts/gpu_cnn_peers.py) runs each convolution in cuDNN and its bias, residual add and ReLU
in a Triton kernel after it: at batch 256 every activation is written by the convolution and read back by the
epilogue. cuDNN can run the bias, the residual add and the ReLU inside the convolution's own kernel
(`aten.cudnn_convolution_relu` / `aten.cudnn_convolution_add_relu`, its runtime-fusion engines). This script
folds batch norm into each convolution, runs every Bottleneck as three fused calls (the downsample as a plain
convolution with bias), replays the whole network in one CUDA graph, and sets it beside the compiled peer in
the same run, with the lowest logits cosine against the FP32 model, so the pipeline adds the path only if it
pays. Random weights (seeded), random images. Usage, on the GPU host: python3 scripts/gpu_cnn_fused_peers.py
[1 32 256]
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable

import torch
from gpu_peers import graphed, p50_ms
from torch import nn
from torch.nn import functional as F


def folded(conv: nn.Conv2d, norm: nn.BatchNorm2d) -> tuple[torch.Tensor, torch.Tensor]:
    """The convolution's weight and bias with the (inference) batch norm after it folded in."""
    scale = norm.weight / torch.sqrt(norm.running_var + norm.eps)
    weight = conv.weight * scale.reshape(-1, 1, 1, 1)
    bias = norm.bias - norm.running_mean * scale
    if conv.bias is not None:
        bias = bias + conv.bias * scale
    return weight.detach(), bias.detach()


class FusedConv(nn.Module):
    """conv + folded batch norm (+ residual) (+ ReLU), one cuDNN call on a GPU (eager ops elsewhere, to check
    the folding on a CPU)."""

    def __init__(self, conv: nn.Conv2d, norm: nn.BatchNorm2d, relu: bool) -> None:
        super().__init__()
        weight, bias = folded(conv, norm)
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.bias = nn.Parameter(bias, requires_grad=False)
        self.stride, self.padding = list(conv.stride), list(conv.padding)
        self.dilation, self.groups, self.relu = list(conv.dilation), conv.groups, relu

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        args = (self.stride, self.padding, self.dilation, self.groups)
        if x.is_cuda and self.relu and residual is not None:
            return torch.ops.aten.cudnn_convolution_add_relu(x, self.weight, residual, 1.0, self.bias, *args)
        if x.is_cuda and self.relu:
            return torch.ops.aten.cudnn_convolution_relu(x, self.weight, self.bias, *args)
        out = F.conv2d(x, self.weight, self.bias, *args)
        if residual is not None:
            out = out + residual
        return F.relu(out) if self.relu else out


class FusedBottleneck(nn.Module):
    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.a = FusedConv(block.conv1, block.bn1, relu=True)
        self.b = FusedConv(block.conv2, block.bn2, relu=True)
        self.c = FusedConv(block.conv3, block.bn3, relu=True)
        self.down = (
            FusedConv(block.downsample[0], block.downsample[1], relu=False) if block.downsample else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = self.down(x) if self.down is not None else x
        return self.c(self.b(self.a(x)), residual=identity)


class FusedResNet(nn.Module):
    """torchvision's ResNet (Bottleneck blocks) with every convolution fused with what follows it."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.stem = FusedConv(model.conv1, model.bn1, relu=True)
        self.pool = model.maxpool
        self.blocks = nn.Sequential(
            *[
                FusedBottleneck(b)
                for layer in (model.layer1, model.layer2, model.layer3, model.layer4)
                for b in layer
            ]
        )
        self.fc = model.fc

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.pool(self.stem(x)))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(F.cosine_similarity(a.float(), b.float(), dim=1).min())


def timed(
    name: str, fn: Callable[[torch.Tensor], torch.Tensor], images: torch.Tensor, want: torch.Tensor
) -> None:
    with torch.no_grad():
        try:
            replay = graphed(lambda: fn(images))
        except Exception as error:  # noqa: BLE001 - a cuDNN without a fused engine for this shape says so
            print(f"{name}: {type(error).__name__}: {str(error)[:300]}")
            return
        print(f"{name}: {p50_ms(replay):.3f} ms, lowest logits cosine vs FP32 {cosine(replay(), want):.5f}")


def main(batches: list[int]) -> None:
    import torchvision

    print(f"{torch.cuda.get_device_name()} torch {torch.__version__} cuDNN {torch.backends.cudnn.version()}")
    torch.manual_seed(0)
    reference = torchvision.models.resnet50().eval().cuda()
    half = copy.deepcopy(reference).to(torch.float16).to(memory_format=torch.channels_last)
    with torch.no_grad():
        fused = FusedResNet(copy.deepcopy(reference)).to(torch.float16).to(memory_format=torch.channels_last)
    compiled = torch.compile(half, dynamic=False)
    for batch in batches:
        images = torch.randn(batch, 3, 224, 224, device="cuda")
        with torch.no_grad():
            want = reference(images)
        images = images.to(torch.float16).contiguous(memory_format=torch.channels_last)
        for benchmark in (False, True):
            torch.backends.cudnn.benchmark = benchmark
            label = f"batch {batch}, cudnn.benchmark={benchmark}"
            timed(f"peer: torch.compile + CUDA graph, {label}", compiled, images, want)
            timed(f"cuDNN fused epilogues + CUDA graph, {label}", fused, images, want)


if __name__ == "__main__":
    main([int(b) for b in sys.argv[1:]] or [1, 32, 256])
