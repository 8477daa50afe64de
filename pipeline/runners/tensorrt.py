"""Runner for TensorRT engines (both flavours): device buffers, a chosen optimization profile, execute_async_v3.

An engine runs only where its runtime is installed, on a GPU its flavour supports, of a compute capability it was
built for, with the TensorRT version that built it; otherwise the artifact is NotRunnable with the reason, and no
number is ever reported for it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from pipeline.check.results import EngineDetails
from pipeline.core.artifacts import ArtifactRecord
from pipeline.core.runtimes import Runtime
from pipeline.core.variants import parse
from pipeline.inputs.specs import RunnerSettings
from pipeline.runners.base import Family, Feeds, NotRunnable, Runner
from pipeline.toolchain.trt.flavour import (
    DISPLAY,
    INSTALL,
    RTX_COMPUTE_CAPABILITIES,
    import_trt,
    local_compute_capability,
    module_name,
    parse_compute_capability,
    trt_version,
)


def engine_details(artifact: ArtifactRecord) -> EngineDetails:
    """What the engine stage recorded about the build (pipeline/stages/tensorrt.py)."""
    return artifact.details  # type: ignore[return-value]


def engine_flavour(artifact: ArtifactRecord) -> str:
    """The flavour that built an engine: recorded in its details, else the one its name states."""
    return engine_details(artifact).get("flavour") or parse(artifact.name).flavour or "tensorrt"


def not_runnable_reason(
    flavour: str, built_for: list[str], built_with: str | None, gpu: str | None
) -> str | None:
    """Why an engine cannot run here (None when it can): GPU, flavour support, compute capability, version."""
    name = DISPLAY[flavour]
    if gpu is None:
        return f"no GPU: {name} engines need an NVIDIA GPU; not runnable on this host"
    targets = ", ".join(built_for) or "unknown"
    if flavour == "tensorrt-rtx" and gpu not in RTX_COMPUTE_CAPABILITIES:
        major, minor = parse_compute_capability(gpu)
        return f"{name} does not support compute capability {major}.{minor} (built for {targets}); not runnable on this host"
    if built_for and gpu not in built_for:
        return f"engine built for {targets}, this GPU is {gpu}; not runnable on this host"
    if module_name(flavour) is None:
        return f"no {name} runtime installed ({INSTALL[flavour]})"
    installed = trt_version(flavour)
    if built_with and installed and built_with != installed:
        return f"engine built with {name} {built_with}, this host has {installed} (engines are not portable across versions)"
    return None


def runners_for_engine(artifact: ArtifactRecord, settings: RunnerSettings) -> list[Runner] | NotRunnable:
    """A host-I/O and a device-I/O runner for the engine, or why it cannot run on this machine."""
    flavour, details = engine_flavour(artifact), engine_details(artifact)
    built_for = list(details.get("compute_capabilities") or [])
    reason = not_runnable_reason(flavour, built_for, details.get("trt_version"), local_compute_capability())
    if reason:
        return NotRunnable(artifact.name, reason)
    return [TensorRTRunner(artifact, flavour, "host"), TensorRTRunner(artifact, flavour, "device")]


class TensorRTRunner(Runner):
    """One engine on the first GPU. io=device: prepare() stages inputs once and infer_prepared() only executes;
    io=host: infer_prepared() also copies inputs in and outputs out on the engine's stream."""

    def __init__(self, artifact: ArtifactRecord, flavour: str, io: str):
        self.artifact, self.runtime, self.io = artifact.name, flavour, io
        self._path: Path = artifact.path
        self._key: tuple | None = None

    def activate_impl(self) -> None:
        import torch

        trt = import_trt(self.runtime)
        self._trt, self._torch = trt, torch
        self._logger = trt.Logger(trt.Logger.WARNING)
        self._engine = trt.Runtime(self._logger).deserialize_cuda_engine(self._path.read_bytes())
        if self._engine is None:
            raise RuntimeError(
                f"{self.artifact}: {DISPLAY[self.runtime]} could not deserialize {self._path.name}"
            )
        self._context = self._engine.create_execution_context()
        self._stream = torch.cuda.Stream()
        names = [self._engine.get_tensor_name(i) for i in range(self._engine.num_io_tensors)]
        self._inputs = [n for n in names if self._engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self._outputs = [n for n in names if n not in self._inputs]
        self._profile = 0

    def _dtype(self, name: str) -> Any:
        return self._torch.from_numpy(
            np.empty(0, self._trt.nptype(self._engine.get_tensor_dtype(name)))
        ).dtype

    def _choose_profile(self, shapes: dict[str, tuple[int, ...]]) -> int:
        """The first optimization profile whose min..max range holds every feed shape."""
        for p in range(self._engine.num_optimization_profiles):
            ranges = {n: self._engine.get_tensor_profile_shape(n, p) for n in self._inputs}
            if all(
                all(lo <= s <= hi for s, lo, hi in zip(shapes[n], r[0], r[2], strict=True))
                for n, r in ranges.items()
            ):
                return p
        raise ValueError(f"{self.artifact}: no optimization profile holds the shapes {shapes}")

    def _bind(self, feeds: Feeds) -> None:
        """Set shapes and (re)allocate device buffers when the feed shapes change."""
        shapes = {n: tuple(feeds[n].shape) for n in self._inputs}
        key = tuple(sorted(shapes.items()))
        if key == self._key:
            return
        profile = self._choose_profile(shapes)
        if profile != self._profile:
            self._context.set_optimization_profile_async(profile, self._stream.cuda_stream)
            self._profile = profile
        torch = self._torch
        self._buffers = {}
        for name in self._inputs:
            self._context.set_input_shape(name, shapes[name])
            self._buffers[name] = torch.empty(shapes[name], dtype=self._dtype(name), device="cuda")
        for name in self._outputs:
            shape = tuple(self._context.get_tensor_shape(name))
            self._buffers[name] = torch.empty(shape, dtype=self._dtype(name), device="cuda")
        for name, tensor in self._buffers.items():
            self._context.set_tensor_address(name, tensor.data_ptr())
        self._key = key

    def _upload(self, feeds: Feeds) -> None:
        with self._torch.cuda.stream(self._stream):
            for name in self._inputs:
                host = self._torch.from_numpy(np.ascontiguousarray(feeds[name]))
                self._buffers[name].copy_(host.to(self._buffers[name].dtype), non_blocking=True)

    def _execute(self) -> None:
        if not self._context.execute_async_v3(self._stream.cuda_stream):
            raise RuntimeError(f"{self.artifact}: execute_async_v3 failed")

    def _download(self) -> Feeds:
        with self._torch.cuda.stream(self._stream):
            out = {name: self._buffers[name].to("cpu", non_blocking=False) for name in self._outputs}
        self._stream.synchronize()
        return {name: t.numpy() for name, t in out.items()}

    def infer_impl(self, feeds: Feeds) -> Feeds:
        self._bind(feeds)
        self._upload(feeds)
        self._execute()
        return self._download()

    def prepare_impl(self, feeds: Feeds) -> None:
        self._bind(feeds)
        self._host_feeds = feeds
        self._upload(feeds)
        self._stream.synchronize()

    def infer_prepared_impl(self) -> None:
        if self.io == "host":
            self._upload(self._host_feeds)
            self._execute()
            self._download()
        else:
            self._execute()

    def synchronize(self) -> None:
        self._stream.synchronize()

    def deactivate_impl(self) -> None:
        for attr in ("_buffers", "_context", "_engine", "_stream"):
            self.__dict__.pop(attr, None)
        self._key = None
        if getattr(self, "_torch", None) is not None:
            self._torch.cuda.empty_cache()


# An engine's runtime is its flavour, on the GPU only
RUNTIMES = (
    Runtime("tensorrt", "cuda", ("host", "device"), package="tensorrt"),
    Runtime("tensorrt-rtx", "cuda", ("host", "device"), package="tensorrt_rtx_bindings"),
)
FAMILY = Family(kinds=("engine",), runtimes=RUNTIMES, runners=runners_for_engine)
