"""What exporters print or log goes to the stage's log, not the live display: torch.export prints the graph it
failed on to sys.stderr, and torch's artifact loggers carry stderr handlers of their own (a -q deploy showed
50 lines of graph code)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest
import torch

from pipeline.toolchain.capture import captured


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


class _Histogram(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.histc(x, bins=4, min=-1, max=1).sum()


def test_the_graph_torchs_legacy_exporter_logs_on_failure_goes_to_the_log(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """torch's TorchScript-based exporter logs the whole graph through its C++ log (std::cout) when an operator
    has no ONNX form, and leaves that log switched on."""
    log, enabled = torch._C._jit_onnx_log, torch._C._jit_is_onnx_log_enabled()
    with pytest.raises(torch.onnx.errors.UnsupportedOperatorError), captured(tmp_path / "export.log"):
        torch.onnx.export(_Histogram(), (torch.randn(2, 8),), str(tmp_path / "h.onnx"), dynamo=False)
    out, err = capfd.readouterr()
    assert "Torch IR graph" not in out + err
    assert "Torch IR graph at exception: graph(" in (tmp_path / "export.log").read_text()
    # as it was: an earlier uncaptured legacy export in this process may have left torch's log on
    assert torch._C._jit_onnx_log is log and torch._C._jit_is_onnx_log_enabled() == enabled
