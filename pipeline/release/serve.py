"""`serve RECIPE [VERSION]`: the signed-off winner of a version behind a real Triton server (PyTriton, the
`serve` extra), with Triton's dynamic batcher, on HTTP and gRPC on localhost.

The winner runs as the deploy validated and timed it: its own runner (pipeline/runners/), the runtime it won on
with host I/O, in this process; Triton's Python backend hands it the batches. The model's tensors keep the
recipe's names (TorchScript's positional inputs too), and the batcher's largest batch and queue delay are the
recipe's `benchmark.server` ones. A version that does not verify against its manifest, or did not sign off, is
not served. Ctrl-C or SIGTERM stops the server and its processes and exits 0; a port already in use is refused
before anything starts."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import sys
import sysconfig
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.core.artifacts import ArtifactRecord
from pipeline.core.errors import PipelineError
from pipeline.core.packages import installed
from pipeline.core.stored import read_stored
from pipeline.inputs.specs import RunnerSettings
from pipeline.recipe import Recipe
from pipeline.release.store import Store
from pipeline.runners.base import NotRunnable, Runner
from pipeline.runners.registry import runners_for

HOST = "127.0.0.1"


@dataclass(frozen=True)
class Ports:
    http: int
    grpc: int
    metrics: int


@dataclass(frozen=True)
class Served:
    """What is served: the version, its winner, and the runner that runs it."""

    folder: Path
    winner: dict[str, Any]
    runner: Runner


def version_folder(recipe: Recipe, version: str) -> Path:
    """The version to serve: `latest` or vNNNN in the recipe's store, intact and signed off."""
    store = Store(Path(recipe.output.root), recipe.name)
    folder = store.latest() if version == "latest" else store.base / version
    if folder is None or not (folder / "manifest.json").is_file():
        known = ", ".join(store.versions()) or "none"
        raise PipelineError(
            f"serve: no version '{version}' of {recipe.name} in {store.base} (versions: {known})"
        )
    damage = store.verify(folder)
    if damage:
        raise PipelineError(f"serve: {folder} is damaged ({damage[0]}); a damaged version is not served")
    if not (folder / "winner.json").is_file():
        raise PipelineError(f"serve: {recipe.name} {folder.name} did not sign off: it has no winner to serve")
    return folder


def winner_runner(recipe: Recipe, folder: Path) -> Served:
    """The winner's runner, on the runtime it won on, with host I/O (the server hands it host arrays)."""
    winner = read_stored(folder / "winner.json")
    manifest = read_stored(folder / "manifest.json")
    entry = next(a for a in manifest["artifacts"] if a["name"] == winner["artifact"])
    record = ArtifactRecord(
        name=entry["name"],
        path=folder / entry["path"],
        kind=entry["kind"],
        precision=entry.get("precision"),
        sha256=entry["sha256"],
        stage=entry["stage"],
        details=dict(entry.get("details") or {}),
    )
    found = runners_for(record, RunnerSettings.from_recipe(recipe))
    if isinstance(found, NotRunnable):
        raise PipelineError(f"serve: {winner['artifact']} cannot run on this machine: {found.reason}")
    for runner in found:
        if runner.runtime == winner["runtime"] and runner.io == "host" and not runner.cuda_graph:
            return Served(folder, winner, runner)
    offered = ", ".join(sorted({r.runtime for r in found}))
    raise PipelineError(
        f"serve: {winner['artifact']} won on {winner['runtime']}, which this machine does not offer "
        f"(it offers {offered}); serve it on the machine it was deployed on"
    )


def free_port(wanted: int | None, what: str) -> int:
    """`wanted` when it is free on localhost (0 or None: any free port); a port in use is refused."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds: TIME_WAIT is free
        try:
            probe.bind((HOST, wanted or 0))
        except OSError as exc:
            raise PipelineError(
                f"serve: the {what} port {wanted} on {HOST} is in use ({exc.strerror})"
            ) from None
        return int(probe.getsockname()[1])


def _python_backend_env() -> None:
    """Triton's Python backend stub links libpython dynamically; where the system has another build of this
    Python's version (a pyenv or venv interpreter beside Debian's), the stub would load that one with this
    interpreter's standard library and fail to load the model. This interpreter's own library goes first."""
    libdir = sysconfig.get_config_var("LIBDIR")
    soname = sysconfig.get_config_var("INSTSONAME") or ""
    if libdir and soname and os.path.exists(os.path.join(libdir, soname)):
        current = os.environ.get("LD_LIBRARY_PATH")
        os.environ["LD_LIBRARY_PATH"] = libdir + (f":{current}" if current else "")


def serve(
    store_recipe: Recipe,
    version: str,
    ports: tuple[int | None, int | None, int | None],
    say: Callable[[str], None],
    stop: threading.Event | None = None,
) -> int:
    """Serve until Ctrl-C, SIGTERM or `stop` is set; returns 0 once the server and its processes are gone.
    `store_recipe` names the store; the version's own resolved recipe (its recipe.yaml) says how it runs, so a
    recipe edited since does not change what an old version serves."""
    if not installed("pytriton"):
        raise PipelineError("serve: PyTriton is not installed (pip install 'deploy-pipeline[serve]')")
    folder = version_folder(store_recipe, version)
    chosen = Ports(free_port(ports[0], "HTTP"), free_port(ports[1], "gRPC"), free_port(ports[2], "metrics"))
    from pipeline.recipe.loader import load

    recipe = load(folder / "recipe.yaml").recipe
    served = winner_runner(recipe, folder)
    sample = signature_sample(recipe)
    served.runner.activate()
    try:
        outputs = served.runner.infer(sample)  # the output signature, and the first call out of the way
        return _run_triton(recipe, served, sample, outputs, chosen, say, stop)
    finally:
        served.runner.deactivate()


def signature_sample(recipe: Recipe) -> dict[str, np.ndarray]:
    """One request at the dims' opt (batch 1), all ones: a valid token id and mask for text models, and a shape
    for the rest. It only tells the outputs' names, types and ranks."""
    from pipeline.inputs.data import NUMPY_DTYPES

    dims = {name: r.opt for name, r in recipe.dims.items()}
    dims[recipe.benchmark.batch_dim] = 1
    return {
        spec.name: np.ones(
            [dims[d] if isinstance(d, str) else d for d in spec.shape], NUMPY_DTYPES[spec.dtype]
        )
        for spec in recipe.inputs
    }


def _bind(triton: Any, recipe: Recipe, runner: Runner, sample: dict, outputs: dict) -> int:
    """The model on the server, named after the recipe with its tensor names; returns the largest batch (0:
    the model has no batch dim, and each request runs on its own)."""
    from pytriton.decorators import batch
    from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor

    batch_dim = recipe.benchmark.batch_dim
    batched = all(spec.shape and spec.shape[0] == batch_dim for spec in recipe.inputs)
    dims = recipe.dims.get(batch_dim)
    server = recipe.benchmark.server
    largest = server.max_batch or max(recipe.benchmark.batch_sizes)
    max_batch = min(largest, dims.max) if batched and dims is not None else 0
    names = list(sample)

    def run(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        found = runner.infer({name: feeds[name] for name in names})
        return {name: np.ascontiguousarray(found[name]) for name in outputs}

    def each(requests: list[Any]) -> list[dict[str, np.ndarray]]:
        return [run(request) for request in requests]

    def tensor(name: str, array: np.ndarray) -> Any:
        shape = array.shape[1:] if batched else array.shape
        return Tensor(name=name, dtype=array.dtype, shape=tuple(-1 for _ in shape))

    triton.bind(
        model_name=recipe.name,
        infer_func=batch(lambda **feeds: run(feeds)) if batched else each,
        inputs=[tensor(n, a) for n, a in sample.items()],
        outputs=[tensor(n, a) for n, a in outputs.items()],
        config=ModelConfig(
            batching=max_batch > 0,
            max_batch_size=max_batch,
            batcher=DynamicBatcher(max_queue_delay_microseconds=round(server.max_queue_delay_ms * 1000)),
        ),
        strict=True,
    )
    return max_batch


def _run_triton(
    recipe: Recipe,
    served: Served,
    sample: dict[str, np.ndarray],
    outputs: dict[str, np.ndarray],
    ports: Ports,
    say: Callable[[str], None],
    stop: threading.Event | None,
) -> int:
    from pytriton.triton import Triton, TritonConfig

    _python_backend_env()
    scratch = Path(tempfile.mkdtemp(prefix="pipeline-triton-"))  # the server's log; its workspace inside
    log = scratch / "tritonserver.log"
    config = TritonConfig(
        http_address=HOST,
        http_port=ports.http,
        grpc_address=HOST,
        grpc_port=ports.grpc,
        metrics_address=HOST,
        metrics_port=ports.metrics,
        log_file=log,
        log_verbose=0,
        exit_timeout_secs=10,
    )
    stopping = stop or threading.Event()
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, lambda *_: stopping.set()) if main else None
    triton = Triton(config=config, workspace=scratch / "workspace")
    died = False
    try:
        max_batch = _bind(triton, recipe, served.runner, sample, outputs)
        triton.run()
        winner = served.winner
        say(
            f"serving {recipe.name} {served.folder.name}: {winner['artifact']} on {winner['runtime']} "
            f"(max batch {max_batch}, queue delay {recipe.benchmark.server.max_queue_delay_ms:g} ms)"
        )
        say(
            f"ready: http://{HOST}:{ports.http} (HTTP) · {HOST}:{ports.grpc} (gRPC) · "
            f"http://{HOST}:{ports.metrics}/metrics; model '{recipe.name}'; Ctrl-C or SIGTERM stops"
        )
        try:
            while not stopping.wait(0.2):
                if not triton.is_alive():
                    died = True
                    raise PipelineError(f"serve: the Triton server stopped on its own (its log: {log})")
        except KeyboardInterrupt:
            pass
        say("stopping the server")
        return 0
    finally:
        triton.stop()
        if main:
            signal.signal(signal.SIGTERM, previous)
        if not died:  # a server that died keeps its log, which the error names
            shutil.rmtree(scratch, ignore_errors=True)
        sys.stdout.flush()
