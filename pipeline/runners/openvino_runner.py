"""OpenVINO on the CPU, for ONNX graphs of standard operators: FP32 graphs, and static Q/DQ INT8 graphs, which
OpenVINO reads as its own quantized form and runs with INT8 kernels (its INT8 path).

A compiled model is pinned like an ONNX Runtime session: the recipe's intra-op threads, one stream, the latency
hint, and FP32 inference precision, since the CPU plugin would otherwise compute in BF16 where the CPU has it,
which an FP32 tolerance is not meant to absorb. The runtime is opt-in (a recipe lists it under
benchmark.runtimes; on a CPU host selection.runtimes does too): it is a second runtime for graphs ONNX Runtime
already runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pipeline.core.packages import installed
from pipeline.core.runtimes import Runtime
from pipeline.core.variants import DYNAMIC, parse
from pipeline.runners.base import Family, Feeds, Runner, output_names

if TYPE_CHECKING:
    from pipeline.core.artifacts import ArtifactRecord
    from pipeline.inputs.specs import RunnerSettings

RUNTIME = "openvino-cpu"
INSTALL = "pip install 'deploy-pipeline[openvino]'"


def _openvino() -> Any:
    try:
        import openvino
    except ImportError:
        raise ImportError(f"openvino is not installed: {INSTALL}") from None
    return openvino


def why_not(artifact: ArtifactRecord) -> str | None:
    """Why OpenVINO is not offered for this graph, or None. Told from the variant (what the stage that made
    it puts in it), so that offering costs no read of the graph."""
    if artifact.precision not in ("fp32", "int8"):
        return f"OpenVINO is offered for FP32 and static Q/DQ INT8 graphs; this graph is {artifact.precision}"
    try:
        flavour = parse(artifact.name).flavour
    except ValueError:  # a name outside the grammar: a plain graph as far as can be told
        flavour = None
    if flavour == "optimized":
        return (
            "the graph holds ONNX Runtime's own fused operators (com.microsoft), which OpenVINO does not read"
        )
    if flavour in DYNAMIC:
        return "OpenVINO's INT8 path is static Q/DQ; this graph is quantized dynamically"
    return None


class OpenVinoRunner(Runner):
    """One compiled model and its infer request; host I/O (numpy in, numpy out, outputs copied)."""

    runtime = RUNTIME

    def __init__(self, artifact: str, path: Path, threads: int, recipe_outputs: list[str]):
        self.artifact, self.path, self.io = artifact, Path(path), "host"
        self._threads, self._recipe_outputs = threads, recipe_outputs
        self._compiled: Any = None
        self._request: Any = None
        self._inputs: dict[str, Any] = {}
        self._names: dict[str, str] = {}
        self._prepared: Feeds | None = None

    def activate_impl(self) -> None:
        ov = _openvino()
        config = {
            "INFERENCE_NUM_THREADS": self._threads,
            "NUM_STREAMS": 1,
            "PERFORMANCE_HINT": "LATENCY",
            "INFERENCE_PRECISION_HINT": "f32",
        }
        self._compiled = ov.Core().compile_model(str(self.path), "CPU", config)
        self._request = self._compiled.create_infer_request()
        self._inputs = {p.get_any_name(): p.get_element_type().to_dtype() for p in self._compiled.inputs}
        names = [p.get_any_name() for p in self._compiled.outputs]
        self._names = output_names(names, self._recipe_outputs)

    def deactivate_impl(self) -> None:
        self._compiled = self._request = self._prepared = None

    def infer_impl(self, feeds: Feeds) -> Feeds:
        result = self._request.infer(self._feeds(feeds))
        return {self._names[p.get_any_name()]: np.array(result[p]) for p in self._compiled.outputs}

    def prepare_impl(self, feeds: Feeds) -> None:
        self._prepared = self._feeds(feeds)

    def infer_prepared_impl(self) -> None:
        self._request.infer(self._prepared)

    def _feeds(self, feeds: Feeds) -> Feeds:
        missing = [name for name in self._inputs if name not in feeds]
        if missing:
            raise KeyError(f"{self.artifact}: the model needs input(s) {missing}, feeds have {sorted(feeds)}")
        return {name: np.ascontiguousarray(feeds[name], dtype=dtype) for name, dtype in self._inputs.items()}


def openvino_runners(artifact: ArtifactRecord, settings: RunnerSettings) -> list[Runner]:
    if not installed("openvino") or why_not(artifact) is not None:
        return []
    return [OpenVinoRunner(artifact.name, Path(artifact.path), settings.threads, list(settings.outputs))]


def openvino_declined(artifact: ArtifactRecord, settings: RunnerSettings) -> dict[str, str]:
    reason = why_not(artifact) if installed("openvino") else None
    return {RUNTIME: reason} if reason else {}


RUNTIMES = (Runtime(RUNTIME, "cpu", tier=1, package="openvino", install=INSTALL, opt_in=True),)
FAMILY = Family(kinds=("onnx",), runtimes=RUNTIMES, runners=openvino_runners, declined=openvino_declined)
