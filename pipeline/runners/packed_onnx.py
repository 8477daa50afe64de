"""Packed ONNX graphs on ONNX Runtime (`onnxruntime-cpu-packed`, `onnxruntime-cuda-packed`): the recipe's padded
feeds are packed (pipeline/core/packing.py) and run through one session, whose outputs are already in the
padded layout.

With host I/O a batch is packed on every call, as a server packs each batch it forms: the packing is part of
the timed call. With device I/O (CUDA) the inputs are packed once, when they are staged on the GPU, as they are
copied there once: a server packs the next batch on the host while the GPU runs this one. The CUDA placement
probe (pipeline/runners/ort_placement.py) feeds the recipe's shapes, which a packed graph does not take, so the
CUDA provider is offered for packed graphs without it: the graph is gathers, matrix products and elementwise
float nodes, each with a CUDA kernel.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pipeline.core.packing import Packing, run_details
from pipeline.core.runtimes import Runtime
from pipeline.runners.base import Family, Feeds, NotRunnable, Runner
from pipeline.runners.loaders import SessionFromPath
from pipeline.runners.onnxruntime_runner import OnnxRuntimeRunner, cuda_provider_available
from pipeline.runners.ort_session import CPU_PROVIDER, CUDA_PROVIDER, load_onnxruntime, session_options
from pipeline.toolchain.ort_recurrent import recurrent_ops

if TYPE_CHECKING:
    from pipeline.core.artifacts import ArtifactRecord
    from pipeline.inputs.specs import RunnerSettings

KIND = "onnx-packed"


class PackedOnnxRunner(OnnxRuntimeRunner):
    """An ONNX Runtime session of a packed graph behind the recipe's padded feeds."""

    def __init__(
        self,
        artifact: str,
        load: SessionFromPath,
        recipe_outputs: list[str],
        packing: Packing,
        provider: str = CPU_PROVIDER,
        io: str = "host",
    ):
        super().__init__(artifact, load, recipe_outputs, provider, io)
        self.runtime += "-packed"
        self.packing = packing
        self._padded: Feeds | None = None

    def _feeds(self, feeds: Feeds) -> Feeds:
        return super()._feeds(self.packing.pack(feeds))

    def prepare_impl(self, feeds: Feeds) -> None:
        super().prepare_impl(feeds)
        self._padded = feeds
        self.details["packing"] = run_details(self.packing, feeds, self.io)

    def infer_prepared_impl(self) -> None:
        if self.io == "host":
            assert self._padded is not None
            self._session.run(None, self._feeds(self._padded))
            return
        super().infer_prepared_impl()

    def deactivate_impl(self) -> None:
        super().deactivate_impl()
        self._padded = None


def packed_runners(artifact: ArtifactRecord, settings: RunnerSettings) -> list[Runner] | NotRunnable:
    """CPU always; CUDA with host and device I/O where onnxruntime-gpu sees a GPU (and the graph has no recurrent
    nodes, toolchain/ort_recurrent.py)."""
    try:
        load_onnxruntime()
    except ImportError as exc:
        return NotRunnable(artifact.name, str(exc))
    found: Any = artifact.details.get("packing")
    if not isinstance(found, dict):
        return NotRunnable(artifact.name, "the packed graph's record does not say how its batches pack")
    packing = Packing.from_json(found)
    load, outputs = SessionFromPath(artifact.path, settings.threads, session_options), list(settings.outputs)
    runners: list[Runner] = [PackedOnnxRunner(artifact.name, load, outputs, packing)]
    if cuda_provider_available() and not recurrent_ops(artifact.path):
        runners += [
            PackedOnnxRunner(artifact.name, load, outputs, packing, CUDA_PROVIDER, "host"),
            PackedOnnxRunner(artifact.name, load, outputs, packing, CUDA_PROVIDER, "device"),
        ]
    return runners


RUNTIMES = (
    Runtime("onnxruntime-cpu-packed", "cpu", tier=1, package="onnxruntime"),
    Runtime("onnxruntime-cuda-packed", "cuda", ("host", "device"), tier=1, package="onnxruntime"),
)
FAMILY = Family(kinds=(KIND,), runtimes=RUNTIMES, runners=packed_runners)
