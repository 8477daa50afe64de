"""Triton's preferred batch sizes come from measured throughput where the benchmark ran it (rule 6: never
derived from latency when a throughput run exists), else from calls made one at a time."""

from __future__ import annotations

from pipeline.release.triton import preferred_batch_sizes

WINNER = {"artifact": "aoti-fp16", "runtime": "torch-aoti-cuda-graph", "io": "device"}


def _row(batch: int, p50: float, rate: float | None = None) -> dict:
    row = {**WINNER, "batch": batch, "p50_ms": p50}
    if rate is not None:
        row["throughput"] = {"sequences_per_s": rate, "ci95": [rate * 0.99, rate * 1.01]}
    return row


def test_the_throughput_run_decides_where_it_exists() -> None:
    # by batch / p50 batch 32 would beat batch 8 (32/4 > 8/2); the throughput runs say it does not
    speed = {"results": [_row(1, 1.0, 900.0), _row(8, 2.0, 5000.0), _row(32, 4.0, 4800.0)]}
    assert preferred_batch_sizes(WINNER, speed, 64) == [8]


def test_without_throughput_runs_calls_one_at_a_time_decide() -> None:
    speed = {"results": [_row(1, 1.0), _row(8, 2.0), _row(32, 4.0), _row(64, 20.0)]}
    assert preferred_batch_sizes(WINNER, speed, 64) == [8, 32]
    assert preferred_batch_sizes(WINNER, speed, 16) == [8]  # never above the served maximum


def test_the_version_folder_is_the_release_number() -> None:
    from pipeline.release.triton import model_version

    assert [model_version(v) for v in ("v0001", "v0003", "v0120")] == ["1", "3", "120"]


def test_verify_parses_each_config_with_tritons_protobuf(tmp_path) -> None:
    import pytest

    pytest.importorskip("tritonclient", reason="the triton extra carries Triton's ModelConfig protobuf")
    from pipeline.release.triton import config_problems

    repo = tmp_path / "triton" / "m"
    repo.mkdir(parents=True)
    (repo / "config.pbtxt").write_text('name: "m"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n')
    assert config_problems(tmp_path) == []
    (repo / "config.pbtxt").write_text('name: "m"\nmax_batch_size: eight\n')
    (problem,) = config_problems(tmp_path)
    assert problem.startswith("triton/m/config.pbtxt: not a Triton model configuration")
