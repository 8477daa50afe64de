"""What this machine has, probed once per process: a CUDA GPU, ONNX Runtime's execution providers. Every
"is there a GPU" question is asked here, so that a broken CUDA setup reads the same (as no GPU) everywhere and
a test can stand in for a GPU host by replacing one function. Each library is imported only when a question
needs it (importing ONNX Runtime writes a session file into the temp folder: a deploy asks once its own temp
folder is set)."""

from __future__ import annotations

import functools
import os
from pathlib import Path


def has_cuda() -> bool:
    """Whether torch can compute on a CUDA GPU here."""
    return _torch_cuda()[0]


def gpu_name() -> str | None:
    """The first CUDA GPU's name, None without one."""
    return _torch_cuda()[1]


def gpu_names() -> list[str]:
    """Every CUDA GPU's name, in torch's order ([] without one)."""
    if not has_cuda():
        return []
    import torch

    return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]


def has_ort_provider(provider: str) -> bool:
    """The provider is built into ONNX Runtime and a GPU is present where it needs one (onnxruntime-gpu lists
    its CUDA provider on GPU-less hosts too)."""
    if provider not in ort_providers():
        return False
    return (
        provider == "CPUExecutionProvider" or has_cuda() or (gpus_visible() and Path("/dev/nvidia0").exists())
    )


def gpus_visible() -> bool:
    """False where CUDA_VISIBLE_DEVICES hides every GPU (empty, or -1): a CPU target's deploy on a GPU node
    must not time a GPU provider because the device file exists."""
    hidden = os.environ.get("CUDA_VISIBLE_DEVICES")
    return hidden is None or hidden.strip() not in ("", "-1")


@functools.cache
def _torch_cuda() -> tuple[bool, str | None]:
    try:
        import torch
    except ImportError:
        return False, None
    try:
        if torch.cuda.is_available():
            return True, torch.cuda.get_device_name(0)
    except Exception:  # noqa: BLE001 - a broken CUDA setup reads as no GPU
        pass
    return False, None


@functools.cache
def ort_providers() -> tuple[str, ...]:
    """ONNX Runtime's execution providers, () without ONNX Runtime."""
    try:
        import onnxruntime
    except ImportError:
        return ()
    return tuple(onnxruntime.get_available_providers())


@functools.cache
def x86_without_vnni() -> bool:
    """An x86 CPU with AVX2 but no VNNI (neither AVX512-VNNI nor AVX-VNNI): there ONNX Runtime's 8-bit
    GEMMs multiply through an instruction whose 16-bit sums saturate, so an INT8 graph can lose accuracy
    only on such a CPU and only with the runtime's fused 8-bit kernels. False where it cannot be told."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            flags = next((line.split(":", 1)[1].split() for line in handle if line.startswith("flags")), [])
    except OSError:
        return False
    return "avx2" in flags and not {"avx512_vnni", "avx_vnni"} & set(flags)
