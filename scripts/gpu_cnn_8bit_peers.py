"""Whether 8-bit 1x1 convolutions can take torchvision ResNet-50 past its 16-bit peer on a GPU without TensorRT:
issue 26 asks for 1.3 ms at batch 32 and 7.4 ms at batch 256 on an H200, where the best FP16 peer took 1.61 and
9.67 ms (10.10 on an H100), and no pipeline row has beaten that peer by more than noise.

A bottleneck's two 1x1 convolutions hold about half of ResNet-50's multiply-adds. In channels-last memory a 1x1
convolution is a GEMM over [images × height × width, channels], so it can run on Hopper's FP8 tensor cores
(`torch._scaled_mm`, twice FP16's rate) or its INT8 ones (`torch._int_mm`), with static scales: the input's from
its absolute maximum on a calibration batch, one per output channel for the weights, after batch norm is folded
into them. The 3x3 and 7x7 convolutions stay in BF16 (cuDNN has no 8-bit path that torch calls).

Each model is compiled by torch.compile per batch shape and replayed in a CUDA graph, as gpu_cnn_peers.py's peer;
the baseline is that peer in BF16 (the 8-bit GEMMs' output dtype), which ran as fast as FP16 there.
Prints each variant's lowest per-image cosine against the FP32 model and its p50 ms per batch; random weights
(seeded) and random images: the speed does not depend on them, the cosine only shows the arithmetic is sound.
Usage, on the GPU host: python3 scripts/gpu_cnn_8bit_peers.py [batches, default 32 256]
"""

from __future__ import annotations

import sys

import torch
from gpu_peers import graphed_p50_ms
from torch import nn
from torch.nn.utils.fusion import fuse_conv_bn_eval

FP8 = torch.float8_e4m3fn
TOP = {"fp8": 448.0, "int8": 127.0}  # the largest value of each format


class Conv1x1In8Bits(nn.Module):
    """A 1x1 convolution (batch norm folded in) as one 8-bit GEMM over the channels-last pixels; BF16 out."""

    def __init__(self, conv: nn.Conv2d, input_amax: float, kind: str):
        super().__init__()
        self.kind, self.stride = kind, conv.stride[0]
        weight = conv.weight.detach().float().flatten(1)  # [out, in]
        self.out_channels = weight.shape[0]
        weight_scale = weight.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / TOP[kind]
        scaled = weight / weight_scale
        quantized = scaled.to(FP8) if kind == "fp8" else scaled.round().clamp(-127, 127).to(torch.int8)
        self.register_buffer("weight_q", quantized.contiguous())
        self.register_buffer("weight_scale", weight_scale.t().contiguous())  # [1, out]
        self.register_buffer(
            "input_scale", torch.tensor(max(input_amax, 1e-12) / TOP[kind], device=weight.device)
        )
        self.register_buffer("bias", conv.bias.detach().to(torch.bfloat16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.stride > 1:
            x = x[:, :, :: self.stride, :: self.stride]
        n, c, h, w = x.shape
        rows = x.permute(0, 2, 3, 1).reshape(-1, c).float() / self.input_scale
        top = TOP[self.kind]
        if self.kind == "fp8":
            out = torch._scaled_mm(
                rows.clamp(-top, top).to(FP8),
                self.weight_q.t(),
                scale_a=self.input_scale.expand(rows.shape[0], 1).contiguous(),
                scale_b=self.weight_scale,
                out_dtype=torch.bfloat16,
            )
        else:
            products = torch._int_mm(rows.round().clamp(-top, top).to(torch.int8), self.weight_q.t())
            out = (products.float() * (self.weight_scale * self.input_scale)).to(torch.bfloat16)
        return (out + self.bias).reshape(n, h, w, self.out_channels).permute(0, 3, 1, 2)


def folded_resnet50() -> nn.Module:
    """torchvision's ResNet-50 (seeded random weights) with every batch norm folded into its convolution."""
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet50().eval()
    for block in model.modules():
        if isinstance(block, torchvision.models.resnet.Bottleneck):
            for conv, norm in (("conv1", "bn1"), ("conv2", "bn2"), ("conv3", "bn3")):
                setattr(block, conv, fuse_conv_bn_eval(getattr(block, conv), getattr(block, norm)))
                setattr(block, norm, nn.Identity())
            if block.downsample is not None:
                block.downsample = fuse_conv_bn_eval(block.downsample[0], block.downsample[1])
    model.conv1, model.bn1 = fuse_conv_bn_eval(model.conv1, model.bn1), nn.Identity()
    return model


def to_8_bits(model: nn.Module, reference: nn.Module, kind: str, images: torch.Tensor) -> int:
    """Swap every 1x1 convolution of `model` (already in BF16: a cast would turn the 8-bit weights to BF16
    too) for Conv1x1In8Bits, made from the FP32 `reference`'s, its input scale from `images`; the count."""
    amax: dict[str, float] = {}

    def seen(name: str):  # noqa: ANN202
        return lambda _module, inputs: amax.__setitem__(
            name, max(amax.get(name, 0.0), inputs[0].abs().max().item())
        )

    hooks = [
        module.register_forward_pre_hook(seen(name))
        for name, module in reference.named_modules()
        if isinstance(module, nn.Conv2d) and module.kernel_size == (1, 1)
    ]
    with torch.no_grad():
        reference(images)
    for hook in hooks:
        hook.remove()
    for name, value in amax.items():
        parent, _, child = name.rpartition(".")
        setattr(
            model.get_submodule(parent), child, Conv1x1In8Bits(reference.get_submodule(name), value, kind)
        )
    return len(amax)


def main(batches: list[int]) -> None:
    torch.backends.cudnn.benchmark = True
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__}", flush=True)
    reference = folded_resnet50().to("cuda")
    calibration = torch.randn(32, 3, 224, 224, device="cuda")
    check = torch.randn(16, 3, 224, 224, device="cuda")
    with torch.no_grad():
        expected = reference(check).float()
    for kind in ("bf16", "fp8", "int8"):
        model = folded_resnet50().to("cuda", torch.bfloat16, memory_format=torch.channels_last)
        swapped = 0 if kind == "bf16" else to_8_bits(model, reference, kind, calibration)
        with torch.no_grad():
            got = model(check.to(torch.bfloat16).contiguous(memory_format=torch.channels_last)).float()
        cosine = nn.functional.cosine_similarity(got, expected).min().item()
        print(
            f"{kind}: {swapped} 1x1 convolutions in 8 bits, lowest cosine against FP32 {cosine:.5f}",
            flush=True,
        )
        torch._dynamo.reset()
        compiled = torch.compile(model, dynamic=False)
        for batch in batches:
            images = torch.randn(batch, 3, 224, 224, device="cuda", dtype=torch.bfloat16)
            images = images.contiguous(memory_format=torch.channels_last)
            ms, seconds = graphed_p50_ms(lambda x=images, f=compiled: f(x))
            print(f"{kind}, batch {batch}: {ms:.3f} ms (compile, capture and timing {seconds:.0f} s)")


if __name__ == "__main__":
    main([int(b) for b in sys.argv[1:]] or [32, 256])
