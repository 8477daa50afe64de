"""The matrix of work (pipeline/bench/matrix.py): what one plan says is validated and what is timed."""

from __future__ import annotations

from pathlib import Path

from pipeline.bench import hosts
from pipeline.bench.matrix import FAILED_VALIDATION, Matrix, timed_batches
from tests.unit.stages.onnx_fixtures import tiny_context

ONNX_GPU = [
    ("onnxruntime-cpu", "host"),
    ("onnxruntime-cuda", "host"),
    ("onnxruntime-cuda", "device"),
    ("onnxruntime-cuda-graph", "device"),
]


def timing(**changes: object) -> hosts.HostTiming:
    base = hosts.HostTiming.from_recipe(tiny_context(Path(".")).recipe)  # batch sizes [1, 2]
    return base.model_copy(update=changes)


def test_a_gpu_host_validates_every_timed_runtime_and_a_twin_left_artifact_once() -> None:
    matrix = Matrix(timing(), gpu_host=True)
    for artifact in ("onnx-fp32", "onnx-optimized-fp32"):
        matrix.offer(artifact, ONNX_GPU)
    matrix.offer("torch-fp32", [("torch-cpu", "host"), ("torch-cuda", "host"), ("torch-cuda", "device")])
    reference = matrix.plan("torch-fp32")
    plain, optimized = matrix.plan("onnx-fp32"), matrix.plan("onnx-optimized-fp32")
    # the plain graph's CUDA rows go to its optimized twin: no cell, yet validated (on one runtime)
    assert plain.cells == () and plain.validated == ("onnxruntime-cuda",) and plain.reason is None
    assert optimized.validated == ("onnxruntime-cuda", "onnxruntime-cuda-graph")
    assert reference.validated == ()  # the reference is what the others are validated against
    report = matrix.report(["onnx-fp32", "onnx-optimized-fp32"])
    batches = timed_batches(report)
    assert batches[("onnx-optimized-fp32", "onnxruntime-cuda", "device")] == [1, 2]
    assert batches[("onnx-optimized-fp32", "onnxruntime-cuda", "host")] == [1]  # host I/O at the smallest
    assert batches[("torch-fp32", "torch-cpu", "host")] == [1]  # the CPU yardstick
    assert ("onnx-optimized-fp32", "onnxruntime-cpu", "host") not in batches  # a CPU runtime on a GPU host
    assert report["cells"][0]["artifact"] == "torch-fp32"  # the reference first, then the recipe's order
    assert report["validated"] == {
        "onnx-fp32": ["onnxruntime-cuda"],
        "onnx-optimized-fp32": ["onnxruntime-cuda", "onnxruntime-cuda-graph"],
    }
    left = {(x["artifact"], x["runtime"]) for x in report["not_timed"]}
    assert left == {("onnx-fp32", "onnxruntime-cuda"), ("onnx-fp32", "onnxruntime-cuda-graph")}


def test_a_graph_the_cuda_provider_declines_is_validated_on_the_gpu_hosts_cpu_runtime_untimed() -> None:
    """The dynamic INT8 graph (the CPU deploy's winner) or a recurrent model's graph on a GPU host: no cell,
    but an accuracy verdict on the CPU runtime, and not_timed says why the CUDA provider was not offered."""
    matrix = Matrix(timing(), gpu_host=True)
    matrix.offer(
        "onnx-int8-dynamic",
        [("onnxruntime-cpu", "host"), ("openvino-cpu", "host")],
        {"onnxruntime-cuda": "MatMulInteger would run on the CPU"},
    )
    plan = matrix.plan("onnx-int8-dynamic")
    assert plan.cells == () and plan.validated == ("onnxruntime-cpu",) and plan.reason is None
    report = matrix.report()
    assert report["validated"] == {"onnx-int8-dynamic": ["onnxruntime-cpu"]} and report["not_validated"] == []
    reasons = {x["runtime"]: x["reason"] for x in report["not_timed"]}
    assert reasons["onnxruntime-cuda"] == "MatMulInteger would run on the CPU"
    assert timed_batches(report) == {}
    # an opt-in runtime the recipe does not list is not used for it
    only_opt_in = Matrix(timing(), gpu_host=True)
    only_opt_in.offer("onnx-fp32", [("openvino-cpu", "host")])
    assert only_opt_in.plan("onnx-fp32").validated == ()


def test_the_recipes_runtimes_are_timed_everywhere_and_nothing_is_left_for_a_twin() -> None:
    matrix = Matrix(timing(runtimes=["onnxruntime-cuda"]), gpu_host=True)
    for artifact in ("onnx-fp32", "onnx-optimized-fp32"):
        matrix.offer(artifact, ONNX_GPU)
        assert matrix.plan(artifact).validated == ("onnxruntime-cuda",)
    report = matrix.report()
    assert {tuple(c["batches"]) for c in report["cells"]} == {(1, 2)}
    assert report["not_timed"] == []


def test_an_artifact_on_no_timed_runtime_is_not_validated_and_says_why() -> None:
    matrix = Matrix(timing(), gpu_host=False)
    matrix.offer("onnx-fp32", [("openvino-cpu", "host")], {"onnxruntime-cpu": "declined for a test"})
    matrix.cannot_run("trt-fp16", "no TensorRT runtime here")
    plan = matrix.plan("onnx-fp32")
    assert plan.validated == () and plan.cells == ()
    assert "declined for a test" in plan.reason and "none of its runtimes is timed" in plan.reason
    report = matrix.report()
    assert report["not_validated"] == [{"artifact": "onnx-fp32", "reason": plan.reason}]
    assert report["not_run"] == [{"artifact": "trt-fp16", "reason": "no TensorRT runtime here"}]
    reasons = {x["runtime"]: x["reason"] for x in report["not_timed"]}
    assert "opt-in" in reasons["openvino-cpu"] and reasons["onnxruntime-cpu"] == "declined for a test"


def test_a_runtime_that_raised_in_validation_is_not_timed_there_and_says_so_once() -> None:
    """An FP16 graph ONNX Runtime loads but cannot run: validated (and failed) on onnxruntime-cpu, its cells
    there are dropped, and not_timed says why once; its other runtime keeps its cells."""
    matrix = Matrix(timing(runtimes=["onnxruntime-cpu", "onnxruntime-cpu-bucketed"]), gpu_host=False)
    matrix.offer("onnx-fp16", [("onnxruntime-cpu", "host"), ("onnxruntime-cpu-bucketed", "host")])
    plan = matrix.plan("onnx-fp16")
    assert {c["runtime"] for c in plan.cells} == {"onnxruntime-cpu", "onnxruntime-cpu-bucketed"}
    matrix.failed_validation("onnx-fp16", "onnxruntime-cpu")
    report = matrix.report(["onnx-fp16"])
    assert set(timed_batches(report)) == {("onnx-fp16", "onnxruntime-cpu-bucketed", "host")}
    assert report["validated"] == {"onnx-fp16": ["onnxruntime-cpu", "onnxruntime-cpu-bucketed"]}
    left = [x for x in report["not_timed"] if x["artifact"] == "onnx-fp16"]
    assert left == [
        {"artifact": "onnx-fp16", "runtime": "onnxruntime-cpu", "io": "any", "reason": FAILED_VALIDATION}
    ]
    assert FAILED_VALIDATION.startswith("it failed validation")


def test_an_artifact_whose_runtimes_the_recipe_leaves_out_is_not_timed_not_unrunnable() -> None:
    """benchmark.runtimes without torchscript-cpu: TorchScript runs here, the recipe chose not to time it. Not
    validated, not "not run" (no runtime lacking), named under not_timed with the recipe's reason."""
    matrix = Matrix(timing(runtimes=["onnxruntime-cpu"]), gpu_host=False)
    matrix.offer("torchscript-fp32", [("torchscript-cpu", "host")])
    plan = matrix.plan("torchscript-fp32")
    assert plan.cells == () and plan.validated == () and plan.runnable
    assert plan.reason == "benchmark.runtimes lists none of its runtimes (torchscript-cpu)"
    report = matrix.report()
    assert report["not_run"] == []
    assert report["not_timed"] == [
        {"artifact": "torchscript-fp32", "runtime": "torchscript-cpu", "io": "any", "reason": plan.reason}
    ]
