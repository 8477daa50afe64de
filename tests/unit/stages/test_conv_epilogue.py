"""The convolution-epilogue pass on small exported CNNs: batch norms folded, convolutions with their residual
add and ReLU rewritten to cuDNN's fused calls, what is left alone, and that the re-exported program computes
what the model does. cuDNN's ops run on a CUDA GPU only (tests/gpu/test_conv_epilogue_gpu.py runs them there);
here the ops get their definition on the CPU (a convolution, the add, a ReLU), so that the rewiring of every
argument is checked against the model."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

from pipeline.core.artifacts import ArtifactRecord
from pipeline.inputs.specs import RunnerSettings
from pipeline.recipe.loader import load
from pipeline.runners.base import NotRunnable
from pipeline.runners.pt2 import pt2_runners
from pipeline.stages.export_pt2 import conv_epilogue_for, fuse_program
from pipeline.toolchain.conv_epilogue import CONV_ADD_RELU, CONV_RELU, fold_batch_norms, fuse_conv_epilogues
from tests.zoo.models import ResNet

TINY = Path(__file__).resolve().parents[2] / "recipes" / "tiny.yaml"
BATCH = ({0: torch.export.Dim("batch", min=1, max=8)},)


@pytest.fixture(scope="module")
def cpu_definitions() -> Iterator[None]:
    """cuDNN's fused ops as what they compute, on the CPU, for this module's tests only."""
    library = torch.library.Library("aten", "IMPL")
    conv = torch.nn.functional.conv2d
    library.impl("cudnn_convolution_relu", lambda x, w, b, *g: torch.relu(conv(x, w, b, *g)), "CPU")
    library.impl(
        "cudnn_convolution_add_relu", lambda x, w, z, a, b, *g: torch.relu(conv(x, w, b, *g) + a * z), "CPU"
    )
    yield
    library._destroy()


def _resnet() -> nn.Module:
    torch.manual_seed(0)
    return ResNet().eval().to(memory_format=torch.channels_last)


def _images(batch: int) -> torch.Tensor:
    return torch.randn(batch, 3, 64, 64).contiguous(memory_format=torch.channels_last)


def _targets(program: torch.export.ExportedProgram) -> list[object]:
    return [n.target for n in program.graph.nodes if n.op == "call_function"]


def test_a_channels_last_resnet_becomes_one_cudnn_call_per_convolution_and_relu(
    cpu_definitions: None,
) -> None:
    model, example = _resnet(), (_images(2),)
    with torch.no_grad():
        program = torch.export.export(model, example, dynamic_shapes=BATCH, strict=False)
        fused, details = fuse_program(program, example, BATCH, projections=False, gelu=False, conv=True)
    targets = _targets(fused)
    # the stem, and per block its first two convolutions and the third with the residual add
    assert details == {"conv_epilogues": 13}
    assert targets.count(CONV_RELU) == 9 and targets.count(CONV_ADD_RELU) == 4
    assert torch.ops.aten.batch_norm.default not in targets  # all folded, the downsample's too
    assert targets.count(torch.ops.aten.conv2d.default) == 4  # the downsamples: no ReLU follows them
    assert len(fused.state_dict) < len(program.state_dict) / 2  # the replaced weights and statistics are gone
    images = _images(5)  # another batch than the export's
    with torch.no_grad():
        got, want = fused.module()(images), model(images)
    assert torch.allclose(got, want, atol=1e-4), (got - want).abs().max()


class Corners(nn.Module):
    """Convolutions the pass must leave as they are, beside one it takes."""

    def __init__(self) -> None:
        super().__init__()
        self.taken = nn.Conv2d(4, 4, 3, padding=1)
        self.shared = nn.Conv2d(4, 4, 3, padding=1)  # read by the ReLU and by the output
        self.scaled = nn.Conv2d(4, 4, 1)  # added with alpha 2
        self.broadcast = nn.Conv2d(4, 4, 1)  # added to a per-channel vector: not a residual of its shape
        self.depthwise = nn.Conv2d(4, 4, 3, padding=1, groups=4)  # grouped: not measured, left as it is

    def forward(self, x: torch.Tensor, channel: torch.Tensor) -> torch.Tensor:
        shared = self.shared(x)
        y = torch.relu(self.taken(x)) + torch.relu(shared) + shared
        y = y + torch.relu(torch.add(self.scaled(x), x, alpha=2))
        y = y + torch.relu(self.depthwise(x))
        return y + torch.relu(self.broadcast(x) + channel.reshape(1, 4, 1, 1))


def test_only_a_convolution_read_by_its_relu_or_residual_alone_is_rewritten(cpu_definitions: None) -> None:
    torch.manual_seed(0)
    model = Corners().eval().to(memory_format=torch.channels_last)
    example = (torch.randn(2, 4, 8, 8).contiguous(memory_format=torch.channels_last), torch.randn(4))
    module = torch.export.export(model, example, dynamic_shapes=(BATCH[0], None), strict=False).module()
    assert fuse_conv_epilogues(module) == 1
    assert [n.target for n in module.graph.nodes].count(torch.ops.aten.conv2d.default) == 4
    with torch.no_grad():
        assert torch.allclose(module(*example), model(*example), atol=1e-5)


class ComputedScale(nn.Module):
    """A batch norm whose scale is computed in forward: folding only its stored tensors would drop it."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.norm = nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        norm = self.norm
        scaled = nn.functional.batch_norm(
            self.conv(x),
            norm.running_mean,
            norm.running_var,
            norm.weight * 2,
            norm.bias,
            False,
            0.1,
            norm.eps,
        )
        return torch.relu(scaled)


class WrittenBetween(nn.Module):
    """The convolution's input is written in place before the ReLU: fused at the ReLU, the convolution would
    read it changed."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x * 1
        y = self.conv(h)
        h.mul_(2)
        return torch.relu(y) + h


class SelfResidual(nn.Module):
    """A convolution added to itself: the same node as convolution and residual."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        return torch.relu(y + y)


@pytest.mark.parametrize("model", [ComputedScale, WrittenBetween, SelfResidual])
def test_graphs_the_rewrite_would_change_keep_their_meaning(cpu_definitions: None, model: type) -> None:
    torch.manual_seed(0)
    module_in = model().eval().to(memory_format=torch.channels_last)
    example = (torch.randn(2, 4, 8, 8).contiguous(memory_format=torch.channels_last),)
    module = torch.export.export(module_in, example, dynamic_shapes=BATCH, strict=False).module()
    assert fuse_conv_epilogues(module) == 0
    x = torch.randn(3, 4, 8, 8).contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        assert torch.allclose(module(x), module_in(x), atol=1e-5)


def test_a_contiguous_program_keeps_its_convolutions_with_batch_norm_folded() -> None:
    """cuDNN's fused call writes channels-last; an NCHW program would pay a layout change around each one."""
    torch.manual_seed(0)
    model = ResNet().eval()
    example = (torch.randn(2, 3, 64, 64),)
    module = torch.export.export(model, example, dynamic_shapes=BATCH, strict=False).module()
    assert fuse_conv_epilogues(module) == 0
    targets = [n.target for n in module.graph.nodes]
    assert torch.ops.aten.batch_norm.default not in targets and CONV_RELU not in targets
    images = torch.randn(3, 3, 64, 64)
    with torch.no_grad():
        assert torch.allclose(module(images), model(images), atol=1e-4)


def test_a_batch_norm_in_training_mode_or_after_another_op_is_not_folded() -> None:
    norm_after_relu = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.BatchNorm2d(4)).eval()
    module = torch.export.export(norm_after_relu, (torch.randn(2, 3, 8, 8),)).module()
    assert fold_batch_norms(module) == 0


def test_only_fp16_programs_compiled_for_a_gpu_take_it_and_a_cpu_host_says_why_it_cannot_run_one(
    tmp_path: Path,
) -> None:
    recipe = load(TINY, []).recipe
    for precision, asked in [("fp16", True), ("fp8", True), ("bf16", False), ("fp32", False)]:
        assert conv_epilogue_for(recipe, precision) is asked, precision
    assert not conv_epilogue_for(load(TINY, ["export.pt2.conv_epilogue=false"]).recipe, "fp16")
    if torch.cuda.is_available():
        return
    artifact = ArtifactRecord(
        name="exported-fp16",
        path=tmp_path / "model.exported.fp16.pt2",
        kind="exported",
        precision="fp16",
        sha256="",
        stage="export_pt2_fp16",
        details={"conv_epilogues": 13},
    )
    refused = pt2_runners(artifact, RunnerSettings.from_recipe(recipe))
    assert isinstance(refused, NotRunnable)
    assert (
        "13 convolutions are cuDNN's fused kernels" in refused.reason and "no CUDA GPU here" in refused.reason
    )


def test_a_contiguous_weight_on_a_channels_last_input_gets_a_channels_last_copy(
    cpu_definitions: None,
) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), nn.ReLU()).eval()  # its weight stays contiguous
    example = (torch.randn(2, 4, 8, 8).contiguous(memory_format=torch.channels_last),)
    module = torch.export.export(model, example, dynamic_shapes=BATCH, strict=False).module()
    assert fuse_conv_epilogues(module) == 1
    call = next(n for n in module.graph.nodes if n.target == CONV_RELU)
    weight = getattr(module, call.args[1].target)
    assert weight.is_contiguous(memory_format=torch.channels_last) and not weight.is_contiguous()
    with torch.no_grad():
        assert torch.allclose(module(*example), model(*example), atol=1e-5)
