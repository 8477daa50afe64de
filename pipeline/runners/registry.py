"""Which runners can load an artifact on this machine, by artifact kind (an explicit dict literal).

Validation and benchmark both ask here, so that they run every artifact the same way. An artifact this
machine cannot run comes back as NotRunnable with the reason, for the reports' not_run lists.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING

from pipeline.runners.base import NotRunnable, Runner
from pipeline.runners.torch_runner import reference_runners as _torch_reference_runners

if TYPE_CHECKING:
    from pipeline.artifacts import ArtifactRecord
    from pipeline.models import LoadedModel
    from pipeline.specs import RunnerSettings

RunnerFactory = Callable[["ArtifactRecord", "RunnerSettings"], "list[Runner] | NotRunnable"]


def _torchscript(artifact: ArtifactRecord, settings: RunnerSettings) -> list[Runner] | NotRunnable:
    from pipeline.runners.torch_runner import torchscript_runners

    return list(torchscript_runners(artifact, settings))


def _onnx(artifact: ArtifactRecord, settings: RunnerSettings) -> list[Runner] | NotRunnable:
    try:
        from pipeline.runners.onnxruntime_runner import onnx_runners
        from pipeline.runners.ort_cuda_graph import graph_runners

        return [*onnx_runners(artifact, settings), *graph_runners(artifact, settings)]
    except ImportError as exc:
        return NotRunnable(artifact.name, str(exc))


def _exported(artifact: ArtifactRecord, settings: RunnerSettings) -> list[Runner] | NotRunnable:
    from pipeline.runners.pt2 import exported_runners

    return list(exported_runners(artifact, settings))


def _aoti(artifact: ArtifactRecord, settings: RunnerSettings) -> list[Runner] | NotRunnable:
    from pipeline.runners.pt2 import aoti_runners

    found = aoti_runners(artifact, settings)
    return found if isinstance(found, NotRunnable) else list(found)


def _engine(artifact: ArtifactRecord, settings: RunnerSettings) -> list[Runner] | NotRunnable:
    """TensorRT engines live in pipeline.runners.tensorrt, imported only when an engine is asked for."""
    try:
        module = importlib.import_module("pipeline.runners.tensorrt")
    except ModuleNotFoundError as exc:
        if exc.name != "pipeline.runners.tensorrt":
            raise
        return NotRunnable(
            artifact.name, "no TensorRT runner in this installation (pipeline.runners.tensorrt is missing)"
        )
    return module.runners_for_engine(artifact, settings)


RUNNERS: dict[str, RunnerFactory] = {
    "torchscript": _torchscript,
    "onnx": _onnx,
    "engine": _engine,
    "exported": _exported,  # torch.export ExportedProgram (.pt2)
    "aoti": _aoti,  # AOTInductor package (.pt2), compiled for one device
}


def runners_for(artifact: ArtifactRecord, settings: RunnerSettings) -> list[Runner] | NotRunnable:
    """Every way this machine can run the artifact (host-I/O CPU runner first), or why it cannot."""
    factory = RUNNERS.get(artifact.kind)
    if factory is None:
        return NotRunnable(
            artifact.name, f"no runner for artifact kind '{artifact.kind}' (known: {', '.join(RUNNERS)})"
        )
    runners = factory(artifact, settings)
    if isinstance(runners, list) and not runners:
        return NotRunnable(artifact.name, f"no runtime for a {artifact.kind} artifact on this machine")
    return runners


def declined_runtimes(artifact: ArtifactRecord, settings: RunnerSettings) -> dict[str, str]:
    """Runtimes this machine has but does not offer for the artifact, with why (the reports say so)."""
    if artifact.kind != "onnx":
        return {}
    try:
        from pipeline.runners.onnxruntime_runner import cuda_declined

        reason = cuda_declined(artifact.path, settings)
    except ImportError:  # no onnxruntime: runners_for says so
        return {}
    return {"onnxruntime-cuda": reason} if reason else {}


def reference_runners(settings: RunnerSettings, model: Callable[[], LoadedModel]) -> list[Runner]:
    """The eager FP32 PyTorch model (artifact name torch-fp32) from a model loader: CPU, and CUDA where
    available."""
    return list(_torch_reference_runners(settings, model))


def runtime_environment() -> dict[str, object]:
    """Which runtimes this machine offers: validation and benchmark results depend on it, so it belongs in
    their fingerprints (a GPU appearing makes engines runnable and adds CUDA rows)."""
    import onnxruntime

    from pipeline.trt.flavour import installed_flavours

    gpu = None
    try:
        import torch

        if torch.cuda.is_available():
            gpu = torch.cuda.get_device_name(0)
    except Exception:  # noqa: BLE001 - a broken CUDA setup reads as no GPU
        gpu = None
    return {
        "gpu": gpu,
        "onnxruntime_providers": sorted(onnxruntime.get_available_providers()),
        "tensorrt_flavours": installed_flavours(),
    }
