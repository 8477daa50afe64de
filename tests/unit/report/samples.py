"""Realistic report dicts (the contract's JSON) for the report tests: several artifacts, one failing
validation, one engine not runnable here, one unstable benchmark row, and a previous version to diff."""

from __future__ import annotations

import copy
from typing import Any

SEQ = 128


def _check(output: str, inputs: str, metric: str, value: float, threshold: float, info: bool = False) -> dict:
    passed = value >= threshold if metric == "cosine" else value <= threshold
    check: dict[str, Any] = {
        "output": output,
        "inputs": inputs,
        "metric": metric,
        "value": value,
        "threshold": threshold,
        "passed": passed,
    }
    if info:
        check["informational"] = True
    return check


def _checks(
    cosine: float, max_abs: float, cos_thr: float, abs_thr: float, info_abs: bool = False
) -> list[dict]:
    checks = []
    for i, inputs in enumerate(("min", "opt", "max", "data")):
        for output in ("last_hidden_state", "sentence_embedding"):
            wobble = 1 + 0.1 * i
            checks.append(_check(output, inputs, "cosine", 1 - (1 - cosine) * wobble / 1.3, cos_thr))
            checks.append(_check(output, inputs, "max_abs", max_abs * wobble / 1.3, abs_thr, info_abs))
    return checks


def accuracy() -> dict:
    int8 = _checks(0.9712, 0.41, 0.98, 1.0, info_abs=True)
    return {
        "schema_version": 1,
        "reference": "torch-fp32",
        "artifacts": {
            "torchscript-fp32": {
                "passed": True,
                "reason": None,
                "precision": "fp32",
                "checks": _checks(0.99999994, 2.1e-6, 0.9999, 1e-3),
            },
            "onnx-fp32": {
                "passed": True,
                "reason": None,
                "precision": "fp32",
                "checks": _checks(0.9999999, 3.4e-6, 0.9999, 1e-3),
            },
            "onnx-fp16": {
                "passed": True,
                "reason": None,
                "precision": "fp16",
                "checks": _checks(0.99993, 0.061, 0.999, 5e-2, info_abs=True),
            },
            "onnx-int8": {
                "passed": False,
                "precision": "int8",
                "checks": int8,
                "reason": "cosine 0.971200 < 0.98 on sentence_embedding @ data",
            },
            "onnx-int8-dynamic": {
                "passed": True,
                "reason": None,
                "precision": "int8",
                "checks": _checks(0.9862, 0.33, 0.98, 1.0, info_abs=True),
            },
        },
        "not_run": [
            {
                "artifact": "tensorrt-rtx-fp16",
                "reason": "no TensorRT-RTX runtime for this machine: no GPU (cudaError 35 <driver>)",
            }
        ],
    }


def _row(
    artifact: str, runtime: str, batch: int, p50: float, stable: bool = True, spread: float = 0.08
) -> dict:
    shape = [batch, SEQ]
    return {
        "artifact": artifact,
        "precision": artifact.rsplit("-", 1)[-1] if artifact != "onnx-int8-dynamic" else "int8",
        "sequence_length": SEQ,
        "runtime": runtime,
        "io": "host",
        "batch": batch,
        "shapes": {"input_ids": shape, "attention_mask": shape},
        "n": 240 if stable else 61,
        "mean_ms": p50 * 1.02,
        "p50_ms": p50,
        "p90_ms": p50 * (1 + spread),
        "p95_ms": p50 * (1 + 1.4 * spread),
        "p99_ms": p50 * (1 + 2 * spread),
        "min_ms": p50 * 0.97,
        "max_ms": p50 * (1 + 3 * spread),
        "cv": spread / 2,
        "p50_ci95_ms": [round(p50 * 0.99, 3), round(p50 * 1.01, 3)],
        "stable": stable,
        "unstable_reason": None
        if stable
        else "window medians spread 12.0% over the last 3 windows (limit 5%)",
    }


def speed() -> dict:
    results = []
    for batch, scale in ((1, 1.0), (8, 6.1)):
        results += [
            _row("torch-fp32", "torch-cpu", batch, 39.3 * scale),
            _row("torchscript-fp32", "torchscript-cpu", batch, 35.0 * scale),
            _row("onnx-fp32", "onnxruntime-cpu", batch, 31.6 * scale),
            _row(
                "onnx-fp16",
                "onnxruntime-cpu",
                batch,
                30.2 * scale,
                stable=batch == 1,
                spread=0.4 if batch == 8 else 0.08,
            ),
            _row("onnx-int8", "onnxruntime-cpu", batch, 65.0 * scale / 1.8),
            _row("onnx-int8-dynamic", "onnxruntime-cpu", batch, 10.8 * scale),
        ]
    return {
        "schema_version": 1,
        "conditions": {
            "device": "cpu",
            "cpu": "AMD EPYC 9654 (2 threads)",
            "intra_op_threads": 2,
            "versions": {"onnxruntime": "1.32.0", "torch": "2.13.0"},
            "warmup": {"iters": 10, "s": 0.2},
            "windows": {"window_s": 0.2, "stable_within": 0.05},
        },
        "results": results,
        "not_run": [
            {
                "artifact": "tensorrt-rtx-fp16",
                "reason": "no TensorRT-RTX runtime for this machine: no GPU (cudaError 35 <driver>)",
            }
        ],
        "flags": [  # as the benchmark stage writes them: dicts with a kind, where, and a message
            {
                "kind": "int8_not_faster",
                "artifact": "onnx-int8",
                "than": "onnx-fp16",
                "runtime": "onnxruntime-cpu",
                "io": "host",
                "batch": 1,
                "sequence_length": SEQ,
                "shapes": {"input_ids": [1, SEQ], "attention_mask": [1, SEQ]},
                "message": "onnx-int8 p50 36.100 ms vs onnx-fp16 30.200 ms: slower",
            },
            {
                "kind": "unstable",
                "artifact": "onnx-fp16",
                "runtime": "onnxruntime-cpu",
                "io": "host",
                "batch": 8,
                "sequence_length": SEQ,
                "shapes": {"input_ids": [8, SEQ], "attention_mask": [8, SEQ]},
                "message": "stopped by max_windows, cv 0.200",
            },
        ],
    }


def winner() -> dict:
    """As the select stage writes it."""
    return {
        "artifact": "onnx-int8-dynamic",
        "file": "model.int8-dynamic.onnx",
        "runtime": "onnxruntime-cpu",
        "io": "host",
        "cuda_graph": False,
        "objective": {"metric": "p50_ms", "batch": 1, "sequence_length": SEQ, "io": None},
        "value": 10.8,
        "unit": "ms",
        "interval": [10.7, 10.9],
        "provisional": False,
        "accuracy": {
            "runtime": "onnxruntime-cpu",
            "passed": True,
            "record": "reports/accuracy.json: artifacts.onnx-int8-dynamic.runtimes.onnxruntime-cpu",
            "figures": {"cosine": 0.9862, "max_abs": 0.33},
        },
        "runner_up": {
            "artifact": "onnx-fp16",
            "runtime": "onnxruntime-cpu",
            "io": "host",
            "value": 30.2,
            "interval": [29.9, 30.5],
            "accuracy": {"cosine": 0.99993},
        },
        "baseline": {
            "artifact": "onnx-fp32",
            "runtime": "onnxruntime-cpu",
            "io": "host",
            "value": 31.6,
            "interval": [31.3, 31.9],
            "accuracy": {"cosine": 0.9999999, "max_abs": 3.4e-6},
        },
        "within_noise_of": [],
        "reason": "fastest passing artifact; its p50 CI does not overlap the runner-up's",
    }


def stages() -> list[dict]:
    def stage(
        name: str, status: str, duration: float | None, error: str | None = None, **details: Any
    ) -> dict:
        return {
            "name": name,
            "status": status,
            "error": error,
            "duration_s": duration,
            "fingerprint": f"fp-{name}",
            "details": details,
        }

    return [
        stage("export_torchscript", "ran", 4.2, warnings=["TracerWarning: torch.jit.trace is deprecated"]),
        stage("export_onnx", "ran", 11.8),
        stage("fp16", "reused", 0.0),
        stage("int8", "ran", 21.4),
        stage(
            "int8_entropy",
            "failed",
            3.1,
            "calibration failed: Too many bins for data range <x>\nTraceback (most recent call last):\n  ...",
        ),
        stage("tensorrt-rtx", "skipped", None, "depends on failed int8_entropy"),
        stage("validate", "ran", 48.0),
        stage("benchmark", "ran", 95.5),
        stage("select", "ran", 0.01),
    ]


def header(signed_off: bool = True) -> dict:
    return {
        "name": "bert",
        "version": "v0003",
        "created": "2026-12-02T14:00:00Z",
        "signed_off": signed_off,
        "signoff_reasons": [] if signed_off else ["no artifact passed validation"],
        "git_revision": "abc1234",
        "environment": {
            "python": "3.11.9",
            "torch": "2.13.0",
            "onnxruntime": {"version": "1.32.0", "providers": ["CPUExecutionProvider"]},
            "cpu": "AMD EPYC 9654",
            "gpu": None,
        },
        "artifacts": [
            {
                "name": "onnx-fp32",
                "path": "model.onnx",
                "kind": "onnx",
                "precision": "fp32",
                "sha256": "a" * 64,
                "bytes": 90_900_000,
                "details": {},
            },
            {
                "name": "onnx-fp16",
                "path": "model.fp16.onnx",
                "kind": "onnx",
                "precision": "fp16",
                "sha256": "b" * 64,
                "bytes": 45_500_000,
                "details": {"fp16_node_share": 0.97},
            },
            {
                "name": "tensorrt-rtx-fp16",
                "path": "model.tensorrt-rtx.fp16.engine",
                "kind": "engine",
                "precision": "fp16",
                "sha256": "c" * 64,
                "bytes": 51_000_000,
                "details": {"compute_capability": "8.9"},
            },
        ],
    }


def previous() -> dict:
    """v0002: onnx-fp32 was slower, onnx-int8 passed, and onnx-fp32 won (no int8-dynamic yet)."""
    acc = accuracy()
    acc["artifacts"].pop("onnx-int8-dynamic")
    acc["artifacts"]["onnx-int8"] = copy.deepcopy(acc["artifacts"]["onnx-fp16"]) | {"precision": "int8"}
    acc["not_run"] = []
    spd = speed()
    spd["results"] = [r for r in spd["results"] if r["artifact"] != "onnx-int8-dynamic"]
    for r in spd["results"]:
        if r["artifact"] == "onnx-fp32" and r["batch"] == 1:
            r.update(p50_ms=34.7, p50_ci95_ms=[34.3, 35.1])
    spd["not_run"] = []
    win = {
        "artifact": "onnx-fp32",
        "runtime": "onnxruntime-cpu",
        "io": "host",
        "objective": {"metric": "p50_ms", "batch": 1},
        "value": 34.7,
        "unit": "ms",
        "runner_up": None,
        "reason": "only passing candidate",
    }
    return {"version": "v0002", "accuracy": acc, "speed": spd, "winner": win, "signed_off": True}
