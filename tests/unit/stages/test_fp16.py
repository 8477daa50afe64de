"""The fp16 stage on the tiny encoder: a real float16 graph with FP32 I/O, blocked ops kept FP32, loadable by
ONNX Runtime and close to the eager FP32 model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from pipeline.core.artifacts import ArtifactRecord
from pipeline.stages.base import StageResult
from pipeline.toolchain import onnx_tools
from tests.unit.stages.onnx_fixtures import lowest_cosine, reference, run_onnx, tiny_context, tiny_onnx

FLOAT, HALF = onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> ArtifactRecord:
    return tiny_onnx(tmp_path_factory)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, source: ArtifactRecord) -> tuple[StageResult, Path]:
    ctx = tiny_context(tmp_path_factory.mktemp("fp16"))
    result = ctx.run_named("fp16", {"onnx-fp32": source}, variants=["onnx-fp16"])
    return result, ctx.workdir / "model.fp16.onnx"


def test_stage_declares_its_artifact() -> None:
    ctx = tiny_context(Path("/nonexistent"))
    st = ctx.stage("fp16", ["onnx-fp16"])
    assert (st.name, st.consumes, st.produces) == ("fp16", ("onnx-fp32",), ("onnx-fp16",))
    assert st.config.fp16.block_ops == list(ctx.recipe.export.fp16.block_ops)
    env = st.environment()
    assert env["onnx"] and env["onnxruntime"]


def test_output_record(built: tuple[StageResult, Path]) -> None:
    result, path = built
    (out,) = result.outputs
    assert (out.path, out.kind, out.artifact, out.precision) == (
        "model.fp16.onnx",
        "onnx",
        "onnx-fp16",
        "fp16",
    )
    assert 0.5 < out.details["fp16_node_share"] <= 1.0
    assert out.details["blocked_ops"] == sorted(tiny_context(Path(".")).recipe.export.fp16.block_ops)
    assert out.details["onnxruntime_cpu"] == "ok"
    assert path.is_file()


def test_weights_are_half_and_io_stays_float(built: tuple[StageResult, Path], source: ArtifactRecord) -> None:
    model = onnx.load(str(built[1]))
    original = onnx.load(str(source.path))
    assert not onnx_tools.has_external_data(model)
    assert [(i.name, i.type.tensor_type.elem_type) for i in model.graph.input] == [
        (i.name, i.type.tensor_type.elem_type) for i in original.graph.input
    ]
    assert {o.type.tensor_type.elem_type for o in model.graph.output} == {FLOAT}
    floats = [i for i in model.graph.initializer if i.data_type in (FLOAT, HALF)]
    assert floats and all(i.data_type == HALF for i in floats)
    weights = {n.input[1] for n in model.graph.node if n.op_type == "MatMul"}
    assert all(i.data_type == HALF for i in model.graph.initializer if i.name in weights)


def test_blocked_ops_compute_in_float(built: tuple[StageResult, Path]) -> None:
    model = onnx.load(str(built[1]))
    types = onnx_tools.value_types(model)
    blocked = set(tiny_context(Path(".")).recipe.export.fp16.block_ops)
    seen = [n for n in model.graph.node if n.op_type in blocked]
    assert {n.op_type for n in seen} >= {"Softmax", "Erf"}
    for node in seen:
        assert all(types[o] == FLOAT for o in node.output if types.get(o) in onnx_tools.FLOAT_TYPES), (
            node.name
        )
    matmuls = [n for n in model.graph.node if n.op_type == "MatMul"]
    assert all(types[n.output[0]] == HALF for n in matmuls)


def test_matches_the_eager_model(built: tuple[StageResult, Path]) -> None:
    ctx = tiny_context(Path("."))
    feeds = ctx.dataset().feeds_at({"batch": 2, "sequence": 12})
    got, want = run_onnx(built[1], feeds), reference(ctx, feeds)
    assert got["hidden"].dtype == np.float32
    assert np.abs(got["hidden"] - want["hidden"]).max() < 5e-2
    assert lowest_cosine(got["pooled"], want["pooled"]) >= 0.999


def test_output_is_byte_deterministic(
    built: tuple[StageResult, Path], source: ArtifactRecord, tmp_path: Path
) -> None:
    ctx = tiny_context(tmp_path)
    ctx.run_named("fp16", {"onnx-fp32": source}, variants=["onnx-fp16"])
    assert (tmp_path / "model.fp16.onnx").read_bytes() == built[1].read_bytes()


def test_recipe_block_list_is_honoured(source: ArtifactRecord, tmp_path: Path) -> None:
    ctx = tiny_context(tmp_path, "export.fp16.block_ops=[MatMul]")
    result = ctx.run_named("fp16", {"onnx-fp32": source}, variants=["onnx-fp16"])
    model = onnx.load(str(tmp_path / "model.fp16.onnx"))
    types = onnx_tools.value_types(model)
    assert all(types[n.output[0]] == FLOAT for n in model.graph.node if n.op_type == "MatMul")
    assert result.outputs[0].details["blocked_ops"] == ["MatMul"]


def test_a_constant_output_is_converted_with_the_rest(tmp_path: Path) -> None:
    """A batch-independent output the exporter folded into an initializer (a learned temperature): the FP16
    graph keeps it, as float at the graph's edge, and ONNX Runtime runs it."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from pipeline.recipe import Fp16Export
    from pipeline.stages.fp16 import convert

    weights = np.eye(4, dtype=np.float32) * 0.5
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "constant-output",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4]),
            helper.make_tensor_value_info("temperature", TensorProto.FLOAT, [1]),
        ],
        [
            helper.make_tensor("w", TensorProto.FLOAT, weights.shape, weights.ravel()),
            helper.make_tensor("temperature", TensorProto.FLOAT, [1], [0.7]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "model.fp16.onnx"
    onnx.save(convert(model, Fp16Export()), path)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    y, temperature = session.run(["y", "temperature"], {"x": np.ones((2, 4), np.float32)})
    assert y.dtype == np.float32 and np.allclose(y, 0.5)
    assert temperature.dtype == np.float32 and np.allclose(temperature, [0.7], atol=1e-3)
