"""Which TensorRT builders are installed, and how to import one.

Two flavours: the datacenter `tensorrt` and `tensorrt-rtx`. The TensorRT-RTX wheels on PyPI install the module
`tensorrt_rtx_bindings`; the usual `tensorrt_rtx` name comes from a meta package that is not always installable,
so this module maps the name itself. Detection uses find_spec and distribution metadata only: importing a
flavour loads large native libraries and changes process-wide state, which belongs in the builder's child.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import sys
from importlib import metadata
from types import ModuleType

from pipeline.core import host
from pipeline.core.variants import ENGINE_FLAVOURS

FLAVOURS = ENGINE_FLAVOURS
# Module names to try, first match wins: the meta package's name, then the bindings' own.
MODULES = {"tensorrt": ("tensorrt",), "tensorrt-rtx": ("tensorrt_rtx", "tensorrt_rtx_bindings")}
INSTALL = {
    "tensorrt": "pip install 'deploy-pipeline[tensorrt]'",
    "tensorrt-rtx": "pip install 'deploy-pipeline[tensorrt-rtx]'",
}
DISPLAY = {"tensorrt": "TensorRT", "tensorrt-rtx": "TensorRT-RTX"}
# What TensorRT-RTX 1.7 can target ahead of time (its ComputeCapability enum); the child re-checks against the
# installed module, which is authoritative. Kept here so the parent can check a recipe without importing it.
RTX_COMPUTE_CAPABILITIES = ("sm75", "sm80", "sm86", "sm89", "sm120", "sm121")


def module_name(flavour: str) -> str | None:
    """The importable module of a flavour, or None when it is not installed."""
    for name in MODULES[flavour]:
        try:
            if importlib.util.find_spec(name) is not None:
                return name
        except (ImportError, ValueError):
            continue
    return None


def installed_flavours() -> list[str]:
    """Flavours whose Python module is importable, found without importing them."""
    return [f for f in FLAVOURS if module_name(f) is not None]


def resolve_flavour(setting: str) -> str | None:
    """'auto' picks the datacenter build when installed, else TensorRT-RTX, else None. An explicit name passes
    through whether installed or not: the recipe asked for it, and pre-flight reports when it is missing."""
    if setting == "auto":
        installed = installed_flavours()
        return installed[0] if installed else None
    if setting not in FLAVOURS:
        raise ValueError(f"unknown TensorRT flavour {setting!r} (expected auto, {', '.join(FLAVOURS)})")
    return setting


def import_trt(flavour: str) -> ModuleType:
    """Import a flavour's module (in the builder's child process, or a runner's process).

    For TensorRT-RTX the module is also registered as `tensorrt_rtx`, and Polygraphy is told to use it; both are
    process-wide, which is why builds run in a child per flavour.
    """
    name = module_name(flavour)
    if name is None:
        raise ImportError(f"{DISPLAY[flavour]} is not installed ({INSTALL[flavour]})")
    module = importlib.import_module(name)
    if flavour == "tensorrt-rtx":
        sys.modules.setdefault("tensorrt_rtx", module)
        if "polygraphy" not in sys.modules:
            os.environ["POLYGRAPHY_USE_TENSORRT_RTX"] = "1"
    return module


@functools.cache
def _distributions() -> dict[str, list[str]]:
    return metadata.packages_distributions()


def trt_version(flavour: str) -> str | None:
    """The installed version of a flavour's bindings, read from distribution metadata without importing them."""
    for name in MODULES[flavour]:
        for dist in _distributions().get(name, []):
            try:
                return metadata.version(dist)
            except metadata.PackageNotFoundError:
                continue
    return None


def local_compute_capability() -> str | None:
    """'sm90' for this machine's first CUDA GPU, None without one (torch is a core dependency)."""
    import torch

    if not host.has_cuda():
        return None
    return compute_capability_name(*torch.cuda.get_device_capability(0))


def compute_capability_name(major: int, minor: int) -> str:
    """(8, 9) -> 'sm89', the recipe's spelling."""
    return f"sm{major}{minor}"


def parse_compute_capability(name: str) -> tuple[int, int]:
    """'sm89' -> (8, 9); 'sm120' -> (12, 0)."""
    digits = name.removeprefix("sm")
    return int(digits[:-1]), int(digits[-1])
