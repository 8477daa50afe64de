"""A Triton server started for `serve` or the server scenario, where PyTriton is installed outside site-packages
(pip --target, a PYTHONPATH folder, as on hosts without a registry): it serves, and a server that dies as it
starts is reported at once with its own words, not after PyTriton's two-minute wait."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.reliability.conftest import ROOT

pytest.importorskip("pytriton", reason="the serve extra: pip install 'deploy-pipeline[serve]'")

CHILD = """
import sys
from pathlib import Path
import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper
import pytriton
from pipeline.core.errors import PipelineError
from pipeline.release.triton_server import Batching, Ports, triton_serving

assert pytriton.__file__.startswith(sys.argv[1]), pytriton.__file__  # the copy outside site-packages


class MatMul:
    def __init__(self, path):
        self.session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])

    def infer(self, feeds):
        return {"y": self.session.run(None, feeds)[0]}


w = np.eye(4, dtype=np.float32)
graph = helper.make_graph(
    [helper.make_node("MatMul", ["x", "w"], ["y"])], "mm",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
    [helper.make_tensor("w", TensorProto.FLOAT, w.shape, w.ravel())],
)
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
model.ir_version = 8
onnx.save(model, sys.argv[2])
runner = MatMul(sys.argv[2])
sample = {"x": np.ones((1, 4), np.float32)}
try:
    with triton_serving("mm", runner, sample, runner.infer(sample), Batching(4, 1.0), Ports.free()) as running:
        verdict = f"served {running.alive()}"
except PipelineError as exc:
    verdict = f"error: {exc}"
Path(sys.argv[3]).write_text(verdict)
"""


def _serve_from(folder: Path, tmp_path: Path, python: str = sys.executable) -> tuple[str, float]:
    """The child's verdict and its seconds, with `folder` first on PYTHONPATH. The verdict comes in a file: the
    server writes to the child's stdout and stderr, and its bytes can land inside a line the child prints."""
    # without the library path an earlier server of this test process left in the environment
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"} | {"PYTHONPATH": f"{folder}:{ROOT}"}
    verdict = tmp_path / "verdict.txt"
    started = time.monotonic()
    done = subprocess.run(
        [python, "-c", CHILD, str(folder), str(tmp_path / "mm.onnx"), str(verdict)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=200,
    )
    seconds = time.monotonic() - started
    assert done.returncode == 0 and verdict.exists(), done.stdout[-2000:] + done.stderr[-2000:]
    return verdict.read_text(), seconds


def _installed_elsewhere(tmp_path: Path, with_libs: bool) -> Path:
    """PyTriton as pip --target lays it out: the package, and its bundled libraries beside it (or not)."""
    import pytriton

    site = Path(pytriton.__file__).resolve().parent.parent
    folder = tmp_path / "target"
    folder.mkdir()
    (folder / "pytriton").symlink_to(site / "pytriton")
    if with_libs:
        (folder / "nvidia_pytriton.libs").symlink_to(site / "nvidia_pytriton.libs")
    return folder


def test_pytriton_installed_outside_site_packages_serves(tmp_path: Path) -> None:
    line, _ = _serve_from(_installed_elsewhere(tmp_path, with_libs=True), tmp_path)
    assert line == "served True", line


def test_a_server_that_dies_as_it_starts_is_reported_at_once_with_its_reason(tmp_path: Path) -> None:
    """Without its bundled libraries the server binary cannot even load: the error says so within seconds
    (PyTriton alone polled its port for 120 s)."""
    line, seconds = _serve_from(_installed_elsewhere(tmp_path, with_libs=False), tmp_path)
    assert line.startswith("error: the Triton server exited as it started:"), line
    assert "shared librar" in line, line
    assert seconds < 60, seconds


def test_pytriton_seen_only_through_pythonpath_is_refused_at_start_with_the_way_out(tmp_path: Path) -> None:
    """The interpreter's own environment lacks PyTriton and its proxy's modules (zmq), which only PYTHONPATH
    reaches: Triton's Python backend cannot load the model (it never reads PYTHONPATH). The error comes at
    start, with the backend's reason and what to do, not from every request."""
    import pytriton

    site_packages = Path(pytriton.__file__).resolve().parent.parent
    base = Path(sys.base_prefix) / "bin" / "python3"
    if Path(sys.prefix) == Path(sys.base_prefix) or not base.exists():
        pytest.skip("needs a virtual environment over a base interpreter without the serve extra")
    line, _ = _serve_from(site_packages, tmp_path, str(base))
    assert line.startswith("error: the Triton server could not load the model:"), line
    assert "No module named 'zmq'" in line and "does not read PYTHONPATH" in line, line
    assert " At: " not in line
