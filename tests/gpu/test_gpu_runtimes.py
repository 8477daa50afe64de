"""The GPU runtimes on a CUDA host, with the tiny encoder: AOTInductor (plain, CUDA graph, padding-aware),
the exported program (eager, torch.compile reduce-overhead), ONNX Runtime in CUDA-graph mode, TorchScript traced
on the GPU, and the benchmark rows' memory and throughput. Outputs are checked against the eager reference."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.core.artifacts import ArtifactRecord
from pipeline.runners.compiled import release_all
from pipeline.runners.registry import runners_for
from pipeline.stages import benchmark, export_torchscript
from tests.stage_env import StageEnv
from tests.unit.runners.tiny_artifacts import export_onnx, planned_matrix
from tests.unit.stages.onnx_fixtures import lowest_cosine, tiny_context

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
PT2 = ["exported-fp32", "exported-fp16", "exported-bf16", "aoti-fp32", "aoti-fp16", "aoti-bf16"]
PADDING = "runtime.padding={per_token_outputs: [hidden], multiple: 4, group_overhead_tokens: 0}"
TINY_WINDOWS = [
    "benchmark.warmup_s=0.01",
    "benchmark.window_s=0.01",
    "benchmark.min_s=0.02",
    "benchmark.max_s=0.2",
    "benchmark.min_iters=3",
    "benchmark.throughput_s=0.02",
    "benchmark.profile=true",  # off in the tiny recipe; the rows' profiles are checked here
]


def _record(ctx: StageEnv, out) -> ArtifactRecord:
    path = ctx.workdir / out.path
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    return ArtifactRecord(out.artifact, path, out.kind, out.precision, digest, "test", dict(out.details))


def _run(ctx: StageEnv, name: str, inputs: dict | None = None) -> ArtifactRecord:
    return _record(ctx, ctx.run_named(name, inputs, variants=PT2).outputs[0])


@pytest.fixture(scope="module")
def ctx(tmp_path_factory: pytest.TempPathFactory) -> StageEnv:
    return tiny_context(tmp_path_factory.mktemp("gpu"), PADDING, *TINY_WINDOWS)


@pytest.fixture(scope="module")
def exported(ctx: StageEnv) -> ArtifactRecord:
    return _run(ctx, "export_pt2_fp16")


@pytest.fixture(scope="module")
def aoti(ctx: StageEnv, exported: ArtifactRecord) -> ArtifactRecord:
    return _run(ctx, "aoti_fp16", {"exported-fp16": exported})


def _padded(ctx: StageEnv, batch: int, seq: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
    feeds = ctx.dataset().feeds_at({"batch": batch, "sequence": seq})
    real = np.linspace(seq, 3, batch).astype(int)
    mask = (np.arange(seq)[None, :] < real[:, None]).astype(feeds["attention_mask"].dtype)
    return {**feeds, "attention_mask": mask}, mask.astype(bool)


def _check(ctx: StageEnv, runner, feeds: dict, real: np.ndarray) -> None:
    with torch.no_grad():
        want = ctx.model().module(*(torch.from_numpy(feeds[s.name]) for s in ctx.recipe.inputs))
    got = runner.infer(feeds)
    assert lowest_cosine(got["hidden"][real][None], want[0].numpy()[real][None]) > 0.999, runner.runtime
    assert lowest_cosine(got["pooled"], want[1].numpy()) > 0.999, runner.runtime


def _exercise(ctx: StageEnv, runner) -> None:
    runner.activate()
    try:
        for batch, seq in ((4, 20), (1, 8)):
            feeds, real = _padded(ctx, batch, seq)
            _check(ctx, runner, feeds, real)
            runner.prepare(feeds)
            runner.infer_prepared()
            runner.synchronize()
        _check(ctx, runner, *_padded(ctx, 4, 20))  # back to a captured shape
    finally:
        runner.deactivate()


def test_aoti_package_compiled_for_the_gpu(aoti: ArtifactRecord) -> None:
    assert aoti.details["device"] == "cuda" and aoti.details["compile_s"] > 0


def test_aoti_runtimes(ctx: StageEnv, aoti: ArtifactRecord) -> None:
    runners = runners_for(aoti, ctx.settings)
    assert [(r.runtime, r.io) for r in runners] == [
        ("torch-aoti-cuda", "host"),
        ("torch-aoti-cuda", "device"),
        ("torch-aoti-cuda-bucketed", "device"),
        ("torch-aoti-cuda-graph", "device"),
        ("torch-aoti-cuda-graph-bucketed", "device"),
    ]
    for runner in runners:
        _exercise(ctx, runner)
    assert runners[4].cuda_graph and "padding" in runners[4].details


def test_exported_runtimes(ctx: StageEnv, exported: ArtifactRecord) -> None:
    runners = runners_for(exported, ctx.settings)
    assert [r.runtime for r in runners] == ["torch-cuda", "torch-compile-cuda-reduce-overhead"]
    for runner in runners:
        _exercise(ctx, runner)
    # a later activation (the benchmark's, after validation's) takes the compiled module and says what it held
    again = runners_for(exported, ctx.settings)[1]
    _exercise(ctx, again)
    assert again.details["compiled_before"] and again.details["resident_bytes"] > 0, again.details
    release_all()


def test_onnxruntime_cuda_graph(ctx: StageEnv, tmp_path: Path) -> None:
    from pipeline.runners.onnxruntime_runner import cuda_provider_available
    from pipeline.runners.ort_cuda_graph import OrtCudaGraphRunner

    if not cuda_provider_available():
        pytest.skip("onnxruntime has no CUDA provider here")
    artifact = export_onnx(ctx, tmp_path / "model.onnx")
    runner = next(r for r in runners_for(artifact, ctx.settings) if r.runtime == "onnxruntime-cuda-graph")
    assert isinstance(runner, OrtCudaGraphRunner)
    _exercise(ctx, runner)


def test_the_cuda_provider_is_not_offered_a_dynamic_int8_graph(ctx: StageEnv, tmp_path: Path) -> None:
    """ONNX Runtime's CUDA provider has no kernel for DynamicQuantizeLinear (nor MatMulInteger on uint8): it
    runs those on the CPU, so the graph keeps its CPU runner only; the FP32 and FP16 graphs get every CUDA
    runner (their shape arithmetic on the CPU is no reason)."""
    from dataclasses import replace

    from pipeline.runners.onnxruntime_runner import cuda_provider_available
    from pipeline.runners.registry import declined_runtimes
    from pipeline.stages.int8_dynamic import quantize

    if not cuda_provider_available():
        pytest.skip("onnxruntime has no CUDA provider here")
    fp32 = export_onnx(ctx, tmp_path / "model.onnx")
    assert declined_runtimes(fp32, ctx.settings) == {}
    assert {"onnxruntime-cuda", "onnxruntime-cuda-graph"} <= {
        r.runtime for r in runners_for(fp32, ctx.settings)
    }
    quantize(fp32.path, tmp_path / "model.int8-dynamic.onnx")  # what the int8_dynamic stage writes
    dynamic = replace(
        fp32, name="onnx-int8-dynamic", path=tmp_path / "model.int8-dynamic.onnx", precision="int8"
    )
    (reason,) = declined_runtimes(dynamic, ctx.settings).values()
    assert "DynamicQuantizeLinear" in reason, reason
    assert [r.runtime for r in runners_for(dynamic, ctx.settings)] == ["onnxruntime-cpu"]


def test_torchscript_traced_on_the_gpu(tmp_path: Path) -> None:
    ctx = tiny_context(tmp_path)
    result = ctx.run_named("export_torchscript")
    assert [o.path for o in result.outputs] == ["model.ts", export_torchscript.CUDA_FILE]
    record = _record(ctx, result.outputs[0])
    runner = next(
        r for r in runners_for(record, ctx.settings) if r.runtime == "torchscript-cuda" and r.io == "device"
    )
    _exercise(ctx, runner)


def test_benchmark_rows_have_memory_and_throughput(ctx: StageEnv, aoti: ArtifactRecord) -> None:
    bench = benchmark.stage(ctx.recipe, ctx.recipe_dir, ["aoti-fp16"])
    ctx.run(
        bench, {"aoti-fp16": aoti, "report:matrix": planned_matrix(ctx, {"aoti-fp16": aoti}, ctx.workdir)}
    )
    speed = json.loads((ctx.workdir / benchmark.REPORT).read_text())
    rows = speed["results"]
    assert {r["runtime"] for r in rows if r["artifact"] == "aoti-fp16"} == {
        "torch-aoti-cuda",
        "torch-aoti-cuda-graph",
        "torch-aoti-cuda-graph-bucketed",
    }
    # the modes without graphs are left out at device I/O by default, and said so
    left = speed["conditions"]["runtimes_timed"]["not_timed"]
    assert [(x["artifact"], x["runtime"], x["io"]) for x in left] == [
        ("aoti-fp16", "torch-aoti-cuda", "device"),
        ("aoti-fp16", "torch-aoti-cuda-bucketed", "device"),
    ]
    smallest = min(r["batch"] for r in rows)
    assert all(r["batch"] == smallest for r in rows if r["io"] == "host")  # host I/O at the smallest batch
    plain = [r["io"] for r in rows if r["runtime"] == "torch-aoti-cuda"]
    assert plain == ["host"]  # the plain package keeps its host-I/O row (the graph mode has none)
    cpu = [(r["runtime"], r["batch"]) for r in rows if "-cuda" not in r["runtime"]]
    assert cpu == [("torch-cpu", 1)]  # the CPU reference, at the smallest batch only
    for row in rows:
        if "-cuda" in row["runtime"]:
            assert row["peak_memory"]["bytes"] > 0 and row["throughput"]["sequences_per_s"] > 0, row
            low, high = row["throughput"]["ci95"]
            assert low <= row["throughput"]["sequences_per_s"] <= high, row
            assert row["cuda_graph"] == ("graph" in row["runtime"])
            _profiled_on_the_gpu(row)


def _profiled_on_the_gpu(row: dict) -> None:
    """A GPU row's profile counts the CUDA kernels of its calls (CUPTI sees every library's) and splits the
    call's time; the split covers it."""
    profile = row["profile"]
    assert profile.get("kernels_per_call", 0) > 0, (row["runtime"], profile)
    assert abs(sum(profile["split"].values()) - 1) < 0.01, profile
    assert profile["split"]["gemm"] > 0 and profile["bound"] in {
        "launch-bound",
        "compute-bound",
        "memory-bound",
    }


def test_a_plain_onnx_graph_leaves_its_rows_to_its_optimized_twin(ctx: StageEnv, tmp_path: Path) -> None:
    """With onnx-optimized-fp32 timed on the CUDA provider, onnx-fp32 gets no row there in either I/O mode, is
    still validated on that runtime, and speed.json names the pairs left out. The twin here is a copy of the
    same graph: the rule goes by the artifacts' names, not their speed."""
    import shutil

    from pipeline.runners.onnxruntime_runner import cuda_provider_available
    from pipeline.stages import validate
    from tests.unit.runners.tiny_artifacts import record

    if not cuda_provider_available():
        pytest.skip("onnxruntime has no CUDA provider here")
    plain = export_onnx(ctx, tmp_path / "model.onnx")
    shutil.copy(plain.path, tmp_path / "model.optimized.onnx")
    optimized = record("onnx-optimized-fp32", tmp_path / "model.optimized.onnx", "onnx")
    inputs = {"onnx-fp32": plain, "onnx-optimized-fp32": optimized}
    result = ctx.run(validate.stage(ctx.recipe, ctx.recipe_dir, list(inputs)), inputs)
    accuracy = result.outputs[0].value["artifacts"]
    assert set(accuracy["onnx-fp32"]["runtimes"]) == {"onnxruntime-cuda"}, accuracy
    assert accuracy["onnx-fp32"]["passed"], accuracy["onnx-fp32"]
    assert {"onnxruntime-cuda", "onnxruntime-cuda-graph"} <= set(accuracy["onnx-optimized-fp32"]["runtimes"])
    matrix = record(
        "report:matrix", ctx.workdir / validate.MATRIX, "report", None
    )  # as validation planned it
    ctx.run(benchmark.stage(ctx.recipe, ctx.recipe_dir, list(inputs)), {**inputs, "report:matrix": matrix})
    speed = json.loads((ctx.workdir / benchmark.REPORT).read_text())
    rows = [(r["artifact"], r["runtime"], r["io"], r["batch"]) for r in speed["results"]]
    assert not [row for row in rows if row[0] == "onnx-fp32"], rows
    batches = sorted({b for *_, b in rows})
    for runtime in ("onnxruntime-cuda", "onnxruntime-cuda-graph"):
        timed = sorted(b for a, r, io, b in rows if (a, r, io) == ("onnx-optimized-fp32", runtime, "device"))
        assert timed == batches, (runtime, rows)
    assert ("onnx-optimized-fp32", "onnxruntime-cuda", "host", batches[0]) in rows
    for row in speed["results"]:
        if "-cuda" in row["runtime"]:  # ONNX Runtime's kernels too, graph replays among them
            _profiled_on_the_gpu(row)
    left = speed["conditions"]["runtimes_timed"]["not_timed"]
    assert [(x["artifact"], x["runtime"], x["io"]) for x in left] == [
        ("onnx-fp32", "onnxruntime-cuda", "any"),
        ("onnx-fp32", "onnxruntime-cuda-graph", "any"),
    ]


def test_a_cuda_graph_candidate_serves_load_in_buckets_captured_before_the_runs(
    ctx: StageEnv, aoti: ArtifactRecord, tmp_path: Path
) -> None:
    """The load stage's path for a CUDA-graph runtime: every bucket shape captured up front, a real LoadGen
    Server run replays them (no capture while requests wait), and a padded batch answers its real rows as the
    model does unpadded."""
    pytest.importorskip("mlperf_loadgen", reason="the load extra")
    from pipeline.bench.load.buckets import ShapeBuckets
    from pipeline.bench.load.loadgen_run import RunSettings, in_process, server_run
    from pipeline.bench.load.requests import RequestPool

    runners = {r.runtime: r for r in runners_for(aoti, ctx.settings) if r.io == "device" or not r.cuda_graph}
    graph, plain = runners["torch-aoti-cuda-graph"], runners["torch-aoti-cuda"]
    pool = RequestPool.from_dataset(ctx.dataset())
    buckets = ShapeBuckets.powers(8, pool.longest(), step=16)
    warm = pool.bucket_feeds(buckets)
    graph.keep_graphs(len(warm))
    graph.activate()
    plain.activate()
    try:
        for feeds in warm:
            graph.infer(feeds)
        captured = graph.captures
        assert captured == len(warm)
        settings = RunSettings(p99_ms=50.0, run_s=0.3, max_batch=8, max_delay_s=0.001)
        run = server_run(in_process(graph, pool, settings, buckets), pool, 200.0, settings, tmp_path / "run")
        assert run.error is None and run.queries > 0
        assert graph.captures == captured
        # requests that can share a batch: any, for padded text; those of one shape otherwise (synthetic ids)
        rows = [i for i in range(len(pool)) if pool.batchable or pool.key(i) == pool.key(0)][:3]
        padded, want = graph.infer(pool.collate(rows, buckets)), plain.infer(pool.collate(rows))
        for name, value in want.items():
            assert lowest_cosine(padded[name][: len(rows)], value) > 0.999, name
    finally:
        graph.deactivate()
        plain.deactivate()
