"""Whether ONNX Runtime can load a graph (and run it at given feeds), asked in a child process: a graph a converter produced can crash the
runtime natively as it loads (ONNX Runtime 1.2x's CPU session segfaults on some FP16 recurrent graphs), and a
crash in the deploy's own process would end the deploy with no message. In a child it is one variant's
failure, with the signal named."""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from pipeline.core.children import child_env, exit_text, popen_tied, python

SHAPES = "output-shapes.json"  # what the probe writes in each folder of feeds it ran (output name -> shape)

PROBE = (
    "import json, sys, numpy as np, onnxruntime as ort\n"
    "from pathlib import Path\n"
    "try:\n"
    "    session = ort.InferenceSession(sys.argv[1], providers=['CPUExecutionProvider'])\n"
    "    names = [o.name for o in session.get_outputs()]\n"
    "    for folder in map(Path, sys.argv[2:]):\n"
    "        got = session.run(None, {f.stem: np.load(f) for f in sorted(folder.glob('*.npy'))})\n"
    "        shapes = {n: list(v.shape) for n, v in zip(names, got) if isinstance(v, np.ndarray)}\n"
    f"        (folder / {SHAPES!r}).write_text(json.dumps(shapes))\n"
    "except Exception as exc:\n"
    "    print(f'{type(exc).__name__}: {\" \".join(str(exc).split())[:400]}')\n"
    "    sys.exit(1)\n"
)
TIMEOUT_S = 600.0  # loading (and a run at each shape asked for) takes seconds even for big graphs


class Crashed(Exception):
    """ONNX Runtime died (or hung) loading the graph: nothing in this process may load it."""


def load_problem(path: Path, timeout_s: float = TIMEOUT_S, feeds: tuple[Path, ...] = ()) -> str | None:
    """None when ONNX Runtime's CPU session loads the graph (and runs it at each folder of feeds, one `.npy`
    per input named like it), else its error message; raises Crashed when the runtime crashes or hangs."""
    return run_graph(path, timeout_s, feeds)[0]


def run_graph(
    path: Path, timeout_s: float = TIMEOUT_S, feeds: tuple[Path, ...] = ()
) -> tuple[str | None, list[dict[str, list[int]]]]:
    """load_problem, with the output shapes of each folder's run (output name -> shape) when it ran."""
    proc = popen_tied(
        python("-c", PROBE, str(path), *map(str, feeds)),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        env=child_env(),
    )
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise Crashed(
            f"ONNX Runtime did not finish loading and running {path.name} within {timeout_s:g} s"
        ) from None
    lines = [line for line in out.splitlines() if line.strip()]
    if proc.returncode == 0:
        return None, [json.loads((folder / SHAPES).read_text()) for folder in feeds]
    if proc.returncode == 1 and lines:
        return lines[-1], []
    raise Crashed(f"ONNX Runtime crashed loading {path.name} ({exit_text(proc.returncode)})")


def corner_problem(path: Path, feeds: dict[str, dict[str, Any]]) -> str | None:
    """Why the graph at `path` does not run at each named set of feeds (the recipe's corners), or None; in a
    child, as load_problem. Only the feeds the graph declares as inputs are passed. A crash is the reason."""
    return corner_run(path, feeds)[0]


def corner_run(
    path: Path, feeds: dict[str, dict[str, Any]]
) -> tuple[str | None, dict[str, dict[str, list[int]]]]:
    """corner_problem, with each named set's output shapes (output name -> shape) when the graph ran."""
    import numpy as np
    import onnx

    names = {i.name for i in onnx.load(str(path), load_external_data=False).graph.input}
    with tempfile.TemporaryDirectory(prefix="onnx-corners-") as tmp:
        folders = []
        for corner, values in feeds.items():
            folders.append(Path(tmp) / corner)
            folders[-1].mkdir()
            for name, value in values.items():
                if name in names:
                    np.save(folders[-1] / f"{name}.npy", value)
        try:
            problem, shapes = run_graph(path, feeds=tuple(folders))
        except Crashed as exc:
            return str(exc), {}
    if problem:
        names = list(feeds)
        where = " or ".join(names) if len(names) < 3 else f"{', '.join(names[:-1])} or {names[-1]}"
        return f"at the {where} shape: {problem}", {}
    return None, dict(zip(feeds, shapes, strict=False))
