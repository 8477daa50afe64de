"""Lazy loaders, Polygraphy's way: cheap to construct, called once by a runner's activate(), and composable (a
module on a device from a model loader; a session from a path with the providers the runner picks). Runner
factories build them from an artifact's file; nothing is loaded until a runner is activated."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.toolchain.aoti import no_cpu_isa_probe

if TYPE_CHECKING:
    import torch

    from pipeline.inputs.models import LoadedModel


@dataclass(frozen=True)
class ModuleOnDevice:
    """The eager model from a model loader, in eval mode; off the CPU a copy is moved, so that the shared
    module stays on the CPU for every other user of the loader."""

    model: Callable[[], LoadedModel]
    device: str

    def __call__(self) -> torch.nn.Module:
        module = self.model().module.eval()
        return module if self.device == "cpu" else copy.deepcopy(module).to(self.device)


@dataclass(frozen=True)
class TorchScriptFromPath:
    path: Path
    device: str

    def __call__(self) -> torch.nn.Module:
        import torch

        return torch.jit.load(str(self.path), map_location=self.device).eval()


@dataclass(frozen=True)
class ExportedProgramFromPath:
    """An ExportedProgram's graph module on a device (moved with move_to_device_pass, which also rewrites the
    device arguments baked into the graph)."""

    path: Path
    device: str

    def __call__(self) -> Callable[..., Any]:
        import torch
        from torch.export.passes import move_to_device_pass

        from pipeline.toolchain.conv_epilogue import register_meta

        register_meta()  # a program with cuDNN's fused convolutions: torch.compile traces them through it
        program = torch.export.load(str(self.path))
        device = self.device
        if device != "cpu":
            program = move_to_device_pass(program, torch.device(device, 0) if device == "cuda" else device)
        return program.module()


@dataclass(frozen=True)
class AotiPackageFromPath:
    """An AOTInductor package compiled for `device`; `single_threaded` packages can be captured in CUDA
    graphs."""

    path: Path
    single_threaded: bool
    device: str

    def __call__(self) -> Callable[..., Any]:
        import torch

        with no_cpu_isa_probe(self.device):
            return torch._inductor.aoti_load_package(str(self.path), run_single_threaded=self.single_threaded)


@dataclass(frozen=True)
class SessionFromPath:
    """An ONNX Runtime session of a file with the pipeline's session options (`options(threads)`), on the
    providers the runner asks for when it activates (a CUDA provider may run on a stream the runner owns)."""

    path: Path
    threads: int
    options: Callable[[int], Any]

    def __call__(self, providers: list[Any]) -> Any:
        import onnxruntime

        return onnxruntime.InferenceSession(str(self.path), self.options(self.threads), providers=providers)
