"""The benchmark stage end to end on real tiny artifacts (ONNX + TorchScript) with tiny windows: the
structure of speed.json, never the speed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from pipeline.bench.rows import flags
from pipeline.bench.shapes import BenchShape, benchmark_shapes, data_sequence_lengths
from pipeline.stages.benchmark import stage
from tests.contract import SPEED_ROW_KEYS
from tests.unit.runners.tiny_artifacts import (
    export_onnx,
    export_torchscript,
    planned_matrix,
    record,
    tiny_context,
)

TINY_WINDOWS = dict(
    warmup_iters=2,
    warmup_s=0.01,
    window_s=0.01,
    stable_windows=2,
    min_iters=3,
    min_s=0.02,
    max_windows=3,
    max_s=0.2,
    intra_op_threads=1,
    profile=True,  # off in the tiny recipe; the rows' profiles are checked here
)
ROW_KEYS = SPEED_ROW_KEYS
ENGINE = "tensorrt-rtx-fp16"
GPU = torch.cuda.is_available()
GPU_MODES = [("cuda", "host"), ("cuda", "device")]


@pytest.fixture(scope="module")
def speed(tmp_path_factory: pytest.TempPathFactory) -> dict:
    workdir = tmp_path_factory.mktemp("bench")
    ctx = tiny_context(workdir, **TINY_WINDOWS)
    messages: list[str] = []
    ctx.ctx.report = messages.append
    art = tmp_path_factory.mktemp("artifacts")
    inputs = {
        "onnx-fp32": export_onnx(ctx, art / "model.onnx"),
        "torchscript-fp32": export_torchscript(ctx, art / "model.ts"),
        ENGINE: record(ENGINE, art / "model.tensorrt-rtx.fp16.engine", "engine", "fp16"),
    }
    bench = stage(ctx.recipe, ctx.recipe_dir, list(inputs))
    assert bench.name == "benchmark" and bench.critical and bench.volatile
    assert bench.consumes == ("report:matrix",)  # what to time: the matrix the validate stage planned
    assert bench.consumes_any == (*inputs, "report:accuracy")  # to measure an unstable winner again
    json.dumps(bench.config.fingerprinted())
    result = ctx.run(bench, {**inputs, "report:matrix": planned_matrix(ctx, inputs, art)})
    assert [o.path for o in result.outputs] == ["reports/speed.json"] and result.outputs[0].kind == "report"
    report = json.loads((workdir / "reports" / "speed.json").read_text())
    report["_messages"] = messages
    return report


def test_speed_json_has_the_contract_keys(speed: dict) -> None:
    assert speed["schema_version"] == 1
    conditions = speed["conditions"]
    for key in ("intra_op_threads", "device", "versions", "policy", "measured_at", "host"):
        assert key in conditions
    assert conditions["intra_op_threads"] == 1
    assert conditions["measured_at"].endswith("Z")
    assert conditions["policy"]["max_windows"] == 3
    assert conditions["runtimes_timed"]["runtimes"] is None and conditions["runtimes_timed"]["rule"]
    phases = conditions["phase_seconds"]  # where a slow benchmark's time went
    assert set(phases) == {"gpu_workers", "measure", "profile"} and phases["measure"] > 0, (
        phases
    )  # no confirm
    for row in speed["results"]:
        assert set(row) >= ROW_KEYS, ROW_KEYS - set(row)
        assert row["n"] >= 1 and len(row["p50_ci95_ms"]) == 2
        assert row["p50_ci95_ms"] == row["ci95_ms"]["p50"] and set(row["ci95_ms"]) == {
            "p50",
            "p90",
            "p99",
            "mean",
        }
        assert sum(row["window_sizes"]) == row["n"] and len(row["window_sizes"]) == row["windows"]
        assert (row["unstable_reason"] is None) == row["stable"]
        assert row["min_ms"] <= row["p50_ms"] <= row["max_ms"]
        assert isinstance(row["stable"], bool)
        assert row["io"] == "host" or GPU  # on the CPU every row is host I/O


def test_one_row_per_artifact_runner_and_shape(speed: dict) -> None:
    rows = [(r["artifact"], r["runtime"], r["io"], r["batch"]) for r in speed["results"]]
    expected = {
        (artifact, f"{kind}-{device}", io, batch)
        for artifact, kind in [
            ("torch-fp32", "torch"),
            ("torchscript-fp32", "torchscript"),
            ("onnx-fp32", "onnxruntime"),
        ]
        for device, io in [("cpu", "host")] + (GPU_MODES if GPU else [])
        for batch in (1, 2)
        # a GPU host times the GPU runtimes, and the CPU reference at the smallest batch only
        if not GPU or device == "cuda" or (artifact == "torch-fp32" and batch == 1)
    }
    # a TorchScript traced on the CPU may bake the CPU device in: on CUDA it then fails, and says so
    failed = {(e["artifact"], e["runtime"], e["io"], e["batch"]) for e in speed["failed"]}
    assert all(f[1] == "torchscript-cuda" for f in failed)
    assert set(rows) | failed == expected and len(rows) + len(failed) == len(expected)
    for row in speed["results"]:
        assert row["shapes"] == {"input_ids": [row["batch"], 16], "attention_mask": [row["batch"], 16]}


def test_engine_without_gpu_is_not_run_with_a_reason(speed: dict) -> None:
    entries = [e for e in speed["not_run"] if e["artifact"] == ENGINE]
    assert len(entries) == 1 and entries[0]["reason"]
    assert all(r["artifact"] != ENGINE for r in speed["results"])


def test_flags_list_and_progress(speed: dict) -> None:
    assert isinstance(speed["flags"], list)
    unstable = {(f["artifact"], f["batch"]) for f in speed["flags"] if f["kind"] == "unstable"}
    assert unstable == {(r["artifact"], r["batch"]) for r in speed["results"] if not r["stable"]}
    assert any(m.startswith("benchmark onnx-fp32") and "batch 2" in m for m in speed["_messages"])


def _row(artifact: str, precision: str, p50: float, ci: tuple[float, float]) -> dict:
    return {
        "artifact": artifact,
        "precision": precision,
        "runtime": "onnxruntime-cpu",
        "io": "host",
        "batch": 1,
        "sequence_length": 16,
        "shapes": {"x": [1, 16]},
        "p50_ms": p50,
        "p50_ci95_ms": list(ci),
        "stable": True,
        "cv": 0.01,
        "stop_reason": "stable",
    }


def test_int8_not_faster_than_fp16_is_flagged() -> None:
    slower = flags(
        [_row("onnx-fp16", "fp16", 10.0, (9.8, 10.2)), _row("onnx-int8", "int8", 11.0, (10.8, 11.2))]
    )
    assert [(f["kind"], f["artifact"], f["than"]) for f in slower] == [
        ("int8_not_faster", "onnx-int8", "onnx-fp16")
    ]
    assert slower[0]["message"].endswith(": slower")  # beyond the noise
    noise = flags([_row("onnx-fp16", "fp16", 10.0, (9.5, 10.5)), _row("onnx-int8", "int8", 9.9, (9.4, 10.4))])
    assert [f["kind"] for f in noise] == ["int8_not_faster"]
    assert noise[0]["message"].endswith("not faster beyond the noise (confidence intervals overlap)")
    # a higher p50 within the noise is not called plainly slower
    close = flags(
        [_row("onnx-fp16", "fp16", 10.0, (9.5, 10.5)), _row("onnx-int8", "int8", 10.1, (9.6, 10.6))]
    )
    assert close[0]["message"].endswith(": slower by p50, within the noise (confidence intervals overlap)")
    faster = flags([_row("onnx-fp16", "fp16", 10.0, (9.8, 10.2)), _row("onnx-int8", "int8", 5.0, (4.9, 5.1))])
    assert faster == []


def test_shapes_follow_the_recipe(tmp_path: Path) -> None:
    recipe = tiny_context(tmp_path).recipe
    bench, dims = recipe.benchmark, recipe.dims
    assert benchmark_shapes(bench, dims) == [BenchShape(1, 16), BenchShape(2, 16)]
    from_data = bench.model_copy(update={"sequence_lengths": "data"})
    assert benchmark_shapes(from_data, dims, [5, 9, 10, 40, 50]) == [
        BenchShape(b, s) for b in (1, 2) for s in (10, 32)
    ]
    assert benchmark_shapes(from_data, dims, []) == [BenchShape(1, 16), BenchShape(2, 16)]  # no lengths: opt
    no_sequence = bench.model_copy(update={"sequence_dim": None})
    assert benchmark_shapes(no_sequence, dims) == [BenchShape(1, None), BenchShape(2, None)]


def test_data_sequence_lengths_are_median_and_p90_clipped() -> None:
    assert data_sequence_lengths(list(range(1, 101)), 8, 256) == [50, 90]
    assert data_sequence_lengths([3, 3, 3], 8, 256) == [8]
    assert data_sequence_lengths([], 8, 256) == []


def test_an_unstable_would_be_winner_is_measured_again(tmp_path: Path) -> None:
    """With a stability bound nothing can meet, the would-be winner and its rivals get more windows (earlier
    ones kept) before selection; rows of other shapes and of candidates that cannot win are left alone."""
    # every window must agree exactly (it failed once in a full run with two windows: no row re-measured, cause
    # unknown; the message below says what the rows were if it happens again)
    ctx = tiny_context(tmp_path, **(TINY_WINDOWS | {"stable_within": 1e-9, "stable_windows": 3}))
    messages: list[str] = []
    ctx.ctx.report = messages.append
    inputs = {
        "onnx-fp32": export_onnx(ctx, tmp_path / "model.onnx"),
        "torchscript-fp32": export_torchscript(ctx, tmp_path / "model.ts"),
    }
    accuracy = {
        "artifacts": {
            name: {"passed": True, "runtimes": {runtime: {"passed": True}}}
            for name, runtime in (("onnx-fp32", "onnxruntime-cpu"), ("torchscript-fp32", "torchscript-cpu"))
        }
    }
    (tmp_path / "accuracy.json").write_text(json.dumps(accuracy))
    inputs_with_accuracy = {
        **inputs,
        "report:accuracy": record("report:accuracy", tmp_path / "accuracy.json", "report", None),
        "report:matrix": planned_matrix(ctx, inputs, tmp_path),
    }
    ctx.run(stage(ctx.recipe, ctx.recipe_dir, list(inputs)), inputs_with_accuracy)
    speed = json.loads((tmp_path / "reports" / "speed.json").read_text())
    again = {(r["artifact"], r["batch"]) for r in speed["results"] if r.get("remeasured")}
    said = [
        (r["artifact"], r["runtime"], r["batch"], r["stable"], r["window_medians_ms"])
        for r in speed["results"]
    ]
    assert again, f"nothing re-measured: rows {said}, failed {speed['failed']}, messages {messages[-5:]}"
    assert all(batch == 1 for _, batch in again)  # the objective's shape only
    assert ("torch-fp32", 1) not in again  # the reference cannot win
    for row in speed["results"]:
        if row.get("remeasured"):
            assert row["windows_remeasured"] >= 1 and not row["stable"]
            assert sum(row["window_sizes"]) == row["n"]
    assert any("is unstable; measuring" in m for m in messages)


def test_a_throughput_objective_measures_every_row_and_selects_on_it(tmp_path: Path) -> None:
    """Under selection.objective.metric = sequences_per_s the CPU rows get a throughput run too (on a CPU host
    they are the only rows): sequences/s with an interval from its segments, and selection reads it."""
    from pipeline.bench.device import SEGMENTS
    from pipeline.decide.selection import SelectionPolicy, choose
    from pipeline.recipe import Objective

    ctx = tiny_context(tmp_path, **(TINY_WINDOWS | {"throughput_s": 0.05}))
    selection = ctx.recipe.selection.model_copy(
        update={"objective": Objective(metric="sequences_per_s", batch=2)}
    )
    ctx.recipe = ctx.recipe.model_copy(update={"selection": selection})
    inputs = {
        "onnx-fp32": export_onnx(ctx, tmp_path / "model.onnx"),
        "torchscript-fp32": export_torchscript(ctx, tmp_path / "model.ts"),
    }
    ctx.run(
        stage(ctx.recipe, ctx.recipe_dir, list(inputs)),
        {**inputs, "report:matrix": planned_matrix(ctx, inputs, tmp_path)},
    )
    speed = json.loads((tmp_path / "reports" / "speed.json").read_text())
    assert speed["results"]
    for row in speed["results"]:
        run = row["throughput"]
        assert run["requests"] >= SEGMENTS and len(run["segment_rates"]) == SEGMENTS
        # equal segments, each as many requests as the row's median call fits in a fifth of throughput_s
        per_segment = max(1, round(0.05 / SEGMENTS / (row["p50_ms"] / 1000)))
        assert run["requests"] == SEGMENTS * per_segment
        low, high = run["ci95"]
        assert low <= run["sequences_per_s"] <= high and low > 0
        assert run["sequences_per_s"] == pytest.approx(
            row["batch"] * run["requests"] / run["seconds"], rel=1e-3
        )
        assert isinstance(run["stable"], bool)
    accuracy = {
        "artifacts": {
            name: {"passed": True, "runtimes": {runtime: {"passed": True}}}
            for name, runtime in (("onnx-fp32", "onnxruntime-cpu"), ("torchscript-fp32", "torchscript-cpu"))
        }
    }
    winner = choose(SelectionPolicy.from_recipe(ctx.recipe), speed, accuracy)
    best = max(
        (r for r in speed["results"] if r["batch"] == 2 and r["artifact"] != "torch-fp32"),
        key=lambda r: r["throughput"]["sequences_per_s"],
    )
    assert winner["unit"] == "seq/s"
    tied = " ".join(winner["within_noise_of"])  # the best, or the simpler of those tied with it
    assert winner["artifact"] == best["artifact"] or f"{best['artifact']} ({best['runtime']}" in tied


def test_each_row_says_where_its_time_goes(speed: dict) -> None:
    """Every row at the objective's batch (every GPU row) carries a profile of real operators (PyTorch's, or
    ONNX Runtime's through its own profiler; on a GPU, kernels) whose time split covers the call."""
    runtimes = set()
    for row in speed["results"]:
        on_cuda = row["runtime"].endswith("-cuda")
        if row["batch"] != 1 and not on_cuda:  # a CPU row is profiled at the objective's batch only
            assert "profile" not in row
            continue
        profile = row["profile"]
        assert "unavailable" not in profile, (row["runtime"], profile)
        runtimes.add(row["runtime"])
        unit = "kernels_per_call" if on_cuda else "operators_per_call"
        assert profile[unit] > 0 and profile["calls"] >= 3 and profile["call_ms"] > 0
        split = profile["split"]
        assert set(split) == {"gemm", "attention", "elementwise", "copies", "idle"}
        assert abs(sum(split.values()) - 1) < 0.01 and min(split.values()) >= 0
        assert split["gemm"] > 0  # the tiny BERT's projections
        shares = [k["share_of_busy"] for k in profile["top"]]
        assert shares == sorted(shares, reverse=True) and 0 < shares[0] <= 1
        assert profile["bound"] in {"launch-bound", "overhead-bound", "compute-bound", "memory-bound"}
    assert {"torch-cpu", "torchscript-cpu", "onnxruntime-cpu"} <= runtimes
    ort = next(r["profile"] for r in speed["results"] if r["runtime"] == "onnxruntime-cpu")
    assert "ONNX Runtime" in ort["tool"] and any("MatMul" in k["name"] for k in ort["top"])


def test_int8_slower_than_fp32_is_flagged_when_fp16_is_slower_still() -> None:
    """On a CPU FP16 is often the slowest: INT8 is judged against the fastest float row."""
    found = flags(
        [
            _row("onnx-fp16", "fp16", 20.0, (19.8, 20.2)),
            _row("onnx-fp32", "fp32", 10.0, (9.8, 10.2)),
            _row("onnx-int8", "int8", 11.0, (10.8, 11.2)),
        ]
    )
    assert [(f["kind"], f["than"], f["than_precision"]) for f in found] == [
        ("int8_not_faster", "onnx-fp32", "fp32")
    ]


def test_a_padded_row_faster_than_its_padding_aware_twin_is_flagged() -> None:
    padded = _row("onnx-fp32", "fp32", 0.10, (0.098, 0.102))
    aware = {**_row("onnx-fp32", "fp32", 0.15, (0.148, 0.152)), "runtime": "onnxruntime-cpu-bucketed"}
    [flag] = flags([padded, aware])
    assert flag["kind"] == "padding_aware_slower" and flag["twin"] == "onnxruntime-cpu-bucketed"
    assert "the other graphs' padded rows were left to their padding-aware twins" in flag["message"]
    within_noise = {**aware, "p50_ms": 0.101, "p50_ci95_ms": [0.095, 0.11]}
    assert flags([padded, within_noise]) == []
    assert (
        flags([{**padded, "p50_ms": 0.2, "p50_ci95_ms": [0.19, 0.21]}, aware]) == []
    )  # padding-aware faster
