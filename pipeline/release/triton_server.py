"""A runner behind a real Triton server, through PyTriton (the `serve` extra): Triton's HTTP and gRPC front ends
and its dynamic batcher on localhost, the Python backend handing each batch to the runner in this process. Both
`python -m pipeline serve` and the server scenario's `through: triton` start it here."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import site
import socket
import sys
import sysconfig
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.bench.load.triton_counters import RunnerClock, reading
from pipeline.core.errors import InternalError, PipelineError
from pipeline.recipe import Recipe
from pipeline.runners.base import Feeds, Runner

HOST = "127.0.0.1"


@dataclass(frozen=True)
class Ports:
    http: int
    grpc: int
    metrics: int

    @classmethod
    def free(cls, http: int | None = 0, grpc: int | None = 0, metrics: int | None = 0) -> Ports:
        """The ports asked for where they are free (0 or None: any free port); one in use is refused."""
        return cls(free_port(http, "HTTP"), free_port(grpc, "gRPC"), free_port(metrics, "metrics"))


@dataclass(frozen=True)
class Batching:
    """Triton's dynamic batcher for the model: the largest batch (0: no batch dim, each request on its own)
    and how long a request may wait for a fuller batch."""

    max_batch: int
    queue_delay_ms: float

    @classmethod
    def from_recipe(cls, recipe: Recipe) -> Batching:
        bench = recipe.benchmark
        batched = all(spec.shape and spec.shape[0] == bench.batch_dim for spec in recipe.inputs)
        dims = recipe.dims.get(bench.batch_dim)
        largest = bench.server.max_batch or max(bench.batch_sizes)
        max_batch = min(largest, dims.max) if batched and dims is not None else 0
        return cls(max_batch, bench.server.max_queue_delay_ms)


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


@dataclass(frozen=True)
class Running:
    triton: Any  # PyTriton's Triton
    log: Path  # kept only when serving failed
    model: str
    ports: Ports
    clock: RunnerClock

    def alive(self) -> bool:
        return bool(self.triton.is_alive())

    def counters(self) -> dict[str, float]:
        """Triton's counters for the model now, and the runner's own time ({} when the endpoint is silent)."""
        try:
            with urllib.request.urlopen(f"http://{HOST}:{self.ports.metrics}/metrics", timeout=2.0) as answer:
                text = answer.read().decode(errors="replace")
        except OSError:
            return {}
        return reading(text, self.model, self.clock)


@contextlib.contextmanager
def triton_serving(
    model: str, runner: Runner, sample: Feeds, outputs: Feeds, batching: Batching, ports: Ports
) -> Iterator[Running]:
    """The active `runner` served as `model` until the block ends. The server's log is kept only when the
    block failed, for the error to name."""
    from pytriton.triton import Triton, TritonConfig

    saved = os.environ.get("LD_LIBRARY_PATH")  # the server's own: the deploy's later children keep theirs
    _python_backend_env()
    scratch = Path(tempfile.mkdtemp(prefix="pipeline-triton-"))  # the server's log; its workspace inside
    config = TritonConfig(
        http_address=HOST,
        http_port=ports.http,
        grpc_address=HOST,
        grpc_port=ports.grpc,
        metrics_address=HOST,
        metrics_port=ports.metrics,
        log_file=scratch / "tritonserver.log",
        log_verbose=0,
        exit_timeout_secs=10,
    )
    triton = Triton(config=config, workspace=scratch / "workspace")
    clock = RunnerClock()
    failed = True
    try:
        _bind(triton, model, runner, sample, outputs, batching, clock)
        _start(triton, ports)
        _require_loaded(model, ports)
        yield Running(triton, scratch / "tritonserver.log", model, ports, clock)
        failed = False
    except KeyboardInterrupt:
        failed = False
        raise
    finally:
        triton.stop()
        if saved is None:
            os.environ.pop("LD_LIBRARY_PATH", None)
        else:
            os.environ["LD_LIBRARY_PATH"] = saved
        if not failed:
            shutil.rmtree(scratch, ignore_errors=True)


STARTUP_S = 120.0  # the longest a live server may take to become ready (PyTriton's own bound)


def _start(triton: Any, ports: Ports) -> None:
    """Start the server and wait for it only while its process lives. PyTriton's run() polls the port for
    two minutes even when the server died at once (a shared library it could not load): a server that exits
    here is reported at once, with the last lines it printed."""
    triton._run_server()  # PyTriton's run() is this start, then connect(): the wait between them is ours
    server = triton._triton_server
    deadline = time.monotonic() + STARTUP_S
    while _get(f"http://{HOST}:{ports.http}/v2/health/ready") != 200:  # 400 until its models load
        if not server.is_alive():
            raise PipelineError(f"the Triton server exited as it started: {_last_lines(server.logs())}")
        if time.monotonic() > deadline:
            raise PipelineError(
                f"the Triton server was not ready after {STARTUP_S:g} s: {_last_lines(server.logs())}"
            )
        time.sleep(0.1)
    try:
        triton.connect()  # PyTriton loads the bound model here
    except Exception as exc:  # noqa: BLE001 - tritonclient's InferenceServerException: the load failed
        text = " ".join(str(exc).split()).split(" At: ")[0]  # the backend's Python traceback follows "At:"
        raise _not_loaded(text) from None


def _require_loaded(model: str, ports: Ports) -> None:
    """The server is up, but its Python backend may have failed to load the model (PyTriton only warns, and
    every request then fails): say why at start."""
    if _get(f"http://{HOST}:{ports.http}/v2/models/{model}/ready") == 200:
        return
    raise _not_loaded(_load_failure(model, ports.http) or "no reason given")


def _not_loaded(reason: str) -> PipelineError:
    """The server refused the model: the user's environment where PyTriton sits outside it (exit 2, with the
    way out), else the configuration or the binding this module made (a bug: exit 3)."""
    hint = _environment_hint()
    if hint:
        return PipelineError(f"the Triton server could not load the model: {reason}{hint}")
    return InternalError(f"the Triton server could not load the model the pipeline configured: {reason}")


def _load_failure(model: str, port: int) -> str | None:
    request = urllib.request.Request(f"http://{HOST}:{port}/v2/repository/index", data=b"{}", method="POST")
    try:
        with urllib.request.urlopen(request, timeout=5.0) as answer:
            index = json.loads(answer.read())
    except (OSError, ValueError):
        return None
    found = [m for m in index if isinstance(m, dict) and m.get("name") == model]
    return next((str(m["reason"]) for m in found if m.get("reason")), None)


def _environment_hint() -> str:
    """Triton's Python backend imports PyTriton's proxy from the environment of the interpreter that started
    the server (found through PATH), never from PYTHONPATH: where PyTriton sits outside that environment, say
    so."""
    import pytriton

    here = Path(pytriton.__file__).resolve().parent.parent
    environment = [Path(p).resolve() for p in site.getsitepackages()]
    if here in environment:
        return ""
    return (
        f" (PyTriton is installed at {here}, outside this interpreter's environment {sys.prefix}: Triton's "
        "Python backend does not read PYTHONPATH; install the serve extra into a virtual environment, or "
        "make one with --system-site-packages and a .pth file naming that folder)"
    )


def _get(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=2.0) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return None


def _last_lines(log: str, count: int = 3) -> str:
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    return " | ".join(lines[-count:]) or "it printed nothing"


def _bind(
    triton: Any,
    model: str,
    runner: Runner,
    sample: Feeds,
    outputs: Feeds,
    batching: Batching,
    clock: RunnerClock,
) -> None:
    from pytriton.decorators import batch
    from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor

    names, batched = list(sample), batching.max_batch > 0
    # A tensor that is only the batch axis (one value per sample) has no dims of its own, which Triton refuses
    # ("must specify 'dims'"): it is served as [batch, 1], as a config.pbtxt's dims [ 1 ] reshaped to [ ] is
    # (pipeline/release/triton.py), and the runner keeps seeing and giving [batch].
    own = 1 if batched else 0  # the leading axes that are not the tensor's own dims
    flat_in = {n for n, a in sample.items() if a.ndim == own}
    flat_out = {n for n, a in outputs.items() if np.asarray(a).ndim == own}

    def run(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        started = time.perf_counter()
        given = {
            name: feeds[name].reshape(feeds[name].shape[:own]) if name in flat_in else feeds[name]
            for name in names
        }
        found = runner.infer(given)
        answer = {
            name: np.ascontiguousarray(found[name]).reshape(*np.shape(found[name]), 1)
            if name in flat_out
            else np.ascontiguousarray(found[name])
            for name in outputs
        }
        rows = len(feeds[names[0]]) if batched and names else 1
        clock.add(rows, time.perf_counter() - started)
        return answer

    def each(requests: list[Any]) -> list[dict[str, np.ndarray]]:
        return [run(request) for request in requests]

    def tensor(name: str, array: np.ndarray) -> Any:
        shape = array.shape[own:]
        return Tensor(name=name, dtype=array.dtype, shape=tuple(-1 for _ in shape) or (1,))

    triton.bind(
        model_name=model,
        infer_func=batch(lambda **feeds: run(feeds)) if batched else each,
        inputs=[tensor(n, a) for n, a in sample.items()],
        outputs=[tensor(n, a) for n, a in outputs.items()],
        config=ModelConfig(
            batching=batched,
            max_batch_size=batching.max_batch,
            batcher=DynamicBatcher(max_queue_delay_microseconds=round(batching.queue_delay_ms * 1000)),
        ),
        strict=True,
    )


def _python_backend_env() -> None:
    """The libraries the server and its Python backend must find first.

    Triton's Python backend stub links libpython dynamically; where the system has another build of this
    Python's version (a pyenv or venv interpreter beside Debian's), the stub would load that one with this
    interpreter's standard library and fail to load the model: this interpreter's own library goes first.

    PyTriton looks for the libraries it bundles (nvidia_pytriton.libs, libcudart among them) beside itself only
    in a site-packages folder; installed elsewhere (pip --target, a PYTHONPATH folder) it takes itself for an
    editable install, and the server dies at start for want of them: the folder beside the package goes
    first too."""
    import pytriton

    bundled = Path(pytriton.__file__).parent.parent / "nvidia_pytriton.libs"
    libdir = sysconfig.get_config_var("LIBDIR")
    soname = sysconfig.get_config_var("INSTSONAME") or ""
    first = [str(bundled)] if bundled.is_dir() else []
    if libdir and soname and os.path.exists(os.path.join(libdir, soname)):
        first.append(libdir)
    current = [p for p in os.environ.get("LD_LIBRARY_PATH", "").split(":") if p]
    os.environ["LD_LIBRARY_PATH"] = ":".join([*first, *(p for p in current if p not in first)])
