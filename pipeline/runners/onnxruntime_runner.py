"""ONNX Runtime runners: CPUExecutionProvider (io host) and, where present, CUDAExecutionProvider with host
I/O and with device I/O (IOBinding: inputs and outputs preallocated on the GPU once per shape).

Sessions are pinned the same way for every ONNX artifact: intra-op threads from the recipe (default all
CPUs), one inter-op thread, sequential execution, every graph optimization.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pipeline.runners.base import Feeds, Runner
from pipeline.runners.loaders import SessionFromPath

if TYPE_CHECKING:
    from pipeline.artifacts import ArtifactRecord
    from pipeline.specs import RunnerSettings

CUDA_PROVIDER = "CUDAExecutionProvider"
# FP32 means FP32: the CUDA provider's default TF32 matmuls round inputs to a 10-bit mantissa, which an FP32
# artifact's tolerance is not meant to absorb (TF32 would be a precision of its own, validated as such).
CUDA_OPTIONS = {"use_tf32": "0"}
CPU_PROVIDER = "CPUExecutionProvider"
ORT_TYPES = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(double)": np.float64,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8,
    "tensor(bool)": np.bool_,
}


def _onnxruntime() -> Any:
    try:
        import onnxruntime
    except ImportError:
        raise ImportError(
            "onnxruntime is not installed: pip install 'deploy-pipeline[cpu]' (or [gpu] for onnxruntime-gpu)"
        ) from None
    return onnxruntime


def session_options(threads: int) -> Any:
    ort = _onnxruntime()
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    # Candidates are interleaved window by window: an idle session's spinning intra-op threads would steal the
    # cores from whichever candidate runs next (docs/benchmarking.md has what it did to the tails).
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return options


def output_names(session_outputs: list[str], recipe_outputs: list[str]) -> dict[str, str]:
    """Session output name -> recipe output name: identity where the names match, else by position
    (an exporter may rename outputs); outputs beyond the recipe's keep their own names."""
    if set(recipe_outputs) <= set(session_outputs):
        return {name: name for name in session_outputs}
    return {
        name: recipe_outputs[i] if i < len(recipe_outputs) else name for i, name in enumerate(session_outputs)
    }


class OnnxRuntimeRunner(Runner):
    """One InferenceSession. infer() feeds only the inputs the session declares, cast to its dtypes."""

    def __init__(
        self,
        artifact: str,
        load: SessionFromPath,
        recipe_outputs: list[str],
        provider: str = CPU_PROVIDER,
        io: str = "host",
    ):
        if io == "device" and provider != CUDA_PROVIDER:
            raise ValueError("device I/O needs the CUDA execution provider")
        self.artifact, self.path, self.io = artifact, Path(load.path), io
        self.runtime = "onnxruntime-cuda" if provider == CUDA_PROVIDER else "onnxruntime-cpu"
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
        _onnxruntime()  # a clear error when it is not installed
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
        results = self._session.run(None, self._feeds(feeds))
        return {
            self._names[o.name]: value for o, value in zip(self._session.get_outputs(), results, strict=True)
        }

    def prepare_impl(self, feeds: Feeds) -> None:
        """Cast once (host I/O) or bind inputs and preallocated outputs on the GPU once (device I/O)."""
        host = self._feeds(feeds)
        if self.io != "device":
            self._prepared = host
            return
        ort = _onnxruntime()
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
        else:
            self._session.run(None, self._prepared)

    def synchronize(self) -> None:
        if self._binding is not None:
            self._binding.synchronize_outputs()
        if self.cuda_stream is not None:
            self.cuda_stream.synchronize()

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
        try:
            import torch
        except ImportError:
            return dict(CUDA_OPTIONS)
        if not torch.cuda.is_available():
            return dict(CUDA_OPTIONS)
        self.cuda_stream = torch.cuda.Stream()
        return {**CUDA_OPTIONS, "user_compute_stream": str(self.cuda_stream.cuda_stream)}


def cuda_provider_available() -> bool:
    """The CUDA provider is built in and a GPU is present (onnxruntime-gpu lists it on GPU-less hosts too)."""
    if CUDA_PROVIDER not in _onnxruntime().get_available_providers():
        return False
    return Path("/dev/nvidia0").exists() or _torch_cuda()


def _torch_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def cuda_declined(path: Path, settings: RunnerSettings) -> str | None:
    """Why the CUDA provider is not offered for the graph at `path` (data nodes ONNX Runtime would run on the
    CPU, pipeline/runners/ort_placement.py), or None."""
    from pipeline.runners.ort_placement import declined_reason, off_provider

    if not cuda_provider_available():
        return None
    off = off_provider(Path(path), CUDA_PROVIDER, settings)
    return declined_reason(off, CUDA_PROVIDER, _onnxruntime().__version__) if off else None


def onnx_runners(artifact: ArtifactRecord, settings: RunnerSettings) -> list[OnnxRuntimeRunner]:
    """CPU always; CUDA with host and device I/O where onnxruntime-gpu sees a GPU and runs the graph's data
    nodes on it (cuda_declined)."""
    load, outputs = SessionFromPath(artifact.path, settings.threads, session_options), list(settings.outputs)
    runners = [OnnxRuntimeRunner(artifact.name, load, outputs)]
    if cuda_provider_available() and cuda_declined(artifact.path, settings) is None:
        runners += [
            OnnxRuntimeRunner(artifact.name, load, outputs, CUDA_PROVIDER, "host"),
            OnnxRuntimeRunner(artifact.name, load, outputs, CUDA_PROVIDER, "device"),
        ]
    return runners
