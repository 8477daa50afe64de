"""Which runners can load an artifact on this machine, and every runtime there is.

Each runner module declares a module-level FAMILY (pipeline/runners/base.py: the artifact kinds it loads, its
Runtime descriptors, its runners): adding a runtime is adding one module here, and nothing else changes.
Validation and the benchmark both ask here, so that they run every artifact the same way. An artifact this
machine cannot run comes back as NotRunnable with the reason, for the reports' not_run lists.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from collections.abc import Callable
from typing import TYPE_CHECKING

import pipeline.runners
from pipeline.core import host
from pipeline.core.runtimes import Runtime
from pipeline.runners.base import Family, NotRunnable, Runner
from pipeline.runners.torch_runner import reference_runners as _torch_reference_runners

if TYPE_CHECKING:
    from pipeline.core.artifacts import ArtifactRecord
    from pipeline.inputs.models import LoadedModel
    from pipeline.inputs.specs import RunnerSettings


@functools.cache
def families() -> tuple[Family, ...]:
    """Every runner module's FAMILY, in module-name order (a module that is not a runner declares none)."""
    found = []
    for info in sorted(pkgutil.iter_modules(pipeline.runners.__path__), key=lambda i: i.name):
        family = getattr(importlib.import_module(f"pipeline.runners.{info.name}"), "FAMILY", None)
        if isinstance(family, Family):
            found.append(family)
    return tuple(found)


@functools.cache
def runtimes() -> dict[str, Runtime]:
    """Every declared runtime by name; a name declared twice is a bug of the runner modules."""
    table: dict[str, Runtime] = {}
    for family in families():
        for runtime in family.runtimes:
            if runtime.name in table:
                raise RuntimeError(f"runtime {runtime.name} is declared by two runner modules")
            table[runtime.name] = runtime
    return table


def runtime(name: str) -> Runtime:
    try:
        return runtimes()[name]
    except KeyError:
        raise KeyError(f"unknown runtime {name!r} (known: {', '.join(runtimes())})") from None


def on_gpu(name: str) -> bool:
    """Whether the runtime computes on a CUDA device; a name no runner declares (a stored record of another
    version) reads as not."""
    found = runtimes().get(name)
    return bool(found and found.on_gpu)


def tier(name: str) -> int:
    """The runtime's simplicity tier (pipeline/core/runtimes.py); an undeclared name is the least simple."""
    found = runtimes().get(name)
    return found.tier if found else 2


def kinds() -> tuple[str, ...]:
    return tuple(dict.fromkeys(k for family in families() for k in family.kinds))


def runners_for(artifact: ArtifactRecord, settings: RunnerSettings) -> list[Runner] | NotRunnable:
    """Every way this machine can run the artifact (CPU host-I/O runners first), or why it cannot."""
    loading = [f for f in families() if artifact.kind in f.kinds]
    if not loading:
        return NotRunnable(
            artifact.name,
            f"no runner in this installation loads a '{artifact.kind}' artifact (known: {', '.join(kinds())})",
        )
    runners: list[Runner] = []
    reasons: list[str] = []
    for family in loading:
        found = family.runners(artifact, settings)
        if isinstance(found, NotRunnable):
            reasons.append(found.reason)
        else:
            runners += found
    if not runners:
        why = "; ".join(reasons) or f"no runtime for a {artifact.kind} artifact on this machine"
        return NotRunnable(artifact.name, why)
    return sorted(runners, key=lambda r: (runtime(r.runtime).on_gpu, r.io != "host"))


def declined_runtimes(artifact: ArtifactRecord, settings: RunnerSettings) -> dict[str, str]:
    """Runtimes this machine has but does not offer for the artifact, with why (the reports say so)."""
    declined: dict[str, str] = {}
    for family in families():
        if artifact.kind in family.kinds and family.declined is not None:
            declined.update(family.declined(artifact, settings))
    return declined


def reference_runners(settings: RunnerSettings, model: Callable[[], LoadedModel]) -> list[Runner]:
    """The eager FP32 PyTorch model (artifact name torch-fp32) from a model loader: CPU, and CUDA where
    available."""
    return list(_torch_reference_runners(settings, model))


def runtime_environment() -> dict[str, object]:
    """Which runtimes this machine offers: validation and benchmark results depend on it, so it belongs in
    their fingerprints (a GPU appearing makes engines runnable and adds CUDA rows)."""
    from pipeline.toolchain.trt.flavour import installed_flavours

    return {
        "gpu": host.gpu_name(),
        "onnxruntime_providers": sorted(host.ort_providers()),
        "tensorrt_flavours": installed_flavours(),
    }
