"""compare's judgments on constructed reports: interval verdicts, tolerance shares, and the speed gate on
what B ships (real versions are compared in tests/integration/test_first_hour.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pipeline.check.accuracy import tolerance_share
from pipeline.check.timings import Timing
from pipeline.check.version_diff import speed_verdict
from pipeline.release.compare import compare_served, regressions, shipped


@pytest.mark.parametrize(
    ("a", "b", "verdict"),
    [
        ([10.0, 11.0], [8.0, 9.5], "faster"),
        ([10.0, 11.0], [11.5, 12.0], "slower"),
        ([10.0, 11.0], [10.9, 12.0], "within noise"),
        ([10.0, 11.0], None, "no interval"),
    ],
)
def test_speed_verdicts_need_disjoint_intervals(a, b, verdict) -> None:
    assert speed_verdict(a, b) == verdict
    flipped = {"faster": "slower", "slower": "faster"}.get(verdict, verdict)
    assert speed_verdict(a, b, "sequences_per_s") == flipped  # more sequences/s is faster


def test_interval_of_the_objective_metric() -> None:
    row = Timing.read({"p50_ci95_ms": [1.0, 2.0], "ci95_ms": {"p99": [5.0, 7.0]}})
    assert row.interval("p50_ms") == (1.0, 2.0) and row.interval("p99_ms") == (5.0, 7.0)
    assert Timing.read({"p50_ci95_ms": [1.0, 2.0]}).interval("p90_ms") is None
    rate = Timing.read({"throughput": {"sequences_per_s": 5.0, "ci95": [4, 6]}})
    assert rate.interval("sequences_per_s") == (4.0, 6.0) and rate.value("sequences_per_s") == 5.0
    assert row.interval("sequences_per_s") is None and row.value("sequences_per_s") is None


def test_tolerance_share_reads_the_same_for_every_metric() -> None:
    assert tolerance_share("max_abs", 5e-4, 1e-3) == pytest.approx(0.5)
    assert tolerance_share("cosine", 0.9995, 0.999) == pytest.approx(0.5)
    assert tolerance_share("finite", 0, 0) is None and tolerance_share("cosine", 1.0, 1.0) is None


def _version(name: str, p50: float, ci: list[float], budget: dict[str, float]) -> dict[str, Any]:
    row = {"artifact": "onnx-fp32", "runtime": "onnxruntime-cpu", "io": "host", "batch": 1, "shapes": {}}
    row |= {"p50_ms": p50, "p50_ci95_ms": ci}
    winner = {**row, "objective": {"metric": "p50_ms", "batch": 1}, "value": p50}
    recipe = {"selection": {"regression": budget}}
    return {
        "folder": Path(name),
        "manifest": {"recipe": recipe},
        "speed": {"results": [row]},
        "accuracy": {"artifacts": {}},
        "winner": winner,
    }


@pytest.mark.parametrize(
    ("b_p50", "b_ci", "max_slowdown", "gated"),
    [
        (12.0, [11.8, 12.2], 0.1, True),  # 20 % slower, beyond noise and budget
        (12.0, [10.5, 12.5], 0.1, False),  # 20 % slower, but the intervals overlap
        (12.0, [11.8, 12.2], 0.25, False),  # beyond noise, within the budget
    ],
)
def test_speed_gate_on_the_shipped_value(b_p50, b_ci, max_slowdown, gated) -> None:
    budget = {"max_slowdown": max_slowdown, "max_accuracy_loss": 0.25}
    a = _version("v0001", 10.0, [9.8, 10.9], budget)
    b = _version("v0002", b_p50, b_ci, budget)
    found = regressions(a, b, shipped(a, b, "p50_ms"))
    assert bool(found) == gated
    if gated:
        assert found[0].startswith("shipped p50_ms 10 -> 12 ms (+20.0%")


def test_throughput_gate_counts_a_lower_rate_as_the_slowdown() -> None:
    """Under a sequences_per_s objective B is slower when it serves fewer sequences/s."""
    budget = {"max_slowdown": 0.1, "max_accuracy_loss": 0.25}

    def version(name: str, rate: float, ci: list[float]) -> dict[str, Any]:
        v = _version(name, 1.0, [0.9, 1.1], budget)
        v["speed"]["results"][0]["throughput"] = {"sequences_per_s": rate, "ci95": ci}
        v["winner"] |= {"objective": {"metric": "sequences_per_s", "batch": 1}, "value": rate}
        return v

    a = version("v0001", 1000.0, [980.0, 1020.0])
    slower = version("v0002", 800.0, [790.0, 810.0])
    ship = shipped(a, slower, "sequences_per_s")
    assert ship["verdict"] == "slower" and ship["slowdown"] == pytest.approx(0.2)
    found = regressions(a, slower, ship)
    assert found and found[0].startswith("shipped sequences_per_s 1000 -> 800 seq/s (-20.0%: 20.0% slower")
    faster = version("v0003", 1300.0, [1290.0, 1310.0])
    ship = shipped(a, faster, "sequences_per_s")
    assert ship["verdict"] == "faster" and regressions(a, faster, ship) == []


def _served(rate: float, ci: list[float], target: float = 50.0) -> dict[str, Any]:
    """load.json of one candidate, onnx-fp32 in process, serving `rate` requests/s within `target` ms."""
    row = {"artifact": "onnx-fp32", "runtime": "onnxruntime-cpu", "through": "in_process"}
    return {"results": [row | {"p99_target_ms": target, "max_qps": rate, "ci95": ci}]}


@pytest.mark.parametrize(
    ("b_rate", "b_ci", "b_target", "verdict", "gated"),
    [
        (700.0, [690.0, 710.0], 50.0, "slower", True),  # 30 % less, beyond noise and the 10 % budget
        (700.0, [600.0, 990.0], 50.0, "within noise", False),  # the intervals overlap
        (1200.0, [1190.0, 1210.0], 50.0, "faster", False),
        (700.0, [690.0, 710.0], 20.0, "other target", False),  # not comparable: another SLO
    ],
)
def test_compare_gates_on_the_winners_served_rate(b_rate, b_ci, b_target, verdict, gated) -> None:
    budget = {"max_slowdown": 0.1, "max_accuracy_loss": 0.25}
    a = _version("v0001", 10.0, [9.8, 10.2], budget) | {"load": _served(1000.0, [980.0, 1020.0])}
    b = _version("v0002", 10.0, [9.8, 10.2], budget) | {"load": _served(b_rate, b_ci, b_target)}
    found = regressions(a, b, shipped(a, b, "p50_ms"))
    rows = compare_served(a["load"], b["load"])
    assert [r["verdict"] for r in rows] == [verdict]
    assert bool(found) == gated
    if gated:
        assert found == [
            "served onnx-fp32 (onnxruntime-cpu, in_process) at p99 ≤ 50 ms: 1000 -> 700 requests/s "
            "(30.0% less, budget 10%, slower)"
        ]


def _row(artifact: str, p50: float, ci: list[float], cuda_graph: bool = False) -> dict[str, Any]:
    return {
        "artifact": artifact,
        "runtime": "onnxruntime-cpu",
        "io": "host",
        "batch": 1,
        "shapes": {"input_ids": [1, 16]},
        "p50_ms": p50,
        "p50_ci95_ms": ci,
        "cuda_graph": cuda_graph,
    }


def test_compare_and_the_signoffs_changes_since_read_one_diff() -> None:
    """A row faster beyond noise, one within noise, one new and one gone: `compare` and the report's "changes
    since" say the same of each (check/version_diff.py), matching rows by the one row identity."""
    from pipeline.check.version_diff import speed_changes
    from pipeline.release.compare import compare_rows
    from pipeline.report.diff import diff_versions

    a = {
        "results": [
            _row("onnx-fp32", 10.0, [9.8, 10.2]),
            _row("torchscript-fp32", 5.0, [4.9, 5.1]),
            _row("onnx-int8", 7.0, [6.9, 7.1]),
        ]
    }
    b = {
        "results": [
            _row("onnx-fp32", 8.0, [7.9, 8.1]),
            _row("torchscript-fp32", 5.05, [4.95, 5.15]),
            _row("onnx-fp16", 6.0, [5.9, 6.1]),
            _row("onnx-fp32", 3.0, [2.9, 3.1], cuda_graph=True),
        ]
    }
    verdicts = {
        m.row.artifact + ("+graph" if m.row.cuda_graph else ""): m.verdict for m in speed_changes(a, b)
    }
    assert verdicts == {
        "onnx-fp32": "faster",
        "torchscript-fp32": "within noise",
        "onnx-int8": "gone",
        "onnx-fp16": "new",
        "onnx-fp32+graph": "new",
    }  # a CUDA graph is another row
    compared = {r["artifact"]: r["verdict"] for r in compare_rows(a, b, "p50_ms")}
    assert compared == {"onnx-fp32": "faster", "torchscript-fp32": "within noise"}
    lines = diff_versions({"speed": a}, {"speed": b})
    assert "onnx-int8 batch 1 not benchmarked any more" in lines
    assert "onnx-fp16 batch 1 new: p50 6.00 ms" in lines
    assert any(line.startswith("onnx-fp32 batch 1 p50 10.0 -> 8.00 ms") for line in lines)
    assert any(line.startswith("within noise") and "torchscript-fp32" in line for line in lines)
