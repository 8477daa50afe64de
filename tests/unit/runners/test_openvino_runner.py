"""OpenVINO, the runtime added as one module: real OpenVINO compiles of real exports of the tiny encoder,
compared with ONNX Runtime on the same feeds."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pipeline.bench import hosts
from pipeline.runners import openvino_runner, registry
from pipeline.runners.onnxruntime_runner import onnx_runners
from pipeline.runners.openvino_runner import OpenVinoRunner, why_not
from tests.unit.runners.tiny_artifacts import record, tiny_context

pytest.importorskip("openvino")


class _Reader:
    def __init__(self, feeds: list[dict[str, np.ndarray]]):
        self._feeds = iter(feeds)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._feeds, None)


def _run(runner, feeds):
    runner.activate()
    try:
        return runner.infer(feeds)
    finally:
        runner.deactivate()


def _static_int8(source: Path, target: Path, feeds: dict[str, np.ndarray]) -> Path:
    """A static Q/DQ graph, calibrated on the feeds, by ONNX Runtime's own quantizer."""
    from onnxruntime.quantization import QuantFormat, quantize_static

    reader = _Reader(
        [{k: v[i : i + 1] for k, v in feeds.items()} for i in range(len(next(iter(feeds.values()))))]
    )
    quantize_static(
        str(source), str(target), reader, quant_format=QuantFormat.QDQ, op_types_to_quantize=["MatMul"]
    )
    return target


def test_fp32_graph_matches_onnx_runtime(ctx, onnx_artifact, feeds) -> None:
    found = registry.runners_for(onnx_artifact, ctx.settings)
    runner = next(r for r in found if r.runtime == "openvino-cpu")
    assert isinstance(runner, OpenVinoRunner) and runner.io == "host"
    ours = _run(runner, feeds)
    ort = _run(onnx_runners(onnx_artifact, ctx.settings)[0], feeds)
    assert set(ours) == set(ort) == set(ctx.recipe.outputs)
    for name in ort:
        assert ours[name].shape == ort[name].shape
        np.testing.assert_allclose(ours[name], ort[name], atol=1e-4, rtol=1e-4)


def test_prepared_runs_leave_the_outputs_of_infer_unchanged(ctx, onnx_artifact, feeds) -> None:
    runner = OpenVinoRunner("onnx-fp32", onnx_artifact.path, 1, list(ctx.recipe.outputs))
    runner.activate()
    try:
        first = runner.infer(feeds)
        runner.prepare(feeds)
        runner.infer_prepared()
        again = runner.infer(feeds)
    finally:
        runner.deactivate()
    for name in first:
        np.testing.assert_array_equal(first[name], again[name])


def test_static_int8_runs_and_dynamic_int8_and_fp16_are_declined(ctx, onnx_artifact, feeds, workdir) -> None:
    static = record(
        "onnx-int8", _static_int8(onnx_artifact.path, workdir / "ov.int8.onnx", feeds), "onnx", "int8"
    )
    dynamic = record("onnx-int8-dynamic", onnx_artifact.path, "onnx", "int8")  # told from the variant
    assert why_not(static) is None
    out = _run(OpenVinoRunner("onnx-int8", static.path, 1, list(ctx.recipe.outputs)), feeds)
    ort = _run(onnx_runners(static, ctx.settings)[0], feeds)
    first = ctx.recipe.outputs[0]
    cosine = float(
        np.dot(out[first].ravel(), ort[first].ravel())
        / (np.linalg.norm(out[first]) * np.linalg.norm(ort[first]))
    )
    assert cosine > 0.99, cosine  # both run the same Q/DQ graph; INT8 kernels round differently
    assert "dynamically" in registry.declined_runtimes(dynamic, ctx.settings)["openvino-cpu"]
    assert "openvino-cpu" not in [r.runtime for r in registry.runners_for(dynamic, ctx.settings)]
    fp16 = record("onnx-fp16", onnx_artifact.path, "onnx", "fp16")
    assert "fp16" in registry.declined_runtimes(fp16, ctx.settings)["openvino-cpu"]


def test_an_optimized_graph_is_declined(ctx, onnx_artifact) -> None:
    optimized = record("onnx-optimized-fp32", onnx_artifact.path, "onnx")
    reason = registry.declined_runtimes(optimized, ctx.settings)["openvino-cpu"]
    assert "com.microsoft" in reason
    assert "openvino-cpu" not in [r.runtime for r in registry.runners_for(optimized, ctx.settings)]


def test_opt_in_until_the_recipe_lists_it(workdir) -> None:
    plain = hosts.HostTiming.from_recipe(tiny_context(workdir).recipe)
    assert not hosts.timed(plain, "onnx-fp32", "openvino-cpu", 1, gpu_host=False, io="host")
    pairs = [("onnx-fp32", "onnxruntime-cpu"), ("onnx-fp32", "openvino-cpu")]
    left = hosts.not_timed(plain, pairs, gpu_host=False)
    assert [(e["runtime"], e["io"]) for e in left] == [("openvino-cpu", "any")] and "opt-in" in left[0][
        "reason"
    ]
    listed = hosts.HostTiming.from_recipe(
        tiny_context(workdir, runtimes=["onnxruntime-cpu", "openvino-cpu"]).recipe
    )
    assert hosts.timed(listed, "onnx-fp32", "openvino-cpu", 1, gpu_host=False, io="host")


def test_the_family_is_found_without_an_edit_elsewhere() -> None:
    declared = registry.runtimes()["openvino-cpu"]
    assert declared is openvino_runner.RUNTIMES[0] and declared.opt_in and not declared.on_gpu
