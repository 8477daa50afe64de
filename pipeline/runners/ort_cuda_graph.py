"""ONNX Runtime's CUDA provider in CUDA-graph mode (runtime `onnxruntime-cuda-graph`, device I/O).

A CUDA graph replays fixed shapes and fixed buffers, and ONNX Runtime captures one only when every node runs
on the CUDA provider. So the runner keeps one session per shape it serves: the graph's symbolic dims are
fixed to that shape, the shape arithmetic a dynamic export carries (Shape, Gather, Concat ... that the provider
would place on the CPU) is constant-folded away by onnxscript's optimizer, and the session is created with
`enable_cuda_graph` and no CPU fallback. The weights are written apart once (`weights_apart`), so that a
shape's copy is the graph alone. Inputs and outputs are preallocated torch
CUDA tensors bound through IOBinding by address, so a replay reads and writes the same memory; the first runs
(capture) happen in prepare(), outside the timed windows.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx

from pipeline.core.runtimes import Runtime
from pipeline.inputs.specs import dim_sizes
from pipeline.runners.base import Family, Feeds, Runner, output_names
from pipeline.runners.onnxruntime_runner import (
    CUDA_TWIN_WHY,
    CUDA_TWINS,
    cuda_declined,
    cuda_provider_available,
)
from pipeline.runners.ort_placement import SHAPE_OPS
from pipeline.runners.ort_session import (
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

RUNTIME = "onnxruntime-cuda-graph"
CAPTURE_RUNS = 4  # ONNX Runtime runs regularly a few times before it captures, then replays


def weights_apart(path: Path) -> Path:
    """The graph at `path` saved once per process with its weights in a file of their own (a temporary folder,
    removed at exit). Each fixed-dims copy is then a graph of a few hundred KB that names that file, and ONNX
    Runtime reads the weights from it: copying and serializing the weights for every shape, and ONNX Runtime
    parsing them out of the bytes again, took 2.5 s of the 2.6 s a shape's FP32 MiniLM session cost on a
    2-core CPU (0.3 s now), at 7 validated and 3 benchmarked shapes per graph."""
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    kept = _APART.get(key)
    if kept is not None and kept.exists():
        return kept
    folder = Path(tempfile.mkdtemp(prefix="pipeline-graph-"))
    atexit.register(shutil.rmtree, folder, True)
    onnx.save_model(
        onnx.load(str(path)),
        str(folder / "graph.onnx"),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="weights.bin",
        size_threshold=1024,
    )
    _APART[key] = folder / "graph.onnx"
    return _APART[key]


_APART: dict[tuple[str, int, int], Path] = {}


def fixed_dims_model(path: Path, dims: dict[str, int]) -> onnx.ModelProto:
    """The graph at `path` with each named dim fixed and the shape computations folded into constants; weights
    kept in an external file stay there (the result names it, relative to `path`'s folder)."""
    import onnx_ir as ir
    import onnxscript.optimizer

    model = ir.load(path)
    graph = model.graph
    nodes = ir.traversal.RecursiveGraphIterator(graph)
    for value in [*graph.inputs, *graph.outputs, *(out for node in nodes for out in node.outputs)]:
        if value.shape is not None and any(_named(d, dims) for d in value.shape):
            value.shape = ir.Shape([dims[d.value] if _named(d, dims) else d for d in value.shape])
    onnxscript.optimizer.optimize(model, input_size_limit=1 << 22, output_size_limit=1 << 24)
    return ir.to_proto(model)


def _named(dim: Any, dims: dict[str, int]) -> bool:
    import onnx_ir as ir

    return isinstance(dim, ir.SymbolicDim) and dim.value in dims


def fixed_dims_file(source: Path, dims: dict[str, int]) -> tuple[Path, onnx.ModelProto]:
    """fixed_dims_model of `source` written beside it (so that its external weights resolve), for ONNX
    Runtime to load by path."""
    fixed = fixed_dims_model(source, dims)
    label = "-".join(f"{k}{v}" for k, v in sorted(dims.items()))
    target = source.parent / f"{source.stem}.{label}.onnx"
    onnx.save_model(fixed, str(target))
    return target, fixed


def runtime_shape_ops(model: onnx.ModelProto) -> list[str]:
    """Nodes still computing shapes at run time (they would land on the CPU and prevent a graph)."""
    return [n.name or n.op_type for n in model.graph.node if n.op_type in SHAPE_OPS]


def provider_options(stream: int | None, layout: dict[str, str]) -> dict[str, str]:
    options = {**CUDA_OPTIONS, **layout, "enable_cuda_graph": "1"}
    if stream is not None:
        options["user_compute_stream"] = str(stream)
    return options


def graph_session_options(threads: int) -> Any:
    """The pipeline's session options, with CPU fallback off: a node that cannot run on the CUDA provider
    fails session creation with its name, instead of a graph that is silently not captured."""
    options = session_options(threads)
    options.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    return options


@dataclass
class _Entry:
    session: Any
    binding: Any
    inputs: dict[str, Any]  # name -> torch CUDA tensor (bound)
    outputs: dict[str, Any]


class OrtCudaGraphRunner(Runner):
    """One fixed-shape CUDA-graph session per shape served (see the module docstring)."""

    runtime = RUNTIME
    io = "device"
    cuda_graph = True

    def __init__(self, artifact: str, path: Path, settings: RunnerSettings, precision: str):
        self.artifact, self.path, self._settings = artifact, Path(path), settings
        self._threads = settings.threads
        self._layout = layout_options(self.path, precision)
        self._source: Path | None = None  # the graph with its weights apart (weights_apart)
        self._entries: dict[tuple[tuple[str, int], ...], _Entry] = {}
        self._current: _Entry | None = None
        self.cuda_stream: Any = None
        self.details: dict[str, Any] = {}

    def activate_impl(self) -> None:
        import torch

        self.cuda_stream = torch.cuda.Stream()
        self._source = weights_apart(self.path)
        self.details = {"cuda_graph": True, "sessions": {}, "user_stream": True}
        if self._layout:
            self.details["cuda_layout"] = "nhwc"

    def deactivate_impl(self) -> None:
        self._entries, self._current, self._source, self.cuda_stream = {}, None, None, None

    def infer_impl(self, feeds: Feeds) -> Feeds:
        entry = self._entry(feeds)
        self._copy_in(entry, feeds)
        self._run(entry)
        self.synchronize()
        names = output_names(list(entry.outputs), list(self._settings.outputs))
        return {names[name]: t.cpu().numpy() for name, t in entry.outputs.items()}

    def prepare_impl(self, feeds: Feeds) -> None:
        entry = self._entry(feeds)
        self._copy_in(entry, feeds)
        for _ in range(CAPTURE_RUNS):
            self._run(entry)
        self.synchronize()
        self._current = entry

    def infer_prepared_impl(self) -> None:
        assert self._current is not None
        self._run(self._current)

    def synchronize(self) -> None:
        import torch

        if self.cuda_stream is not None:
            self.cuda_stream.synchronize()
        else:  # ONNX Runtime computes on a stream of its own
            torch.cuda.synchronize()

    # ------------------------------------------------------------ internals

    def _entry(self, feeds: Feeds) -> _Entry:
        dims = dim_sizes(self._settings.inputs, feeds)
        key = tuple(sorted(dims.items()))
        if key not in self._entries:
            started = time.perf_counter()
            self._entries[key] = self._create(dims)
            label = " ".join(f"{k}={v}" for k, v in key)
            self.details["sessions"][label] = round(time.perf_counter() - started, 3)
        return self._entries[key]

    def _create(self, dims: dict[str, int]) -> _Entry:
        import torch

        ort = load_onnxruntime()
        assert self._source is not None
        path, fixed = fixed_dims_file(self._source, dims)
        left = runtime_shape_ops(fixed)
        if left:
            raise RuntimeError(f"{self.artifact}: shape ops left after folding at {dims}: {left[:5]}")
        data = str(path)
        options = graph_session_options(self._threads)
        stream = self.cuda_stream.cuda_stream if self.cuda_stream is not None else None
        try:
            session = ort.InferenceSession(
                data, options, providers=[(CUDA_PROVIDER, provider_options(stream, self._layout))]
            )
        except Exception:  # noqa: BLE001 - a build that refuses graphs on a user stream: let it use its own
            if stream is None:
                raise
            session = ort.InferenceSession(
                data, options, providers=[(CUDA_PROVIDER, provider_options(None, self._layout))]
            )
            self.cuda_stream, self.details["user_stream"] = None, False
        binding = session.io_binding()
        inputs, outputs = {}, {}
        for value, table in [(v, inputs) for v in session.get_inputs()] + [
            (v, outputs) for v in session.get_outputs()
        ]:
            dtype = np.dtype(ORT_TYPES[value.type])
            shape = [int(d) for d in value.shape]
            tensor = torch.empty(shape, dtype=torch.from_numpy(np.empty(0, dtype)).dtype, device="cuda")
            bind = binding.bind_input if table is inputs else binding.bind_output
            bind(value.name, "cuda", 0, dtype.type, shape, tensor.data_ptr())
            table[value.name] = tensor
        return _Entry(session, binding, inputs, outputs)

    def _copy_in(self, entry: _Entry, feeds: Feeds) -> None:
        import torch

        with torch.cuda.stream(self.cuda_stream or torch.cuda.current_stream()):
            for name, tensor in entry.inputs.items():
                host = np.ascontiguousarray(
                    feeds[name], dtype=torch.empty(0, dtype=tensor.dtype).numpy().dtype
                )
                tensor.copy_(torch.from_numpy(host))

    @staticmethod
    def _run(entry: _Entry) -> None:
        entry.session.run_with_iobinding(entry.binding)


def graph_runners(artifact: ArtifactRecord, settings: RunnerSettings) -> list[OrtCudaGraphRunner]:
    """A graph-mode runner where the graph is eligible (_eligible) and ONNX Runtime can capture it."""
    if not _eligible(artifact, settings) or capture_refused(artifact, settings) is not None:
        return []
    return [OrtCudaGraphRunner(artifact.name, Path(artifact.path), settings, artifact.precision)]


def _eligible(artifact: ArtifactRecord, settings: RunnerSettings) -> bool:
    """The recipe wants graphs, the graph is FP32/FP16 (INT8 Q/DQ and dynamic-quantized graphs have nodes the
    CUDA provider does not run), the CUDA provider sees a GPU and runs every data node of it."""
    if not settings.runtime.cuda_graphs or artifact.precision not in ("fp32", "fp16"):
        return False
    return cuda_provider_available() and cuda_declined(artifact.path, settings) is None


def capture_refused(artifact: ArtifactRecord, settings: RunnerSettings) -> str | None:
    """Why ONNX Runtime cannot capture this graph in a CUDA graph, or None.

    Every node may run on the CUDA provider and the capture still fail: a kernel that synchronizes or copies
    through the host mid-run ends the capture with an error (ONNX Runtime 1.31's LSTM on an H100; graphs with
    recurrent nodes are now declined before this, toolchain/ort_recurrent.py). That is
    a limit of the runtime's graph mode for this graph, not a defect of the artifact, which its other CUDA rows
    still validate; so the runtime is not offered for it, with the reason, instead of failing the variant. Tried
    once per graph file and process, at the recipe's smallest shapes (the first shape validation runs)."""
    path = Path(artifact.path)
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _REFUSED:
        _REFUSED[key] = _capture_in_child(artifact, settings)
    return _REFUSED[key]


# a capture at the smallest shapes takes seconds; a hung driver must not hold the deploy
PROBE_TIMEOUT_S = 300.0


def _capture_in_child(artifact: ArtifactRecord, settings: RunnerSettings) -> str | None:
    """try_capture in a child process (pipeline/runners/ort_capture_probe.py says why)."""
    from pipeline.core.children import run_job
    from pipeline.runners.ort_capture_probe import MODULE

    with tempfile.TemporaryDirectory(prefix="capture-probe-") as tmp:
        job = {
            "name": artifact.name,
            "path": str(Path(artifact.path).resolve()),
            "precision": artifact.precision,
            "settings": settings.model_dump(mode="json"),
            "result": str(Path(tmp) / "result.json"),
        }
        # the child's own temporary files (its copy of the weights, weights_apart) go in this folder, removed
        # here however the child ends (its atexit cleanup does not run after an abort or a kill)
        outcome = run_job(
            MODULE, job, Path(tmp), PROBE_TIMEOUT_S, report=lambda line: None, env={"TMPDIR": tmp}
        )
    if outcome.result is not None and outcome.result.get("ok"):
        return outcome.result["refused"]
    death = outcome.death(PROBE_TIMEOUT_S, "capture probe", "its limit")
    return f"onnxruntime {load_onnxruntime().__version__} cannot capture this graph in a CUDA graph ({death})"


_REFUSED: dict[tuple[str, int, int], str | None] = {}


def try_capture(runner: OrtCudaGraphRunner, settings: RunnerSettings) -> str | None:
    """None when the runner captures its graph at the recipe's smallest shapes, else why not. Run in the probe's
    own process, which ends right after: the runner is not released here, since releasing a session after a
    failed capture is what aborted the process (the reason is written before the process ends)."""
    feeds = {
        spec.name: np.full(
            [settings.dims[d].min if isinstance(d, str) else d for d in spec.shape],
            spec.low if spec.low is not None else 0,
            dtype=spec.dtype,
        )
        for spec in settings.inputs
    }
    try:
        runner.activate()
        runner.prepare(feeds)
    except Exception as error:  # noqa: BLE001 - any failure to capture is the reason the reports give
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        version = load_onnxruntime().__version__
        return f"onnxruntime {version} cannot capture this graph in a CUDA graph ({first})"
    return None


def graph_declined(artifact: ArtifactRecord, settings: RunnerSettings) -> dict[str, str]:
    """The graph runtime's own reason for not offering itself: a graph it cannot capture (the provider's
    reasons are the plain CUDA runtime's, in onnxruntime_runner)."""
    try:
        if not _eligible(artifact, settings):
            return {}
    except ImportError:  # no onnxruntime: the plain runtime says so
        return {}
    reason = capture_refused(artifact, settings)
    return {RUNTIME: reason} if reason else {}


RUNTIMES = (
    Runtime(
        RUNTIME,
        "cuda",
        ("device",),
        package="onnxruntime",
        artifact_twins=CUDA_TWINS,
        twin_why=CUDA_TWIN_WHY,
    ),
)
FAMILY = Family(kinds=("onnx",), runtimes=RUNTIMES, runners=graph_runners, declined=graph_declined)
