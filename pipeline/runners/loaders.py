"""Lazy loaders, Polygraphy's way: cheap to construct, called once by a runner's activate(), and composable (a
module on a device from a model loader; a session from a path with the providers the runner picks). Runner
factories build them from an artifact's file; nothing is loaded until a runner is activated."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import onnx
    import torch

    from pipeline.models import LoadedModel


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

        program = torch.export.load(str(self.path))
        device = self.device
        if device != "cpu":
            program = move_to_device_pass(program, torch.device(device, 0) if device == "cuda" else device)
        return program.module()


@contextlib.contextmanager
def no_cpu_isa_probe(device: str) -> Iterator[None]:
    """Inductor's config for compiling or loading an AOTInductor package that runs on `device`: off the CPU,
    the CPU vector-ISA probe answers "none" without probing.

    Both the compile and the load ask Inductor which CPU vector ISA the machine has (for the wrapper's
    compile flags; to compare with what the package recorded). torch 2.11 answers by building and loading a
    test library per ISA, each load in a fresh Python that imports torch: 40-50 s on the H200 host at each
    compile and at the first load in a process, for a GPU package whose wrapper only launches GPU kernels.
    `cpp.vec_isa_ok=False` answers at once: the wrapper is built without SIMD flags (no CPU kernel to
    vectorize) and a load compares against the same answer the compile recorded. Inductor caches the answer
    for the rest of the process: the compile runs in a child of its own, and the deploy process compiles no
    CPU kernels with Inductor (CPU packages compile in their child and keep the probe: their kernels need the
    real ISA)."""
    if device == "cpu":
        yield
        return
    import torch._inductor.config as inductor_config

    with inductor_config.patch({"cpp.vec_isa_ok": False}):
        yield


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


@dataclass(frozen=True)
class OnnxFromPath:
    path: Path

    def __call__(self) -> onnx.ModelProto:
        from pipeline import onnx_tools

        return onnx_tools.load(self.path)
