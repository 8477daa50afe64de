"""The card's load snippet for an exported program runs it where it won: one traced on the CPU and timed on a
GPU is moved there first, as the runners move it (device arguments baked into the graph included); on the CPU
it runs as written (tests/integration/test_packed_pt2.py runs that snippet)."""

from __future__ import annotations

from pathlib import Path

import torch

from pipeline.report.card import load_snippet


def _snippet(runtime: str, details: dict) -> str:
    header = {"artifacts": [{"name": "exported-fp16", "kind": "exported", "details": details}]}
    winner = {"artifact": "exported-fp16", "runtime": runtime, "file": "model.exported.fp16.pt2"}
    snippet = load_snippet(header, winner, ["images"])
    assert snippet is not None
    return snippet


def test_a_gpu_winner_is_moved_to_the_gpu_and_a_fused_one_says_what_torch_compile_needs() -> None:
    plain = _snippet("torch-cuda", {})
    assert 'move_to_device_pass(torch.export.load("model.exported.fp16.pt2"), "cuda").module()' in plain
    assert "register_meta" not in plain
    fused = _snippet("torch-compile-cuda-reduce-overhead", {"conv_epilogues": 49})
    assert "from pipeline.toolchain.conv_epilogue import register_meta; register_meta()" in fused
    compile(fused, "snippet", "exec")  # it parses as the user pastes it


def test_a_cpu_winner_loads_as_written(tmp_path: Path) -> None:
    model = torch.nn.Linear(4, 2).eval()
    path = tmp_path / "model.exported.fp32.pt2"
    torch.export.save(torch.export.export(model, (torch.randn(1, 4),)), str(path))
    snippet = _snippet("torch-cpu", {}).replace("model.exported.fp16.pt2", str(path))
    assert "move_to_device_pass" not in snippet
    scope = {"images": torch.ones(1, 4)}
    exec(snippet, scope)  # noqa: S102 - the product's own text, run as a user would paste it
    assert torch.allclose(scope["outputs"], model(torch.ones(1, 4)))
