"""The int8 (static Q/DQ) and int8_dynamic stages on the tiny encoder: TensorRT-shaped Q/DQ placement, the
recipe's selection by module path, calibration on the calibration split only, and a calibration failure
surfacing as the variant's error."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from pipeline.core.artifacts import ArtifactRecord
from pipeline.core.errors import StageError
from pipeline.recipe import Recipe
from pipeline.stages import int8
from pipeline.stages.base import StageResult
from pipeline.toolchain import onnx_tools
from tests.stage_env import StageEnv
from tests.unit.stages.onnx_fixtures import (
    lowest_cosine,
    producers,
    record,
    reference,
    run_onnx,
    tiny_context,
    tiny_onnx,
)

LAYERS = (0, 1)
WEIGHT_MODULES = ("query", "key", "value", "attention_out", "intermediate", "output")


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> ArtifactRecord:
    return tiny_onnx(tmp_path_factory)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, source: ArtifactRecord) -> tuple[StageEnv, StageResult]:
    """Exclude the second FFN projection ('inner.layers.N.output') by pattern, the graph's own feed-forward
    detection off (test_the_family_default_keeps_each_feed_forward_block_in_float covers it)."""
    ctx = tiny_context(
        tmp_path_factory.mktemp("int8"),
        "export.int8.exclude=['*.output']",
        "export.int8.exclude_feed_forward=false",
    )
    return ctx, ctx.run_named("int8", {"onnx-fp32": source}, variants=["onnx-int8"])


def _model(ctx: StageEnv) -> onnx.ModelProto:
    return onnx.load(str(ctx.workdir / "model.int8.onnx"))


def test_stage_declares_its_artifact() -> None:
    ctx = tiny_context(Path("."))
    st = ctx.stage("int8", ["onnx-int8"])
    assert (st.name, st.consumes, st.produces) == ("int8", ("onnx-fp32",), ("onnx-int8",))
    assert st.config.int8 == ctx.recipe.export.int8
    assert st.config.settings["QuantizeBias"] is False
    assert st.config.data.digest  # calibration depends on the data: its fingerprint is part of the config


def test_details_match_the_graph(built: tuple[StageEnv, StageResult]) -> None:
    ctx, result = built
    out = result.outputs[0]
    assert (out.path, out.kind, out.artifact, out.precision) == (
        "model.int8.onnx",
        "onnx",
        "onnx-int8",
        "int8",
    )
    counts = onnx_tools.op_counts(_model(ctx))
    d = out.details
    assert d["qdq_pairs"] > 0
    assert counts["QuantizeLinear"] == counts["DequantizeLinear"] == d["qdq_pairs"] == d["quantize_linear"]
    assert d["quantized_count"] == len(d["quantized_nodes"]) == 10
    assert d["calibration_method"] == "minmax"
    assert d["calibration_samples"] == len(ctx.dataset().calibration_index) == 8
    assert d["calibration_hash"] == ctx.dataset().calibration_hash()
    assert (ctx.workdir / "logs" / "int8.log").is_file()


def test_selection_by_module_path(built: tuple[StageEnv, StageResult]) -> None:
    ctx, result = built
    d = result.outputs[0].details
    assert d["excluded"] == [f"inner.layers.{i}.output" for i in LAYERS]
    expected = {f"inner.layers.{i}.{m}" for i in LAYERS for m in WEIGHT_MODULES if m != "output"}
    assert set(d["quantized_nodes"]) == expected
    assert d["activation_matmuls_skipped"] == 4  # q @ k^T and attention @ v, per layer


def test_qdq_placement_is_tensorrt_shaped(built: tuple[StageEnv, StageResult]) -> None:
    model = _model(built[0])
    made_by = producers(model)
    inits = {i.name: i for i in model.graph.initializer}
    paths = onnx_tools.module_paths(model)
    for node in model.graph.node:
        if node.op_type == "DequantizeLinear":
            assert made_by[node.input[0]].op_type == "QuantizeLinear"  # a Q/DQ pair, also on weights
            zero_point = inits[node.input[2]]
            assert zero_point.data_type == TensorProto.INT8
            assert not np.any(numpy_helper.to_array(zero_point))  # symmetric
            assert node.input[0] not in inits  # no pre-quantized (e.g. int32 bias) initializer
        if node.op_type == "MatMul":
            from_dq = [i in made_by and made_by[i].op_type == "DequantizeLinear" for i in node.input]
            quantized = paths[node.name] in built[1].outputs[0].details["quantized_nodes"]
            assert from_dq == ([True, True] if quantized else [False, False]), node.name
        if node.op_type == "QuantizeLinear":
            assert (
                made_by.get(node.input[0]) is None or made_by[node.input[0]].op_type != "MatMul"
            )  # inputs only
    weights = [n for n in model.graph.node if n.op_type == "QuantizeLinear" and n.input[0] in inits]
    assert weights and all(inits[w.input[0]].data_type == TensorProto.FLOAT for w in weights)
    per_channel = [
        n
        for n in model.graph.node
        if n.op_type == "DequantizeLinear" and n.input[0] in {w.output[0] for w in weights}
    ]
    assert all(numpy_helper.to_array(inits[n.input[1]]).size > 1 for n in per_channel)


def test_close_to_the_eager_model(built: tuple[StageEnv, StageResult]) -> None:
    ctx = built[0]
    feeds = ctx.dataset().feeds_at({"batch": 4, "sequence": 16})
    got, want = run_onnx(ctx.workdir / "model.int8.onnx", feeds), reference(ctx, feeds)
    assert lowest_cosine(got["pooled"], want["pooled"]) >= 0.98


def test_output_is_byte_deterministic(
    built: tuple[StageEnv, StageResult], source: ArtifactRecord, tmp_path: Path
) -> None:
    ctx = tiny_context(tmp_path, "export.int8.exclude=['*.output']", "export.int8.exclude_feed_forward=false")
    ctx.run_named("int8", {"onnx-fp32": source}, variants=["onnx-int8"])
    assert (tmp_path / "model.int8.onnx").read_bytes() == (built[0].workdir / "model.int8.onnx").read_bytes()


@pytest.mark.parametrize("method", ["entropy", "percentile"])
def test_histogram_calibrations(method: str, source: ArtifactRecord, tmp_path: Path) -> None:
    ctx = tiny_context(
        tmp_path, f"export.int8.calibration={method}", "export.int8.include=['*.query', '*.key']"
    )
    details = ctx.run_named("int8", {"onnx-fp32": source}, variants=["onnx-int8"]).outputs[0].details
    assert details["calibration_method"] == method
    assert sorted(details["quantized_nodes"]) == sorted(
        f"inner.layers.{i}.{m}" for i in LAYERS for m in ("key", "query")
    )


def test_calibration_feeds_only_the_declared_inputs(tmp_path: Path) -> None:
    ctx = tiny_context(tmp_path)
    feeds = int8.calibration_feeds(ctx.dataset(), ["input_ids"])
    assert all(list(f) == ["input_ids"] for f in feeds)
    calibration = [row.tobytes() for f in feeds for row in f["input_ids"]]
    validation = {row.tobytes() for f in ctx.dataset().validation_feeds(8) for row in f["input_ids"]}
    assert len(calibration) == 8 and len({len(row) for row in calibration}) > 1  # several lengths
    assert not set(calibration) & validation


def test_nothing_left_to_quantize_says_what_the_graph_has(source: ArtifactRecord, tmp_path: Path) -> None:
    ctx = tiny_context(tmp_path, "export.int8.include=['no.such.module']")
    with pytest.raises(StageError) as info:
        ctx.run_named("int8", {"onnx-fp32": source}, variants=["onnx-int8"])
    assert str(info.value) == (
        "int8: nothing to quantize: export.int8.op_types is ['MatMul', 'Gemm']; the graph has 12 MatMul; "
        "left out: 8 not matched by include; 4 activation MatMul (weights_only_matmul); "
        "4 feed-forward layer (exclude_feed_forward)"
    )


def test_the_family_default_keeps_each_feed_forward_block_in_float(
    source: ArtifactRecord, tmp_path: Path
) -> None:
    """A transformer's default: the two linears around each block's activation stay in float, found from the
    graph (the tiny encoder names them intermediate and output, which no BERT pattern matches)."""
    ctx = tiny_context(tmp_path)
    assert ctx.recipe.export.int8.exclude_feed_forward and ctx.recipe.export.int8.exclude == []
    details = ctx.run_named("int8", {"onnx-fp32": source}, variants=["onnx-int8"]).outputs[0].details
    kept = [f"inner.layers.{i}.{m}" for i in LAYERS for m in ("intermediate", "output")]
    assert details["kept_float_feed_forward"] == kept
    assert set(details["quantized_nodes"]) == {
        f"inner.layers.{i}.{m}" for i in LAYERS for m in ("query", "key", "value", "attention_out")
    }


def _unbounded_model(path: Path, factor: float = np.inf) -> ArtifactRecord:
    """y = (x * factor) @ W: with inf, an activation whose range is not finite, which no histogram can bin (the
    failure is numpy's own, whichever numpy is installed); with nan, a range of NaN (ONNX Runtime's 'scale
    issue')."""
    weight = numpy_helper.from_array(np.arange(16, dtype=np.float32).reshape(4, 4) / 16, "w")
    scale = numpy_helper.from_array(np.array(factor, dtype=np.float32), "scale")
    graph = helper.make_graph(
        [
            helper.make_node("Mul", ["x", "scale"], ["tiny"], name="mul"),
            helper.make_node("MatMul", ["tiny", "w"], ["y"], name="mm"),
        ],
        "denormal",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        [weight, scale],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    return record(path)


@pytest.mark.parametrize(
    ("calibration", "factor", "error"),
    [("entropy", np.inf, r"ValueError: .* not finite"), ("minmax", np.nan, "AssertionError: scale issue")],
)
def test_a_calibration_failure_is_the_variants_error_and_says_the_graph_computes_nan(
    tmp_path: Path, calibration: str, factor: float, error: str
) -> None:
    recipe = Recipe.model_validate(
        {
            "name": "unbounded",
            "model": {"source": "entrypoint", "entrypoint": "tests.models.tiny:cnn"},
            "inputs": [{"name": "x", "shape": ["batch", 4]}],
            "dims": {"batch": {"min": 1, "opt": 2, "max": 4}},
            "outputs": ["y"],
            "data": {"samples": {"source": "random", "samples": 16}, "calibration": 8},
            "benchmark": {"batch_sizes": [1]},
            "export": {"int8": {"calibration": calibration, "exclude": []}},
        }
    )
    ctx = StageEnv(recipe, tmp_path, tmp_path / "work")
    source = _unbounded_model(tmp_path / "model.onnx", factor)
    with pytest.raises(StageError) as failed:
        ctx.run_named("int8", {"onnx-fp32": source}, variants=["onnx-int8"])
    message = str(failed.value)
    assert re.search(f"{calibration} calibration/quantization failed: {error}", message), message
    assert re.search(
        r"the FP32 graph itself computes \d+ NaN/inf values in output 'y' on calibration batch 1 ", message
    )


def test_the_nan_hint_is_silent_where_the_graph_computes_finite_values(tmp_path: Path) -> None:
    graph = _unbounded_model(tmp_path / "model.onnx", 1.0).path
    feeds = [{"x": np.ones((2, 4), np.float32)}]
    assert int8.nonfinite_calibration(graph, feeds) == ""
    assert "in output 'y' on calibration batch 1 (x 2×4)" in int8.nonfinite_calibration(
        _unbounded_model(tmp_path / "nan.onnx", np.nan).path, feeds
    )


# ------------------------------------------------------------------ int8_dynamic


def test_dynamic_quantization(source: ArtifactRecord, tmp_path: Path) -> None:
    ctx = tiny_context(tmp_path)
    st = ctx.stage("int8_dynamic", ["onnx-int8-dynamic"])
    assert (st.name, st.consumes, st.produces) == ("int8_dynamic", ("onnx-fp32",), ("onnx-int8-dynamic",))
    out = ctx.run(st, {"onnx-fp32": source}).outputs[0]
    assert (out.path, out.artifact, out.precision) == ("model.int8-dynamic.onnx", "onnx-int8-dynamic", "int8")
    model = onnx.load(str(tmp_path / out.path))
    counts = onnx_tools.op_counts(model)
    assert counts["MatMulInteger"] == out.details["quantized_count"] == 12  # every weight MatMul
    assert out.details["weight_layers"] == 12  # ... which is every weight layer there is
    assert counts["MatMul"] == 4  # activation MatMuls stay float
    assert out.details["target"] == "onnxruntime"
    feeds = ctx.dataset().feeds_at({"batch": 4, "sequence": 16})
    got, want = run_onnx(tmp_path / out.path, feeds), reference(ctx, feeds)
    assert lowest_cosine(got["pooled"], want["pooled"]) >= 0.98


def test_a_cnns_dynamic_int8_says_how_few_of_its_weight_layers_it_quantized(tmp_path: Path) -> None:
    """A hold-out CNN's onnx-int8-dynamic quantized its classifier's Gemm and none of its 31 convolutions, and
    the report said 'int8' as for the whole model: the Artifacts table now says 1 of 3 here."""
    import torch

    from pipeline.report.record import artifacts_section
    from tests.models.tiny import cnn

    recipe = Recipe.model_validate(
        {
            "name": "cnn",
            "model": {"source": "entrypoint", "entrypoint": "tests.models.tiny:cnn"},
            "inputs": [{"name": "images", "shape": ["batch", 3, 16, 16]}],
            "dims": {"batch": {"min": 1, "opt": 2, "max": 4}},
            "outputs": ["logits"],
            "data": {"samples": {"source": "random", "samples": 8}},
            "benchmark": {"batch_sizes": [1]},
        }
    )
    ctx = StageEnv(recipe, tmp_path, tmp_path / "work")
    path = tmp_path / "model.onnx"
    torch.manual_seed(0)
    torch.onnx.export(
        cnn().eval(),
        (torch.randn(2, 3, 16, 16),),
        str(path),
        dynamo=False,
        input_names=["images"],
        output_names=["logits"],
        dynamic_axes={"images": {0: "batch"}, "logits": {0: "batch"}},
        opset_version=18,
    )
    out = ctx.run_named("int8_dynamic", {"onnx-fp32": record(path)}, variants=["onnx-int8-dynamic"]).outputs[
        0
    ]
    assert (out.details["quantized_count"], out.details["weight_layers"]) == (1, 3)  # the Gemm; two Convs
    header = {"artifacts": [{"name": out.artifact, "precision": "int8", "details": out.details}]}
    (table, *_) = artifacts_section(header).blocks
    assert table.rows[0][2] == "int8 (1 of 3 weight layers)"
