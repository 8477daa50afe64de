"""`serve RECIPE [VERSION]`: the signed-off winner of a version behind a real Triton server (PyTriton, the
`serve` extra), with Triton's dynamic batcher, on HTTP and gRPC on localhost.

The winner runs as the deploy validated and timed it: its own runner (pipeline/runners/), the runtime it won on
with host I/O, in this process; Triton's Python backend hands it the batches. The model's tensors keep the
recipe's names (TorchScript's positional inputs too), and the batcher's largest batch and queue delay are the
recipe's `benchmark.server` ones. A version that does not verify against its manifest, or did not sign off, is
not served. Ctrl-C or SIGTERM stops the server and its processes and exits 0; a port already in use is refused
before anything starts."""

from __future__ import annotations

import signal
import sys
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
from pipeline.release.triton_server import HOST, Batching, Ports, triton_serving
from pipeline.runners.base import NotRunnable, Runner
from pipeline.runners.registry import runners_for


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
    chosen = Ports.free(*ports)
    from pipeline.recipe.loader import load

    recipe = load(folder / "recipe.yaml").recipe
    served = winner_runner(recipe, folder)
    sample = signature_sample(recipe)
    served.runner.activate()
    try:
        outputs = served.runner.infer(sample)  # the output signature, and the first call out of the way
        return _serve_until_stopped(recipe, served, sample, outputs, chosen, say, stop)
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


def _serve_until_stopped(
    recipe: Recipe,
    served: Served,
    sample: dict[str, np.ndarray],
    outputs: dict[str, np.ndarray],
    ports: Ports,
    say: Callable[[str], None],
    stop: threading.Event | None,
) -> int:
    batching = Batching.from_recipe(recipe)
    stopping = stop or threading.Event()
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, lambda *_: stopping.set()) if main else None
    try:
        with triton_serving(recipe.name, served.runner, sample, outputs, batching, ports) as running:
            winner = served.winner
            say(
                f"serving {recipe.name} {served.folder.name}: {winner['artifact']} on {winner['runtime']} "
                f"(max batch {batching.max_batch}, queue delay {batching.queue_delay_ms:g} ms)"
            )
            say(
                f"ready: http://{HOST}:{ports.http} (HTTP) · {HOST}:{ports.grpc} (gRPC) · "
                f"http://{HOST}:{ports.metrics}/metrics; model '{recipe.name}'; Ctrl-C or SIGTERM stops"
            )
            while not stopping.wait(0.2):
                if not running.alive():
                    raise PipelineError(
                        f"serve: the Triton server stopped on its own (its log: {running.log})"
                    )
            say("stopping the server")
    except KeyboardInterrupt:
        say("stopping the server")
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous)
        sys.stdout.flush()
    return 0
