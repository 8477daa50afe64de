"""Which runtimes a host times and which variants it builds (benchmark.runtimes, variants.gpu)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.bench import hosts
from pipeline.plan import needed_variants
from tests.unit.stages.onnx_fixtures import tiny_context


def test_gpu_host_times_gpu_runtimes_and_the_cpu_reference_at_the_smallest_batch() -> None:
    recipe = hosts.HostTiming.from_recipe(tiny_context(Path(".")).recipe)  # batch sizes [1, 2]
    assert hosts.timed(recipe, "onnx-fp32", "onnxruntime-cuda-graph", 2, gpu_host=True)
    assert hosts.timed(recipe, "aoti-fp16", "torch-aoti-cuda", 1, gpu_host=True)
    assert hosts.timed(recipe, "torch-fp32", "torch-cpu", 1, gpu_host=True)
    assert not hosts.timed(recipe, "torch-fp32", "torch-cpu", 2, gpu_host=True)
    assert not hosts.timed(recipe, "onnx-fp32", "onnxruntime-cpu", 1, gpu_host=True)
    assert "batch 1 only" in hosts.policy(recipe, True)["rule"]


def test_cpu_host_times_cpu_runtimes() -> None:
    recipe = hosts.HostTiming.from_recipe(tiny_context(Path(".")).recipe)
    assert hosts.timed(recipe, "onnx-fp32", "onnxruntime-cpu", 2, gpu_host=False)
    assert hosts.timed(recipe, "exported-fp32", "torch-cpu-bucketed", 2, gpu_host=False)
    assert not hosts.timed(recipe, "onnx-fp32", "onnxruntime-cuda", 1, gpu_host=False)


def test_listed_runtimes_are_timed_at_every_batch() -> None:
    recipe = tiny_context(Path("."), "benchmark.runtimes=[onnxruntime-cpu, torch-aoti-cuda-graph]").recipe
    recipe = hosts.HostTiming.from_recipe(recipe)
    assert hosts.timed(recipe, "onnx-fp32", "onnxruntime-cpu", 2, gpu_host=True)
    assert hosts.timed(recipe, "aoti-fp16", "torch-aoti-cuda-graph", 2, gpu_host=False)
    assert not hosts.timed(recipe, "torch-fp32", "torch-cpu", 1, gpu_host=True)
    assert hosts.policy(recipe, True)["runtimes"] == ["onnxruntime-cpu", "torch-aoti-cuda-graph"]


def test_gpu_variants_are_built_only_with_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    recipe = tiny_context(Path("."), "variants.gpu=[aoti-fp16]").recipe
    monkeypatch.setattr(hosts, "has_cuda", lambda: False)
    assert [v.name for v in needed_variants(recipe)] == ["torchscript-fp32", "onnx-fp32"]
    skipped = hosts.skipped_gpu_variants(hosts.gpu_only_variants(recipe), gpu_host=False)
    assert [s["artifact"] for s in skipped] == ["aoti-fp16"] and "no CUDA GPU" in skipped[0]["reason"]
    monkeypatch.setattr(hosts, "has_cuda", lambda: True)
    names = [v.name for v in needed_variants(recipe)]
    assert names == ["torchscript-fp32", "onnx-fp32", "exported-fp16", "aoti-fp16"]
    assert hosts.skipped_gpu_variants(hosts.gpu_only_variants(recipe), gpu_host=True) == []


def test_gpu_host_times_host_io_at_the_smallest_batch_only() -> None:
    recipe = hosts.HostTiming.from_recipe(tiny_context(Path(".")).recipe)  # batch sizes [1, 2]
    assert hosts.timed(recipe, "onnx-fp16", "onnxruntime-cuda", 1, True, "host")
    assert not hosts.timed(recipe, "onnx-fp16", "onnxruntime-cuda", 2, True, "host")
    assert hosts.timed(recipe, "onnx-fp16", "onnxruntime-cuda", 2, True, "device")
    assert hosts.timed(recipe, "onnx-fp32", "onnxruntime-cpu", 2, False, "host")  # a CPU host: every batch
    listed = tiny_context(Path("."), "benchmark.runtimes=[onnxruntime-cuda]").recipe
    assert hosts.timed(hosts.HostTiming.from_recipe(listed), "onnx-fp16", "onnxruntime-cuda", 2, True, "host")


def test_a_mode_whose_faster_twin_is_timed_is_left_out_and_named() -> None:
    recipe = hosts.HostTiming.from_recipe(tiny_context(Path(".")).recipe)
    aoti = [
        "torch-aoti-cuda",
        "torch-aoti-cuda-bucketed",
        "torch-aoti-cuda-graph",
        "torch-aoti-cuda-graph-bucketed",
    ]
    exported = ["torch-cuda", "torch-compile-cuda-reduce-overhead"]
    assert not hosts.timed(recipe, "aoti-fp16", "torch-aoti-cuda-bucketed", 1, True, siblings=aoti)
    assert hosts.timed(recipe, "aoti-fp16", "torch-aoti-cuda-bucketed", 1, True, siblings=aoti[:2])  # no twin
    assert not hosts.timed(recipe, "exported-fp16", "torch-cuda", 1, True, siblings=exported)
    assert hosts.timed(recipe, "torch-fp32", "torch-cuda", 1, True, siblings=["torch-cuda", "torch-cpu"])
    # the plain package's device-I/O rows go for its captured graph; its host-I/O row (no twin there) stays
    assert not hosts.timed(recipe, "aoti-fp16", "torch-aoti-cuda", 1, True, "device", aoti)
    assert hosts.timed(recipe, "aoti-fp16", "torch-aoti-cuda", 1, True, "host", aoti)
    assert hosts.timed_anywhere(recipe, "aoti-fp16", "torch-aoti-cuda", True, "host", aoti)  # so validated
    # validation covers what is timed: a mode left out in every I/O mode it has is not validated either
    assert not hosts.timed_anywhere(recipe, "exported-fp16", "torch-cuda", True, "device", exported)
    pairs = [("aoti-fp16", r) for r in aoti] + [("exported-fp16", r) for r in exported]
    left = hosts.not_timed(recipe, pairs, gpu_host=True)
    assert [(x["artifact"], x["runtime"], x["io"]) for x in left] == [
        ("aoti-fp16", "torch-aoti-cuda", "device"),
        ("aoti-fp16", "torch-aoti-cuda-bucketed", "device"),
        ("exported-fp16", "torch-cuda", "device"),
    ]
    assert "torch-aoti-cuda-graph is timed" in left[0]["reason"]
    assert "torch-aoti-cuda-graph-bucketed is timed" in left[1]["reason"]
    assert hosts.not_timed(recipe, pairs, gpu_host=False) == []


def test_host_io_is_also_timed_at_the_objective_batch_and_winner_runtimes_are_never_left_out() -> None:
    recipe = tiny_context(
        Path("."), "selection.objective.batch=2", "selection.runtimes=[torch-aoti-cuda-bucketed]"
    ).recipe
    timing = hosts.HostTiming.from_recipe(recipe)  # batch sizes [1, 2]
    assert hosts.timed(timing, "onnx-fp16", "onnxruntime-cuda", 2, True, "host")  # where the winner is chosen
    aoti = ["torch-aoti-cuda-bucketed", "torch-aoti-cuda-graph-bucketed"]
    assert hosts.timed(timing, "aoti-fp16", "torch-aoti-cuda-bucketed", 1, True, siblings=aoti)
    assert hosts.not_timed(timing, [("aoti-fp16", r) for r in aoti], gpu_host=True) == []
    assert "host I/O at batch 1, 2 only" in hosts.policy(timing, True)["rule"]
