"""The profile's arithmetic on traces of known shape: kernels on two streams share their overlap, nested CPU
operators count once, and the bound follows the split."""

from __future__ import annotations

from pipeline.bench.profile import CALL, bound, category, summarize


def _event(name: str, ts: float, dur: float, cat: str, tid: int = 1) -> dict:
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "cat": cat, "tid": tid}


def test_attention_kernels_are_not_taken_for_gemms() -> None:
    assert category("void fmha_cutlassF_f16_aligned_64x64_rf_sm80(...)") == "attention"
    assert category("sm90_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize128x128x64") == "gemm"
    assert category("void at::native::vectorized_elementwise_kernel<4, ...>") == "elementwise"
    assert category("aten::view", on_gpu=False) == "overhead"
    assert category("onnx::MatMulInteger", on_gpu=False) == "gemm"
    assert category("onnx::DequantizeLinear", on_gpu=False) == "elementwise"  # not a GEMM for its "Linear"
    assert category("aten::linear", on_gpu=False) == "gemm"


def test_overlapping_kernels_are_counted_once_and_the_gaps_are_idle() -> None:
    # one 100 µs call: a GEMM on one stream 10-50, an elementwise kernel on another 30-60, nothing else
    events = [
        _event(CALL, 0, 100, "user_annotation"),
        _event(CALL, 8, 60, "gpu_user_annotation"),  # Kineto's mirror on the GPU timeline: not a second call
        _event("ampere_sgemm_128x64_tn", 10, 40, "kernel"),
        _event("elementwise_kernel", 30, 30, "kernel"),
    ]
    profile = summarize(events, on_gpu=True)
    split = profile["split"]
    assert profile["calls"] == 1 and profile["kernels_per_call"] == 2
    assert abs(split["idle"] - 0.5) < 1e-6  # busy is the union, 10-60
    assert abs(split["gemm"] + split["elementwise"] - 0.5) < 1e-6 and split["gemm"] > split["elementwise"]
    assert profile["bound"] == "launch-bound"


def test_nested_cpu_operators_count_their_self_time() -> None:
    events = [
        _event(CALL, 0, 100, "user_annotation"),
        _event("aten::linear", 0, 80, "cpu_op"),
        _event("aten::addmm", 10, 60, "cpu_op"),
        _event("aten::t", 5, 4, "cpu_op"),
    ]
    profile = summarize(events, on_gpu=False)
    assert profile["operators_per_call"] == 1  # addmm: aten::t is a view, linear only wraps
    assert abs(profile["split"]["gemm"] - 0.76) < 1e-6  # addmm 60 + linear's own 16
    assert profile["bound"] == "compute-bound"


def test_the_bound_follows_the_split() -> None:
    base = {"gemm": 0.0, "attention": 0.0, "elementwise": 0.0, "copies": 0.0}
    assert bound({**base, "gemm": 0.7, "idle": 0.3}, on_gpu=True) == "compute-bound"
    assert bound({**base, "gemm": 0.2, "elementwise": 0.5, "idle": 0.3}, on_gpu=True) == "memory-bound"
    assert bound({**base, "gemm": 0.4, "idle": 0.6}, on_gpu=False) == "overhead-bound"
