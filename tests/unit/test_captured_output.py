"""What exporters print or log goes to the stage's log, not the live display: torch.export prints the graph it
failed on to sys.stderr, and torch's artifact loggers carry stderr handlers of their own (a -q deploy showed
50 lines of graph code)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest

from pipeline.toolchain.onnx_tools import captured


def test_prints_and_torch_loggers_go_to_the_log(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    artifact = logging.getLogger("torch.fx.experimental.symbolic_shapes.test_artifact")
    artifact.addHandler(logging.StreamHandler(sys.stderr))
    artifact.propagate = False
    try:
        with captured(tmp_path / "export.log"):
            print("def forward(self, x): graph code", file=sys.stderr)
            print("progress on stdout")
            artifact.warning("Unable to find user code corresponding to u0")
    finally:
        artifact.handlers.clear()
    out, err = capfd.readouterr()
    assert out == "" and err == ""
    log = (tmp_path / "export.log").read_text()
    assert "graph code" in log and "progress on stdout" in log and "Unable to find user code" in log
