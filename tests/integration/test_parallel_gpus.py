"""`benchmark.parallel_gpus`: candidates shared out one GPU each, an artifact's runtimes together; a worker is a
real child process that measures its cells as the stage does and says where it ran; a host with fewer GPUs
than asked times on one and says so. The parallel run itself needs a host of two or more GPUs (the `gpu` test)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from pipeline.bench.gpu_split import plan_note, split, visible_gpus
from pipeline.stages.benchmark import stage
from pipeline.stages.benchmark_worker import run_workers
from tests.integration.test_benchmark_stage import TINY_WINDOWS
from tests.unit.runners.tiny_artifacts import export_onnx, export_torchscript, planned_matrix, tiny_context


def test_an_artifacts_runtimes_stay_on_one_gpu_and_the_gpus_share_the_cells() -> None:
    keys = [
        ("aoti-fp16", "torch-aoti-cuda", "host"),
        ("onnx-fp16", "onnxruntime-cuda", "device"),
        ("aoti-fp16", "torch-aoti-cuda-graph", "device"),
        ("exported-fp16", "torch-cuda", "device"),
        ("aoti-fp16", "torch-aoti-cuda", "device"),
    ]
    groups = split(keys, 2)
    assert groups == [
        [
            ("aoti-fp16", "torch-aoti-cuda", "host"),
            ("aoti-fp16", "torch-aoti-cuda-graph", "device"),
            ("aoti-fp16", "torch-aoti-cuda", "device"),
        ],
        [("onnx-fp16", "onnxruntime-cuda", "device"), ("exported-fp16", "torch-cuda", "device")],
    ]
    assert split(keys, 8) == [
        [k for k in keys if k[0] == a] for a in ("aoti-fp16", "onnx-fp16", "exported-fp16")
    ]
    assert split([], 4) == []


def test_fewer_gpus_than_asked_are_said() -> None:
    assert plan_note(1, 0, 0) is None and plan_note(2, 2, 2) is None
    assert plan_note(4, 1, 0) == "benchmark.parallel_gpus is 4, but this host has 1 GPU(s): timed on one"
    assert plan_note(4, 2, 2) == "benchmark.parallel_gpus is 4, but this host has 2 GPUs: timed on 2"
    assert plan_note(4, 8, 3) == "benchmark.parallel_gpus is 4: 3 GPU(s) used, one per GPU artifact to time"


def test_workers_are_pinned_to_the_gpus_this_process_was_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,7")
    assert visible_gpus(2) == ["5", "7"]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert visible_gpus(3) == ["0", "1", "2"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory):
    workdir = tmp_path_factory.mktemp("bench")
    ctx = tiny_context(workdir, **TINY_WINDOWS, parallel_gpus=2)
    art = tmp_path_factory.mktemp("artifacts")
    inputs = {
        "onnx-fp32": export_onnx(ctx, art / "model.onnx"),
        "torchscript-fp32": export_torchscript(ctx, art / "model.ts"),
    }
    return ctx, art, inputs


def test_a_worker_measures_its_cells_in_a_process_of_its_own(tiny) -> None:
    """A real child process, with its own view of the devices, times the cells it is given as the stage does
    (on this host the cells are CPU ones: the worker is the same for either)."""
    ctx, art, inputs = tiny
    bench = stage(ctx.recipe, ctx.recipe_dir, list(inputs))
    matrix = planned_matrix(ctx, inputs, art).report()
    cells = [("onnx-fp32", "onnxruntime-cpu", "host")]
    lines: list[str] = []
    ctx.ctx.report = lines.append
    [(device, given, outcome)] = run_workers(ctx.ctx, bench.config, inputs, matrix, [("", cells)])
    assert (device, given) == ("", cells) and outcome["ok"] is True, outcome
    rows = outcome["results"]
    assert {(r["artifact"], r["runtime"], r["io"]) for r in rows} == set(cells)
    assert sorted(r["batch"] for r in rows) == sorted(ctx.recipe.benchmark.batch_sizes)
    worker = rows[0]["runtime_details"]["gpu_worker"]
    assert worker["visible_device"] == "" and worker["process"] != os.getpid()
    assert any(line.startswith("[gpu ] benchmark onnx-fp32") for line in lines)  # its progress, tagged


def test_a_worker_that_cannot_measure_says_why(tiny, tmp_path: Path) -> None:
    ctx, art, inputs = tiny
    bench = stage(ctx.recipe, ctx.recipe_dir, list(inputs))
    matrix = planned_matrix(ctx, inputs, art).report()
    broken = {
        **inputs,
        "onnx-fp32": inputs["onnx-fp32"].__class__(
            **{**inputs["onnx-fp32"].__dict__, "path": tmp_path / "gone.onnx"}
        ),
    }
    [(_, _, outcome)] = run_workers(
        ctx.ctx, bench.config, broken, matrix, [("", [("onnx-fp32", "onnxruntime-cpu", "host")])]
    )
    assert outcome["ok"] is True and outcome["results"] == []
    assert outcome["failed"] and all(
        "gone.onnx" in f["reason"] or "NO_SUCHFILE" in f["reason"] for f in outcome["failed"]
    )


def test_a_host_with_fewer_gpus_times_on_one_and_says_so(tiny) -> None:
    ctx, art, inputs = tiny
    bench = stage(ctx.recipe, ctx.recipe_dir, list(inputs))
    ctx.run(bench, {**inputs, "report:matrix": planned_matrix(ctx, inputs, art)})
    speed = json.loads((ctx.workdir / "reports" / "speed.json").read_text())
    parallel = speed["conditions"]["parallel_gpus"]
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus < 2:
        assert (
            parallel["note"] == f"benchmark.parallel_gpus is 2, but this host has {gpus} GPU(s): timed on one"
        )
        assert parallel["workers"] == []
    assert speed["results"]


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs"
)
def test_on_two_gpus_each_worker_times_its_share(tiny) -> None:
    ctx, art, inputs = tiny
    bench = stage(ctx.recipe, ctx.recipe_dir, list(inputs))
    ctx.run(bench, {**inputs, "report:matrix": planned_matrix(ctx, inputs, art)})
    speed = json.loads((ctx.workdir / "reports" / "speed.json").read_text())
    workers = speed["conditions"]["parallel_gpus"]["workers"]
    assert len(workers) == 2 and {w["visible_device"] for w in workers} == {"0", "1"}
    gpu_rows = [r for r in speed["results"] if "gpu_worker" in r.get("runtime_details", {})]
    assert {r["runtime_details"]["gpu_worker"]["visible_device"] for r in gpu_rows} == {"0", "1"}
