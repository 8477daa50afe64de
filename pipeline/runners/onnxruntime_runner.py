"""ONNX Runtime runners: CPUExecutionProvider (io host) and, where present, CUDAExecutionProvider with host
I/O and with device I/O (IOBinding: inputs and outputs preallocated on the GPU once per shape). Where the recipe
configures `runtime.padding`, the CPU provider also runs padding-aware (`onnxruntime-cpu-bucketed`): each batch
split by real length and run trimmed (pipeline/runners/bucketing.py), so that real text, mostly padding at a
fixed length, costs its real tokens.

Sessions are pinned the same way for every ONNX artifact: intra-op threads from the recipe (default all
CPUs), one inter-op thread, sequential execution, every graph optimization.
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pipeline.core import host
from pipeline.core.runtimes import Runtime
from pipeline.runners.base import CallProfile, Family, Feeds, NotRunnable, Runner, output_names
from pipeline.runners.bucketing import Bucketing
from pipeline.runners.loaders import SessionFromPath
from pipeline.runners.ort_session import (
    CPU_PROVIDER,
    CUDA_OPTIONS,
    CUDA_PROVIDER,
    ORT_TYPES,
    layout_options,
    load_onnxruntime,
    session_options,
)

if TYPE_CHECKING:
    from pipeline.core.artifacts import ArtifactRecord
    from pipeline.inputs.specs import RunnerSettings


class OnnxRuntimeRunner(Runner):
    """One InferenceSession. infer() feeds only the inputs the session declares, cast to its dtypes."""

    def __init__(
        self,
        artifact: str,
        load: SessionFromPath,
        recipe_outputs: list[str],
        provider: str = CPU_PROVIDER,
        io: str = "host",
        bucketing: Bucketing | None = None,
        layout: dict[str, str] | None = None,
    ):
        if io == "device" and provider != CUDA_PROVIDER:
            raise ValueError("device I/O needs the CUDA execution provider")
        if bucketing is not None and (provider, io) != (CPU_PROVIDER, "host"):
            raise ValueError("padding-aware runs are offered on the CPU provider only")
        self.artifact, self.path, self.io = artifact, Path(load.path), io
        self.runtime = "onnxruntime-cuda" if provider == CUDA_PROVIDER else "onnxruntime-cpu"
        self.bucketing = bucketing
        self.layout = layout or {}  # the CUDA provider's layout option for this graph (layout_options)
        self.details: dict[str, Any] = (
            {"cuda_layout": "nhwc"} if self.layout and provider == CUDA_PROVIDER else {}
        )
        if bucketing is not None:
            self.runtime += "-bucketed"
        self._load, self._provider, self._recipe_outputs = load, provider, recipe_outputs
        self._session: Any = None
        self._inputs: dict[str, Any] = {}
        self._names: dict[str, str] = {}
        self._prepared: Any = None
        self._binding: Any = None
        self._device_values: list[Any] = []
        self.cuda_stream: Any = None

    # ------------------------------------------------------------ life cycle

    def activate_impl(self) -> None:
        load_onnxruntime()  # a clear error when it is not installed
        providers: list[Any] = [CPU_PROVIDER]
        if self._provider == CUDA_PROVIDER:
            providers = [(CUDA_PROVIDER, self._cuda_options()), CPU_PROVIDER]
        self._session = self._load(providers)
        if self._provider not in self._session.get_providers():
            raise RuntimeError(
                f"{self.artifact}: ONNX Runtime did not enable {self._provider} (got {self._session.get_providers()})"
            )
        self._inputs = {i.name: ORT_TYPES.get(i.type) for i in self._session.get_inputs()}
        self._names = output_names([o.name for o in self._session.get_outputs()], self._recipe_outputs)

    def deactivate_impl(self) -> None:
        self._session = self._prepared = self._binding = self.cuda_stream = None
        self._device_values = []

    # ------------------------------------------------------------ inference

    def infer_impl(self, feeds: Feeds) -> Feeds:
        if self.bucketing is not None:
            return self._bucketed(feeds)
        results = self._session.run(None, self._feeds(feeds))
        return {
            self._names[o.name]: value for o, value in zip(self._session.get_outputs(), results, strict=True)
        }

    def _bucketed(self, feeds: Feeds) -> Feeds:
        """One padded batch, group by group (Bucketing works on torch tensors: CPU ones share the arrays'
        memory, so no copy is made on the way in or out)."""
        import torch

        assert self.bucketing is not None
        names = self.bucketing.inputs  # every recipe input: the mask among them
        tensors = [torch.from_numpy(np.ascontiguousarray(feeds[name])) for name in names]
        by_recipe = {self._names[o.name]: o.name for o in self._session.get_outputs()}
        order = [by_recipe[name] for name in self.bucketing.outputs]

        def call(sub: list[torch.Tensor]) -> list[torch.Tensor]:
            group = {name: t.numpy() for name, t in zip(names, sub, strict=True)}
            return [torch.from_numpy(value) for value in self._session.run(order, self._feeds(group))]

        results = self.bucketing.run(tensors, call, contiguous=False)
        return {name: value.numpy() for name, value in zip(self.bucketing.outputs, results, strict=True)}

    def prepare_impl(self, feeds: Feeds) -> None:
        """Cast once (host I/O) or bind inputs and preallocated outputs on the GPU once (device I/O)."""
        host = self._feeds(feeds)
        if self.io != "device":
            self._prepared = host
            if self.bucketing is not None:  # the plan of this shape's batch, for the row (its real tokens)
                self._prepared = dict(feeds)  # cast per group
                self._bucketed(feeds)
                self.details["padding"] = dict(self.bucketing.last_plan or {})
            return
        ort = load_onnxruntime()
        shapes = self.infer(feeds)  # one untimed run tells the output shapes and dtypes at this shape
        binding = self._session.io_binding()
        self._device_values = []
        for name, array in host.items():
            value = ort.OrtValue.ortvalue_from_numpy(array, "cuda", 0)
            binding.bind_ortvalue_input(name, value)
            self._device_values.append(value)
        for output in self._session.get_outputs():
            out = shapes[self._names[output.name]]
            value = ort.OrtValue.ortvalue_from_shape_and_type(list(out.shape), out.dtype, "cuda", 0)
            binding.bind_ortvalue_output(output.name, value)
            self._device_values.append(value)
        binding.synchronize_inputs()
        self._binding = binding

    def infer_prepared_impl(self) -> None:
        if self.io == "device":
            self._session.run_with_iobinding(self._binding)
        elif self.bucketing is not None:
            self._bucketed(self._prepared)  # the plan is made on every call, as a server makes it
        else:
            self._session.run(None, self._prepared)

    def synchronize(self) -> None:
        if self._binding is not None:
            self._binding.synchronize_outputs()
        if self.cuda_stream is not None:
            self.cuda_stream.synchronize()

    def own_profile(self, calls: int) -> list[CallProfile] | None:
        """ONNX Runtime profiles a session from its creation only: a twin session of the same file, with the
        same options and the profiler on, stands in for this one for a warm call and `calls` profiled ones
        (on its bucketed path too), then this session is back."""
        if self._provider != CPU_PROVIDER or self.io != "host":
            return None  # the CUDA provider's kernels are the PyTorch profiler's
        timed = self._session
        with tempfile.TemporaryDirectory(prefix="pipeline-ort-profile-") as folder:

            def profiled(threads: int) -> Any:
                options = self._load.options(threads)
                options.enable_profiling = True
                options.profile_file_prefix = str(Path(folder) / "run")
                return options

            twin = dataclasses.replace(self._load, options=profiled)([CPU_PROVIDER])
            walls: list[float] = []
            try:
                self._session = twin
                self.infer_prepared_impl()
                for _ in range(calls):
                    started = time.perf_counter()
                    self.infer_prepared_impl()
                    walls.append((time.perf_counter() - started) * 1e6)
            finally:
                self._session = timed
            events = json.loads(Path(twin.end_profiling()).read_text())
        return _nodes_per_call(events, walls)

    # ------------------------------------------------------------ helpers

    def _feeds(self, feeds: Feeds) -> Feeds:
        missing = [name for name in self._inputs if name not in feeds]
        if missing:
            raise KeyError(
                f"{self.artifact}: the session needs input(s) {missing}, feeds have {sorted(feeds)}"
            )
        return {
            name: np.ascontiguousarray(feeds[name], dtype=dtype) if dtype is not None else feeds[name]
            for name, dtype in self._inputs.items()
        }

    def _cuda_options(self) -> dict[str, str]:
        """Run on a stream we own (when torch has CUDA) so that CUDA events can be recorded on it."""
        if not host.has_cuda():
            return {**CUDA_OPTIONS, **self.layout}
        import torch

        self.cuda_stream = torch.cuda.Stream()
        return {**CUDA_OPTIONS, **self.layout, "user_compute_stream": str(self.cuda_stream.cuda_stream)}


def _nodes_per_call(events: list[dict[str, Any]], walls: list[float]) -> list[CallProfile]:
    """The profiled calls (after one warm call) each with its nodes' (op type, µs), from ONNX Runtime's trace:
    a call is one session run, or a fixed number of them on the bucketed path."""
    runs = sorted((e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"), key=_ts)
    nodes = [e for e in events if e.get("cat") == "Node" and str(e.get("name", "")).endswith("_kernel_time")]
    per_call = len(runs) // (len(walls) + 1)
    if not walls or per_call == 0:
        return []
    out: list[CallProfile] = []
    for i, wall in enumerate(walls, start=1):
        mine = runs[i * per_call : (i + 1) * per_call]
        spans = [(r["ts"], r["ts"] + r["dur"]) for r in mine]
        ops = [
            (str(n.get("args", {}).get("op_name", "?")), float(n.get("dur", 0.0)))
            for n in nodes
            if any(start <= n["ts"] <= end for start, end in spans)
        ]
        out.append((wall, ops))
    return out


def _ts(event: dict[str, Any]) -> float:
    return float(event.get("ts", 0.0))


def cuda_provider_available() -> bool:
    """The CUDA provider is built in and a GPU is present (onnxruntime-gpu lists it on GPU-less hosts too)."""
    return host.has_ort_provider(CUDA_PROVIDER)


def cuda_declined(path: Path, settings: RunnerSettings) -> str | None:
    """Why the CUDA provider is not offered for the graph at `path` (recurrent nodes, toolchain/ort_recurrent.py;
    data nodes ONNX Runtime would run on the CPU, ort_placement.py), or None. The recurrent nodes are found
    before any session is made, since releasing one is what aborted."""
    from pipeline.runners.ort_placement import declined_reason, off_provider
    from pipeline.toolchain.ort_recurrent import recurrent_ops, recurrent_reason

    if not cuda_provider_available():
        return None
    recurrent = recurrent_ops(Path(path))
    if recurrent:
        return recurrent_reason(recurrent, load_onnxruntime().__version__)
    off = off_provider(Path(path), CUDA_PROVIDER, settings)
    return declined_reason(off, CUDA_PROVIDER, load_onnxruntime().__version__) if off else None


def onnx_runners(artifact: ArtifactRecord, settings: RunnerSettings) -> list[OnnxRuntimeRunner]:
    """CPU always; CUDA with host and device I/O where onnxruntime-gpu sees a GPU and runs the graph's data
    nodes on it (cuda_declined)."""
    load, outputs = SessionFromPath(artifact.path, settings.threads, session_options), list(settings.outputs)
    runners = [OnnxRuntimeRunner(artifact.name, load, outputs)]
    if settings.runtime.padding is not None and not host.has_cuda():
        bucketing = Bucketing(settings.runtime.padding, settings, "cpu")
        runners.append(OnnxRuntimeRunner(artifact.name, load, outputs, bucketing=bucketing))
    if cuda_provider_available() and cuda_declined(artifact.path, settings) is None:
        layout = layout_options(artifact.path, artifact.precision)
        runners += [
            OnnxRuntimeRunner(artifact.name, load, outputs, CUDA_PROVIDER, "host", layout=layout),
            OnnxRuntimeRunner(artifact.name, load, outputs, CUDA_PROVIDER, "device", layout=layout),
        ]
    return runners


def ort_runners(artifact: ArtifactRecord, settings: RunnerSettings) -> list[Runner] | NotRunnable:
    try:
        load_onnxruntime()  # not installed: not runnable, with the pip command
        return list(onnx_runners(artifact, settings))
    except ImportError as exc:
        return NotRunnable(artifact.name, str(exc))


def ort_declined(artifact: ArtifactRecord, settings: RunnerSettings) -> dict[str, str]:
    try:
        reason = cuda_declined(artifact.path, settings)
    except ImportError:  # no onnxruntime: ort_runners says so
        return {}
    return {"onnxruntime-cuda": reason} if reason else {}


# An ONNX graph -> the graphs (first found wins) that, timed on the same CUDA runtime, make it not worth
# timing there by default: ONNX Runtime's own fusions of a plain graph at the same precision; for the static
# Q/DQ INT8 graph (built for TensorRT), its float graph, since ONNX Runtime fuses Q/DQ MatMuls into INT8
# kernels for its CPU provider only. Measured on the H200 (docs/benchmarking.md, "Faster twins").
CUDA_TWINS = {
    "onnx-fp32": ("onnx-optimized-fp32",),
    "onnx-fp16": ("onnx-optimized-fp16",),
    "onnx-int8": ("onnx-optimized-fp32", "onnx-fp32"),
}
CUDA_TWIN_WHY = {
    "onnx-fp32": "the same graph without ONNX Runtime's fusions",
    "onnx-fp16": "the same graph without ONNX Runtime's fusions",
    "onnx-int8": "ONNX Runtime fuses Q/DQ MatMuls into INT8 kernels for its CPU provider only: the CUDA provider "
    "dequantizes and multiplies in float",
}
RUNTIMES = (
    Runtime(
        "onnxruntime-cpu",
        "cpu",
        tier=0,
        package="onnxruntime",
        install="pip install 'deploy-pipeline[cpu]'",
        padded_twin="onnxruntime-cpu-bucketed",
    ),
    Runtime("onnxruntime-cpu-bucketed", "cpu", tier=1, package="onnxruntime"),  # a batch split by real length
    Runtime(
        "onnxruntime-cuda",
        "cuda",
        ("host", "device"),
        tier=1,
        package="onnxruntime",
        artifact_twins=CUDA_TWINS,
        twin_why=CUDA_TWIN_WHY,
    ),
)
FAMILY = Family(kinds=("onnx",), runtimes=RUNTIMES, runners=ort_runners, declined=ort_declined)
