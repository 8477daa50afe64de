"""One inference interface for every artifact kind; validation and benchmark share it. Runners never time.

Shaped like Polygraphy's runners: a runner is cheap to construct (it holds loaders, pipeline/runners/loaders.py,
not loaded models), `activate()` loads, `deactivate()` releases, and the base class guards the order:
activating an active runner, or running an inactive one, is a bug and raises."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from pipeline.core.runtimes import Runtime

if TYPE_CHECKING:
    from pipeline.core.artifacts import ArtifactRecord
    from pipeline.inputs.specs import RunnerSettings

Feeds = dict[str, np.ndarray]
CallProfile = tuple[float, list[tuple[str, float]]]  # (wall µs, [(operator, µs), ...])


class RunnerStateError(RuntimeError):
    """A runner was used out of order (activated twice, or run while inactive)."""


class Runner:
    """Loads one artifact for inference.

    infer() takes host numpy feeds and returns host numpy outputs by name (host I/O). A runner with
    io == "device" keeps inputs and outputs on the GPU: prepare(feeds) stages them once per shape, and
    infer_prepared() runs without copies; infer() still returns host arrays for validation. Subclasses
    implement the *_impl methods and synchronize().
    """

    artifact: str
    runtime: str  # torch-cpu | torchscript-cpu | onnxruntime-cpu | onnxruntime-cuda | tensorrt | ...
    io: str = "host"  # host | device
    cuda_graph: bool = False
    is_active: bool = False

    # ------------------------------------------------------------ the guarded interface

    def activate(self) -> None:
        """Load; a failed load releases what it had taken before the error goes on."""
        if self.is_active:
            raise RunnerStateError(f"{self.label}: activated twice")
        try:
            self.activate_impl()
        except BaseException:
            with contextlib.suppress(Exception):
                self.deactivate_impl()
            raise
        self.is_active = True

    def deactivate(self) -> None:
        """Release; a runner that is not active holds nothing, so this is then a no-op."""
        if not self.is_active:
            return
        try:
            self.deactivate_impl()
        finally:
            self.is_active = False

    def infer(self, feeds: Feeds) -> Feeds:
        self._require_active("infer")
        return self.infer_impl(feeds)

    def prepare(self, feeds: Feeds) -> None:
        self._require_active("prepare")
        self.prepare_impl(feeds)

    def infer_prepared(self) -> None:
        self._require_active("infer_prepared")
        self.infer_prepared_impl()

    def keep_graphs(self, count: int) -> None:
        """Hold at least `count` captured CUDA graphs at once (a server's bucket shapes); a runner without its
        own graph cache has nothing to keep."""

    @property
    def captures(self) -> int:
        """CUDA graphs captured in this activation (a runner without its own graph cache captures none)."""
        return 0

    def synchronize(self) -> None:
        return None

    def own_profile(self, calls: int) -> list[CallProfile] | None:
        """Per call: its wall time and each operator's time (µs), from the runtime's own profiler, for a CPU
        runtime whose kernels the PyTorch profiler cannot see (pipeline/bench/profile.py); None: it can."""
        return None

    @property
    def label(self) -> str:
        return f"{self.artifact} on {self.runtime} ({self.io} I/O)"

    def _require_active(self, what: str) -> None:
        if not self.is_active:
            raise RunnerStateError(f"{self.label}: {what} while not active (activate() first)")

    # ------------------------------------------------------------ what a runtime implements

    def activate_impl(self) -> None:
        raise NotImplementedError

    def deactivate_impl(self) -> None:
        raise NotImplementedError

    def infer_impl(self, feeds: Feeds) -> Feeds:
        raise NotImplementedError

    def prepare_impl(self, feeds: Feeds) -> None:
        raise NotImplementedError

    def infer_prepared_impl(self) -> None:
        raise NotImplementedError


@dataclass(frozen=True)
class NotRunnable:
    """Why an artifact cannot run on this machine (goes to the reports' not_run lists)."""

    artifact: str
    reason: str


RunnersOf = Callable[["ArtifactRecord", "RunnerSettings"], "list[Runner] | NotRunnable"]
DeclinedOf = Callable[["ArtifactRecord", "RunnerSettings"], "dict[str, str]"]


@dataclass(frozen=True)
class Family:
    """What one runner module brings, as its module-level FAMILY: the artifact kinds it loads, the runtimes it
    declares, every runner it offers for an artifact on this machine, and the runtimes it has here but does
    not offer for an artifact, with why (the reports say so). pipeline/runners/registry.py finds it; nothing
    else needs an edit for a new runtime."""

    kinds: tuple[str, ...]
    runtimes: tuple[Runtime, ...]
    runners: RunnersOf
    declined: DeclinedOf | None = None


def output_names(session_outputs: list[str], recipe_outputs: list[str]) -> dict[str, str]:
    """Session output name -> recipe output name: identity where the names match, else by position
    (an exporter may rename outputs); outputs beyond the recipe's keep their own names."""
    if set(recipe_outputs) <= set(session_outputs):
        return {name: name for name in session_outputs}
    return {
        name: recipe_outputs[i] if i < len(recipe_outputs) else name for i, name in enumerate(session_outputs)
    }
