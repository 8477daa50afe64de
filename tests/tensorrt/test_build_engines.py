"""Real TensorRT-RTX engine builds of the tiny encoder, ahead of time for sm89 (no GPU needed to build)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.core.artifacts import ArtifactRecord
from pipeline.inputs.specs import RunnerSettings
from pipeline.runners.base import NotRunnable
from pipeline.runners.tensorrt import runners_for_engine
from pipeline.stages.tensorrt import EngineBuildError
from pipeline.toolchain.trt.flavour import local_compute_capability

from .conftest import TINY, context, engine_stages, needs_rtx, record, run, tiny_recipe

pytestmark = [pytest.mark.tensorrt, needs_rtx]


@pytest.fixture(scope="module")
def built(tiny_onnx, tmp_path_factory) -> dict:
    """Build fp32, fp16 and int8 engines once: {precision: (ctx, StageResult)}."""
    recipe = tiny_recipe()
    root = tmp_path_factory.mktemp("store")
    made = engine_stages(recipe, TINY.parent)
    results = {}
    for precision in ("fp32", "fp16", "int8"):
        ctx = context(recipe, root)
        stage = made[f"tensorrt-rtx-{precision}"]
        results[precision] = (ctx, run(stage, ctx, {f"onnx-{precision}": tiny_onnx[f"onnx-{precision}"]}))
    return results


def outputs(result) -> dict[str, object]:
    return {o.path: o for o in result.outputs}


@pytest.mark.parametrize("precision", ["fp32", "fp16", "int8"])
def test_engine_and_its_records(built, precision):
    ctx, result = built[precision]
    name = f"tensorrt-rtx-{precision}"
    out = outputs(result)
    assert set(out) == {
        f"model.tensorrt-rtx.{precision}.engine",
        f"logs/{name}.build.log",
        f"logs/{name}.build.json",
        f"logs/{name}.layers.json",
    }
    engine = out[f"model.tensorrt-rtx.{precision}.engine"]
    assert (engine.kind, engine.artifact, engine.precision) == ("engine", name, precision)
    assert (ctx.workdir / engine.path).stat().st_size > 100_000
    build = json.loads((ctx.workdir / f"logs/{name}.build.json").read_text())
    assert build["ok"] and build["compute_capabilities"] == ["sm89"]
    assert build["profiles"] == [
        {"input_ids": [[1, 4], [2, 16], [8, 32]], "attention_mask": [[1, 4], [2, 16], [8, 32]]}
    ]
    assert build["flavour"] == "tensorrt-rtx" and build["trt_version"]
    assert build["source"]["artifact"] == f"onnx-{precision}"
    assert any("timing caches" in n for n in build["notes"])
    assert engine.details["compute_capabilities"] == ["sm89"] and engine.details["flavour"] == "tensorrt-rtx"
    layers = json.loads((ctx.workdir / f"logs/{name}.layers.json").read_text())
    expected_source = "builder-log" if local_compute_capability() is None else layers["source"]
    assert layers["source"] == build["layers_source"] == expected_source
    assert layers["count"] == len(layers["layers"]) == build["layer_count"] > 5
    log = (ctx.workdir / f"logs/{name}.build.log").read_text()
    assert "[VERBOSE]" in log and "builder process output" in log


def test_precision_lives_in_the_graph(built):
    """Strongly typed builds: the fp16 engine computes in Half, the int8 engine in Int8, the fp32 one in neither."""

    def dtypes(precision):
        ctx, _ = built[precision]
        layers = json.loads((ctx.workdir / f"logs/tensorrt-rtx-{precision}.layers.json").read_text())[
            "layers"
        ]
        return {t.get("dtype") for layer in layers for t in layer["inputs"] + layer["outputs"]}

    assert "Half" in dtypes("fp16") and "Int8" in dtypes("int8")
    assert not {"Half", "Int8"} & dtypes("fp32")


def test_runner_reports_why_it_cannot_run_here(built):
    if local_compute_capability() not in (None, "sm90"):
        pytest.skip("this host may run the engine: covered by tests/gpu")
    ctx, result = built["fp32"]
    engine = next(o for o in result.outputs if o.kind == "engine")
    artifact = ArtifactRecord(
        engine.artifact,
        ctx.workdir / engine.path,
        "engine",
        "fp32",
        "0" * 64,
        "tensorrt-rtx-fp32",
        engine.details,
    )
    verdict = runners_for_engine(artifact, RunnerSettings.from_recipe(tiny_recipe()))
    assert isinstance(verdict, NotRunnable)
    assert verdict.reason.endswith("not runnable on this host")


def _bad_graph(path: Path) -> Path:
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])
    nodes = [
        helper.make_node("Relu", ["x"], ["h"], name="relu_ok"),
        helper.make_node("NoSuchOp", ["h"], ["y"], name="mystery_node", domain="com.example"),
    ]
    graph = helper.make_graph(nodes, "bad", [x], [y])
    onnx.save(
        helper.make_model(
            graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.example", 1)]
        ),
        str(path),
    )
    return path


def _build(tmp_path, onnx_record, *overrides):
    recipe = tiny_recipe(*overrides)
    stage = engine_stages(recipe, TINY.parent)["tensorrt-rtx-fp32"]
    ctx = context(recipe, tmp_path)
    return ctx, lambda: run(stage, ctx, {"onnx-fp32": onnx_record})


def test_unsupported_op_raises_with_the_parser_messages(tmp_path):
    ctx, run = _build(tmp_path, record("onnx-fp32", _bad_graph(tmp_path / "bad.onnx"), "fp32"))
    with pytest.raises(EngineBuildError, match=r"node mystery_node \(NoSuchOp\)") as caught:
        run()
    assert caught.value.parser_errors[0]["node_name"] == "mystery_node"
    build = json.loads((ctx.workdir / "logs/tensorrt-rtx-fp32.build.json").read_text())
    assert not build["ok"] and build["parser_errors"][0]["node_operator"] == "NoSuchOp"
    assert not (ctx.workdir / "model.tensorrt-rtx.fp32.engine").exists()


def test_truncated_onnx_raises(tmp_path, tiny_onnx):
    data = tiny_onnx["onnx-fp32"].path.read_bytes()
    broken = tmp_path / "truncated.onnx"
    broken.write_bytes(data[: len(data) // 3])
    _, run = _build(tmp_path, record("onnx-fp32", broken, "fp32"))
    with pytest.raises(EngineBuildError, match="MODEL_DESERIALIZE_FAILED"):
        run()


def test_unsupported_compute_capability_is_refused_by_the_builder(tmp_path, tiny_onnx):
    _, run = _build(tmp_path, tiny_onnx["onnx-fp32"], "export.tensorrt.compute_capabilities=[sm90]")
    with pytest.raises(
        EngineBuildError, match=r"cannot target sm90: it supports sm75, sm80, sm86, sm89, sm120"
    ):
        run()


def test_several_compute_capabilities(tmp_path, tiny_onnx):
    ctx, run = _build(
        tmp_path,
        tiny_onnx["onnx-fp32"],
        "export.tensorrt.compute_capabilities=[sm86, sm120]",
        "export.tensorrt.optimization_level=0",
    )
    result = run()
    engine = next(o for o in result.outputs if o.kind == "engine")
    assert engine.details["compute_capabilities"] == ["sm86", "sm120"]
    assert engine.details["optimization_level"] == 0


def _whole_map_pool(path: Path) -> Path:
    """transformers EfficientNet's pooler as its export writes it: AveragePool with a window far larger than
    the feature map it averages (AvgPool2d(hidden_dim, ceil_mode=True)), then the batch's vectors."""
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4, 3, 5])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])
    nodes = [
        helper.make_node(
            "AveragePool", ["x"], ["pooled"], kernel_shape=[320, 320], strides=[320, 320], ceil_mode=1
        ),
        helper.make_node("Flatten", ["pooled"], ["y"]),
    ]
    onnx.save(
        helper.make_model(
            helper.make_graph(nodes, "pool", [x], [y]), opset_imports=[helper.make_opsetid("", 18)]
        ),
        str(path),
    )
    return path


def test_a_pool_over_the_whole_map_builds_as_a_global_average(tmp_path):
    """TensorRT refuses the 320 x 320 window ("addPoolingNd: ... volume(windowSize) < maxKernelDimsProduct");
    over a 3 x 5 map it is the map's mean, and the engine is built from a graph that says so."""
    import numpy as np
    import onnxruntime as ort

    from pipeline.toolchain.trt.global_pools import for_tensorrt

    source = _whole_map_pool(tmp_path / "pool.onnx")
    (tmp_path / "rewritten").mkdir()
    rewritten, count = for_tensorrt(source, tmp_path / "rewritten")
    assert count == 1
    x = np.random.default_rng(0).standard_normal((2, 4, 3, 5)).astype(np.float32)
    (want,) = ort.InferenceSession(str(source), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    (got,) = ort.InferenceSession(str(rewritten), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    assert np.allclose(want, x.mean(axis=(2, 3)), atol=1e-6) and np.allclose(got, want, atol=1e-6)
    ctx, build = _build(
        tmp_path,
        record("onnx-fp32", source, "fp32"),
        "inputs=[{name: x, dtype: float32, shape: [batch, 4, 3, 5]}]",
        "dims={batch: {min: 1, opt: 2, max: 8}}",
        "outputs=[y]",
        "validation.padding_mask=null",
        "benchmark.sequence_lengths=[]",
    )
    result = build()
    assert result.details["global_average_pools"] == 1
    assert (ctx.workdir / "model.tensorrt-rtx.fp32.engine").stat().st_size > 0
