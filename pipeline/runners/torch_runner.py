"""Runners for the eager PyTorch reference (torch-fp32) and for TorchScript artifacts.

Both feed the recipe's inputs positionally and name the returned tuple by the recipe's outputs. On the CPU
the intra-op thread count is pinned for the runner's active life (the same count ONNX Runtime gets), and
restored at deactivate(), so that every candidate runs with the same threads.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from pipeline.core import host
from pipeline.core.runtimes import Runtime
from pipeline.core.variants import REFERENCE
from pipeline.runners.base import Family, Feeds, Runner
from pipeline.runners.loaders import ModuleOnDevice, TorchScriptFromPath
from pipeline.runners.torch_cuda import autotune_convolutions

if TYPE_CHECKING:
    import torch

    from pipeline.core.artifacts import ArtifactRecord
    from pipeline.inputs.models import LoadedModel
    from pipeline.inputs.specs import RunnerSettings


class TorchRunner(Runner):
    """A torch.nn.Module (eager or TorchScript) on one device, run under torch.inference_mode().

    io "host": numpy in, numpy out, copies included. io "device" (CUDA only): prepare() stages the inputs on
    the GPU once and infer_prepared() leaves the outputs there; infer() still returns host arrays.
    """

    def __init__(
        self,
        artifact: str,
        runtime: str,
        load: Callable[[], torch.nn.Module],
        inputs: list[str],
        outputs: list[str],
        device: str = "cpu",
        io: str = "host",
        threads: int | None = None,
    ):
        self.artifact, self.runtime, self.io = artifact, runtime, io
        self.device = device
        self._load, self._inputs, self._outputs, self._threads = load, inputs, outputs, threads
        self._module: Any = None
        self._prepared: Any = None
        self._result: Any = None
        self._saved_threads: int | None = None
        self.cuda_stream: Any = None

    def activate_impl(self) -> None:
        import torch

        if self._threads and self.device == "cpu":
            self._saved_threads = torch.get_num_threads()
            torch.set_num_threads(self._threads)
        self._module = self._load()
        if self.device != "cpu":
            autotune_convolutions()
            self.cuda_stream = torch.cuda.current_stream(torch.device(self.device))

    def infer_impl(self, feeds: Feeds) -> Feeds:
        import torch

        with torch.inference_mode():
            result = self._module(*self._tensors(feeds))
        return self._named(result)

    def prepare_impl(self, feeds: Feeds) -> None:
        self._prepared = self._tensors(feeds) if self.io == "device" else feeds
        self.synchronize()

    def infer_prepared_impl(self) -> None:
        import torch

        if self.io != "device":
            self.infer(self._prepared)
            return
        with torch.inference_mode():
            self._result = self._module(*self._prepared)

    def synchronize(self) -> None:
        if self.device != "cpu":
            import torch

            torch.cuda.synchronize(torch.device(self.device))

    def deactivate_impl(self) -> None:
        import torch

        self._module = self._prepared = self._result = self.cuda_stream = None
        if self._saved_threads is not None:
            torch.set_num_threads(self._saved_threads)
            self._saved_threads = None

    def _tensors(self, feeds: Feeds) -> list[torch.Tensor]:
        import torch

        missing = [name for name in self._inputs if name not in feeds]
        if missing:
            raise KeyError(f"{self.artifact}: feeds lack input(s) {missing} (got {sorted(feeds)})")
        return [torch.from_numpy(np.ascontiguousarray(feeds[name])).to(self.device) for name in self._inputs]

    def _named(self, result: Any) -> Feeds:
        values = _flatten(result)
        if len(values) != len(self._outputs):
            raise ValueError(
                f"{self.artifact}: the module returned {len(values)} outputs, the recipe names {len(self._outputs)}"
            )
        return {name: value.detach().cpu().numpy() for name, value in zip(self._outputs, values, strict=True)}


def _flatten(result: Any) -> list[Any]:
    import torch

    if isinstance(result, torch.Tensor):
        return [result]
    if isinstance(result, dict):
        return list(result.values())
    return list(result)


def _device_variants(threads: int) -> list[tuple[str, str, str, int | None]]:
    """(suffix, device, io, threads): the CPU always; on CUDA both I/O modes (rule 3)."""
    variants: list[tuple[str, str, str, int | None]] = [("cpu", "cpu", "host", threads)]
    if host.has_cuda():
        variants += [("cuda", "cuda", "host", None), ("cuda", "cuda", "device", None)]
    return variants


def reference_runners(settings: RunnerSettings, model: Callable[[], LoadedModel]) -> list[TorchRunner]:
    """The eager FP32 PyTorch model, the reference every artifact is compared with and timed against."""
    inputs, outputs = settings.input_names, list(settings.outputs)
    return [
        TorchRunner(
            REFERENCE, f"torch-{suffix}", ModuleOnDevice(model, device), inputs, outputs, device, io, threads
        )
        for suffix, device, io, threads in _device_variants(settings.threads)
    ]


def torchscript_runners(artifact: ArtifactRecord, settings: RunnerSettings) -> list[TorchRunner]:
    """A TorchScript file (torch.jit.load) on the CPU and, where CUDA exists, on the GPU (from the trace made
    on the GPU, when the export stage made one: a CPU trace has CPU devices baked in)."""
    traces = artifact.details.get("devices") or {}
    inputs, outputs = settings.input_names, list(settings.outputs)

    def path(device: str):
        return artifact.path.parent / traces[device] if device in traces else artifact.path

    return [
        TorchRunner(
            artifact.name,
            f"torchscript-{suffix}",
            TorchScriptFromPath(path(device), device),
            inputs,
            outputs,
            device,
            io,
            threads,
        )
        for suffix, device, io, threads in _device_variants(settings.threads)
    ]


# torch-cpu and torch-cuda also run torch.export programs eagerly (pipeline/runners/pt2.py)
RUNTIMES = (
    Runtime("torch-cpu", "cpu", tier=0, package="torch"),
    Runtime(
        "torch-cuda",
        "cuda",
        ("host", "device"),
        tier=1,
        package="torch",
        # an ExportedProgram run eagerly: the same kernels as a torch.compile mode, with more launch overhead
        mode_twins=(
            "torch-compile-cuda",
            "torch-compile-cuda-max-autotune",
            "torch-compile-cuda-max-autotune-no-cudagraphs",
            "torch-compile-cuda-reduce-overhead",
        ),
    ),
    Runtime("torchscript-cpu", "cpu", tier=0, package="torch"),
    Runtime("torchscript-cuda", "cuda", ("host", "device"), tier=1, package="torch"),
)
FAMILY = Family(kinds=("torchscript",), runtimes=RUNTIMES, runners=torchscript_runners)
