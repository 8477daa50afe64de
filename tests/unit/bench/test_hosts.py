"""Which runtimes a host times and which variants it builds (benchmark.runtimes, variants.gpu)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.bench import hosts
from pipeline.bench.matrix import Matrix
from pipeline.core import host
from pipeline.run.plan import needed_variants
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
    monkeypatch.setattr(host, "has_cuda", lambda: False)
    assert [v.name for v in needed_variants(recipe)] == ["torchscript-fp32", "onnx-fp32"]
    skipped = hosts.skipped_gpu_variants(hosts.gpu_only_variants(recipe), gpu_host=False)
    assert [s["artifact"] for s in skipped] == ["aoti-fp16"] and "no CUDA GPU" in skipped[0]["reason"]
    monkeypatch.setattr(host, "has_cuda", lambda: True)
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
    aoti_modes = [
        "torch-aoti-cuda",
        "torch-aoti-cuda-bucketed",
        "torch-aoti-cuda-graph",
        "torch-aoti-cuda-graph-bucketed",
    ]
    aoti = [("aoti-fp16", r) for r in aoti_modes]
    exported = [("exported-fp16", r) for r in ["torch-cuda", "torch-compile-cuda-reduce-overhead"]]
    assert not hosts.timed(recipe, "aoti-fp16", "torch-aoti-cuda-bucketed", 1, True, pairs=aoti)
    assert hosts.timed(recipe, "aoti-fp16", "torch-aoti-cuda-bucketed", 1, True, pairs=aoti[:2])  # no twin
    assert not hosts.timed(recipe, "exported-fp16", "torch-cuda", 1, True, pairs=exported)
    reference = [("torch-fp32", "torch-cuda"), ("torch-fp32", "torch-cpu")]
    assert hosts.timed(recipe, "torch-fp32", "torch-cuda", 1, True, pairs=reference)
    # another artifact's mode is no twin: only the same artifact's
    assert hosts.timed(recipe, "exported-fp16", "torch-cuda", 1, True, pairs=[*exported[:1], *aoti])
    # the plain package's device-I/O rows go for its captured graph; its host-I/O row (no twin there) stays
    assert not hosts.timed(recipe, "aoti-fp16", "torch-aoti-cuda", 1, True, "device", aoti)
    assert hosts.timed(recipe, "aoti-fp16", "torch-aoti-cuda", 1, True, "host", aoti)
    # validation covers what is timed (the matrix): the plain package on its host-I/O row; the eager
    # ExportedProgram, left out in the only I/O mode it has, is validated on its compiled mode only
    offers = {
        "aoti-fp16": [
            (r, io)
            for r in aoti_modes
            for io in ("host", "device")
            if r == "torch-aoti-cuda" or io == "device"
        ],
        "exported-fp16": [(r, "device") for _, r in exported],
    }
    matrix = Matrix(recipe, gpu_host=True)
    for artifact, found in offers.items():
        matrix.offer(artifact, found)
    assert "torch-aoti-cuda" in matrix.plan("aoti-fp16").validated
    assert matrix.plan("exported-fp16").validated == ("torch-compile-cuda-reduce-overhead",)
    left = hosts.not_timed(recipe, aoti + exported, gpu_host=True)
    assert [(x["artifact"], x["runtime"], x["io"]) for x in left] == [
        ("aoti-fp16", "torch-aoti-cuda", "device"),
        ("aoti-fp16", "torch-aoti-cuda-bucketed", "device"),
        ("exported-fp16", "torch-cuda", "device"),
    ]
    assert "torch-aoti-cuda-graph is timed" in left[0]["reason"]
    assert "torch-aoti-cuda-graph-bucketed is timed" in left[1]["reason"]
    assert hosts.not_timed(recipe, aoti + exported, gpu_host=False) == []


def onnx_pairs(*artifacts: str) -> list[tuple[str, str]]:
    """The pairs a GPU host has for ONNX graphs (the Q/DQ graph has no CUDA-graph mode: graph_runners)."""
    runtimes = ["onnxruntime-cpu", "onnxruntime-cuda", "onnxruntime-cuda-graph"]
    return [(a, r) for a in artifacts for r in runtimes if not (a == "onnx-int8" and r.endswith("graph"))]


def test_plain_onnx_graphs_leave_their_device_rows_to_the_optimized_ones_on_the_cuda_provider() -> None:
    recipe = hosts.HostTiming.from_recipe(tiny_context(Path(".")).recipe)
    every = onnx_pairs("onnx-fp32", "onnx-fp16", "onnx-int8", "onnx-optimized-fp32", "onnx-optimized-fp16")
    for artifact in ("onnx-fp32", "onnx-fp16"):
        for runtime in ("onnxruntime-cuda", "onnxruntime-cuda-graph"):
            assert not hosts.timed(recipe, artifact, runtime, 2, True, "device", every)
            assert hosts.timed(
                recipe, artifact.replace("onnx-", "onnx-optimized-"), runtime, 2, True, "device", every
            )
        # the twin has a host-I/O row of its own: the plain graph's goes too, but validation still checks it
        assert not hosts.timed(recipe, artifact, "onnxruntime-cuda", 1, True, "host", every)
        assert not any(
            hosts.timed(recipe, artifact, "onnxruntime-cuda", b, True, "host", every) for b in (1, 2)
        )
        assert hosts.left_for_twin(recipe, artifact, "onnxruntime-cuda", True, every)
    assert not hosts.timed(recipe, "onnx-int8", "onnxruntime-cuda", 1, True, "device", every)
    assert not hosts.timed(recipe, "onnx-int8", "onnxruntime-cuda", 1, True, "host", every)
    assert hosts.left_for_twin(recipe, "onnx-int8", "onnxruntime-cuda", True, every)
    # a mode's twin (the AOTInductor graph) has no host I/O: that pair is not left out in every I/O mode
    aoti = [("aoti-fp16", "torch-aoti-cuda"), ("aoti-fp16", "torch-aoti-cuda-graph")]
    assert not hosts.left_for_twin(recipe, "aoti-fp16", "torch-aoti-cuda", True, aoti)
    assert not hosts.left_for_twin(recipe, "onnx-fp32", "onnxruntime-cuda", False, every)  # a CPU host
    untimed = hosts.not_timed(recipe, every, gpu_host=True)
    assert {x["io"] for x in untimed} == {"any"}
    left = {(x["artifact"], x["runtime"]): x["reason"] for x in untimed}
    assert set(left) == {
        ("onnx-fp32", "onnxruntime-cuda"),
        ("onnx-fp32", "onnxruntime-cuda-graph"),
        ("onnx-fp16", "onnxruntime-cuda"),
        ("onnx-fp16", "onnxruntime-cuda-graph"),
        ("onnx-int8", "onnxruntime-cuda"),
    }
    assert (
        "onnx-optimized-fp16 on onnxruntime-cuda-graph is timed"
        in left[("onnx-fp16", "onnxruntime-cuda-graph")]
    )
    assert "CPU provider only" in left[("onnx-int8", "onnxruntime-cuda")]
    # without the optimized graphs, the plain ones are timed, and the Q/DQ graph goes for the plain FP32 one
    plain = onnx_pairs("onnx-fp32", "onnx-fp16", "onnx-int8")
    assert hosts.timed(recipe, "onnx-fp32", "onnxruntime-cuda-graph", 2, True, "device", plain)
    left = hosts.not_timed(recipe, plain, gpu_host=True)
    assert [(x["artifact"], x["runtime"]) for x in left] == [("onnx-int8", "onnxruntime-cuda")]
    assert "onnx-fp32 on onnxruntime-cuda is timed" in left[0]["reason"]
    # a twin timed only in another runtime is no twin; the CPU host and listed runtimes time everything
    assert hosts.timed(recipe, "onnx-fp16", "onnxruntime-cuda", 2, True, "device", plain + every[:3])
    assert hosts.timed(recipe, "onnx-fp16", "onnxruntime-cpu", 2, False, "host", every)
    listed = hosts.HostTiming.from_recipe(
        tiny_context(Path("."), "benchmark.runtimes=[onnxruntime-cuda]").recipe
    )
    assert hosts.timed(listed, "onnx-fp16", "onnxruntime-cuda", 2, True, "device", every)
    assert hosts.not_timed(listed, every, gpu_host=True) == []


def test_host_io_is_also_timed_at_the_objective_batch_and_winner_runtimes_are_never_left_out() -> None:
    recipe = tiny_context(
        Path("."), "selection.objective.batch=2", "selection.runtimes=[torch-aoti-cuda-bucketed]"
    ).recipe
    timing = hosts.HostTiming.from_recipe(recipe)  # batch sizes [1, 2]
    assert hosts.timed(timing, "onnx-fp16", "onnxruntime-cuda", 2, True, "host")  # where the winner is chosen
    aoti = [("aoti-fp16", r) for r in ["torch-aoti-cuda-bucketed", "torch-aoti-cuda-graph-bucketed"]]
    assert hosts.timed(timing, "aoti-fp16", "torch-aoti-cuda-bucketed", 1, True, pairs=aoti)
    assert hosts.not_timed(timing, aoti, gpu_host=True) == []
    assert "host I/O at batch 1, 2 only" in hosts.policy(timing, True)["rule"]


def test_a_cpu_host_with_padded_traffic_times_all_but_the_plain_exports_padding_aware_only() -> None:
    recipe = tiny_context(Path("."), "runtime.padding={per_token_outputs: [hidden]}").recipe
    timing = hosts.HostTiming.from_recipe(recipe)
    pairs = [
        (artifact, runtime)
        for artifact in ("onnx-fp32", "onnx-int8-dynamic")
        for runtime in ("onnxruntime-cpu", "onnxruntime-cpu-bucketed")
    ]
    timed = {p for p in pairs if hosts.timed(timing, *p, 1, gpu_host=False, io="host", pairs=pairs)}
    assert timed == set(pairs) - {("onnx-int8-dynamic", "onnxruntime-cpu")}
    [left] = hosts.not_timed(timing, pairs, gpu_host=False)
    assert (left["artifact"], left["runtime"], left["io"]) == ("onnx-int8-dynamic", "onnxruntime-cpu", "any")
    assert "padding-aware twin onnxruntime-cpu-bucketed is timed" in left["reason"]
    assert "timed in that mode only, except for the plain exports" in hosts.policy(timing, False)["rule"]
    # without its twin among the pairs (no runtime.padding: no bucketed runner), nothing is left out
    plain = [p for p in pairs if p[1] == "onnxruntime-cpu"]
    assert all(hosts.timed(timing, *p, 1, gpu_host=False, io="host", pairs=plain) for p in plain)
    # a runtime selection.runtimes lists is never left out
    listed = tiny_context(
        Path("."), "runtime.padding={per_token_outputs: [hidden]}", "selection.runtimes=[onnxruntime-cpu]"
    ).recipe
    assert hosts.timed(
        hosts.HostTiming.from_recipe(listed), "onnx-int8-dynamic", "onnxruntime-cpu", 1, False, "host", pairs
    )
