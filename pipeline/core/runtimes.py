"""What a runtime is, declared once by the runner module that provides it (pipeline/runners/registry.py
collects them). Everything else asks a descriptor, never the runtime's name: whether it computes on a GPU,
which I/O modes it has, how simple it is to operate, what it needs installed, and which timed twin makes it
not worth timing by default."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

Device = Literal["cpu", "cuda"]


@dataclass(frozen=True)
class Twin:
    """The timed pair that makes another not worth timing by default."""

    name: str  # a runtime of the same artifact, or "<artifact> on <runtime>"
    every_io: bool  # left out in both I/O modes (the twin has host-I/O rows of its own), else device I/O only
    why: str = ""


@dataclass(frozen=True)
class Runtime:
    """One way of running an artifact, as validation, the benchmark, selection and the reports see it.

    `mode_twins` are faster modes of the same artifact (a CUDA-graph capture, a torch.compile mode): when one
    is timed, this runtime's device-I/O rows are left out by default (a mode has no host-I/O rows, so the
    host-I/O rows stay). `artifact_twins` maps an artifact to other artifacts that, timed on this same
    runtime, leave it out in every I/O mode, with `twin_why` for the reports. Both are defaults a recipe
    overrides by listing the runtime under benchmark.runtimes or selection.runtimes. An `opt_in` runtime is
    timed (and so validated) only where the recipe lists it there: a second runtime for the same graphs, whose
    failure on a graph it cannot run must not fail that graph's sign-off by default."""

    name: str
    device: Device
    io: tuple[str, ...] = ("host",)  # host: host arrays in and out; device: inputs and outputs on the GPU
    tier: int = 2  # simplicity, simplest first: 0 the CPU, 1 a GPU device, 2 compilers and CUDA graphs
    package: str = ""  # the Python module it imports: pre-flight checks a listed CPU runtime has it
    install: str = ""  # how to install that module, for the error that says it is missing
    opt_in: bool = False
    mode_twins: tuple[str, ...] = ()
    padded_twin: str = ""  # a CPU runtime's padding-aware mode: see bench/hosts.py, left_for_padding
    # a CUDA-graph mode that captures another shape within its loaded model in milliseconds: under load, requests
    # are padded to a few bucket shapes, each captured before the run (pipeline/stages/load.py)
    graphs_under_load: bool = False
    artifact_twins: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: MappingProxyType({}))
    twin_why: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def on_gpu(self) -> bool:
        return self.device == "cuda"

    def faster_twin(self, artifact: str, pairs: Collection[tuple[str, str]]) -> Twin | None:
        """The timed twin that makes (artifact, this runtime) not worth timing by default, if any; `pairs`
        are the (artifact, runtime) pairs this host has."""
        others = {r for a, r in pairs if a == artifact} - {self.name}
        found = next((t for t in self.mode_twins if t in others), None)
        if found:
            return Twin(found, every_io=False)
        better = next((a for a in self.artifact_twins.get(artifact, ()) if (a, self.name) in pairs), None)
        if better:
            return Twin(f"{better} on {self.name}", every_io=True, why=self.twin_why.get(artifact, ""))
        return None
