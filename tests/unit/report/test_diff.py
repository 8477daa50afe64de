from __future__ import annotations

import copy

from pipeline.report.diff import diff_versions
from tests.unit.report import samples


def _current() -> dict:
    return {
        "version": "v0003",
        "accuracy": samples.accuracy(),
        "speed": samples.speed(),
        "winner": samples.winner(),
        "signed_off": True,
    }


def test_speed_winner_and_verdict_changes():
    lines = diff_versions(samples.previous(), _current())
    assert lines[0] == (
        "winner onnx-fp32 (onnxruntime-cpu, host I/O) -> onnx-int8-dynamic (onnxruntime-cpu, "
        "host I/O), 34.7 ms -> 10.8 ms (-69%)"
    )
    assert "onnx-fp32 batch 1 p50 34.7 -> 31.6 ms (-9%)" in lines
    assert "onnx-int8 accuracy pass -> FAIL: cosine 0.971200 < 0.98 on sentence_embedding @ data" in lines
    assert "onnx-int8-dynamic new: accuracy pass" in lines
    assert "onnx-int8-dynamic batch 8 new: p50 65.9 ms" in lines
    assert any(line.startswith("tensorrt-rtx-fp16 not run: no TensorRT-RTX runtime") for line in lines)
    noise = next(line for line in lines if line.startswith("within noise"))
    assert "onnx-fp32 batch 8 (+0%)" in noise and "onnx-fp32 batch 1" not in noise


def test_identical_versions_have_only_noise():
    current = _current()
    previous = copy.deepcopy(current) | {"version": "v0002"}
    lines = diff_versions(previous, current)
    assert (
        lines[0]
        == "winner unchanged: onnx-int8-dynamic (onnxruntime-cpu, host I/O), 10.8 ms -> 10.8 ms (+0%, within noise)"
    )
    assert len(lines) == 2 and lines[1].startswith("within noise (p50 95% CIs overlap): ")


def test_unchanged_winner_and_lost_sign_off():
    previous = _current() | {"version": "v0002"}
    current = _current()
    current["speed"] = copy.deepcopy(current["speed"])
    current["winner"] = current["winner"] | {"value": 12.0, "interval": [11.9, 12.1]}
    assert diff_versions(previous, current)[0] == (
        "winner unchanged: onnx-int8-dynamic (onnxruntime-cpu, host I/O), 10.8 ms -> 12.0 ms (+11%)"
    )
    current["winner"] = current["winner"] | {"value": 10.85, "interval": [10.8, 10.95]}
    assert diff_versions(previous, current)[0].endswith("10.8 ms -> 10.8 ms (+0%, within noise)")
    failed = current | {"winner": None, "signed_off": False}
    lines = diff_versions(previous, failed)
    assert lines[:2] == [
        "verdict signed off -> not signed off",
        "winner onnx-int8-dynamic (onnxruntime-cpu, host I/O) -> none (sign-off failed)",
    ]


def test_rows_are_told_apart_by_runtime_io_and_shape():
    row = samples.speed()["results"][2]  # onnx-fp32 batch 1
    device = row | {"runtime": "onnxruntime-cuda", "io": "device", "p50_ms": 2.0, "p50_ci95_ms": [1.9, 2.1]}
    long = row | {"shapes": {"input_ids": [1, 256], "attention_mask": [1, 256]}}
    previous = {"version": "v1", "speed": {"results": [row]}}
    current = {"version": "v2", "speed": {"results": [row, device, long]}}
    lines = diff_versions(previous, current)
    assert "onnx-fp32 [onnxruntime-cuda, device I/O] batch 1 shape 1×128 new: p50 2.00 ms" in lines
    assert "onnx-fp32 [onnxruntime-cpu, host I/O] batch 1 shape 1×256 new: p50 31.6 ms" in lines


def test_removed_artifacts_and_moved_figures():
    previous = _current() | {"version": "v0002"}
    current = _current()
    current["accuracy"] = copy.deepcopy(current["accuracy"])
    del current["accuracy"]["artifacts"]["torchscript-fp32"]
    for check in current["accuracy"]["artifacts"]["onnx-int8-dynamic"]["checks"]:
        if check["metric"] == "cosine":
            check["value"] = 0.99
    current["speed"] = copy.deepcopy(current["speed"])
    current["speed"]["results"] = [
        r for r in current["speed"]["results"] if r["artifact"] != "torchscript-fp32"
    ]
    lines = diff_versions(previous, current)
    assert "torchscript-fp32 not validated any more" in lines
    assert "torchscript-fp32 batch 1 not benchmarked any more" in lines
    assert "onnx-int8-dynamic cosine 0.986200 -> 0.990000" in lines
