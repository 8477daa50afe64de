"""What the numbers were measured on (docs/benchmarking.md rule 7): library versions, CPU, GPU, host.

Every probe is optional and never fails: an absent library reads None, an unreadable device reads None,
so that capturing the environment can never be the reason a benchmark or sign-off breaks.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import platform
import shutil
import socket
import subprocess
from typing import Any

from pipeline.core.packages import package_version
from pipeline.runners.torch_cuda import CUDNN_BENCHMARK

# Distribution names per TensorRT flavour, looked up before importing anything (importing a TensorRT
# module loads native libraries that the build stage keeps to child processes).
TENSORRT_DISTRIBUTIONS = {
    "tensorrt": (
        "tensorrt",
        "tensorrt-cu13",
        "tensorrt-cu12",
        "tensorrt-cu13-bindings",
        "tensorrt-cu12-bindings",
    ),
    "tensorrt-rtx": ("tensorrt-rtx", "tensorrt-rtx-cu13-bindings", "tensorrt-rtx-cu12-bindings"),
}
TENSORRT_MODULES = {"tensorrt": "tensorrt", "tensorrt-rtx": "tensorrt_rtx_bindings"}


def capture_environment() -> dict[str, Any]:
    """One JSON-able dict: the manifest's "environment" and the source of speed.json's conditions."""
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "hostname": socket.gethostname(),
        "torch": _torch_info(),
        "onnx": package_version("onnx"),
        "onnxruntime": _onnxruntime_info(),
        "polygraphy": package_version("polygraphy"),
        "tensorrt": _tensorrt_info(),
        "numpy": package_version("numpy"),
        "cpu": _cpu_info(),
        "gpu": _gpu_info(),
    }


def _safe(probe: Any, default: Any = None) -> Any:
    try:
        return probe()
    except Exception:  # a probe that cannot read something reports nothing
        return default


def _torch_info() -> dict[str, Any] | None:
    if importlib.util.find_spec("torch") is None:
        return None
    import torch

    info: dict[str, Any] = {
        "version": torch.__version__,
        "cuda": torch.version.cuda,
        "threads": torch.get_num_threads(),
    }
    if _safe(torch.cuda.is_available, False):
        info["tf32_matmul"] = torch.backends.cuda.matmul.allow_tf32
        info["tf32_cudnn"] = torch.backends.cudnn.allow_tf32
        info["cudnn_benchmark"] = CUDNN_BENCHMARK  # what every torch runner on CUDA sets as it activates
    return info


def _onnxruntime_info() -> dict[str, Any] | None:
    def probe() -> dict[str, Any]:
        import onnxruntime

        return {
            "version": onnxruntime.__version__,
            "package": "onnxruntime-gpu" if package_version("onnxruntime-gpu") else "onnxruntime",
            "providers": list(onnxruntime.get_available_providers()),
        }

    return _safe(probe)


def _tensorrt_info() -> list[dict[str, Any]]:
    """Every TensorRT flavour present: its version from package metadata, else from the module itself."""
    found = []
    for flavour, distributions in TENSORRT_DISTRIBUTIONS.items():
        version = next((v for v in map(package_version, distributions) if v), None)
        module = TENSORRT_MODULES[flavour]
        if version is None and _safe(lambda m=module: importlib.util.find_spec(m)) is not None:
            version = _safe(lambda m=module: getattr(importlib.import_module(m), "__version__", "unknown"))
        if version is not None:
            found.append({"flavour": flavour, "version": version, "module": module})
    return found


def _cpu_info() -> dict[str, Any]:
    model = _safe(_cpu_model) or platform.processor() or None
    affinity = _safe(lambda: len(os.sched_getaffinity(0)))
    return {"model": model, "count": os.cpu_count(), "available": affinity, "machine": platform.machine()}


def _cpu_model() -> str | None:
    with open("/proc/cpuinfo", encoding="utf-8") as handle:
        for line in handle:
            if line.lower().startswith(("model name", "hardware", "cpu model")):
                return line.split(":", 1)[1].strip()
    return None


def _gpu_info() -> list[dict[str, Any]] | None:
    """GPUs from nvidia-smi (driver, clocks) merged with torch's view (CUDA runtime, capability)."""
    gpus = _safe(_nvidia_smi) or []
    torch_view = _safe(_torch_gpus) or []
    for i, entry in enumerate(torch_view):
        if i < len(gpus):
            gpus[i].update({k: v for k, v in entry.items() if k not in gpus[i]})
        else:
            gpus.append(entry)
    return gpus or None


NVIDIA_SMI_FIELDS = ("name", "driver_version", "memory.total", "clocks.sm", "clocks.max.sm", "clocks.mem")


def _nvidia_smi() -> list[dict[str, Any]]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    query = ",".join(NVIDIA_SMI_FIELDS)
    out = subprocess.run(
        [exe, f"--query-gpu={query}", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        timeout=15,
        check=True,
    ).stdout
    rows = []
    for line in out.strip().splitlines():
        values = [v.strip() for v in line.split(",")]
        rows.append(
            {key.replace(".", "_"): value for key, value in zip(NVIDIA_SMI_FIELDS, values, strict=False)}
        )
    return rows


def _torch_gpus() -> list[dict[str, Any]]:
    if importlib.util.find_spec("torch") is None:
        return []
    import torch

    if not torch.cuda.is_available():
        return []
    gpus = []
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        gpus.append(
            {
                "name": props.name,
                "compute_capability": f"{props.major}.{props.minor}",
                "memory_bytes": int(props.total_memory),
                "cuda_runtime": torch.version.cuda,
            }
        )
    return gpus
