"""ONNX Runtime's basics, shared by its runners and by the placement probe: provider names, the session
options every ONNX artifact runs with, and numpy types of ONNX Runtime's tensor types."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np

CUDA_PROVIDER = "CUDAExecutionProvider"
# FP32 means FP32: the CUDA provider's default TF32 matmuls round inputs to a 10-bit mantissa, which an FP32
# artifact's tolerance is not meant to absorb (TF32 would be a precision of its own, validated as such).
CUDA_OPTIONS = {"use_tf32": "0"}
CPU_PROVIDER = "CPUExecutionProvider"
CONVOLUTIONS = frozenset({"Conv", "ConvTranspose"})
ORT_TYPES = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(double)": np.float64,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8,
    "tensor(bool)": np.bool_,
}


def load_onnxruntime() -> Any:
    try:
        import onnxruntime
    except ImportError:
        raise ImportError(
            "onnxruntime is not installed: pip install 'deploy-pipeline[cpu]' (or [gpu] for onnxruntime-gpu)"
        ) from None
    return onnxruntime


def session_options(threads: int) -> Any:
    ort = load_onnxruntime()
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    # Candidates are interleaved window by window: an idle session's spinning intra-op threads would steal the
    # cores from whichever candidate runs next (docs/benchmarking.md has what it did to the tails).
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return options


def layout_options(path: str | Path, precision: str) -> dict[str, str]:
    """The CUDA provider's layout option for a graph: NHWC kernels (prefer_nhwc) for an FP16 graph with
    convolutions, since cuDNN's FP16 tensor-core convolutions work in NHWC and the provider's default NCHW
    pays for the layout inside them. Measured on an H100 (ONNX Runtime 1.31.1, torchvision ResNet-50 FP16,
    CUDA graph, scripts/gpu_cnn_peers.py): 0.592 -> 0.436 ms at batch 1, 2.63 -> 1.89 ms at 32, 18.4 -> 13.5 ms at
    256. FP32 graphs keep NCHW: not measured, and without TF32 cuDNN's FP32 convolutions gain no tensor cores."""
    if precision != "fp16" or not has_convolutions(str(Path(path).resolve()), Path(path).stat().st_mtime_ns):
        return {}
    return {"prefer_nhwc": "1"}


@functools.lru_cache(maxsize=64)
def has_convolutions(path: str, mtime_ns: int) -> bool:
    import onnx

    model = onnx.load(path, load_external_data=False)
    return any(node.op_type in CONVOLUTIONS for node in model.graph.node)
