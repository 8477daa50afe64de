"""cuDNN's fused convolutions (pipeline/toolchain/conv_epilogue.py) on a GPU: a channels-last FP16 CNN exported
on the CPU as the stage does, rewritten, saved and loaded, computes what the FP32 model does with cuDNN's own
kernels. Their AOTInductor package is checked by a deploy (scripts/gpu_zoo.sh: ResNet-50 validated on
torch-aoti-cuda-graph), since a package of this test's program, fused or not, crashed the process that loaded
it on an H100 (docs/gpu.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pipeline.runners.loaders import ExportedProgramFromPath
from pipeline.stages.export_pt2 import fuse_program
from pipeline.toolchain.conv_epilogue import CONV_ADD_RELU, CONV_RELU
from tests.zoo.models import ResNet

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
BATCH = ({0: torch.export.Dim("batch", min=1, max=16)},)


class HalfInside(torch.nn.Module):
    """FP32 in and out, FP16 channels-last inside, as the export stage wraps a model (KeepIoTypes)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model.half().to(memory_format=torch.channels_last)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x.half().contiguous(memory_format=torch.channels_last)).float()


def _cosine(got: torch.Tensor, want: torch.Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(got.float().cpu(), want.float().cpu(), dim=1).min())


def test_fused_program_matches_the_model_on_cudnns_kernels(tmp_path: Path) -> None:
    torch.manual_seed(0)
    reference = ResNet().eval()
    half = HalfInside(ResNet().eval())
    half.model.load_state_dict(reference.state_dict())
    example = (torch.randn(2, 3, 64, 64),)
    with torch.no_grad():
        program = torch.export.export(half, example, dynamic_shapes=BATCH, strict=False)
        fused, details = fuse_program(program, example, BATCH, projections=False, gelu=False, conv=True)
    assert details == {"conv_epilogues": 13}, details
    assert sum(n.target in (CONV_RELU, CONV_ADD_RELU) for n in fused.graph.nodes) == 13
    path = tmp_path / "model.exported.fp16.pt2"
    torch.export.save(fused, str(path))
    images = torch.randn(5, 3, 64, 64)
    with torch.no_grad():
        want = reference(images)
        eager = ExportedProgramFromPath(path, "cuda")()(images.cuda())
    assert _cosine(eager, want) > 0.999
