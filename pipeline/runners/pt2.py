"""Runners for the compiled PyTorch artifacts (pipeline/stages/export_pt2.py) and their execution modes.

- `exported-<p>` (ExportedProgram): `torch-cpu` / `torch-cuda` run its graph module eagerly; on CUDA one
  `torch-compile-cuda[-<mode>]` runtime per mode in `runtime.torch_compile` compiles it (reduce-overhead
  replays CUDA graphs through cudagraph trees).
- `aoti-<p>` (AOTInductor package, compiled for one device): `torch-aoti-cpu` / `torch-aoti-cuda`; on CUDA also
  `torch-aoti-cuda-bucketed` (padding-aware, runtime.padding), `torch-aoti-cuda-graph` (explicit capture per
  shape, runtime.cuda_graphs) and `torch-aoti-cuda-graph-bucketed` (both).
- `torch-cpu-bucketed`: the exported program, padding-aware, on the CPU.
- `exported-packed-<p>` and `aoti-packed-<p>` (packed tokens, pipeline/stages/export_packed_pt2.py) run in the
  same runtimes but the padding-aware ones (a packed batch has no padding left to trim): the runner packs the
  recipe's feeds (pipeline/core/packing.py) on the host where it turns them into tensors, so with host I/O on
  every call, and with device I/O once, when the inputs are staged on the GPU, as the packed ONNX runners do.
  A program traced with the CUDA-only varlen kernel runs on CUDA only.

Every mode is a runtime of its own, so that validation and the benchmark see each as a separate
(artifact, runtime) pair. Compilation and graph capture happen in prepare(), outside the timed windows; the
seconds they took are reported with the row (`details`).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from pipeline.core import host
from pipeline.core.packing import FLASH_VARLEN, Packing, run_details
from pipeline.core.runtimes import Runtime
from pipeline.runners.base import Family, Feeds, NotRunnable, Runner
from pipeline.runners.bucketing import Bucketing, Group, plan_key
from pipeline.runners.compiled import compiled
from pipeline.runners.cuda_graphs import GraphCache
from pipeline.runners.loaders import AotiPackageFromPath, ExportedProgramFromPath
from pipeline.runners.torch_cuda import autotune_convolutions

if TYPE_CHECKING:
    from pipeline.core.artifacts import ArtifactRecord
    from pipeline.inputs.specs import RunnerSettings
    from pipeline.recipe import PaddingConfig

Loader = Callable[[], Callable[..., Any]]
CUDAGRAPH_MODES = frozenset({"reduce-overhead", "max-autotune"})


class Pt2Runner(Runner):
    """A compiled torch callable on one device, optionally captured in CUDA graphs and/or padding-aware."""

    def __init__(
        self,
        artifact: str,
        runtime: str,
        load: Loader,
        inputs: list[str],
        outputs: list[str],
        device: str,
        io: str,
        *,
        cuda_graph: bool = False,
        compile_mode: str | None = None,
        bucketing: Bucketing | None = None,
        threads: int | None = None,
        packing: Packing | None = None,
    ):
        self.artifact, self.runtime, self.io, self.device = artifact, runtime, io, device
        self.packing = packing
        self._load, self._inputs, self._outputs, self._threads = load, inputs, outputs, threads
        self.compile_mode, self.bucketing = compile_mode, bucketing
        self.cuda_graph = cuda_graph or compile_mode in CUDAGRAPH_MODES
        self._explicit_graphs = cuda_graph
        self._fn: Any = None
        self._graphs: GraphCache | None = None
        self._prepared: Any = None
        self._result: Any = None
        self._replay: Callable[[], None] | None = None
        self._saved_threads: int | None = None
        self._graph_limit = 32
        self.cuda_stream: Any = None
        self.details: dict[str, Any] = {}

    # ------------------------------------------------------------ life cycle

    def activate_impl(self) -> None:
        import torch

        if self._threads and self.device == "cpu":
            self._saved_threads = torch.get_num_threads()
            torch.set_num_threads(self._threads)
        started = time.perf_counter()
        kept = None
        if self.compile_mode is not None:  # compiled once per process: validation and every shape share it
            kept, reused = compiled(self._load, self.compile_mode, self.device)
            fn = kept.fn
        else:
            fn = self._load()
        self._fn = fn
        self._graphs = GraphCache(fn, self._graph_limit) if self._explicit_graphs else None
        self.details = {
            "cuda_graph": self.cuda_graph,
            "load_s": round(time.perf_counter() - started, 3),
            "prepare_s": {},
        }
        if kept is not None:
            self.details |= {
                "compile_mode": self.compile_mode,
                "dynamic_shapes": True,
                "compiled_before": reused,
            }
            if reused:  # its weights were on the device before this activation: the memory probe adds them
                self.details["resident_bytes"] = kept.resident_bytes
        if self.device != "cpu":
            autotune_convolutions()
            self.cuda_stream = torch.cuda.current_stream(torch.device(self.device))

    def deactivate_impl(self) -> None:
        import torch

        if self._graphs is not None:
            self._graphs.clear()
        self._fn = self._graphs = self._prepared = self._result = self._replay = self.cuda_stream = None
        if self._saved_threads is not None:
            torch.set_num_threads(self._saved_threads)
            self._saved_threads = None

    # ------------------------------------------------------------ inference

    def keep_graphs(self, count: int) -> None:
        self._graph_limit = max(self._graph_limit, count)
        if self._graphs is not None:
            self._graphs.limit = self._graph_limit

    @property
    def captures(self) -> int:
        return self._graphs.captures if self._graphs is not None else 0

    def infer_impl(self, feeds: Feeds) -> Feeds:
        values = self._forward(self._tensors(feeds))
        if self.device == "cpu":
            return {name: v.detach().numpy() for name, v in zip(self._outputs, values, strict=True)}
        import torch

        # into pinned host memory (torch's caching host allocator), one synchronization for all outputs: a
        # pageable copy would stage through a driver buffer and block per output
        host = [torch.empty(v.shape, dtype=v.dtype, pin_memory=True) for v in values]
        for out, value in zip(host, values, strict=True):
            out.copy_(value.detach(), non_blocking=True)
        torch.cuda.current_stream(torch.device(self.device)).synchronize()
        return {name: out.numpy() for name, out in zip(self._outputs, host, strict=True)}

    def prepare_impl(self, feeds: Feeds) -> None:
        """Stage the inputs (device I/O) and run once: compilation and graph capture for this shape happen
        here, outside the timed windows; their seconds are kept in details['prepare_s']."""
        self._prepared = self._tensors(feeds) if self.io == "device" else feeds
        self._replay = None
        started = time.perf_counter()
        self.infer_prepared()
        self.synchronize()
        if self._graphs is not None and self.bucketing is None and self.io == "device":
            # keep the inputs in the graph's own buffers: each timed call is then one replay, no copies
            self._prepared = self._graphs.inputs_of(self._prepared) or self._prepared
            self._replay = self._graphs.replay_of(self._prepared)
        shape = "x".join(str(d) for d in next(iter(feeds.values())).shape)
        self.details["prepare_s"][shape] = round(time.perf_counter() - started, 3)
        if self.bucketing is not None and self.bucketing.last_plan is not None:
            self.details["padding"] = dict(self.bucketing.last_plan)
        if self.packing is not None:
            self.details["packing"] = run_details(self.packing, feeds, self.io)

    def infer_prepared_impl(self) -> None:
        if self._replay is not None:  # the inputs are the captured graph's own buffers: one replay
            self._replay()
        elif self.io == "device":
            self._result = self._forward(self._prepared)
        else:
            self.infer(self._prepared)

    def synchronize(self) -> None:
        if self.device != "cpu":
            import torch

            torch.cuda.synchronize(torch.device(self.device))

    # ------------------------------------------------------------ internals

    def _forward(self, tensors: list[Any]) -> list[Any]:
        import torch

        with torch.inference_mode():
            if self.bucketing is None:
                return self._call(tensors)
            if self._graphs is None:
                return self.bucketing.run(tensors, self._call)
            # one graph per plan: the gathers, every group's model call and the scatters replay at once, so the
            # GPU waits for the host only while it plans (launched group by group, it waited between groups)
            groups = self.bucketing.plan(tensors)
            return self._graphs(tensors, plan_key(groups), functools.partial(self._bucketed, groups))

    def _bucketed(self, groups: list[Group], *tensors: Any) -> list[Any]:
        assert self.bucketing is not None
        return self.bucketing.execute(tensors, groups, self._plain)

    def _plain(self, tensors: Sequence[Any]) -> list[Any]:
        result = self._fn(*tensors)
        return [result] if hasattr(result, "shape") else list(result)

    def _call(self, tensors: Sequence[Any]) -> list[Any]:
        if self._graphs is not None:
            return self._graphs(tensors)
        if self.compile_mode in CUDAGRAPH_MODES:
            import torch

            torch.compiler.cudagraph_mark_step_begin()
        return self._plain(tensors)

    def _tensors(self, feeds: Feeds) -> list[Any]:
        import torch

        if self.packing is not None:
            feeds = self.packing.pack(feeds)
        missing = [name for name in self._inputs if name not in feeds]
        if missing:
            raise KeyError(f"{self.artifact}: feeds lack input(s) {missing} (got {sorted(feeds)})")
        arrays = [torch.from_numpy(np.ascontiguousarray(feeds[name])) for name in self._inputs]
        if self.device == "cpu":
            return arrays
        # through pinned host memory, so that the copies are DMA transfers queued on the stream
        return [a.pin_memory().to(self.device, non_blocking=True) for a in arrays]


# ---------------------------------------------------------------- factories (registry entries)


def _runner(
    artifact: ArtifactRecord,
    settings: RunnerSettings,
    runtime: str,
    load: Loader,
    device: str,
    io: str,
    **mode: Any,
) -> Pt2Runner:
    """A runner of this artifact with its input names (the recipe's, then the packing's for a packed artifact)
    and the recipe's output names; `mode` as Pt2Runner takes it."""
    packing = packing_of(artifact)
    names, outputs = list(settings.input_names), list(settings.outputs)
    if packing is not None:
        names += packing.extra_inputs()
    return Pt2Runner(artifact.name, runtime, load, names, outputs, device, io, packing=packing, **mode)


def _padding(artifact: ArtifactRecord, settings: RunnerSettings) -> PaddingConfig | None:
    """The padding-aware runs' settings, None for a packed artifact: its batches hold no padding to trim."""
    return None if packing_of(artifact) else settings.runtime.padding


def packing_of(artifact: ArtifactRecord) -> Packing | None:
    found = artifact.details.get("packing")
    return Packing.from_json(found) if isinstance(found, dict) else None


def exported_runners(artifact: ArtifactRecord, settings: RunnerSettings) -> list[Pt2Runner]:
    """On a CUDA host: eager on the GPU plus one torch.compile runtime per mode; else eager on the CPU (and
    padding-aware, when the recipe configures it)."""
    padding = _padding(artifact, settings)
    if not host.has_cuda():
        load = ExportedProgramFromPath(artifact.path, "cpu")
        runners = [_runner(artifact, settings, "torch-cpu", load, "cpu", "host", threads=settings.threads)]
        if padding is not None:
            bucketing = Bucketing(padding, settings, "cpu")
            runners.append(
                _runner(
                    artifact,
                    settings,
                    "torch-cpu-bucketed",
                    load,
                    "cpu",
                    "host",
                    bucketing=bucketing,
                    threads=settings.threads,
                )
            )
        return runners
    load = ExportedProgramFromPath(artifact.path, "cuda")
    runners = [_runner(artifact, settings, "torch-cuda", load, "cuda", "device")]
    for mode in settings.runtime.torch_compile:
        runtime = "torch-compile-cuda" + ("" if mode == "default" else f"-{mode}")
        runners.append(_runner(artifact, settings, runtime, load, "cuda", "device", compile_mode=mode))
    return runners


def aoti_runners(artifact: ArtifactRecord, settings: RunnerSettings) -> list[Pt2Runner] | NotRunnable:
    """The package runs on the device it was compiled for; on CUDA in plain, graph and bucketed modes."""
    runtime, padding = settings.runtime, _padding(artifact, settings)
    device = artifact.details.get("device", "cpu")
    if device == "cpu":
        load = AotiPackageFromPath(artifact.path, single_threaded=False, device="cpu")
        return [_runner(artifact, settings, "torch-aoti-cpu", load, "cpu", "host", threads=settings.threads)]
    if not host.has_cuda():
        return NotRunnable(
            artifact.name, f"compiled for {device} ({artifact.details.get('gpu')}); no CUDA GPU here"
        )
    plain = AotiPackageFromPath(artifact.path, single_threaded=False, device=device)
    runners = [_runner(artifact, settings, "torch-aoti-cuda", plain, "cuda", io) for io in ("host", "device")]
    if padding is not None:
        bucketing = Bucketing(padding, settings)
        runners.append(
            _runner(
                artifact, settings, "torch-aoti-cuda-bucketed", plain, "cuda", "device", bucketing=bucketing
            )
        )
    if runtime.cuda_graphs:
        capturable = AotiPackageFromPath(artifact.path, single_threaded=True, device=device)
        runners.append(
            _runner(
                artifact, settings, "torch-aoti-cuda-graph", capturable, "cuda", "device", cuda_graph=True
            )
        )
        if padding is not None:
            bucketing = Bucketing(padding, settings)
            runners.append(
                _runner(
                    artifact,
                    settings,
                    "torch-aoti-cuda-graph-bucketed",
                    capturable,
                    "cuda",
                    "device",
                    cuda_graph=True,
                    bucketing=bucketing,
                )
            )
    return runners


def pt2_runners(artifact: ArtifactRecord, settings: RunnerSettings) -> list[Runner] | NotRunnable:
    if artifact.details.get("attention") == FLASH_VARLEN and not host.has_cuda():
        return NotRunnable(artifact.name, f"traced with {FLASH_VARLEN}, a CUDA kernel; no CUDA GPU here")
    from pipeline.toolchain.fp8_linear import fp8_gemm_runs

    if artifact.precision == "fp8" and host.has_cuda() and not fp8_gemm_runs():
        return NotRunnable(
            artifact.name,
            f"FP8 GEMMs need compute capability 8.9 or later (Ada, Hopper); {host.gpu_name()} lacks them",
        )
    if artifact.details.get("conv_epilogues") and not host.has_cuda():
        return NotRunnable(
            artifact.name,
            f"its {artifact.details['conv_epilogues']} convolutions are cuDNN's fused kernels (built for a "
            "CUDA GPU); no CUDA GPU here",
        )
    if artifact.kind in ("exported", "exported-packed"):
        return list(exported_runners(artifact, settings))
    found = aoti_runners(artifact, settings)
    return found if isinstance(found, NotRunnable) else list(found)


def _compiled(name: str) -> Runtime:
    return Runtime(name, "cuda", ("device",), package="torch")


RUNTIMES = (
    _compiled("torch-compile-cuda"),
    _compiled("torch-compile-cuda-reduce-overhead"),
    _compiled("torch-compile-cuda-max-autotune"),
    _compiled("torch-compile-cuda-max-autotune-no-cudagraphs"),
    Runtime("torch-cpu-bucketed", "cpu", package="torch"),
    Runtime("torch-aoti-cpu", "cpu", package="torch"),
    # launched kernel by kernel, plain or padding-aware: slower than its own CUDA-graph capture
    Runtime(
        "torch-aoti-cuda", "cuda", ("host", "device"), package="torch", mode_twins=("torch-aoti-cuda-graph",)
    ),
    Runtime(
        "torch-aoti-cuda-bucketed",
        "cuda",
        ("device",),
        package="torch",
        mode_twins=("torch-aoti-cuda-graph-bucketed",),
    ),
    Runtime("torch-aoti-cuda-graph", "cuda", ("device",), package="torch", graphs_under_load=True),
    Runtime("torch-aoti-cuda-graph-bucketed", "cuda", ("device",), package="torch"),
)
# exported: a torch.export ExportedProgram (.pt2); aoti: an AOTInductor package (.pt2), compiled for one device
FAMILY = Family(
    kinds=("exported", "aoti", "exported-packed", "aoti-packed"), runtimes=RUNTIMES, runners=pt2_runners
)
