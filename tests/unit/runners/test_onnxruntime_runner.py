from __future__ import annotations

import numpy as np
import pytest

from pipeline.runners.loaders import SessionFromPath
from pipeline.runners.onnxruntime_runner import (
    CUDA_PROVIDER,
    OnnxRuntimeRunner,
    cuda_provider_available,
    onnx_runners,
    output_names,
    session_options,
)
from tests.unit.runners.tiny_artifacts import expected, export_onnx


def _load(artifact, threads: int = 1) -> SessionFromPath:
    return SessionFromPath(artifact.path, threads, session_options)


def _cpu_runner(ctx, artifact, threads: int = 1) -> OnnxRuntimeRunner:
    return OnnxRuntimeRunner(artifact.name, _load(artifact, threads), list(ctx.recipe.outputs))


def test_matches_the_torch_module(ctx, onnx_artifact, feeds) -> None:
    runner = _cpu_runner(ctx, onnx_artifact)
    assert (runner.artifact, runner.runtime, runner.io) == ("onnx-fp32", "onnxruntime-cpu", "host")
    runner.activate()
    try:
        out = runner.infer(feeds)
    finally:
        runner.deactivate()
    ref = expected(ctx, feeds)
    assert set(out) == set(ctx.recipe.outputs)
    for name in ref:
        np.testing.assert_allclose(out[name], ref[name], atol=1e-5, rtol=1e-4)


def test_feeds_only_declared_inputs_cast_to_session_dtypes(ctx, onnx_artifact, feeds) -> None:
    runner = _cpu_runner(ctx, onnx_artifact)
    runner.activate()
    try:
        loose = {name: value.astype(np.int32) for name, value in feeds.items()}
        loose["token_type_ids"] = np.zeros_like(feeds["input_ids"])  # not declared by this graph
        out = runner.infer(loose)
        with pytest.raises(KeyError, match="attention_mask"):
            runner.infer({"input_ids": feeds["input_ids"]})
    finally:
        runner.deactivate()
    np.testing.assert_allclose(out["pooled"], expected(ctx, feeds)["pooled"], atol=1e-5)


def test_outputs_are_renamed_by_position_when_the_graph_names_differ(ctx, workdir, feeds) -> None:
    artifact = export_onnx(ctx, workdir / "renamed.onnx", output_names=["out0", "out1"])
    runner = _cpu_runner(ctx, artifact)
    runner.activate()
    try:
        out = runner.infer(feeds)
    finally:
        runner.deactivate()
    assert list(out) == ["hidden", "pooled"]
    assert out["hidden"].ndim == 3 and out["pooled"].ndim == 2


def test_output_name_mapping() -> None:
    assert output_names(["pooled", "hidden"], ["hidden", "pooled"]) == {
        "pooled": "pooled",
        "hidden": "hidden",
    }
    assert output_names(["a", "b", "c"], ["hidden", "pooled"]) == {"a": "hidden", "b": "pooled", "c": "c"}


def test_session_is_pinned_as_the_recipe_says(ctx, onnx_artifact) -> None:
    import onnxruntime as ort

    runner = _cpu_runner(ctx, onnx_artifact, threads=1)
    runner.activate()
    try:
        options = runner._session.get_session_options()
        assert options.intra_op_num_threads == 1
        assert options.inter_op_num_threads == 1
        assert options.execution_mode == ort.ExecutionMode.ORT_SEQUENTIAL
        assert options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    finally:
        runner.deactivate()


def test_prepared_host_run(ctx, onnx_artifact, feeds) -> None:
    runner = _cpu_runner(ctx, onnx_artifact)
    runner.activate()
    try:
        runner.prepare(feeds)
        runner.infer_prepared()
        runner.synchronize()
    finally:
        runner.deactivate()
    assert runner._session is None


def test_factory_lists_cpu_first_and_cuda_only_where_available(ctx, onnx_artifact) -> None:
    runners = onnx_runners(onnx_artifact, ctx.settings)
    assert (runners[0].runtime, runners[0].io) == ("onnxruntime-cpu", "host")
    cuda = [(r.runtime, r.io) for r in runners[1:]]
    assert cuda == (
        [("onnxruntime-cuda", "host"), ("onnxruntime-cuda", "device")] if cuda_provider_available() else []
    )


def test_device_io_needs_the_cuda_provider(ctx, onnx_artifact) -> None:
    with pytest.raises(ValueError):
        OnnxRuntimeRunner("x", _load(onnx_artifact), ["hidden"], io="device")


@pytest.mark.gpu
def test_cuda_device_io_binds_once_and_matches(ctx, onnx_artifact, feeds) -> None:
    if not cuda_provider_available():
        pytest.skip("needs onnxruntime-gpu and a GPU")
    runner = OnnxRuntimeRunner(
        onnx_artifact.name, _load(onnx_artifact), list(ctx.recipe.outputs), CUDA_PROVIDER, "device"
    )
    runner.activate()
    try:
        runner.prepare(feeds)
        for _ in range(3):
            runner.infer_prepared()
        runner.synchronize()
        bound = {
            name: value.numpy()
            for name, value in zip(["hidden", "pooled"], runner._binding.get_outputs(), strict=True)
        }
        out = runner.infer(feeds)
    finally:
        runner.deactivate()
    ref = expected(ctx, feeds)
    for name in ref:
        np.testing.assert_allclose(out[name], ref[name], atol=1e-3)
        np.testing.assert_allclose(bound[name], ref[name], atol=1e-3)


def test_padding_aware_cpu_rows_match_the_padded_session_on_real_tokens(ctx, onnx_artifact) -> None:
    """runtime.padding on a CPU host: onnx_runners adds onnxruntime-cpu-bucketed, which runs the real ONNX
    session group by group at each group's real length; on real tokens and on the pooled output it matches the
    same session on the whole padded batch, and the row's details say how many tokens it computed."""
    from pipeline.recipe import PaddingConfig

    padding = PaddingConfig(
        mask_input="attention_mask", per_token_outputs=["hidden"], multiple=4, group_overhead_tokens=0
    )
    settings = ctx.settings.model_copy(
        update={"runtime": ctx.settings.runtime.model_copy(update={"padding": padding})}
    )
    plain, bucketed = onnx_runners(onnx_artifact, settings)[:2]
    assert (bucketed.runtime, bucketed.io) == ("onnxruntime-cpu-bucketed", "host")
    feeds = ctx.dataset().feeds_at({"batch": 6, "sequence": 32})
    real = np.array([3, 32, 5, 9, 17, 4])
    feeds["attention_mask"] = (np.arange(32)[None, :] < real[:, None]).astype(feeds["attention_mask"].dtype)
    for runner in (plain, bucketed):
        runner.activate()
    try:
        want, got = plain.infer(feeds), bucketed.infer(feeds)
        bucketed.prepare(feeds)
        bucketed.infer_prepared()
    finally:
        for runner in (plain, bucketed):
            runner.deactivate()
    on_real = feeds["attention_mask"].astype(bool)
    np.testing.assert_allclose(got["hidden"][on_real], want["hidden"][on_real], atol=1e-5, rtol=1e-4)
    np.testing.assert_allclose(got["pooled"], want["pooled"], atol=1e-5, rtol=1e-4)
    plan = bucketed.details["padding"]
    assert plan["real_tokens"] == real.sum() and plan["computed_tokens"] < plan["padded_tokens"] == 6 * 32
