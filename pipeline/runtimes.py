"""Runtime names, in one place: every runtime an artifact can be validated and timed on, and which of them
compute on a GPU. Pure: only the variant names below it."""

from __future__ import annotations

from pipeline.variants import ENGINE_FLAVOURS

RUNTIMES = (
    "torch-cpu",
    "torch-cuda",
    "torchscript-cpu",
    "torchscript-cuda",
    "torch-compile-cuda",
    "onnxruntime-cpu",
    "onnxruntime-cuda",
    "tensorrt",
    "tensorrt-rtx",
    # execution modes of the GPU runtimes (pipeline/runners/pt2.py, ort_cuda_graph.py): rows of their own
    "torch-compile-cuda-reduce-overhead",
    "torch-compile-cuda-max-autotune",
    "torch-compile-cuda-max-autotune-no-cudagraphs",
    "torch-aoti-cpu",
    "torch-aoti-cuda",
    "torch-aoti-cuda-bucketed",
    "torch-aoti-cuda-graph",
    "torch-aoti-cuda-graph-bucketed",
    "torch-cpu-bucketed",
    "onnxruntime-cuda-graph",
)
ENGINE_RUNTIMES = frozenset(ENGINE_FLAVOURS)  # an engine's runtime is its flavour: on the GPU only


def is_gpu_runtime(runtime: str) -> bool:
    """Whether the runtime computes on a CUDA device (a `-cuda` mode, or a TensorRT engine)."""
    return "-cuda" in runtime or runtime in ENGINE_RUNTIMES
