"""Shared ONNX helpers on small hand-built graphs: module paths from dynamo metadata and legacy names,
selection rules, topological sorting, self-contained saving."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from pipeline.toolchain import onnx_tools


def _node(
    name: str, scopes: list[str] | None = None, op: str = "MatMul", inputs=("a", "w"), output="y"
) -> onnx.NodeProto:
    node = helper.make_node(op, list(inputs), [output], name=name)
    if scopes is not None:
        prop = node.metadata_props.add()
        prop.key, prop.value = onnx_tools.NAME_SCOPES_KEY, repr(scopes)
    return node


@pytest.mark.parametrize(
    ("node", "path"),
    [
        (
            _node("node_MatMul_83", ["", "encoder", "encoder.layer.0.intermediate.dense", "linear_4"]),
            "encoder.layer.0.intermediate.dense",
        ),
        (
            _node("node_matmul", ["", "encoder", "encoder.layer.0.attention.self", "matmul"]),
            "encoder.layer.0.attention.self",
        ),
        (_node("node_Shape_0", ["_empty_nn_module_stack_from_metadata_hook", "sym_size_int_5"]), ""),
        (_node("node_Add", ["", "add"]), ""),
        (_node("/encoder/layer.0/output/dense/MatMul"), "encoder.layer.0.output.dense"),
        (_node("MatMul_12"), None),
    ],
)
def test_module_path(node: onnx.NodeProto, path: str | None) -> None:
    assert onnx_tools.module_path(node) == path


def test_patterns_match_module_paths() -> None:
    ffn_down = "*.layer.*[0-9].output.dense"
    assert onnx_tools.matches("encoder.encoder.layer.11.output.dense", [ffn_down])
    assert not onnx_tools.matches("encoder.encoder.layer.0.attention.output.dense", [ffn_down])
    assert onnx_tools.matches("encoder.encoder.layer.0.attention.output.dense", ["*.output.dense"])
    assert not onnx_tools.matches(None, ["*"])


def _graph_with_weights() -> onnx.ModelProto:
    w = numpy_helper.from_array(np.ones((4, 4), np.float32), "w")
    nodes = [
        _node("q", ["", "m.layer.0.query", "linear"], inputs=("x", "w"), output="q"),
        _node("o", ["", "m.layer.0.output.dense", "linear_1"], inputs=("q", "w"), output="o"),
        _node("qk", ["", "m.layer.0", "matmul"], inputs=("q", "o"), output="y"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 4])],
        [w],
    )
    return helper.make_model(graph)


def test_select_nodes() -> None:
    model = _graph_with_weights()
    sel = onnx_tools.select_nodes(model, ["MatMul"], True, [], ["*.output.dense"])
    assert sel.quantize == ["q"]
    assert sel.excluded == {"o": "matched by exclude", "qk": "activation MatMul (weights_only_matmul)"}
    assert sel.label("o") == "m.layer.0.output.dense"
    everything = onnx_tools.select_nodes(model, ["MatMul"], False)
    assert everything.quantize == ["q", "o", "qk"]
    only = onnx_tools.select_nodes(model, ["MatMul"], True, include=["*.query"])
    assert only.quantize == ["q"] and only.excluded["o"] == "not matched by include"


def test_a_module_run_several_times_is_named_once() -> None:
    """ALBERT runs one layer's modules in every layer: one node per run, all under the module's label."""
    ffn = onnx_tools.FEED_FORWARD
    selection = onnx_tools.Selection(
        excluded={"n1": ffn, "n2": ffn, "n3": ffn, "n4": ffn, "n5": "matched by exclude"},
        paths={"n1": "layer.ffn", "n2": "layer.ffn_output", "n3": "layer.ffn", "n4": "layer.ffn_output"},
    )
    assert selection.feed_forward() == ["layer.ffn", "layer.ffn_output"]
    assert selection.by_pattern() == ["layer.ffn", "layer.ffn_output", "n5"]


def test_topological_sort_is_stable() -> None:
    model = _graph_with_weights()
    nodes = list(model.graph.node)
    del model.graph.node[:]
    model.graph.node.extend([nodes[2], nodes[0], nodes[1]])
    onnx_tools.topological_sort(model.graph)
    assert [n.name for n in model.graph.node] == ["q", "o", "qk"]
    onnx.checker.check_model(model)


def test_save_is_self_contained(tmp_path: Path) -> None:
    model = _graph_with_weights()
    onnx_tools.save(model, tmp_path / "m.onnx")
    assert list(tmp_path.iterdir()) == [tmp_path / "m.onnx"]
    loaded = onnx_tools.load(tmp_path / "m.onnx")
    assert not onnx_tools.has_external_data(loaded)
    assert onnx_tools.op_counts(loaded) == {"MatMul": 3}
    assert onnx_tools.graph_inputs(loaded) == ["x"]


def test_fp16_share_counts_compute_nodes() -> None:
    model = _graph_with_weights()
    assert onnx_tools.fp16_node_share(model) == 0.0
    cast = helper.make_node("Cast", ["x"], ["x16"], to=TensorProto.FLOAT16)
    half = helper.make_graph(
        [
            cast,
            helper.make_node("Relu", ["x16"], ["r"]),
            helper.make_node("Cast", ["r"], ["y"], to=TensorProto.FLOAT),
        ],
        "h",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    assert onnx_tools.fp16_node_share(helper.make_model(half)) == 1.0


def test_contrib_domains_get_an_opset_import() -> None:
    model = _graph_with_weights()
    model.graph.node.append(helper.make_node("BiasGelu", ["y", "x"], ["z"], domain="com.microsoft"))
    onnx_tools.ensure_opset_imports(model)
    assert "com.microsoft" in {o.domain for o in model.opset_import}
    assert onnx_tools.fp16_node_share(model) is None  # ONNX cannot type a contrib op's output
